//! judge: `(&Facts, &Policy) -> Vec<Finding>`, pure.
//!
//! Every check is one row of `CHECKS`: a stable id (users pass it to `--ignore`;
//! ids never change once released), a title, and a judging function. The runner,
//! not the checks, applies `--ignore`.

mod cuda_runtime;
mod dev_shm;
mod gdr;
mod gpu_devices;
mod gpu_health;
mod gpu_p2p;
mod host_ipc;
mod libfabric;
mod memlock;
mod mnnvl;
mod nccl_env;
mod nccl_net_plugin;
mod nvlink;
mod pod_placement;
mod rdma_devices;
mod rdma_memreg;
pub(crate) mod rdma_scope;
mod stack_limit;

use crate::facts::Facts;
pub(crate) use crate::finding::combine;
use crate::finding::ids;
pub use crate::finding::{Finding, Problem, Status, verdict};
use crate::policy::Policy;

/// One row of the check table: a registered id and the function that judges it. Its
/// title and source live in the registry (`crate::finding::REGISTRY`).
pub struct Check {
    pub id: &'static str,
    pub judge: fn(&Facts, &Policy) -> Finding,
}

/// Every check judged from facts, in report order.
pub const CHECKS: &[Check] = &[
    Check {
        id: ids::MEMLOCK,
        judge: memlock::judge,
    },
    Check {
        id: ids::DEV_SHM,
        judge: dev_shm::judge,
    },
    Check {
        id: ids::HOST_IPC,
        judge: host_ipc::judge,
    },
    Check {
        id: ids::STACK_LIMIT,
        judge: stack_limit::judge,
    },
    Check {
        id: ids::GPU_DEVICES,
        judge: gpu_devices::judge,
    },
    Check {
        id: ids::GPU_P2P,
        judge: gpu_p2p::judge,
    },
    Check {
        id: ids::NVLINK,
        judge: nvlink::judge,
    },
    Check {
        id: ids::GPU_HEALTH,
        judge: gpu_health::judge,
    },
    Check {
        id: ids::MNNVL,
        judge: mnnvl::judge,
    },
    Check {
        id: ids::CUDA_RUNTIME,
        judge: cuda_runtime::judge,
    },
    Check {
        id: ids::POD_PLACEMENT,
        judge: pod_placement::judge,
    },
    Check {
        id: ids::RDMA_DEVICES,
        judge: rdma_devices::judge,
    },
    Check {
        id: ids::RDMA_MEMREG,
        judge: rdma_memreg::judge,
    },
    Check {
        id: ids::LIBFABRIC,
        judge: libfabric::judge,
    },
    Check {
        id: ids::NCCL_NET_PLUGIN,
        judge: nccl_net_plugin::judge,
    },
    Check {
        id: ids::GDR,
        judge: gdr::judge,
    },
    Check {
        id: ids::NCCL_ENV,
        judge: nccl_env::judge,
    },
];

/// The ids of all checks (those judged here, the bench's and serve's).
pub fn check_ids() -> impl Iterator<Item = &'static str> {
    crate::finding::all_ids()
}

/// Runs every check, stamps each finding with its row's id, and applies the ignore policy.
pub fn judge(facts: &Facts, policy: &Policy) -> Vec<Finding> {
    CHECKS
        .iter()
        .map(|check| {
            let mut finding = (check.judge)(facts, policy);
            finding.id = check.id.to_string();
            policy.settle(finding)
        })
        .collect()
}

/// One failed dlopen as an evidence line; dlerror already starts with the library's name.
fn attempt_failure(library: &str, error: &str) -> String {
    if error.starts_with(&format!("{library}:")) {
        error.to_string()
    } else {
        format!("{library}: {error}")
    }
}

/// The status for "could not determine": a warning, or a failure when the user
/// explicitly asked for what this check enforces.
fn undetermined(explicit: bool) -> Status {
    if explicit { Status::Fail } else { Status::Warn }
}

#[cfg(test)]
use crate::test_facts;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy;

    #[test]
    fn ignore_turns_failures_into_flagged_warnings() {
        let mut facts = test_facts::healthy();
        facts.dev_shm.usage = crate::facts::Observed::Value(Some(crate::facts::FsUsage {
            size_bytes: 64 << 20,
            free_bytes: 64 << 20,
        }));
        let strict = judge(&facts, &Policy::default());
        let shm = strict.iter().find(|f| f.id == "dev-shm").unwrap();
        assert_eq!(shm.status, Status::Fail);
        assert_eq!(verdict(&strict), Status::Fail);
        let lenient = judge(
            &facts,
            &policy::build(&["dev-shm".into()], &[], None, None).unwrap(),
        );
        let shm = lenient.iter().find(|f| f.id == "dev-shm").unwrap();
        assert_eq!((shm.status, shm.ignored), (Status::Warn, true));
        assert_eq!(verdict(&lenient), Status::Warn);
    }

    #[test]
    fn healthy_node_passes_every_check() {
        let findings = judge(&test_facts::healthy(), &Policy::default());
        assert_eq!(findings.len(), CHECKS.len());
        // The healthy node is a 2x H200 without RDMA: the RDMA checks have nothing to look at,
        // and an HGX node is in no multi-node NVLink cluster.
        let rdma = ["rdma-devices", "rdma-memreg", "nccl-net-plugin", "gdr", "mnnvl"];
        for f in &findings {
            let want = if rdma.contains(&f.id.as_str()) {
                Status::Skip
            } else {
                Status::Pass
            };
            assert_eq!(f.status, want, "{f:?}");
        }
        assert_eq!(verdict(&findings), Status::Pass);
    }

    #[test]
    fn the_table_follows_the_registry() {
        // Judged checks are the registry's node, image and settings entries, in its order.
        let judged: Vec<&str> = crate::finding::REGISTRY
            .iter()
            .filter(|c| {
                !matches!(
                    c.source,
                    crate::finding::Source::Measured | crate::finding::Source::Runtime
                )
            })
            .map(|c| c.id)
            .collect();
        let table: Vec<&str> = CHECKS.iter().map(|c| c.id).collect();
        assert_eq!(table, judged);
        // Every judge names its own id (the runner stamps it anyway).
        for facts in test_facts::broken_variants() {
            for check in CHECKS {
                assert_eq!((check.judge)(&facts, &Policy::default()).id, check.id);
            }
        }
    }

    #[test]
    fn every_failure_has_a_remediation() {
        for facts in test_facts::broken_variants() {
            for f in judge(
                &facts,
                &policy::build(&[], &["host-ipc".into()], None, None).unwrap(),
            ) {
                if f.status == Status::Fail {
                    assert!(f.remediation.is_some(), "{f:?}");
                }
            }
        }
    }
}
