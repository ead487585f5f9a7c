//! Diagnoses: `&LogSummary -> Vec<Finding>`, pure. NCCL's messages are read
//! through the meaning table (warns.rs); the rules here judge what the log
//! shows around them: transports, settings, the fabric. Each states what it
//! saw (lines of the log as evidence) and the fix; measured costs from
//! FACTS.md section 1.

use super::summary::LogSummary;
use crate::finding::Finding;

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
    let summary = format!(
        "{} connections went through SHM (host memory) although the topology shows NVLink: measured 27 GB/s instead of ~295 GB/s on 2x H200",
        s.connections("SHM")
    );
    let mut evidence = examples(s, "SHM");
    evidence.extend(
        s.path_types
            .iter()
            .map(|t| format!("intra-node path type {t}")),
    );
    let fix = if is_set_to(s, "NCCL_P2P_DISABLE", "1") {
        evidence.extend(setting_evidence(s, "NCCL_P2P_DISABLE"));
        "Unset NCCL_P2P_DISABLE: it turns NVLink peer transfers off.".to_string()
    } else if let Some(level) = s.setting("NCCL_P2P_LEVEL") {
        evidence.extend(setting_evidence(s, "NCCL_P2P_LEVEL"));
        format!(
            "Unset NCCL_P2P_LEVEL (set to {}) or set it to NVL or higher.",
            level.iter().cloned().collect::<Vec<_>>().join(",")
        )
    } else {
        "P2P between these GPUs was refused: run each node's ranks in one container that sees all its GPUs, \
         and check peer access with `nvidia-smi topo -p2p rw`."
            .to_string()
    };
    let mut f = Finding::warn("log-shm-instead-of-nvlink", summary, fix);
    f.evidence = evidence;
    Some(f)
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
            let mut f = Finding::warn(
                "log-split-pods",
                format!(
                    "communicator {id}: every rank is its own NCCL node with one GPU, each at a different PCI bus id: this looks like one machine's GPUs split across pods, talking over the network (measured 3.3 GB/s instead of ~295 GB/s over NVLink)"
                ),
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
    let summary = format!(
        "{socket_conns} connections used NET/Socket (TCP) although RDMA was available or a net plugin failed to start"
    );
    let mut evidence: Vec<String> = Vec::new();
    evidence.extend(
        s.ib_devices
            .iter()
            .map(|d| format!("NET/IB listed devices: {d}")),
    );
    evidence.extend(
        failed_plugins
            .iter()
            .map(|p| format!("Failed to initialize NET plugin {p}")),
    );
    evidence.extend(s.ofi_lines.iter().take(3).cloned());
    evidence.extend(examples(s, "NET/Socket"));
    let mut fixes = Vec::new();
    for name in ["NCCL_IB_DISABLE", "NCCL_NET"] {
        if let Some(v) = s.setting(name) {
            evidence.extend(setting_evidence(s, name));
            fixes.push(format!(
                "unset {name} (set to {})",
                v.iter().cloned().collect::<Vec<_>>().join(",")
            ));
        }
    }
    fixes.push("run `nccl-preflight check` in the pod to see whether the RDMA devices open and memory registers".into());
    let mut f = Finding::warn("log-socket-despite-rdma", summary, fixes.join("; "));
    f.evidence = evidence;
    Some(f)
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
    let mut f = Finding::warn(
        "log-gdr-off",
        format!(
            "RDMA connections ({}) run without GPUDirect RDMA: data is staged through host memory",
            rdma.iter()
                .map(|(t, _)| t.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        "Enable GPUDirect RDMA on the node (nvidia-peermem loaded, or dma-buf with open GPU kernel modules), keep GPUs \
         and NICs under the same PCIe switch, and do not lower NCCL_NET_GDR_LEVEL.",
    );
    f.evidence = examples(s, "NET/");
    f.evidence.extend(setting_evidence(s, "NCCL_NET_GDR_LEVEL"));
    Some(f)
}

/// The aws-ofi-nccl version the log printed, as (major, minor).
fn ofi_version(s: &LogSummary) -> Option<(u32, u32)> {
    s.ofi.versions.iter().find_map(|v| {
        let number = v.split_whitespace().last()?;
        let mut parts = number.split(['.', '-']);
        Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
    })
}

/// True when NCCL's traffic went through aws-ofi-nccl on EFA.
fn on_efa(s: &LogSummary) -> bool {
    // `Selected Provider is efa` (1.6-1.14), `Selected provider is efa, fabric is ...`
    // (1.15 on), `Setting provider_filter to efa`, or an EC2 platform line.
    s.ofi.providers.contains("efa")
        || s.ofi_lines
            .iter()
            .any(|l| l.ends_with("provider_filter to efa"))
        || !s.ofi.platforms.is_empty()
}

fn proto_forced(s: &LogSummary) -> Option<Finding> {
    let values = s.setting("NCCL_PROTO")?;
    let joined = values.iter().cloned().collect::<Vec<_>>().join(",");
    let ll128 = values
        .iter()
        .any(|v| !v.starts_with('^') && v.to_ascii_uppercase().contains("LL128"));
    let simple_only = values.iter().all(|v| v.eq_ignore_ascii_case("simple"));
    // aws-ofi-nccl forces NCCL_PROTO=simple itself where EFA lacks in-order
    // delivery, because LL/LL128 poll on flags and corrupt data without it:
    // per platform (p4d, p4de) in 1.6.0 (src/platform-aws.c force_proto_simple),
    // from the endpoint's 128-byte in-order capability in 1.7.0 to 1.14
    // (configure_nccl_proto, "Setting NCCL_PROTO to \"simple\""), and from
    // "byte delivery ordering" or missing GDR in 1.16 on (src/platform-aws.cpp,
    // src/nccl_ofi_net.cpp at v1.21.1). Up to 1.5 users set it by hand on p4d
    // (doc/efa-env-var.md). So on EFA, simple is right unless the log shows a
    // platform with in-order delivery.
    if simple_only && on_efa(s) {
        if s.ofi.forced_proto_simple {
            return None;
        }
        let platforms: Vec<&str> = s.ofi.platforms.iter().map(String::as_str).collect();
        let p4 = platforms
            .iter()
            .any(|p| crate::platform::forces_proto_simple(p));
        if platforms.is_empty() || p4 {
            return None;
        }
        let version = ofi_version(s);
        let mut f = Finding::warn(
            "log-proto-forced",
            format!(
                "NCCL_PROTO=simple on {}: aws-ofi-nccl{} forces it itself only where EFA lacks in-order delivery (p4d, p4de), and did not here; Simple alone costs latency on small messages",
                platforms.join(", "),
                version
                    .map(|(a, b)| format!(" {a}.{b}"))
                    .unwrap_or_default()
            ),
            "Unset NCCL_PROTO: aws-ofi-nccl >= 1.7 sets NCCL_PROTO=simple itself on the platforms that need it.",
        );
        f.evidence = setting_evidence(s, "NCCL_PROTO");
        f.evidence.extend(
            platforms
                .iter()
                .map(|p| format!("NET/OFI Running on {p} platform")),
        );
        return Some(f);
    }
    let mut f = Finding::warn(
        "log-proto-forced",
        if ll128 {
            format!(
                "NCCL_PROTO={joined} forces LL128, which corrupts data where the platform does not support it"
            )
        } else {
            format!(
                "NCCL_PROTO={joined} restricts NCCL's protocol choice (Simple only costs latency on small messages)"
            )
        },
        if on_efa(s) {
            "Unset NCCL_PROTO: aws-ofi-nccl sets NCCL_PROTO=simple itself where EFA needs it, and LL/LL128 corrupt data where it does."
        } else {
            "Unset NCCL_PROTO unless your platform's documentation requires it."
        },
    );
    f.evidence = setting_evidence(s, "NCCL_PROTO");
    Some(f)
}

/// Inter-node traffic over TCP in a multi-node communicator, where the log does
/// not show RDMA hardware going unused (`sockets_despite_rdma` covers that) or
/// one machine split into pods (`split_pods`).
fn tcp_fabric(s: &LogSummary) -> Option<Finding> {
    let socket = s
        .transport_counts
        .iter()
        .filter(|(t, _)| t.starts_with("NET/Socket"))
        .map(|(_, n)| n)
        .sum::<u64>();
    let other_net = s.connections("NET") - socket;
    if socket == 0 || other_net > 0 {
        return None;
    }
    // NET connections join different NCCL nodes unless P2P and SHM are both
    // disabled; a communicator that reports nNodes says so outright.
    let multi = s
        .communicators
        .iter()
        .find(|(_, c)| c.nodes.is_some_and(|n| n >= 2));
    let reported = s.communicators.values().any(|c| c.nodes.is_some());
    let local_only = is_set_to(s, "NCCL_P2P_DISABLE", "1") && is_set_to(s, "NCCL_SHM_DISABLE", "1");
    let span = match multi {
        Some((id, comm)) => format!(
            "communicator {id} spans {} nodes and its",
            comm.nodes.unwrap_or(0)
        ),
        None if !reported && !local_only => {
            "the log shows NET connections between nodes, and their".to_string()
        }
        None => return None,
    };
    let mut f = Finding::warn(
        "log-tcp-fabric",
        format!(
            "{span} inter-node traffic runs over TCP (NET/Socket, {socket} connections): \
             measured 3.3-3.7 GB/s all-reduce bus bandwidth over sockets, where one RDMA NIC carries 12.5-50 GB/s (100-400 Gb/s, EFA on p4d 4x100 Gb/s) \
             and NVLink ~295 GB/s; the log shows no RDMA device in use"
        ),
        "If the nodes have RDMA NICs (InfiniBand, RoCE, EFA), give the pods the RDMA device plugin resource, /dev/infiniband \
         and IPC_LOCK, and for EFA the aws-ofi-nccl plugin; then run `nccl-preflight check` in the pod. If TCP is the only \
         fabric, expect this rate and keep each node's GPUs in one pod.",
    );
    f.evidence = examples(s, "NET/Socket");
    f.evidence.extend(
        s.socket_interfaces
            .iter()
            .map(|i| format!("NET/Socket : Using {i}")),
    );
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
    // NCCL picks read mode itself for SM80 pairs over NVLink (p2pUseRead in
    // src/graph/paths.cc), and INFO output without the GRAPH subsystem shows no
    // topology: read mode without the variable is evidence of NVLink, not of
    // PCIe. Warn where the variable forced it, or where the path types the log
    // printed are all PCIe.
    let pcie_only = !s.path_types.is_empty() && !s.path_types.iter().any(|t| t.starts_with("NVL"));
    if reads == 0 || !(forced || pcie_only && !s.nvlink_in_topology) {
        return None;
    }
    let mut f = Finding::warn(
        "log-p2p-read-mode",
        if forced {
            format!(
                "{reads} P2P connections run in read mode because NCCL_P2P_READ_ENABLE=1; NCCL chooses it itself only for A100 pairs over NVLink"
            )
        } else {
            format!(
                "{reads} P2P connections run in read mode over PCIe paths ({}); NCCL chooses it itself only for A100 pairs over NVLink",
                s.path_types.iter().cloned().collect::<Vec<_>>().join(", ")
            )
        },
        "Unset NCCL_P2P_READ_ENABLE unless measurements on this platform favour read mode.",
    );
    f.evidence = examples(s, "P2P");
    f.evidence
        .extend(setting_evidence(s, "NCCL_P2P_READ_ENABLE"));
    Some(f)
}

/// Every diagnosis for a summary, the verdict first, then failures before
/// warnings; and the lines that are context, not findings (benign WARNs, echoes
/// of the first failure).
pub fn diagnose(s: &LogSummary) -> (Vec<Finding>, Vec<String>) {
    let (mut findings, context) = super::warns::findings(s);
    let socket_explained = [split_pods(s), sockets_despite_rdma(s)];
    if socket_explained.iter().all(Option::is_none) {
        findings.extend(tcp_fabric(s));
    }
    findings.extend(socket_explained.into_iter().flatten());
    for rule in [shm_despite_nvlink, gdr_off, proto_forced, read_mode_forced] {
        findings.extend(rule(s));
    }
    findings.extend(super::settings::findings(s));
    // Stable: the verdict stays first among the failures.
    findings.sort_by_key(|f| std::cmp::Reverse(f.status()));
    (findings, context)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::finding::Status;

    fn summary(lines: &[&str]) -> LogSummary {
        let text: String = lines
            .iter()
            .map(|l| format!("h:1:1 [0] NCCL INFO {l}\n"))
            .collect();
        crate::explain::summarize(text.as_bytes()).unwrap()
    }

    fn diagnose_f(s: &LogSummary) -> Vec<Finding> {
        diagnose(s).0
    }

    fn ids(lines: &[&str]) -> Vec<String> {
        diagnose(&summary(lines))
            .0
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
        let f = diagnose_f(&summary(&[
            NVL_TOPO,
            shm,
            "NCCL_P2P_LEVEL set by environment to LOC",
        ]));
        assert!(
            f[0].remediation()
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
        let split = diagnose_f(&crate::explain::summarize(text("70").as_bytes()).unwrap());
        assert_eq!(
            split.iter().map(|f| f.id.as_str()).collect::<Vec<_>>(),
            ["log-split-pods"]
        );
        // Two real machines put GPU 0 at the same bus id: not split pods, but
        // two nodes over TCP.
        assert_eq!(
            diagnose_f(&crate::explain::summarize(text("60").as_bytes()).unwrap())
                .iter()
                .map(|f| f.id.as_str())
                .collect::<Vec<_>>(),
            ["log-tcp-fabric"]
        );
    }

    #[test]
    fn sockets_despite_rdma_needs_devices_or_a_failed_plugin() {
        let socket = "Channel 00/0 : 1[0] -> 0[0] [receive] via NET/Socket/0";
        // No RDMA device: not "despite RDMA", but still TCP between nodes.
        assert_eq!(
            ids(&[
                socket,
                "NET/IB : No device found.",
                "Failed to initialize NET plugin IB"
            ]),
            ["log-tcp-fabric"]
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
        let f = diagnose_f(&summary(&[
            socket,
            "NET/IB : Using [0]mlx5_0:1/IB",
            "NCCL_IB_DISABLE set by environment to 1.",
        ]));
        assert!(
            f[0].remediation()
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
            diagnose_f(&summary(&["NCCL_PROTO set by environment to LL128"]))[0]
                .summary
                .contains("corrupts")
        );
        assert!(
            !diagnose_f(&summary(&["NCCL_PROTO set by environment to ^LL128"]))[0]
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
    }

    /// Issue 15: read mode fired on 7 of 30 real logs, none of which set
    /// NCCL_P2P_READ_ENABLE; default INFO output prints no topology.
    #[test]
    fn read_mode_without_the_variable_is_evidence_of_nvlink() {
        let read = "Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read";
        let ipc_read = "Channel 00/1 : 0[0] -> 1[1] via P2P/IPC/read";
        assert!(ids(&[read]).is_empty());
        assert!(ids(&[ipc_read]).is_empty());
        assert_eq!(
            ids(&[ipc_read, "NCCL_P2P_READ_ENABLE set by environment to 1."]),
            ["log-p2p-read-mode"]
        );
        // The log's own path types say PCIe only.
        let pcie = "Pattern 4, crossNic 0, nChannels 2, bw 12.000000/12.000000, type PHB/PIX, sameChannels 1";
        let f = diagnose_f(&summary(&[pcie, read]));
        assert_eq!(f[0].id, "log-p2p-read-mode");
        assert!(
            f[0].summary.contains("PCIe paths (PHB/PIX)"),
            "{}",
            f[0].summary
        );
    }

    #[test]
    fn warn_signatures_fail_and_unknown_warns() {
        let text = "h:1:1 [0] shm.cc:1 NCCL WARN Error: failed to extend /dev/shm/nccl-x to 9 bytes\n\
                    h:1:1 [0] shm.cc:1 NCCL WARN Error: failed to extend /dev/shm/nccl-x to 9 bytes\n\
                    h:1:1 [0] x.cc:1 NCCL WARN brand new problem\n";
        let f = diagnose_f(&crate::explain::summarize(text.as_bytes()).unwrap());
        assert_eq!(
            (f[0].id.as_str(), f[0].status()),
            ("log-dev-shm-full", Status::Fail)
        );
        assert!(
            f[0].evidence[0].contains("(2 lines)"),
            "{:?}",
            f[0].evidence
        );
        assert!(
            f[0].remediation()
                .as_ref()
                .unwrap()
                .contains("medium: Memory")
        );
        assert_eq!(
            (f[1].id.as_str(), f[1].status()),
            ("log-nccl-warn", Status::Warn)
        );
    }

    /// Issue 15: `/dev/shm` full was diagnosed from NCCL's generic wrapper when
    /// cudaHostRegister had failed on the line before. Issue 38: the wrapper is
    /// an echo; the first cause in time is the verdict.
    #[test]
    fn shm_segment_error_is_an_echo_of_the_failure_before_it() {
        let text = "h:7:7 [0] include/alloc.h:48 NCCL WARN Cuda failure 'invalid argument'\n\
                    h:7:7 [0] include/shm.h:28 NCCL WARN Error while creating shared memory segment nccl-shm-recv-1 (size 9637888)\n";
        let (f, context) = diagnose(&crate::explain::summarize(text.as_bytes()).unwrap());
        assert_eq!(
            f.iter().map(|f| f.id.as_str()).collect::<Vec<_>>(),
            ["log-cuda"]
        );
        assert!(
            f[0].summary.contains("invalid argument"),
            "{}",
            f[0].summary
        );
        assert!(
            context
                .iter()
                .any(|c| c.contains("9637888") && c.starts_with("echo")),
            "{context:?}"
        );
        // 2.28 prints the errno: ENOSPC is /dev/shm.
        let text = "h:7:7 [0] misc/shmutils.cc:139 NCCL WARN Error while creating shared memory segment /dev/shm/nccl-AbCdEf (size 9637888), error: No space left on device (28)\n";
        let f = diagnose_f(&crate::explain::summarize(text.as_bytes()).unwrap());
        assert_eq!((f[0].id.as_str(), f.len()), ("log-dev-shm-full", 1));
        // A missing segment on attach: the peer's /dev/shm is not this one.
        let text = "g:1:2 [0] misc/shmutils.cc:93 NCCL WARN Call to open failed: No such file or directory\n\
                    g:1:2 [0] misc/shmutils.cc:129 NCCL WARN Error while attaching to shared memory segment /dev/shm/nccl-x (size 1), error: No such file or directory (2)\n";
        let f = diagnose_f(&crate::explain::summarize(text.as_bytes()).unwrap());
        assert_eq!(f.len(), 1, "{f:#?}");
        let fix = f[0].remediation().unwrap();
        assert!(fix.contains("one pod"), "{fix}");
        assert!(f[0].summary.contains("ENOENT"), "{}", f[0].summary);
        // Alone, the wrapper is the verdict and says it repeats an earlier failure.
        let text = "h:8:8 [0] b.cc:1 NCCL WARN Error while attaching to shared memory segment x (size 1)\n";
        let f = diagnose_f(&crate::explain::summarize(text.as_bytes()).unwrap());
        assert_eq!(f[0].id, "log-shm-segment");
        assert!(
            f[0].summary.contains("the WARN before it"),
            "{}",
            f[0].summary
        );
    }

    /// Issue 15: "1 other NCCL WARN message(s)" followed by "(3x)".
    #[test]
    fn other_warns_count_messages_and_lines() {
        let text = "h:1:1 [0] x.cc:1 NCCL WARN brand new problem\n".repeat(3);
        let f = diagnose_f(&crate::explain::summarize(text.as_bytes()).unwrap());
        assert!(
            f[0].summary
                .starts_with("1 other NCCL WARN message (3 lines in all)"),
            "{}",
            f[0].summary
        );
        // Verbatim, with where NCCL's source prints it (nowhere: not NCCL's line).
        assert!(
            f[0].evidence[0].contains("brand new problem (3 lines) [in no NCCL"),
            "{:?}",
            f[0].evidence
        );
    }

    /// Issue 15: NCCL 2.3-2.5's `via direct shared memory` escaped the SHM rule.
    #[test]
    fn direct_shared_memory_is_shm() {
        assert_eq!(
            ids(&[NVL_TOPO, "Ring 00 : 0[0] -> 1[1] via direct shared memory"]),
            ["log-shm-instead-of-nvlink"]
        );
    }

    /// Issue 17: a multi-node communicator over NET/Socket with no RDMA in the
    /// log passed with no finding.
    #[test]
    fn multi_node_over_tcp_says_what_it_costs() {
        let base = [
            "comm 0x1 rank 0 nRanks 16 nNodes 2 localRanks 8 localRank 0 MNNVL 0",
            "Channel 00/0 : 15[7] -> 0[0] [receive] via NET/Socket/0",
        ];
        let f = diagnose_f(&summary(&base));
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].id, "log-tcp-fabric");
        assert!(f[0].summary.contains("3.3-3.7 GB/s"));
        // One node: TCP between processes of one node is another problem.
        assert!(
            ids(&[
                "comm 0x1 rank 0 nRanks 2 nNodes 1 localRanks 2 localRank 0",
                base[1]
            ])
            .is_empty()
        );
        // RDMA in use: not TCP.
        assert!(
            ids(&[
                base[0],
                "Channel 00/0 : 15[7] -> 0[0] [receive] via NET/IB/0/GDRDMA"
            ])
            .is_empty()
        );
        // RDMA listed but unused: the RDMA rule speaks, not this one.
        assert_eq!(
            ids(&[
                base[0],
                base[1],
                "NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:10.0.0.1<0>"
            ]),
            ["log-socket-despite-rdma"]
        );
    }

    /// Issue 17: NCCL_PROTO=simple is right on p4d with aws-ofi-nccl; explain-log
    /// told the user to unset it on the seeds' own p4d log.
    #[test]
    fn proto_simple_on_efa_depends_on_platform_and_plugin() {
        let efa = [
            "NET/Plugin: Loaded net plugin Libfabric (v7)",
            "NET/OFI Selected Provider is efa (found 4 nics)",
            "NCCL_PROTO set by environment to simple",
        ];
        // Platform not in the log: the plugin would have chosen the same where needed.
        assert!(ids(&efa).is_empty());
        // "default" is not "efa": no EFA, the generic advice.
        let f = diagnose_f(&summary(&["NET/OFI Using default provider tcp", efa[2]]));
        assert!(
            f[0].remediation()
                .unwrap()
                .starts_with("Unset NCCL_PROTO unless")
        );
        let p4d = "NET/OFI Running on p4d.24xlarge platform, Setting NCCL_TOPO_FILE environment variable to /x.xml";
        assert!(ids(&[efa[0], efa[1], efa[2], p4d]).is_empty());
        // The plugin forced it itself (1.16 on).
        assert!(
            ids(&[
                efa[0],
                efa[1],
                efa[2],
                "NET/OFI Need to force simple protocol: byte delivery ordering not supported"
            ])
            .is_empty()
        );
        // p5 has in-order delivery: simple there is the user's, and costs latency.
        let f = diagnose_f(&summary(&[
            efa[0],
            "NET/OFI Initializing aws-ofi-nccl 1.9.1-aws",
            efa[1],
            efa[2],
            "NET/OFI Running on p5.48xlarge platform, NCCL_TOPO_FILE environment variable is already set to /x.xml",
        ]));
        assert_eq!(f[0].id, "log-proto-forced");
        assert!(
            f[0].summary.contains("p5.48xlarge: aws-ofi-nccl 1.9"),
            "{}",
            f[0].summary
        );
        // Not EFA: the generic advice.
        assert!(
            diagnose_f(&summary(&[efa[2]]))[0]
                .remediation()
                .unwrap()
                .starts_with("Unset NCCL_PROTO unless")
        );
    }
}
