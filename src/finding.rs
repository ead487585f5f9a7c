//! The finding types every stage shares, and the one registry of check ids.
//!
//! A leaf module: it depends on nothing else in the crate, so judge, bench,
//! serve, explain-log, policy and render all speak the same types without
//! depending on each other. Check ids are stable (users pass them to
//! `--ignore`; ids never change once released), and every id any part of the
//! tool reports is declared here once, with where its answer comes from.

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
pub fn combine(
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

/// Where a check's answer comes from, which decides where it can be judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The node and the pod: limits, mounts, namespaces, devices, GPUs through the NVIDIA
    /// runtime's injected libraries. The same in every container of the pod.
    Node,
    /// The image's own libraries (libibverbs, libfabric, libnccl, the net plugin): only the
    /// trainer's image shows the ones training will load.
    Image,
    /// The user's settings, judged against the node.
    Settings,
    /// A measurement (`bench`, `init --bench`).
    Measured,
    /// Events seen while running (`serve`).
    Runtime,
}

/// One check id with what it looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckInfo {
    pub id: &'static str,
    /// What the check looks at, for `--help` and the README.
    pub title: &'static str,
    pub source: Source,
}

/// Every check id, as constants, so no stage spells one twice.
pub mod ids {
    pub const MEMLOCK: &str = "memlock";
    pub const DEV_SHM: &str = "dev-shm";
    pub const HOST_IPC: &str = "host-ipc";
    pub const STACK_LIMIT: &str = "stack-limit";
    pub const GPU_DEVICES: &str = "gpu-devices";
    pub const GPU_P2P: &str = "gpu-p2p";
    pub const NVLINK: &str = "nvlink";
    pub const GPU_HEALTH: &str = "gpu-health";
    pub const CUDA_RUNTIME: &str = "cuda-runtime";
    pub const MNNVL: &str = "mnnvl";
    pub const POD_PLACEMENT: &str = "pod-placement";
    pub const RDMA_DEVICES: &str = "rdma-devices";
    pub const RDMA_MEMREG: &str = "rdma-memreg";
    pub const LIBFABRIC: &str = "libfabric";
    pub const NCCL_NET_PLUGIN: &str = "nccl-net-plugin";
    pub const GDR: &str = "gdr";
    pub const NCCL_ENV: &str = "nccl-env";
    pub const GPU_BANDWIDTH: &str = "gpu-bandwidth";
    pub const NCCL_ALLREDUCE: &str = "nccl-allreduce";
    pub const GPU_XID: &str = "gpu-xid";
    pub const GANG_JOIN: &str = "gang-join";
    pub const GANG_CONSISTENCY: &str = "gang-consistency";
    pub const GANG_BANDWIDTH: &str = "gang-bandwidth";
}

/// Every check, in report order.
pub const REGISTRY: &[CheckInfo] = &[
    CheckInfo {
        id: ids::MEMLOCK,
        title: "locked-memory limit in force (RLIMIT_MEMLOCK, CAP_IPC_LOCK, a real mlock)",
        source: Source::Node,
    },
    CheckInfo {
        id: ids::DEV_SHM,
        title: "/dev/shm size, free space and filesystem",
        source: Source::Node,
    },
    CheckInfo {
        id: ids::HOST_IPC,
        title: "IPC namespace (host or private)",
        source: Source::Node,
    },
    CheckInfo {
        id: ids::STACK_LIMIT,
        title: "stack limit (unlimited or small stacks shrink NCCL's threads)",
        source: Source::Node,
    },
    CheckInfo {
        id: ids::GPU_DEVICES,
        title: "NVML and the CUDA driver load and see the GPUs (fabric manager, lost GPUs, CUDA_VISIBLE_DEVICES)",
        source: Source::Node,
    },
    CheckInfo {
        id: ids::GPU_P2P,
        title: "peer access (read, write, CUDA) between GPUs that share NVLink or a PCIe switch",
        source: Source::Node,
    },
    CheckInfo {
        id: ids::NVLINK,
        title: "every NVLink a GPU has is up",
        source: Source::Node,
    },
    CheckInfo {
        id: ids::GPU_HEALTH,
        title: "no uncorrectable ECC errors, failed or pending row remaps or page retirements",
        source: Source::Node,
    },
    CheckInfo {
        id: ids::MNNVL,
        title: "multi-node NVLink (GB200 NVL72): fabric state, cluster and clique per GPU, an IMEX channel in the container",
        source: Source::Node,
    },
    CheckInfo {
        id: ids::CUDA_RUNTIME,
        title: "the image's CUDA runtime (libcudart) against the driver's CUDA version (minor-version and forward compatibility)",
        source: Source::Image,
    },
    CheckInfo {
        id: ids::POD_PLACEMENT,
        title: "the pod holds all the node's GPUs and runs one process per GPU",
        source: Source::Node,
    },
    CheckInfo {
        id: ids::RDMA_DEVICES,
        title: "RDMA/EFA devices present, ports up, device nodes openable, enough for the pod's GPUs, libibverbs sees them",
        source: Source::Node,
    },
    CheckInfo {
        id: ids::RDMA_MEMREG,
        title: "a real ibv_reg_mr of --memreg-size on every RDMA device",
        source: Source::Image,
    },
    CheckInfo {
        id: ids::LIBFABRIC,
        title: "libfabric loads and offers efa RDM endpoints where EFA exists",
        source: Source::Image,
    },
    CheckInfo {
        id: ids::NCCL_NET_PLUGIN,
        title: "the NCCL net plugin NCCL will load (aws-ofi-nccl on EFA)",
        source: Source::Image,
    },
    CheckInfo {
        id: ids::GDR,
        title: "GPUDirect RDMA for GPU-NIC pairs under one PCIe switch (nvidia-peermem, EFA's driver or dma-buf)",
        source: Source::Node,
    },
    CheckInfo {
        id: ids::NCCL_ENV,
        title: "the user's own NCCL variables against this node",
        source: Source::Settings,
    },
    CheckInfo {
        id: ids::GPU_BANDWIDTH,
        title: "measured GPU peer-copy bandwidth against the links' figure (bench)",
        source: Source::Measured,
    },
    CheckInfo {
        id: ids::NCCL_ALLREDUCE,
        title: "measured NCCL all-reduce bandwidth and transport (bench)",
        source: Source::Measured,
    },
    CheckInfo {
        id: ids::GPU_XID,
        title: "GPU XID events seen while serving",
        source: Source::Runtime,
    },
    CheckInfo {
        id: ids::GANG_JOIN,
        title: "every pod of the job joined one NCCL communicator in time (gang)",
        source: Source::Measured,
    },
    CheckInfo {
        id: ids::GANG_CONSISTENCY,
        title: "the pods agree: NCCL version, driver, GPUs, NICs, plugin, NCCL/FI variables, local verdicts (gang)",
        source: Source::Measured,
    },
    CheckInfo {
        id: ids::GANG_BANDWIDTH,
        title: "all-reduce busbw across the job, the transport NCCL chose, the node x node matrix and its straggler (gang)",
        source: Source::Measured,
    },
];

/// Every check id, in report order.
pub fn all_ids() -> impl Iterator<Item = &'static str> {
    REGISTRY.iter().map(|c| c.id)
}

/// The registry entry of an id.
pub fn info(id: &str) -> Option<&'static CheckInfo> {
    REGISTRY.iter().find(|c| c.id == id)
}
