//! What the launcher's variables say about the job's layout: how many nodes,
//! how many ranks on this one. torchrun sets WORLD_SIZE and LOCAL_WORLD_SIZE in
//! each worker; the Kubeflow training operator sets PET_NNODES (`N` or an
//! elastic `MIN:MAX`) and PET_NPROC_PER_NODE in the pod.

use crate::facts::EnvValue;
use std::collections::BTreeMap;

fn number(env: &BTreeMap<String, EnvValue>, name: &str) -> Option<u64> {
    env.get(name)?.value.trim().parse().ok()
}

/// The number of nodes the job spans, when the launcher says; the largest value an
/// elastic range allows.
pub fn nodes(env: &BTreeMap<String, EnvValue>) -> Option<u64> {
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
    }
}
