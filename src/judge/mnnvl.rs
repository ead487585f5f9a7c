//! `mnnvl`: multi-node NVLink (GB200 NVL72 and similar racks), as NCCL decides it.
//!
//! NCCL (>= 2.20, NCCL_MNNVL_ENABLE default 2 = auto; NVIDIA/nccl v2.20.3-1 src/init.cc checkMNNVL)
//! checks MNNVL in ncclMnnvlCheck (v2.28.9-1 src/mnnvl.cc) for multi-node communicators:
//! it needs cuMem, every rank's GPU fabric state COMPLETED (nvmlDeviceGetGpuFabricInfoV),
//! a non-zero cluster UUID, and ranks of equal cluster UUID and clique id form one clique.
//! A GPU not COMPLETED or a zero UUID silently turns MNNVL off (traffic between trays goes
//! over the network). Where a clique exists but fabric memory cannot be created or
//! imported, NCCL init fails: "MNNVL ... is available but not working on this system.
//! Check the IMEX channel configuration (/dev/nvidia-caps-imex-channels)". Fabric handles
//! need an IMEX channel device node in the container (NVIDIA IMEX guide,
//! https://docs.nvidia.com/multi-node-nvlink-systems/imex-guide/overview.html); in
//! Kubernetes the NVIDIA DRA driver's ComputeDomain gives pods in the domain their channel
//! (kubernetes-sigs/dra-driver-nvidia-gpu README, "ComputeDomains").
//!
//! Skips on nodes whose GPUs are in no NVLink cluster (every H100/H200 HGX node: NVSwitch
//! inside one node only) unless they are GB200/GB300, whose missing cluster is the problem.

use super::rdma_scope::Scope;
use super::{Finding, Problem};
use crate::facts::Facts;
use crate::facts::gpu::{FabricState, NvmlGpu};
use crate::finding::{Outcome, Owner};
use crate::policy::Policy;
use crate::predict::{Feature, Prediction};

pub const ID: &str = "mnnvl";

/// GPUs built for NVL72-class racks, named as NVML names them (`NVIDIA GB200`).
fn is_mnnvl_part(g: &NvmlGpu) -> bool {
    g.name
        .value()
        .is_some_and(|n| n.contains("GB200") || n.contains("GB300"))
}

const IMEX_FIX: &str = "Give the pod an IMEX channel: in Kubernetes, a ComputeDomain of the NVIDIA DRA driver \
(k8s-dra-driver-gpu) and a resourceClaim on its ResourceClaimTemplate in every pod of the job; by hand, \
the device /dev/nvidia-caps-imex-channels/channel0 (docker --device). On the node, nvidia-imex must run \
(nvidia-imex-ctl -N shows the domain). Or set NCCL_MNNVL_ENABLE=0 to run without multi-node NVLink.";

/// Each GPU's fabric state and clique: a GPU not completed, or completed without a
/// cluster, turns MNNVL off. Returns the (cluster, clique) pairs seen.
fn fabric(
    nvml: &crate::facts::gpu::NvmlFacts,
    off: &Outcome,
    evidence: &mut Vec<String>,
    problems: &mut Vec<Problem>,
) -> std::collections::BTreeSet<(String, u32)> {
    let mut cliques = std::collections::BTreeSet::new();
    for g in &nvml.gpus {
        let state = g.fabric_state.value().copied();
        let state_text = state.map_or_else(|| "unreadable".to_string(), |s| s.to_string());
        let clique = g.fabric_clique.as_ref();
        evidence.push(format!(
            "GPU {}: fabric {state_text}, cluster {}, clique {}",
            g.index,
            clique.map_or("none", |c| c.cluster_uuid.as_str()),
            clique.map_or_else(|| "none".to_string(), |c| c.clique_id.to_string())
        ));
        let completed = state == Some(FabricState::Completed);
        if !completed {
            problems.push(Problem::predicts(
                off.clone(),
                format!("GPU {}: NVLink fabric state {state_text}: NCCL turns multi-node NVLink off for the whole job", g.index),
                "The fabric has not finished taking the GPU in: check `nvidia-smi -q | grep -A6 Fabric` on the node, the NVLink \
                 switch trays and their fabric manager (NMX); a tray whose GPUs stay in_progress or not_started needs the fabric brought up, or draining.",
            ));
        }
        match clique {
            Some(c) if c.has_cluster() => {
                cliques.insert((c.cluster_uuid.clone(), c.clique_id));
            }
            _ if completed => problems.push(Problem::predicts(
                off.clone(),
                format!("GPU {}: fabric completed but no cluster UUID: NCCL reads a zero UUID as no multi-node NVLink", g.index),
                "The GPU was not registered in an NVLink domain: check the NVLink switch trays' fabric manager (NMX) partition for this tray.",
            )),
            _ => {}
        }
    }
    cliques
}

/// The IMEX channel fabric handles need in this container.
/// What a missing IMEX channel does: what the prediction says NCCL's MNNVL check does
/// (crate::predict mnnvl: init fails where the fabric and clique let NCCL try). Where NCCL
/// turns MNNVL off first because this node's fabric is not done, the job still fails on
/// every node whose fabric is: the pod spec's failure, whatever this node's state (issue
/// 39 row 5). Where the job turns MNNVL off itself, or stays on one node, NCCL never
/// needs the channel.
fn imex_outcome(facts: &Facts, scope: &Scope, predicted: &Prediction, error: &str) -> Outcome {
    let env_off = ["NCCL_CUMEM_ENABLE", "NCCL_MNNVL_ENABLE"]
        .iter()
        .any(|v| crate::predict::int_param(facts, v) == Some(0))
        || crate::predict::int_param(facts, "NCCL_P2P_DISABLE").is_some_and(|v| v != 0);
    let old = predicted
        .nccl_version
        .is_some_and(|v| v < crate::nccl::version::MNNVL);
    match predicted.mnnvl.value {
        _ if scope.span == crate::layout::Span::Single || env_off || old => Outcome::Unaffected,
        Feature::FailsInit => Outcome::init_fails(error),
        _ => Outcome::init_fails(format!(
            "{error}, on every node whose NVLink fabric registration completes (here NCCL turns multi-node NVLink off first: {})",
            predicted.mnnvl.why
        )),
    }
}

fn imex(
    (facts, predicted): (&Facts, &Prediction),
    scope: &Scope,
    evidence: &mut Vec<String>,
    problems: &mut Vec<Problem>,
) {
    let channels = facts.gpus.imex_channels.value().cloned().flatten();
    match &channels {
        Some(c) if !c.is_empty() => evidence.push(format!("IMEX channels: {}", c.join(", "))),
        _ if facts.gpus.imex_channels.error().is_some() => evidence.push(format!(
            "IMEX channels unreadable: {}",
            facts.gpus.imex_channels.error().map(|e| e.to_string()).unwrap_or_default()
        )),
        // The prediction says how this version fails (crate::predict mnnvl): 2.27+ at
        // init with an IMEX hint, 2.20-2.26 at the first FABRIC handle it shares.
        _ => problems.push(Problem::predicts(
            imex_outcome(
                facts,
                scope,
                predicted,
                if crate::nccl::version(facts).is_none_or(|v| v >= crate::nccl::version::MNNVL_TRIAL) {
                    "\"MNNVL ... is available but not working on this system. Check the IMEX channel configuration\" (src/mnnvl.cc ncclMnnvlCheck)"
                } else {
                    "cuMemExportToShareableHandle / cuMemImportFromShareableHandle of the first FABRIC buffer NCCL shares (nccl#1647)"
                },
            ),
            if crate::nccl::version(facts).is_none_or(|v| v >= crate::nccl::version::MNNVL_TRIAL) {
                "no IMEX channel in this container (/dev/nvidia-caps-imex-channels): NCCL's multi-node NVLink init fails \
                 (\"MNNVL ... is available but not working on this system. Check the IMEX channel configuration\")"
                    .to_string()
            } else {
                format!(
                    "no IMEX channel in this container (/dev/nvidia-caps-imex-channels): NCCL {} turns multi-node NVLink on without \
                     trying it, then fails when it first shares a FABRIC buffer (cuMemExportToShareableHandle / cuMemImportFromShareableHandle), with no IMEX hint",
                    crate::nccl::version(facts).map_or(String::new(), |v| v.to_string())
                )
            },
            IMEX_FIX,
        )
        // The channel comes with the pod's ComputeDomain claim (or its device request).
        .blamed(Owner::PodSpec)),
    }
}

/// The skip where no GPU is in a cluster and none is a GB200/GB300, saying whether the
/// fabric state could not be read (issue 39 row 2: unread is no "not MNNVL").
fn not_mnnvl(nvml: &crate::facts::gpu::NvmlFacts) -> Option<Finding> {
    let in_cluster = nvml
        .gpus
        .iter()
        .any(|g| g.fabric_clique.as_ref().is_some_and(|c| c.has_cluster()));
    if in_cluster || nvml.gpus.iter().any(is_mnnvl_part) {
        return None;
    }
    let unread = nvml
        .gpus
        .iter()
        .any(|g| g.fabric_state.error().is_some_and(|e| e.is_unread()));
    Some(Finding::skip(
        ID,
        if unread {
            "could not read the NVLink fabric state (gpu-devices says why): multi-node NVLink not checked"
        } else {
            "no GPU is in a multi-node NVLink cluster: not an MNNVL system"
        },
    ))
}

pub fn judge(facts: &Facts, predicted: &Prediction, _policy: &Policy) -> Finding {
    let Some(nvml) = facts.gpus.nvml.loaded() else {
        return Finding::skip(ID, "no NVML: multi-node NVLink not checked");
    };
    if let Some(skip) = not_mnnvl(nvml) {
        return skip;
    }
    let env = |name: &str| facts.nccl_env.get(name).map(|v| v.value.trim().to_string());
    let scope = Scope::of(facts);
    // Without multi-node NVLink, traffic between trays takes the network: only where
    // the job crosses trays.
    let off = scope.in_use_outcome(
        false,
        Outcome::degraded(
            "the network between trays instead of multi-node NVLink",
            "the NICs' bandwidth instead of NVLink's between trays (GB200 NVL72: 1.8 TB/s per GPU over NVLink)",
        ),
    );
    if env("NCCL_MNNVL_ENABLE").as_deref() == Some("0") {
        return Finding::predicts(
            ID,
            off,
            "NCCL_MNNVL_ENABLE=0 on a multi-node NVLink system: traffic between trays goes over the network instead of NVLink",
            "Unset NCCL_MNNVL_ENABLE once the IMEX channels work (see this check without it).",
        )
        .blamed(Owner::Environment);
    }
    let mut evidence = Vec::new();
    let mut problems = Vec::new();
    let cliques = fabric(nvml, &off, &mut evidence, &mut problems);
    if cliques.len() > 1 {
        problems.push(Problem::predicts(
            off.clone(),
            format!(
                "this node's GPUs are in {} different NVLink cliques: NCCL only joins ranks of the same cluster and clique",
                cliques.len()
            ),
            "A tray's GPUs belong in one NVLink partition: check the fabric manager (NMX) partition configuration for this tray.",
        ));
    }
    imex((facts, predicted), &scope, &mut evidence, &mut problems);
    // MNNVL came with v2.20.3-1 (src/init.cc checkMNNVL; absent at v2.19.4-1).
    if let Some(v) = crate::nccl::version(facts)
        && v < crate::nccl::version::MNNVL
    {
        problems.push(Problem::predicts(
                off.clone(),
                format!("NCCL {v} predates multi-node NVLink (2.20): traffic between trays goes over the network"),
                "Use NCCL 2.20 or later (a current PyTorch wheel; 2.27+ checks the IMEX channel at init) to reach other trays over NVLink.",
            ).blamed(Owner::Image));
    }
    if env("NCCL_CUMEM_ENABLE").as_deref() == Some("0") {
        problems.push(
            Problem::predicts(
                off,
                "NCCL_CUMEM_ENABLE=0: NCCL's multi-node NVLink needs cuMem, so it stays off",
                "Unset NCCL_CUMEM_ENABLE.",
            )
            .blamed(Owner::Environment),
        );
    }
    let summary = match cliques.iter().next() {
        Some((uuid, id)) => format!(
            "{} GPU(s) in NVLink cluster {uuid}, clique {id}, with an IMEX channel",
            nvml.gpus.len()
        ),
        None => String::new(),
    };
    super::combine(ID, summary, evidence, problems)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::Observed;
    use crate::facts::gpu::{FabricClique, LibraryState};
    use crate::finding::Status;
    use crate::test_facts::{healthy, with_env};

    /// The judge as the run calls it, with the prediction made from the same facts.
    fn judge(facts: &Facts, policy: &Policy) -> Finding {
        crate::test_facts::judged(super::judge, facts, policy)
    }

    const CLUSTER: &str = "6e0b1f2c-3d4a-4b5c-8d9e-0f1a2b3c4d5e";

    /// The healthy 2x H200, renamed and placed in one NVL72 clique with channel0.
    fn tray() -> Facts {
        let mut f = healthy();
        if let LibraryState::Loaded(n) = &mut f.gpus.nvml.state {
            for g in &mut n.gpus {
                g.name = Observed::Value("NVIDIA GB200".into());
                g.fabric_state = Observed::Value(FabricState::Completed);
                g.fabric_clique = Some(FabricClique {
                    cluster_uuid: CLUSTER.into(),
                    clique_id: 32766,
                });
            }
        }
        f.gpus.imex_channels = Observed::Value(Some(vec!["channel0".into()]));
        f
    }

    fn gpus(f: &mut Facts) -> &mut Vec<NvmlGpu> {
        match &mut f.gpus.nvml.state {
            LibraryState::Loaded(n) => &mut n.gpus,
            _ => unreachable!("tray() has NVML"),
        }
    }

    #[test]
    fn skips_off_nvl72_and_passes_a_healthy_tray() {
        assert_eq!(judge(&healthy(), &Policy::default()).status(), Status::Skip);
        let f = judge(&tray(), &Policy::default());
        assert_eq!(f.status(), Status::Pass, "{f:?}");
        assert!(f.summary.contains("clique 32766"));
    }

    /// Issue 36: a missing IMEX channel fails NCCL's init where its MNNVL check runs; a
    /// fabric or clique that turns MNNVL off sends the trays' traffic over the network:
    /// degraded, a warning; one node is unaffected.
    #[test]
    fn broken_trays_fail_or_degrade_multi_node_jobs() {
        let multi = |f: Facts| with_env(f, &[("PET_NNODES", "18")]);
        let mut no_channel = multi(tray());
        no_channel.gpus.imex_channels = Observed::Value(None);
        let f = judge(&no_channel, &Policy::default());
        assert_eq!(f.status(), Status::Fail);
        assert!(f.remediation().unwrap().contains("ComputeDomain"));
        let mut not_done = multi(tray());
        gpus(&mut not_done)[1].fabric_state = Observed::Value(FabricState::InProgress);
        assert_eq!(judge(&not_done, &Policy::default()).status(), Status::Warn);
        let mut zero = multi(tray());
        gpus(&mut zero)[0].fabric_clique = Some(FabricClique {
            cluster_uuid: "00000000-0000-0000-0000-000000000000".into(),
            clique_id: 0,
        });
        let f = judge(&zero, &Policy::default());
        assert_eq!(f.status(), Status::Warn);
        assert!(f.summary.contains("no cluster UUID"), "{}", f.summary);
        let mut split = multi(tray());
        gpus(&mut split)[1].fabric_clique = Some(FabricClique {
            cluster_uuid: "7e0b1f2c-3d4a-4b5c-8d9e-0f1a2b3c4d5e".into(),
            clique_id: 32766,
        });
        assert!(
            judge(&split, &Policy::default())
                .summary
                .contains("2 different NVLink cliques")
        );
        // One node: NCCL does not check MNNVL, so nothing changes for it.
        let mut single = with_env(tray(), &[("PET_NNODES", "1")]);
        single.gpus.imex_channels = Observed::Value(Some(vec![]));
        assert_eq!(judge(&single, &Policy::default()).status(), Status::Pass);
        let off = with_env(tray(), &[("NCCL_MNNVL_ENABLE", "0")]);
        assert_eq!(judge(&off, &Policy::default()).status(), Status::Warn);
    }

    /// Issue 39 row 5: a fabric still registering (the node's) beside a pod without an
    /// IMEX channel (the job's). NCCL turns MNNVL off for the fabric here, but fails init
    /// on every node whose fabric is done: the finding fails as the job's, and its worst
    /// line names the problem that carries that blame, not the node's.
    #[test]
    fn regression_the_worst_line_names_the_problem_that_carries_the_blame() {
        let mut f = with_env(tray(), &[("PET_NNODES", "18")]);
        gpus(&mut f)[1].fabric_state = Observed::Value(FabricState::InProgress);
        f.gpus.imex_channels = Observed::Value(None);
        let finding = crate::judge::blame(judge(&f, &Policy::default()));
        assert_eq!(finding.status(), Status::Fail, "{finding:?}");
        assert_eq!(
            finding.blame(),
            Some(crate::finding::Blame::Job),
            "{finding:?}"
        );
        assert!(
            finding.summary.contains("worst: no IMEX channel"),
            "{}",
            finding.summary
        );
    }
}
