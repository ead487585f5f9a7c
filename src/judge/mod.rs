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
pub use crate::finding::Finding;
pub(crate) use crate::finding::Problem;
#[cfg(test)]
use crate::finding::Status;
pub(crate) use crate::finding::combine;
use crate::finding::{Outcome, Owner, Source};
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
    /// Who changes what a failure needs changed unless the finding says otherwise
    /// ([`Finding::blamed`]), whose blame ([`Owner::blame`]) is the check's default, and
    /// why: where its fix is applied. docs/failure-policy.md lists every row's.
    pub owner: Owner,
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
        owner: Owner::HardLimit,
        blame_why: "no pod field sets ulimits: the container inherits RLIMIT_MEMLOCK from the container runtime on the node (containerd: systemd's 8 MiB; CRI-O's default_ulimits), so the fix is the node's; a soft limit below a sufficient hard limit is the job's (set per finding)",
        judge: memlock::judge,
    },
    Check {
        id: dev_shm::ID,
        title: "/dev/shm size, free space and filesystem",
        source: Source::Node,
        needs: &[Fact::DevShm],
        owner: Owner::PodSpec,
        blame_why: "/dev/shm's size comes from the pod spec (an emptyDir of medium Memory with its sizeLimit): the fix is the job's",
        judge: dev_shm::judge,
    },
    Check {
        id: host_ipc::ID,
        title: "IPC namespace (host or private)",
        source: Source::Node,
        needs: &[Fact::Namespaces],
        owner: Owner::PodSpec,
        blame_why: "the IPC namespace is the pod spec's hostIPC field: the fix is the job's",
        judge: host_ipc::judge,
    },
    Check {
        id: stack_limit::ID,
        title: "stack limit (unlimited or small stacks shrink NCCL's threads)",
        source: Source::Node,
        needs: &[Fact::StackLimit, Fact::Rdma, Fact::NcclEnv],
        owner: Owner::SoftLimit,
        blame_why: "the container lowers its own soft RLIMIT_STACK (ulimit -s 8192 in its command), and may raise it up to the hard limit: the job's; a hard limit below 8 MiB, the container runtime's on the node, is the node's (set per finding)",
        judge: stack_limit::judge,
    },
    Check {
        id: gpu_devices::ID,
        title: "NVML and the CUDA driver load and see the GPUs (fabric manager, lost GPUs, CUDA_VISIBLE_DEVICES)",
        source: Source::Node,
        needs: &[Fact::Gpus, Fact::Launcher],
        owner: Owner::Driver,
        blame_why: "the driver, the fabric manager and a lost GPU are the node's; a GPU count the pod did not request (--require gpus=N) or CUDA_VISIBLE_DEVICES are the job's (set per finding)",
        judge: gpu_devices::judge,
    },
    Check {
        id: gpu_p2p::ID,
        title: "peer access (read, write, CUDA) between GPUs that share NVLink or a PCIe switch",
        source: Source::Node,
        needs: &[Fact::Gpus],
        owner: Owner::Driver,
        blame_why: "peer access disabled by ACS, the IOMMU or the driver is the node's; a pod given one GPU, which has no peer, is the job's (set per finding)",
        judge: gpu_p2p::judge,
    },
    Check {
        id: nvlink::ID,
        title: "every NVLink a GPU has is up",
        source: Source::Node,
        needs: &[Fact::Gpus],
        owner: Owner::Hardware,
        blame_why: "an NVLink down is the node's hardware or fabric manager",
        judge: nvlink::judge,
    },
    Check {
        id: gpu_health::ID,
        title: "no uncorrectable ECC errors, failed or pending row remaps or page retirements",
        source: Source::Node,
        needs: &[Fact::Gpus],
        owner: Owner::Hardware,
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
        owner: Owner::FabricManager,
        blame_why: "the NVLink fabric state, cluster and clique are the node's fabric manager and IMEX; a pod without an IMEX channel is the job's (set per finding)",
        judge: mnnvl::judge,
    },
    Check {
        id: cuda_runtime::ID,
        title: "the image's CUDA runtime (libcudart) against the driver's CUDA version (minor-version and forward compatibility)",
        source: Source::Image,
        needs: &[Fact::Gpus, Fact::Image],
        owner: Owner::Image,
        blame_why: "the CUDA runtime is the image's: an image built for a newer CUDA than the node pool's driver fails on every node of the pool",
        judge: cuda_runtime::judge,
    },
    Check {
        id: pod_placement::ID,
        title: "the pod holds all the node's GPUs and runs one process per GPU",
        source: Source::Node,
        needs: &[Fact::Gpus, Fact::Launcher, Fact::Rdma, Fact::NcclEnv],
        owner: Owner::PodSpec,
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
        owner: Owner::Hardware,
        blame_why: "a device missing, a port down or slow, a NIC's PCIe link trained low is the node's NICs and drivers; a pod that requested no RDMA resource, a device node it cannot open (no device plugin grant) or libibverbs missing from the image is the job's (set per finding)",
        judge: rdma_devices::judge,
    },
    Check {
        id: rdma_memreg::ID,
        title: "a real ibv_reg_mr of --memreg-size on every RDMA device",
        source: Source::Image,
        needs: &[Fact::Rdma, Fact::Launcher, Fact::Image, Fact::Memlock],
        owner: Owner::HardLimit,
        blame_why: "a registration refused by the kernel is the node's: its runtime's memlock limit, the NIC driver, nvidia-peermem; refused under a soft memlock limit the container may raise itself, the job's (set per finding)",
        judge: rdma_memreg::judge,
    },
    Check {
        id: libfabric::ID,
        title: "libfabric loads and offers efa RDM endpoints where EFA exists",
        source: Source::Image,
        needs: &[Fact::Rdma, Fact::Launcher, Fact::Image],
        owner: Owner::Image,
        blame_why: "libfabric and its efa provider are the image's libraries",
        judge: libfabric::judge,
    },
    Check {
        id: nccl_library::ID,
        title: "the libnccl the trainer's process loads (torch's RUNPATH, LD_LIBRARY_PATH, ld.so.cache, the wheels) and every other copy in the image",
        source: Source::Image,
        needs: &[Fact::Rdma, Fact::Image],
        owner: Owner::Image,
        blame_why: "the libnccl the trainer loads, and every other copy, are the image's",
        judge: nccl_library::judge,
    },
    Check {
        id: nccl_net_plugin::ID,
        title: "the NCCL net plugin NCCL will load (aws-ofi-nccl on EFA)",
        source: Source::Image,
        needs: &[Fact::Rdma, Fact::Launcher, Fact::Image],
        owner: Owner::Image,
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
        owner: Owner::Driver,
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
        owner: Owner::Environment,
        blame_why: "the NCCL variables are the job's own settings",
        judge: nccl_env::judge,
    },
];

/// The ids of all checks (those judged here, the bench's and serve's).
pub fn check_ids() -> impl Iterator<Item = &'static str> {
    CHECKS.iter().map(|c| c.id).chain(crate::finding::all_ids())
}

/// Who changes what a check's failures ask by default, and why: its row here or in
/// `finding::REGISTRY`; `None` for an id no table declares.
fn default_owner(id: &str) -> Option<(Owner, &'static str)> {
    CHECKS
        .iter()
        .find(|c| c.id == id)
        .map(|c| (c.owner, c.blame_why))
        .or_else(|| crate::finding::info(id).map(|c| (c.owner, c.blame_why)))
}

/// The finding with its check's default blame (its owner's) where it has none of its
/// own (an id no table declares keeps none, which `finding::fault` counts as the job's).
pub fn blame(finding: Finding) -> Finding {
    match default_owner(&finding.id) {
        Some((owner, _)) => finding.blamed_by_default(owner.blame()),
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

/// "Could not determine" `unknown`: a warning, or a job that cannot start when the user
/// explicitly asked for what this check enforces (`--require`, `--min-*`).
fn undetermined(explicit: bool, unknown: impl Into<String>) -> Outcome {
    let unknown = unknown.into();
    if explicit {
        Outcome::cannot_start(format!(
            "a requirement given to the gate cannot be verified: {unknown}"
        ))
    } else {
        Outcome::undetermined(unknown)
    }
}

/// What a problem that only matters between nodes does to this job: `across` where the
/// launcher says the job spans nodes, nothing where it stays on one, and could not
/// determine where the launcher does not say.
fn across_nodes(facts: &Facts, across: Outcome) -> Outcome {
    match crate::layout::span(facts) {
        crate::layout::Span::Multi(_) => across,
        crate::layout::Span::Single => Outcome::Unaffected,
        crate::layout::Span::Unknown => Outcome::undetermined(format!(
            "whether the job spans nodes (the launcher does not say); across nodes: {}",
            across.describe()
        )),
    }
}

/// A requirement given to the gate (`flag`) that this node does not meet: the gate
/// does not start the job, whatever NCCL would have done.
fn unmet(flag: &str) -> Outcome {
    Outcome::cannot_start(format!(
        "{flag} is not met, and the gate does not start the job"
    ))
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
        // No /dev/shm at all: shm_open fails, the job cannot start.
        let mut facts = test_facts::healthy();
        facts.dev_shm.usage = crate::facts::Observed::Value(None);
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
            let (owner, why) = default_owner(id).unwrap();
            assert!(why.len() > 20, "{id}: say why");
            let row = format!("| `{id}` | {} | {} |", owner.blame().label(), owner.label());
            assert!(
                doc.contains(&row),
                "{} lacks the row {row:?}",
                doc_path.display()
            );
        }
        assert_eq!(default_owner("no-such-check"), None);
        for facts in test_facts::broken_variants() {
            for f in judge(&facts, &Policy::default()).into_iter().map(blame) {
                assert_eq!(f.blame().is_some(), f.status() >= Status::Warn, "{f:?}");
            }
        }
    }

    /// Issue 36: every warning and failure a judge gives states the outcome NCCL will
    /// have, its status is that outcome's by the one mapping (ignored failures aside),
    /// and its blame is its owner's, on every broken variant under every policy.
    #[test]
    fn every_judged_finding_follows_its_outcome_and_its_owner() {
        let mut variants = test_facts::broken_variants();
        variants.push(test_facts::with_efa(test_facts::healthy()));
        variants.push(test_facts::with_env(
            test_facts::with_efa(test_facts::healthy()),
            &[("PET_NNODES", "4")],
        ));
        variants.push(test_facts::with_env(
            test_facts::healthy(),
            &[("NCCL_ALGO", "Ring")],
        ));
        let policies = [
            Policy::default(),
            policy::build(
                &[],
                &["host-ipc".into(), "efa".into(), "nvlink".into()],
                Some("2GiB"),
                Some("unlimited"),
            )
            .unwrap(),
        ];
        let mut kinds = std::collections::BTreeSet::new();
        for facts in &variants {
            for policy in &policies {
                for f in judge(facts, policy).into_iter().map(blame) {
                    if f.status() < Status::Warn {
                        assert!(f.outcome().is_none(), "{f:?}");
                        continue;
                    }
                    let outcome = f.outcome().unwrap_or_else(|| panic!("no outcome: {f:?}"));
                    let want = outcome.severity().map(crate::finding::Severity::status);
                    let ignored = f.is_ignored() && want == Some(Status::Fail);
                    assert!(want == Some(f.status()) || ignored, "{f:?}");
                    assert!(f.blame().is_some(), "{f:?}");
                    kinds.insert(outcome.kind());
                }
            }
        }
        // The variants reach every kind a judge can predict, or this proves little.
        for kind in ["init-fails", "cannot-start", "degraded", "undetermined"] {
            assert!(
                kinds.contains(kind),
                "no variant predicts {kind}: {kinds:?}"
            );
        }
    }

    /// Issue 36: the severity and blame of judged findings come from the outcome and the
    /// owner, never from a status or a blame a judge picks: no judge builds a finding or
    /// a problem from a severity, or names a blame.
    #[test]
    fn judges_state_outcomes_and_owners_not_severities_and_blames() {
        let mut files = Vec::new();
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/judge");
        let mut stack = vec![dir];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap().map(Result::unwrap) {
                let path = e.path();
                if path.is_dir() {
                    stack.push(path);
                } else if path.extension().is_some_and(|x| x == "rs") {
                    files.push(path);
                }
            }
        }
        assert!(files.len() > 15, "{files:?}");
        for path in files {
            let text = std::fs::read_to_string(&path).unwrap();
            let code = text.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
            for banned in [
                "Finding::warn(",
                "Finding::fail(",
                "Finding::flagged(",
                "Problem::new(",
                "Severity::",
                "Blame::",
            ] {
                assert!(
                    !code.contains(banned),
                    "{}: {banned} (state an Outcome and an Owner)",
                    path.display()
                );
            }
        }
    }

    /// docs/failure-policy.md states both mappings; its tables say what the code does.
    #[test]
    fn the_policy_document_states_both_mappings() {
        let doc = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/docs/failure-policy.md"
        ))
        .unwrap();
        let outcomes = [
            Outcome::init_fails("e"),
            Outcome::hangs("a"),
            Outcome::cannot_start("w"),
            Outcome::degraded("p", "c"),
            Outcome::undetermined("u"),
            Outcome::Unaffected,
        ];
        for o in outcomes {
            let status = o.severity().map_or("pass", |s| match s {
                crate::finding::Severity::Fail => "fail",
                crate::finding::Severity::Warn => "warn",
            });
            let row = doc
                .lines()
                .find(|l| l.starts_with(&format!("| `{}` |", o.kind())))
                .unwrap_or_else(|| panic!("no row for {}", o.kind()));
            assert!(
                row.trim_end()
                    .trim_end_matches('|')
                    .trim_end()
                    .rsplit('|')
                    .next()
                    .is_some_and(|c| c.trim().starts_with(status)),
                "{row}: want {status}"
            );
        }
        for owner in Owner::ALL {
            let row = doc
                .lines()
                .find(|l| l.starts_with(&format!("| `{}` |", owner.label())))
                .unwrap_or_else(|| panic!("no row for {}", owner.label()));
            assert!(
                row.trim_end()
                    .ends_with(&format!("| {} |", owner.blame().label())),
                "{row}"
            );
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
