//! judge: `(&Facts, &Prediction, &Policy) -> Vec<Finding>`, pure: the prediction
//! (crate::predict) is made once per run and handed to every check.
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
mod nccl_library;
mod nccl_net_plugin;
mod nvlink;
mod pod_placement;
mod rdma_devices;
mod rdma_memreg;
pub(crate) mod rdma_scope;
mod stack_limit;

use crate::facts::{Fact, Facts};
pub(crate) use crate::finding::Problem;
pub(crate) use crate::finding::combine;
use crate::finding::{Blame, Source};
pub use crate::finding::{Finding, Severity, Status};
use crate::policy::Policy;
use crate::predict::Prediction;

/// One row of the check table: everything about a judged check except how it judges,
/// which is its own file. Adding a check is that file and one row here.
pub struct Check {
    /// Stable: users pass it to `--ignore`; never changes once released.
    pub id: &'static str,
    /// What the check looks at, for docs/checks.md.
    #[cfg_attr(
        not(test),
        expect(
            dead_code,
            reason = "read by the tests that hold docs/checks.md and the needs to the table"
        )
    )]
    pub title: &'static str,
    /// Where its answer comes from, which decides where it can be judged.
    #[cfg_attr(
        not(test),
        expect(
            dead_code,
            reason = "read by the tests that hold docs/checks.md and the needs to the table"
        )
    )]
    pub source: Source,
    /// The sections of the facts the judge reads, and only those (a test swaps every
    /// other section and sees the finding unchanged). docs/checks.md's table lists them.
    #[cfg_attr(
        not(test),
        expect(
            dead_code,
            reason = "read by the tests that hold docs/checks.md and the needs to the table"
        )
    )]
    pub needs: &'static [Fact],
    /// Where a failure lies unless the finding says otherwise ([`Finding::blamed`]), and
    /// why: where its fix is applied. docs/failure-policy.md lists every row's.
    pub blame: Blame,
    pub blame_why: &'static str,
    /// Judges the facts against what NCCL will do with them, predicted once per run.
    pub judge: fn(&Facts, &Prediction, &Policy) -> Finding,
}

/// Every check judged from facts, in report order.
pub const CHECKS: &[Check] = &[
    Check {
        id: memlock::ID,
        title: "locked-memory limit in force (RLIMIT_MEMLOCK, CAP_IPC_LOCK, a real mlock)",
        source: Source::Node,
        needs: &[Fact::Memlock, Fact::Rdma, Fact::Launcher, Fact::Image],
        blame: Blame::Node,
        blame_why: "Kubernetes has no pod field for ulimits: the container inherits RLIMIT_MEMLOCK from the container runtime's service on the node (containerd's unit sets no LimitMEMLOCK, so systemd's 8 MiB applies; CRI-O's default_ulimits), so the fix is applied on the node",
        judge: memlock::judge,
    },
    Check {
        id: dev_shm::ID,
        title: "/dev/shm size, free space and filesystem",
        source: Source::Node,
        needs: &[Fact::DevShm],
        blame: Blame::Job,
        blame_why: "/dev/shm's size comes from the pod spec (an emptyDir of medium Memory with its sizeLimit): the fix is the job's",
        judge: dev_shm::judge,
    },
    Check {
        id: host_ipc::ID,
        title: "IPC namespace (host or private)",
        source: Source::Node,
        needs: &[Fact::Namespaces],
        blame: Blame::Job,
        blame_why: "the IPC namespace is the pod spec's hostIPC field: the fix is the job's",
        judge: host_ipc::judge,
    },
    Check {
        id: stack_limit::ID,
        title: "stack limit (unlimited or small stacks shrink NCCL's threads)",
        source: Source::Node,
        needs: &[Fact::StackLimit],
        blame: Blame::Node,
        blame_why: "RLIMIT_STACK, like memlock, is the container runtime's default on the node (no pod field): the fix is applied on the node",
        judge: stack_limit::judge,
    },
    Check {
        id: gpu_devices::ID,
        title: "NVML and the CUDA driver load and see the GPUs (fabric manager, lost GPUs, CUDA_VISIBLE_DEVICES)",
        source: Source::Node,
        needs: &[Fact::Gpus, Fact::Launcher],
        blame: Blame::Node,
        blame_why: "the driver, the fabric manager and a lost GPU are the node's; a GPU count the pod did not request (--require gpus=N) or CUDA_VISIBLE_DEVICES are the job's (set per finding)",
        judge: gpu_devices::judge,
    },
    Check {
        id: gpu_p2p::ID,
        title: "peer access (read, write, CUDA) between GPUs that share NVLink or a PCIe switch",
        source: Source::Node,
        needs: &[Fact::Gpus],
        blame: Blame::Node,
        blame_why: "peer access disabled by ACS, the IOMMU or the driver is the node's; a pod given one GPU, which has no peer, is the job's (set per finding)",
        judge: gpu_p2p::judge,
    },
    Check {
        id: nvlink::ID,
        title: "every NVLink a GPU has is up",
        source: Source::Node,
        needs: &[Fact::Gpus],
        blame: Blame::Node,
        blame_why: "an NVLink down is the node's hardware or fabric manager",
        judge: nvlink::judge,
    },
    Check {
        id: gpu_health::ID,
        title: "no uncorrectable ECC errors, failed or pending row remaps or page retirements",
        source: Source::Node,
        needs: &[Fact::Gpus],
        blame: Blame::Node,
        blame_why: "ECC errors, row remaps and retired pages are the GPU's: drain the node",
        judge: gpu_health::judge,
    },
    Check {
        id: mnnvl::ID,
        title: "multi-node NVLink (GB200 NVL72): fabric state, cluster and clique per GPU, an IMEX channel in the container",
        source: Source::Node,
        needs: &[
            Fact::Gpus,
            Fact::NcclEnv,
            Fact::Rdma,
            Fact::Launcher,
            Fact::Image,
        ],
        blame: Blame::Node,
        blame_why: "the NVLink fabric state, cluster and clique are the node's fabric manager and IMEX; a pod without an IMEX channel is the job's (set per finding)",
        judge: mnnvl::judge,
    },
    Check {
        id: cuda_runtime::ID,
        title: "the image's CUDA runtime (libcudart) against the driver's CUDA version (minor-version and forward compatibility)",
        source: Source::Image,
        needs: &[Fact::Gpus, Fact::Image],
        blame: Blame::Job,
        blame_why: "the CUDA runtime is the image's: an image built for a newer CUDA than the node pool's driver fails on every node of the pool",
        judge: cuda_runtime::judge,
    },
    Check {
        id: pod_placement::ID,
        title: "the pod holds all the node's GPUs and runs one process per GPU",
        source: Source::Node,
        needs: &[Fact::Gpus, Fact::Launcher, Fact::Rdma],
        blame: Blame::Job,
        blame_why: "how many GPUs a pod holds and how many processes it runs are the pod spec's and the launcher's",
        judge: pod_placement::judge,
    },
    Check {
        id: rdma_devices::ID,
        title: "RDMA/EFA devices present, ports up, device nodes openable, enough for the pod's GPUs, libibverbs sees them",
        source: Source::Node,
        needs: &[
            Fact::Rdma,
            Fact::Gpus,
            Fact::Launcher,
            Fact::NcclEnv,
            Fact::Image,
            Fact::Platform,
        ],
        blame: Blame::Node,
        blame_why: "a device missing, a port down or slow, a NIC's PCIe link trained low is the node's NICs and drivers; a pod that requested no RDMA resource, a device node it cannot open (no device plugin grant) or libibverbs missing from the image is the job's (set per finding)",
        judge: rdma_devices::judge,
    },
    Check {
        id: rdma_memreg::ID,
        title: "a real ibv_reg_mr of --memreg-size on every RDMA device",
        source: Source::Image,
        needs: &[Fact::Rdma, Fact::Launcher, Fact::Image],
        blame: Blame::Node,
        blame_why: "a registration refused by the kernel is the node's: its runtime's memlock limit, the NIC driver, nvidia-peermem",
        judge: rdma_memreg::judge,
    },
    Check {
        id: libfabric::ID,
        title: "libfabric loads and offers efa RDM endpoints where EFA exists",
        source: Source::Image,
        needs: &[Fact::Rdma, Fact::Launcher, Fact::Image],
        blame: Blame::Job,
        blame_why: "libfabric and its efa provider are the image's libraries",
        judge: libfabric::judge,
    },
    Check {
        id: nccl_library::ID,
        title: "the libnccl the trainer's process loads (torch's RUNPATH, LD_LIBRARY_PATH, ld.so.cache, the wheels) and every other copy in the image",
        source: Source::Image,
        needs: &[Fact::Rdma, Fact::Image],
        blame: Blame::Job,
        blame_why: "the libnccl the trainer loads, and every other copy, are the image's",
        judge: nccl_library::judge,
    },
    Check {
        id: nccl_net_plugin::ID,
        title: "the NCCL net plugin NCCL will load (aws-ofi-nccl on EFA)",
        source: Source::Image,
        needs: &[Fact::Rdma, Fact::Launcher, Fact::Image],
        blame: Blame::Job,
        blame_why: "the NCCL net plugin (aws-ofi-nccl) is the image's",
        judge: nccl_net_plugin::judge,
    },
    Check {
        id: gdr::ID,
        title: "GPUDirect RDMA for GPU-NIC pairs under one PCIe switch (nvidia-peermem, EFA's driver or dma-buf)",
        source: Source::Node,
        needs: &[
            Fact::Rdma,
            Fact::Gpus,
            Fact::Launcher,
            Fact::Image,
            Fact::Platform,
        ],
        blame: Blame::Node,
        blame_why: "GPUDirect RDMA needs the node's kernel modules (nvidia-peermem, the EFA driver, dma-buf support)",
        judge: gdr::judge,
    },
    Check {
        id: nccl_env::ID,
        title: "the user's own NCCL variables against this node",
        source: Source::Settings,
        needs: &[
            Fact::NcclEnv,
            Fact::Network,
            Fact::Gpus,
            Fact::Rdma,
            Fact::Launcher,
            Fact::Image,
            Fact::Platform,
            Fact::NcclFiles,
        ],
        blame: Blame::Job,
        blame_why: "the NCCL variables are the job's own settings",
        judge: nccl_env::judge,
    },
];

/// The ids of all checks (those judged here, the bench's and serve's).
pub fn check_ids() -> impl Iterator<Item = &'static str> {
    CHECKS.iter().map(|c| c.id).chain(crate::finding::all_ids())
}

/// A check's default blame and why: its row here or in `finding::REGISTRY`; `None` for
/// an id no table declares.
fn default_blame(id: &str) -> Option<(Blame, &'static str)> {
    CHECKS
        .iter()
        .find(|c| c.id == id)
        .map(|c| (c.blame, c.blame_why))
        .or_else(|| crate::finding::info(id).map(|c| (c.blame, c.blame_why)))
}

/// The finding with its check's default blame where it has none of its own (an id no
/// table declares keeps none, which `finding::fault` counts as the job's).
pub fn blame(finding: Finding) -> Finding {
    match default_blame(&finding.id) {
        Some((blame, _)) => finding.blamed_by_default(blame),
        None => finding,
    }
}

/// Runs every check on the facts and the prediction made from them (once, by the run:
/// every check and the report see the same one), stamps each finding with its row's id,
/// and applies the ignore policy.
pub fn judge(facts: &Facts, prediction: &Prediction, policy: &Policy) -> Vec<Finding> {
    CHECKS
        .iter()
        .map(|check| {
            let mut finding = (check.judge)(facts, prediction, policy);
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
fn undetermined(explicit: bool) -> Severity {
    if explicit {
        Severity::Fail
    } else {
        Severity::Warn
    }
}

#[cfg(test)]
use crate::test_facts;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::finding::verdict;
    use crate::policy;

    /// Every check as the run judges them, with the prediction made from the same facts.
    fn judge(facts: &Facts, policy: &Policy) -> Vec<Finding> {
        super::judge(facts, &crate::predict::predict(facts), policy)
    }

    #[test]
    fn ignore_turns_failures_into_flagged_warnings() {
        let mut facts = test_facts::healthy();
        facts.dev_shm.usage = crate::facts::Observed::Value(Some(crate::facts::FsUsage {
            size_bytes: 64 << 20,
            free_bytes: 64 << 20,
        }));
        let strict = judge(&facts, &Policy::default());
        let shm = strict.iter().find(|f| f.id == "dev-shm").unwrap();
        assert_eq!(shm.status(), Status::Fail);
        assert_eq!(verdict(&strict), Status::Fail);
        let lenient = judge(
            &facts,
            &policy::build(&["dev-shm".into()], &[], None, None).unwrap(),
        );
        let shm = lenient.iter().find(|f| f.id == "dev-shm").unwrap();
        assert_eq!((shm.status(), shm.is_ignored()), (Status::Warn, true));
        assert_eq!(verdict(&lenient), Status::Warn);
    }

    #[test]
    fn healthy_node_passes_every_check() {
        let findings = judge(&test_facts::healthy(), &Policy::default());
        assert_eq!(findings.len(), CHECKS.len());
        // The healthy node is a 2x H200 without RDMA: the RDMA checks have nothing to look at,
        // and an HGX node is in no multi-node NVLink cluster.
        let rdma = [
            "rdma-devices",
            "rdma-memreg",
            "nccl-net-plugin",
            "gdr",
            "mnnvl",
        ];
        for f in &findings {
            let want = if rdma.contains(&f.id.as_str()) {
                Status::Skip
            } else {
                Status::Pass
            };
            assert_eq!(f.status(), want, "{f:?}");
        }
        assert_eq!(verdict(&findings), Status::Pass);
    }

    /// Every check has a default blame with its reason, every warning or failure any judge
    /// gives on a broken node carries one once stamped (as `Report` does), and docs/failure-policy.md
    /// lists every check with the same blame.
    #[test]
    fn every_check_has_a_blame_and_the_policy_document_says_which() {
        let doc_path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/failure-policy.md");
        let doc = std::fs::read_to_string(&doc_path).unwrap();
        for id in check_ids() {
            let (blame, why) = default_blame(id).unwrap();
            assert!(why.len() > 20, "{id}: say why");
            let row = format!("| `{id}` | {} |", blame.label());
            assert!(
                doc.contains(&row),
                "{} lacks the row {row:?}",
                doc_path.display()
            );
        }
        assert_eq!(default_blame("no-such-check"), None);
        for facts in test_facts::broken_variants() {
            for f in judge(&facts, &Policy::default()).into_iter().map(blame) {
                assert_eq!(f.blame().is_some(), f.status() >= Status::Warn, "{f:?}");
            }
        }
    }

    /// The text report pads its id column to the longest id it shows, today
    /// `nccl-net-plugin`: a judged check with a longer id would widen that column and
    /// rewrite every line of every text report and golden instead of adding its own.
    #[test]
    fn every_judged_id_fits_the_text_reports_id_column() {
        const COLUMN: usize = "nccl-net-plugin".len();
        for check in CHECKS {
            assert!(
                check.id.len() <= COLUMN,
                "{}: a check id of at most {COLUMN} characters keeps the other report lines as they are",
                check.id
            );
        }
    }

    #[test]
    fn ids_are_unique_and_each_judge_names_its_own() {
        let ids: Vec<&str> = check_ids().collect();
        let mut sorted = ids.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), ids.len(), "{ids:?}");
        for check in CHECKS {
            assert!(
                !matches!(check.source, Source::Measured | Source::Runtime),
                "{}",
                check.id
            );
        }
        // Every judge names its own id (the runner stamps it anyway).
        for facts in test_facts::broken_variants() {
            for check in CHECKS {
                assert_eq!(
                    test_facts::judged(check.judge, &facts, &Policy::default()).id,
                    check.id
                );
            }
        }
    }

    /// A check reads only the sections its row declares: judged on a broken node, and on
    /// a healthy node with only the declared sections taken from the broken one, it says
    /// the same. A judge that starts reading another section fails here until its row
    /// says so.
    #[test]
    fn each_check_reads_only_the_facts_its_row_declares() {
        let mut variants = test_facts::broken_variants();
        variants.push(test_facts::with_efa(test_facts::healthy()));
        let policies = [
            Policy::default(),
            policy::build(&[], &["host-ipc".into(), "efa".into()], None, None).unwrap(),
        ];
        let mut differing = 0;
        for check in CHECKS {
            for broken in &variants {
                let mut mixed = test_facts::healthy();
                for fact in check.needs {
                    fact.copy(broken, &mut mixed);
                }
                for policy in &policies {
                    let want = test_facts::judged(check.judge, broken, policy);
                    assert_eq!(
                        test_facts::judged(check.judge, &mixed, policy),
                        want,
                        "{} reads a section its row does not declare",
                        check.id
                    );
                    if want != test_facts::judged(check.judge, &test_facts::healthy(), policy) {
                        differing += 1;
                    }
                }
            }
        }
        // The variants really do break things, or the comparison above proves nothing.
        assert!(differing > CHECKS.len(), "{differing}");
    }

    /// docs/checks.md's table lists every judged check with the sections it reads and its
    /// title, linked to the check's own section.
    #[test]
    fn docs_checks_md_lists_what_each_check_reads() {
        let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/checks.md"))
            .unwrap();
        for check in CHECKS {
            let reads: Vec<&str> = check.needs.iter().map(|f| f.key()).collect();
            let row = format!(
                "| `{}` | {} | [{}](#{}) |",
                check.id,
                reads.join(", "),
                check.title,
                check.id
            );
            assert!(
                docs.lines().any(|l| l == row),
                "docs/checks.md has no row {row:?}"
            );
            let heading = format!("### `{}`", check.id);
            assert!(docs.lines().any(|l| l == heading), "no {heading:?}");
        }
    }

    #[test]
    fn needs_are_listed_once_each() {
        for check in CHECKS {
            let mut needs = check.needs.to_vec();
            needs.sort();
            needs.dedup();
            assert_eq!(needs.len(), check.needs.len(), "{}", check.id);
            assert!(!needs.is_empty(), "{}", check.id);
        }
    }

    #[test]
    fn every_failure_has_a_remediation() {
        for facts in test_facts::broken_variants() {
            for f in judge(
                &facts,
                &policy::build(&[], &["host-ipc".into()], None, None).unwrap(),
            ) {
                if f.status() >= Status::Warn {
                    assert!(f.remediation().is_some(), "{f:?}");
                }
            }
        }
    }
}
