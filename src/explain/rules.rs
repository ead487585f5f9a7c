//! Diagnoses: `&LogSummary -> Vec<Finding>`, pure. Each rule states what it saw
//! (lines of the log as evidence) and the fix. Known failure signatures come
//! from FACTS.md section 2; measured costs from section 1.

use super::summary::LogSummary;
use crate::finding::{Finding, Status};
use crate::remediation;

/// A known NCCL WARN text, what it means and how to fix it.
struct Signature {
    /// Any of these substrings identifies it.
    needles: &'static [&'static str],
    id: &'static str,
    cause: &'static str,
    fix: &'static str,
}

const SIGNATURES: &[Signature] = &[
    Signature {
        needles: &[
            "failed to extend /dev/shm",
            "posix_fallocate failed",
            "Error while creating shared memory segment",
        ],
        id: "log-dev-shm-full",
        cause: "/dev/shm is too small for NCCL's shared-memory buffers",
        fix: remediation::DEV_SHM,
    },
    Signature {
        needles: &["ibv_reg_mr", "fi_mr_reg"],
        id: "log-memory-registration",
        cause: "RDMA memory registration failed, usually a memlock limit below what NCCL pins",
        fix: remediation::MEMLOCK,
    },
    Signature {
        needles: &["ibv_modify_qp failed"],
        id: "log-roce-gid",
        cause: "the queue pair could not be moved to RTR, typically a wrong RoCE GID index",
        fix: "On NCCL >= 2.21 unset NCCL_IB_GID_INDEX (NCCL picks the RoCE v2 GID itself); on older NCCL set it to the \
              port's RoCE v2 GID index (see /sys/class/infiniband/<dev>/ports/<n>/gid_attrs/types/*).",
    },
    Signature {
        needles: &[
            "no socket interface found",
            "No usable listening interface found",
        ],
        id: "log-socket-ifname",
        cause: "NCCL_SOCKET_IFNAME matched no usable interface, so every rank failed at init",
        fix: "Run `nccl-preflight check` in the pod: it lints NCCL_SOCKET_IFNAME against the pod's interfaces \
              and proposes NCCL_SOCKET_IFNAME='=<interface with the default route>'.",
    },
    Signature {
        needles: &["GDR disabled on GDR-supported instance type"],
        id: "log-gdr-required",
        cause: "aws-ofi-nccl found no GPUDirect RDMA on an instance type that requires it",
        fix: "Load GPUDirect RDMA support on the node: the nvidia-peermem module, or dma-buf (open GPU kernel \
              modules, kernel >= 5.12, libfabric with FI_HMEM); use the EFA-enabled AMI or the GPU operator's RDMA settings.",
    },
    Signature {
        needles: &[
            "Connection refused",
            "No route to host",
            "Connection timed out",
            "connect to",
        ],
        id: "log-socket-connect",
        cause: "a rank could not reach another over TCP (bootstrap or socket transport)",
        fix: "Make NCCL_SOCKET_IFNAME name an interface that routes between nodes on every rank, and allow all TCP \
              between the job's pods (NetworkPolicy, security groups, firewalls).",
    },
    Signature {
        needles: &[
            "cuMemImportFromShareableHandle",
            "cudaIpcOpenMemHandle",
            "pidfd_getfd",
            "peer access is not supported",
        ],
        id: "log-p2p-import",
        cause: "a process could not map another process's GPU memory",
        fix: "Run the ranks of a node in one pod (one container with all its GPUs): cuMem handles travel over \
              abstract UNIX sockets, which do not cross network namespaces.",
    },
    Signature {
        needles: &["out of memory", "Cuda failure 2"],
        id: "log-gpu-oom",
        cause: "the GPU ran out of memory for NCCL's buffers",
        fix: "Leave NCCL room (PYTORCH_CUDA_ALLOC_CONF, smaller batch) or lower NCCL_BUFFSIZE / channel counts.",
    },
    Signature {
        needles: &["Could not open XML topology file", "NCCL_TOPO_FILE"],
        id: "log-topo-file",
        cause: "NCCL_TOPO_FILE names a file NCCL could not read",
        fix: "Point NCCL_TOPO_FILE at the XML for this exact platform, or unset it.",
    },
];

fn examples(summary: &LogSummary, transport_prefix: &str) -> Vec<String> {
    summary
        .transport_examples
        .iter()
        .filter(|(t, _)| t.starts_with(transport_prefix))
        .flat_map(|(_, e)| e.0.iter().cloned())
        .take(3)
        .collect()
}

fn setting_evidence(summary: &LogSummary, name: &str) -> Vec<String> {
    summary
        .setting_examples
        .get(name)
        .map(|e| e.0.clone())
        .unwrap_or_default()
}

fn is_set_to(summary: &LogSummary, name: &str, value: &str) -> bool {
    summary.setting(name).is_some_and(|v| v.contains(value))
}

fn shm_despite_nvlink(s: &LogSummary) -> Option<Finding> {
    if s.connections("SHM") == 0 || !s.nvlink() {
        return None;
    }
    let mut f = Finding::new(
        "log-shm-instead-of-nvlink",
        Status::Warn,
        format!(
            "{} connections went through SHM (host memory) although the topology shows NVLink: measured 27 GB/s instead of ~295 GB/s on 2x H200",
            s.connections("SHM")
        ),
    );
    f.evidence = examples(s, "SHM");
    f.evidence.extend(
        s.path_types
            .iter()
            .map(|t| format!("intra-node path type {t}")),
    );
    let fix = if is_set_to(s, "NCCL_P2P_DISABLE", "1") {
        f.evidence.extend(setting_evidence(s, "NCCL_P2P_DISABLE"));
        "Unset NCCL_P2P_DISABLE: it turns NVLink peer transfers off.".to_string()
    } else if let Some(level) = s.setting("NCCL_P2P_LEVEL") {
        f.evidence.extend(setting_evidence(s, "NCCL_P2P_LEVEL"));
        format!(
            "Unset NCCL_P2P_LEVEL (set to {}) or set it to NVL or higher.",
            level.iter().cloned().collect::<Vec<_>>().join(",")
        )
    } else {
        "P2P between these GPUs was refused: run each node's ranks in one container that sees all its GPUs, \
         and check peer access with `nvidia-smi topo -p2p rw`."
            .to_string()
    };
    Some(f.remediation(fix))
}

fn split_pods(s: &LogSummary) -> Option<Finding> {
    if s.connections("NET") == 0 {
        return None;
    }
    for (id, comm) in &s.communicators {
        if comm.nodes.unwrap_or(0) < 2 || comm.ranks.len() < 2 {
            continue;
        }
        let mut per_host = std::collections::BTreeMap::new();
        for r in comm.ranks.values() {
            *per_host
                .entry(r.host.as_deref().unwrap_or("?"))
                .or_insert(0u32) += 1;
        }
        let buses: Vec<_> = comm
            .ranks
            .values()
            .filter_map(|r| r.bus_id.as_deref())
            .collect();
        let distinct: std::collections::BTreeSet<_> = buses.iter().collect();
        // Separate machines of one type put their GPUs at the same bus ids; one
        // machine split into one-GPU pods shows a different bus id per "node".
        if per_host.values().all(|&n| n == 1)
            && buses.len() == comm.ranks.len()
            && distinct.len() == buses.len()
        {
            let mut f = Finding::new(
                "log-split-pods",
                Status::Warn,
                format!(
                    "communicator {id}: every rank is its own NCCL node with one GPU, each at a different PCI bus id: this looks like one machine's GPUs split across pods, talking over the network (measured 3.3 GB/s instead of ~295 GB/s over NVLink)"
                ),
            )
            .remediation(
                "Run one pod per node with all its GPUs and one process per GPU (torchrun --nproc_per_node=<GPUs>, \
                 PyTorchJob nprocPerNode); NCCL treats different hostnames as different nodes.",
            );
            f.evidence = comm
                .ranks
                .iter()
                .map(|(rank, r)| {
                    format!(
                        "rank {rank}: host {} bus {}",
                        r.host.as_deref().unwrap_or("?"),
                        r.bus_id.as_deref().unwrap_or("?")
                    )
                })
                .take(8)
                .collect();
            f.evidence.extend(examples(s, "NET"));
            return Some(f);
        }
    }
    None
}

fn sockets_despite_rdma(s: &LogSummary) -> Option<Finding> {
    let socket_conns: u64 = s
        .transport_counts
        .iter()
        .filter(|(t, _)| t.starts_with("NET/Socket"))
        .map(|(_, n)| n)
        .sum();
    if socket_conns == 0 {
        return None;
    }
    let failed_plugins: Vec<&String> = s
        .plugins
        .failed
        .iter()
        .filter(|p| p.as_str() != "IB" || !s.ib_devices.is_empty())
        .collect();
    if s.ib_devices.is_empty() && failed_plugins.is_empty() && s.ofi_lines.is_empty() {
        return None;
    }
    let mut f = Finding::new(
        "log-socket-despite-rdma",
        Status::Warn,
        format!(
            "{socket_conns} connections used NET/Socket (TCP) although RDMA was available or a net plugin failed to start"
        ),
    );
    f.evidence.extend(
        s.ib_devices
            .iter()
            .map(|d| format!("NET/IB listed devices: {d}")),
    );
    f.evidence.extend(
        failed_plugins
            .iter()
            .map(|p| format!("Failed to initialize NET plugin {p}")),
    );
    f.evidence.extend(s.ofi_lines.iter().take(3).cloned());
    f.evidence.extend(examples(s, "NET/Socket"));
    let mut fixes = Vec::new();
    for name in ["NCCL_IB_DISABLE", "NCCL_NET"] {
        if let Some(v) = s.setting(name) {
            f.evidence.extend(setting_evidence(s, name));
            fixes.push(format!(
                "unset {name} (set to {})",
                v.iter().cloned().collect::<Vec<_>>().join(",")
            ));
        }
    }
    fixes.push("run `nccl-preflight check` in the pod to see whether the RDMA devices open and memory registers".into());
    Some(f.remediation(fixes.join("; ")))
}

fn gdr_off(s: &LogSummary) -> Option<Finding> {
    let rdma: Vec<(&String, &u64)> = s
        .transport_counts
        .iter()
        .filter(|(t, _)| t.starts_with("NET/") && !t.starts_with("NET/Socket"))
        .collect();
    if rdma.is_empty() || rdma.iter().any(|(t, _)| t.contains("GDRDMA")) {
        return None;
    }
    let mut f = Finding::new(
        "log-gdr-off",
        Status::Warn,
        format!(
            "RDMA connections ({}) run without GPUDirect RDMA: data is staged through host memory",
            rdma.iter().map(|(t, _)| t.as_str()).collect::<Vec<_>>().join(", ")
        ),
    )
    .remediation(
        "Enable GPUDirect RDMA on the node (nvidia-peermem loaded, or dma-buf with open GPU kernel modules), keep GPUs \
         and NICs under the same PCIe switch, and do not lower NCCL_NET_GDR_LEVEL.",
    );
    f.evidence = examples(s, "NET/");
    f.evidence.extend(setting_evidence(s, "NCCL_NET_GDR_LEVEL"));
    Some(f)
}

fn proto_forced(s: &LogSummary) -> Option<Finding> {
    let values = s.setting("NCCL_PROTO")?;
    let joined = values.iter().cloned().collect::<Vec<_>>().join(",");
    let ll128 = values
        .iter()
        .any(|v| !v.starts_with('^') && v.to_ascii_uppercase().contains("LL128"));
    let mut f = Finding::new(
        "log-proto-forced",
        Status::Warn,
        if ll128 {
            format!("NCCL_PROTO={joined} forces LL128, which corrupts data where the platform does not support it")
        } else {
            format!("NCCL_PROTO={joined} restricts NCCL's protocol choice (Simple only costs latency on small messages)")
        },
    )
    .remediation("Unset NCCL_PROTO unless your platform's documentation requires it (only aws-ofi-nccl <= 1.5 needed simple).");
    f.evidence = setting_evidence(s, "NCCL_PROTO");
    Some(f)
}

fn read_mode_forced(s: &LogSummary) -> Option<Finding> {
    let reads: u64 = s
        .transport_counts
        .iter()
        .filter(|(t, _)| t.ends_with("/read"))
        .map(|(_, n)| n)
        .sum();
    let forced = is_set_to(s, "NCCL_P2P_READ_ENABLE", "1");
    // NCCL picks read mode itself only for SM80 pairs over NVLink (src/graph/paths.cc).
    if reads == 0 || (!forced && s.nvlink()) {
        return None;
    }
    let mut f = Finding::new(
        "log-p2p-read-mode",
        Status::Warn,
        format!("{reads} P2P connections run in read mode, which NCCL only chooses itself for A100 pairs over NVLink"),
    )
    .remediation("Unset NCCL_P2P_READ_ENABLE unless measurements on this platform favour read mode.");
    f.evidence = examples(s, "P2P");
    f.evidence
        .extend(setting_evidence(s, "NCCL_P2P_READ_ENABLE"));
    Some(f)
}

fn warnings(s: &LogSummary) -> Vec<Finding> {
    let mut known: Vec<Finding> = Vec::new();
    let mut unknown = Vec::new();
    for w in &s.warnings {
        let line = format!(
            "line {}{}: {} ({}x)",
            w.first_line,
            w.location
                .as_deref()
                .map(|l| format!(" {l}"))
                .unwrap_or_default(),
            w.message,
            w.count
        );
        match SIGNATURES
            .iter()
            .find(|sig| sig.needles.iter().any(|n| w.message.contains(n)))
        {
            Some(sig) => match known.iter_mut().find(|f| f.id == sig.id) {
                Some(f) => f.evidence.push(line),
                None => known.push(
                    Finding::new(sig.id, Status::Fail, format!("NCCL WARN: {}", sig.cause))
                        .evidence(line)
                        .remediation(sig.fix),
                ),
            },
            None => unknown.push(line),
        }
    }
    if !unknown.is_empty() {
        let mut f = Finding::new(
            "log-nccl-warn",
            Status::Warn,
            format!("{} other NCCL WARN message(s); the lines before each usually name the cause", unknown.len()),
        )
        .remediation("Rerun with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,ENV and read the lines before each WARN.");
        f.evidence = unknown.into_iter().take(10).collect();
        known.push(f);
    }
    known
}

/// Every diagnosis for a summary, failures first.
pub fn diagnose(s: &LogSummary) -> Vec<Finding> {
    let mut findings = warnings(s);
    for rule in [
        shm_despite_nvlink,
        split_pods,
        sockets_despite_rdma,
        gdr_off,
        proto_forced,
        read_mode_forced,
    ] {
        findings.extend(rule(s));
    }
    findings.sort_by_key(|f| std::cmp::Reverse(f.status));
    findings
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(lines: &[&str]) -> LogSummary {
        let text: String = lines
            .iter()
            .map(|l| format!("h:1:1 [0] NCCL INFO {l}\n"))
            .collect();
        crate::explain::summarize(text.as_bytes()).unwrap()
    }

    fn ids(lines: &[&str]) -> Vec<String> {
        diagnose(&summary(lines))
            .into_iter()
            .map(|f| f.id)
            .collect()
    }

    const NVL_TOPO: &str = "GPU/0-60 :GPU/0-60 (0/5000.0/LOC) GPU/0-70 (2/370.8/NVL)";

    #[test]
    fn shm_with_nvlink_only() {
        let shm = "Channel 00 : 0[0] -> 1[1] via SHM/direct/direct";
        assert_eq!(ids(&[NVL_TOPO, shm]), ["log-shm-instead-of-nvlink"]);
        assert!(ids(&[shm]).is_empty(), "no NVLink: SHM is the right choice");
        let f = diagnose(&summary(&[
            NVL_TOPO,
            shm,
            "NCCL_P2P_LEVEL set by environment to LOC",
        ]));
        assert!(
            f[0].remediation
                .as_ref()
                .unwrap()
                .contains("NCCL_P2P_LEVEL")
        );
    }

    #[test]
    fn split_pods_needs_one_rank_per_host_and_distinct_buses() {
        let lines = |bus1: &str| {
            vec![
                "ncclCommInitRankConfig comm 0x1 rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 60 commId 0xabc - Init START".to_string(),
                "comm 0x1 rank 0 nRanks 2 nNodes 2 localRanks 1 localRank 0 MNNVL 0".to_string(),
                "Channel 00/0 : 1[0] -> 0[0] [receive] via NET/Socket/0".to_string(),
                format!("ncclCommInitRankConfig comm 0x2 rank 1 nranks 2 cudaDev 0 nvmlDev 0 busId {bus1} commId 0xabc - Init START"),
            ]
        };
        let text = |bus1: &str| -> String {
            let l = lines(bus1);
            // Rank 1 on another host.
            format!(
                "a:1:1 [0] NCCL INFO {}\na:1:1 [0] NCCL INFO {}\na:1:1 [0] NCCL INFO {}\nb:1:1 [0] NCCL INFO {}\n",
                l[0], l[1], l[2], l[3]
            )
        };
        let split = diagnose(&crate::explain::summarize(text("70").as_bytes()).unwrap());
        assert_eq!(
            split.iter().map(|f| f.id.as_str()).collect::<Vec<_>>(),
            ["log-split-pods"]
        );
        // Two real machines put GPU 0 at the same bus id: no finding.
        assert!(diagnose(&crate::explain::summarize(text("60").as_bytes()).unwrap()).is_empty());
    }

    #[test]
    fn sockets_despite_rdma_needs_devices_or_a_failed_plugin() {
        let socket = "Channel 00/0 : 1[0] -> 0[0] [receive] via NET/Socket/0";
        assert!(
            ids(&[
                socket,
                "NET/IB : No device found.",
                "Failed to initialize NET plugin IB"
            ])
            .is_empty()
        );
        assert_eq!(
            ids(&[
                socket,
                "NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:10.0.0.1<0>"
            ]),
            ["log-socket-despite-rdma"]
        );
        assert_eq!(
            ids(&[socket, "Failed to initialize NET plugin Libfabric"]),
            ["log-socket-despite-rdma"]
        );
        let f = diagnose(&summary(&[
            socket,
            "NET/IB : Using [0]mlx5_0:1/IB",
            "NCCL_IB_DISABLE set by environment to 1.",
        ]));
        assert!(
            f[0].remediation
                .as_ref()
                .unwrap()
                .contains("unset NCCL_IB_DISABLE (set to 1)")
        );
    }

    #[test]
    fn gdr_proto_and_read_mode() {
        assert_eq!(
            ids(&["Channel 00/0 : 4[0] -> 0[0] [receive] via NET/IB/0"]),
            ["log-gdr-off"]
        );
        assert!(ids(&["Channel 00/0 : 4[0] -> 0[0] [receive] via NET/IB/0/GDRDMA"]).is_empty());
        assert_eq!(
            ids(&["NCCL_PROTO set by environment to LL128"]),
            ["log-proto-forced"]
        );
        assert!(
            diagnose(&summary(&["NCCL_PROTO set by environment to LL128"]))[0]
                .summary
                .contains("corrupts")
        );
        assert!(
            !diagnose(&summary(&["NCCL_PROTO set by environment to ^LL128"]))[0]
                .summary
                .contains("corrupts")
        );
        let read = "Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read";
        assert!(
            ids(&[NVL_TOPO, read]).is_empty(),
            "A100 over NVLink reads by default"
        );
        assert_eq!(
            ids(&[
                NVL_TOPO,
                read,
                "NCCL_P2P_READ_ENABLE set by environment to 1."
            ]),
            ["log-p2p-read-mode"]
        );
        assert_eq!(ids(&[read]), ["log-p2p-read-mode"]);
    }

    #[test]
    fn warn_signatures_fail_and_unknown_warns() {
        let text = "h:1:1 [0] shm.cc:1 NCCL WARN Error: failed to extend /dev/shm/nccl-x to 9 bytes\n\
                    h:1:1 [0] shm.cc:1 NCCL WARN Error: failed to extend /dev/shm/nccl-x to 9 bytes\n\
                    h:1:1 [0] x.cc:1 NCCL WARN brand new problem\n";
        let f = diagnose(&crate::explain::summarize(text.as_bytes()).unwrap());
        assert_eq!(
            (f[0].id.as_str(), f[0].status),
            ("log-dev-shm-full", Status::Fail)
        );
        assert!(f[0].evidence[0].contains("(2x)"), "{:?}", f[0].evidence);
        assert!(
            f[0].remediation
                .as_ref()
                .unwrap()
                .contains("medium: Memory")
        );
        assert_eq!(
            (f[1].id.as_str(), f[1].status),
            ("log-nccl-warn", Status::Warn)
        );
    }
}
