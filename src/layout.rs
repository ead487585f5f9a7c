//! What the launcher's variables say about the job's layout: how many nodes,
//! how many ranks on this one. torchrun sets WORLD_SIZE and LOCAL_WORLD_SIZE in
//! each worker; the Kubeflow training operator sets PET_NNODES (`N` or an
//! elastic `MIN:MAX`) and PET_NPROC_PER_NODE in the pod.

use crate::facts::EnvValue;
use std::collections::BTreeMap;

/// Launcher and container variables that say how ranks and GPUs are laid out.
pub const LAUNCHER_VARS: &[&str] = &[
    "CUDA_VISIBLE_DEVICES",
    "KUBERNETES_SERVICE_HOST",
    "LOCAL_WORLD_SIZE",
    "NVIDIA_VISIBLE_DEVICES",
    "PET_NNODES",
    "PET_NPROC_PER_NODE",
    "WORLD_SIZE",
];

fn number(env: &BTreeMap<String, EnvValue>, name: &str) -> Option<u64> {
    env.get(name)?.value.trim().parse().ok()
}

/// Where `--nodes` (NCCL_PREFLIGHT_NODES) is recorded among the launcher variables:
/// an initContainer does not get the launcher's variables, so the manifest states it.
pub const NODES_VAR: &str = "NCCL_PREFLIGHT_NODES";

/// The number of nodes the job spans, when `--nodes` or the launcher says; the
/// largest value an elastic range allows.
pub fn nodes(env: &BTreeMap<String, EnvValue>) -> Option<u64> {
    if let Some(n) = number(env, NODES_VAR).filter(|&n| n > 0) {
        return Some(n);
    }
    if let Some(v) = env.get("PET_NNODES") {
        let max = v.value.rsplit(':').next().unwrap_or("").trim();
        if let Ok(n) = max.parse::<u64>() {
            return Some(n);
        }
    }
    let world = number(env, "WORLD_SIZE")?;
    let local = number(env, "LOCAL_WORLD_SIZE").filter(|&l| l > 0)?;
    Some(world.div_ceil(local))
}

/// What the job's span means for RDMA: a single-node job never sends NCCL traffic
/// over EFA or InfiniBand (NVLink, PCIe and shared memory carry it), so RDMA
/// problems only warn there; a multi-node job trains at the network's speed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Span {
    /// The launcher or `--nodes` says one node.
    Single,
    /// The launcher or `--nodes` says this many nodes (more than one).
    Multi(u64),
    /// Nothing says: run by hand, or an initContainer without `--nodes`.
    Unknown,
}

/// The job's span from the launcher variables (and `--nodes`).
pub fn span(env: &BTreeMap<String, EnvValue>) -> Span {
    match nodes(env) {
        Some(1) => Span::Single,
        Some(n) => Span::Multi(n),
        None => Span::Unknown,
    }
}

/// True when the launcher says the job spans more than one node.
pub fn is_multi_node(env: &BTreeMap<String, EnvValue>) -> bool {
    nodes(env).is_some_and(|n| n > 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, EnvValue> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), EnvValue::text(*v)))
            .collect()
    }

    #[test]
    fn node_count_from_launchers() {
        assert_eq!(nodes(&env(&[("PET_NNODES", "4")])), Some(4));
        assert_eq!(nodes(&env(&[("PET_NNODES", "1:3")])), Some(3));
        assert_eq!(
            nodes(&env(&[("WORLD_SIZE", "16"), ("LOCAL_WORLD_SIZE", "8")])),
            Some(2)
        );
        assert_eq!(
            nodes(&env(&[("WORLD_SIZE", "8"), ("LOCAL_WORLD_SIZE", "0")])),
            None
        );
        assert_eq!(nodes(&env(&[("WORLD_SIZE", "x")])), None);
        assert!(!is_multi_node(&env(&[])));
        assert!(is_multi_node(&env(&[("PET_NNODES", "2")])));
        // --nodes wins over the launcher: the manifest knows the job, the initContainer does not.
        assert_eq!(
            span(&env(&[(NODES_VAR, "16"), ("PET_NNODES", "1")])),
            Span::Multi(16)
        );
        assert_eq!(span(&env(&[(NODES_VAR, "1")])), Span::Single);
        assert_eq!(span(&env(&[(NODES_VAR, "0")])), Span::Unknown);
        assert_eq!(span(&env(&[])), Span::Unknown);
    }
}
