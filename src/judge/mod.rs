//! judge: `(&Facts, &Policy) -> Vec<Finding>`, pure.
//!
//! Every check is one row of `CHECKS`: a stable id (users pass it to `--ignore`;
//! ids never change once released), a title, and a judging function. The runner,
//! not the checks, applies `--ignore`.

mod dev_shm;
mod gdr;
mod gpu_devices;
mod gpu_health;
mod gpu_p2p;
mod host_ipc;
mod libfabric;
mod memlock;
mod nccl_env;
mod nccl_net_plugin;
mod nvlink;
mod pod_placement;
mod rdma_devices;
mod rdma_memreg;
pub(crate) mod rdma_scope;
mod stack_limit;

use crate::facts::Facts;
use crate::policy::Policy;
use serde::{Deserialize, Serialize};

/// Outcome of one check, ordered from best to worst.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Skip,
    Pass,
    Warn,
    Fail,
}

impl Status {
    pub fn label(self) -> &'static str {
        match self {
            Status::Skip => "SKIP",
            Status::Pass => "PASS",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
        }
    }
}

/// One check's verdict, with what it saw and how to fix it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    pub id: String,
    pub status: Status,
    /// One line.
    pub summary: String,
    /// What was observed, one item per line.
    pub evidence: Vec<String>,
    /// What to paste to fix it; every failing finding has one.
    pub remediation: Option<String>,
    /// True when `--ignore` turned a failure into this warning.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ignored: bool,
}

impl Finding {
    pub fn new(id: &str, status: Status, summary: impl Into<String>) -> Self {
        Finding {
            id: id.to_string(),
            status,
            summary: summary.into(),
            evidence: Vec::new(),
            remediation: None,
            ignored: false,
        }
    }

    pub fn evidence(mut self, line: impl Into<String>) -> Self {
        self.evidence.push(line.into());
        self
    }

    pub fn remediation(mut self, text: impl Into<String>) -> Self {
        self.remediation = Some(text.into());
        self
    }
}

/// One row of the check table.
pub struct Check {
    pub id: &'static str,
    /// What the check looks at, for `--help` and the README.
    pub title: &'static str,
    pub judge: fn(&Facts, &Policy) -> Finding,
}

/// Every check, in report order.
pub const CHECKS: &[Check] = &[
    Check {
        id: "memlock",
        title: "locked-memory limit in force (RLIMIT_MEMLOCK, CAP_IPC_LOCK, a real mlock)",
        judge: memlock::judge,
    },
    Check {
        id: "dev-shm",
        title: "/dev/shm size, free space and filesystem",
        judge: dev_shm::judge,
    },
    Check {
        id: "host-ipc",
        title: "IPC namespace (host or private)",
        judge: host_ipc::judge,
    },
    Check {
        id: "stack-limit",
        title: "stack limit (unlimited or small stacks shrink NCCL's threads)",
        judge: stack_limit::judge,
    },
    Check {
        id: "gpu-devices",
        title: "NVML and the CUDA driver load and see the GPUs (fabric manager, lost GPUs, CUDA_VISIBLE_DEVICES)",
        judge: gpu_devices::judge,
    },
    Check {
        id: "gpu-p2p",
        title: "peer access (read, write, CUDA) between GPUs that share NVLink or a PCIe switch",
        judge: gpu_p2p::judge,
    },
    Check {
        id: "nvlink",
        title: "every NVLink a GPU has is up",
        judge: nvlink::judge,
    },
    Check {
        id: "gpu-health",
        title: "no uncorrectable ECC errors, failed or pending row remaps or page retirements",
        judge: gpu_health::judge,
    },
    Check {
        id: "pod-placement",
        title: "the pod holds all the node's GPUs and runs one process per GPU",
        judge: pod_placement::judge,
    },
    Check {
        id: "rdma-devices",
        title: "RDMA/EFA devices present, ports active, device nodes openable, libibverbs sees them",
        judge: rdma_devices::judge,
    },
    Check {
        id: "rdma-memreg",
        title: "a real ibv_reg_mr of --memreg-size on every RDMA device",
        judge: rdma_memreg::judge,
    },
    Check {
        id: "libfabric",
        title: "libfabric loads and offers efa RDM endpoints where EFA exists",
        judge: libfabric::judge,
    },
    Check {
        id: "nccl-net-plugin",
        title: "the NCCL net plugin NCCL will load (aws-ofi-nccl on EFA)",
        judge: nccl_net_plugin::judge,
    },
    Check {
        id: "gdr",
        title: "GPUDirect RDMA for GPU-NIC pairs under one PCIe switch (nvidia-peermem or dma-buf)",
        judge: gdr::judge,
    },
    Check {
        id: "nccl-env",
        title: "the user's own NCCL variables against this node",
        judge: nccl_env::judge,
    },
];

/// The ids of all checks.
pub fn check_ids() -> impl Iterator<Item = &'static str> {
    CHECKS
        .iter()
        .map(|c| c.id)
        .chain(crate::bench::CHECK_IDS.iter().copied())
        .chain([crate::serve::xid::ID])
}

/// Runs every check and applies the ignore policy.
pub fn judge(facts: &Facts, policy: &Policy) -> Vec<Finding> {
    CHECKS
        .iter()
        .map(|check| policy.settle((check.judge)(facts, policy)))
        .collect()
}

/// The worst status among the findings, as the verdict: `pass`, `warn` or `fail`.
pub fn verdict(findings: &[Finding]) -> Status {
    findings
        .iter()
        .map(|f| f.status)
        .max()
        .unwrap_or(Status::Pass)
        .max(Status::Pass)
}

/// One problem a check found: how bad, what, and the fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub status: Status,
    pub summary: String,
    pub evidence: Vec<String>,
    pub remediation: String,
}

impl Problem {
    pub fn new(status: Status, summary: impl Into<String>, remediation: impl Into<String>) -> Self {
        Problem {
            status,
            summary: summary.into(),
            evidence: Vec::new(),
            remediation: remediation.into(),
        }
    }
}

/// One finding from a check's problems: a pass with `pass_summary` when there are
/// none, else the worst status, its summary (with a count when there are several),
/// every problem's evidence, and each distinct fix once.
fn combine(
    id: &str,
    pass_summary: String,
    evidence: Vec<String>,
    mut problems: Vec<Problem>,
) -> Finding {
    let mut f = Finding::new(id, Status::Pass, pass_summary);
    f.evidence = evidence;
    if problems.is_empty() {
        return f;
    }
    problems.sort_by_key(|p| std::cmp::Reverse(p.status));
    f.status = problems[0].status;
    f.summary = if problems.len() == 1 {
        problems[0].summary.clone()
    } else {
        format!(
            "{} problems; worst: {}",
            problems.len(),
            problems[0].summary
        )
    };
    for p in &problems {
        if problems.len() > 1 {
            f.evidence.push(p.summary.clone());
        }
        f.evidence.extend(p.evidence.iter().cloned());
    }
    let mut fixes: Vec<&str> = Vec::new();
    for p in &problems {
        if !fixes.contains(&p.remediation.as_str()) {
            fixes.push(&p.remediation);
        }
    }
    f.remediation = Some(fixes.join("\n"));
    f
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
pub(crate) mod test_facts;

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
        // The healthy node is a 2x H200 without RDMA: the RDMA checks have nothing to look at.
        let rdma = ["rdma-devices", "rdma-memreg", "nccl-net-plugin", "gdr"];
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
