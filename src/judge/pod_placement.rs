//! `pod-placement`: the costly mistake is one GPU per pod on a multi-GPU node.
//! NCCL decides "same host" by hostname and boot id, so ranks in separate pods
//! talk over the network even on one machine: measured 3.3 GB/s instead of
//! ~295 GB/s over NVLink on 2x H200 without RDMA (FACTS.md section 1). With
//! GPUDirect RDMA the cost can be small (a p4d field report: 28:15 for 4 pods x
//! 1 GPU x 1 EFA vs 29:47 for 1 pod x 4 GPUs), so the warning states the fabric
//! it assumed. sysfs lists every GPU of the node even inside a container.

use super::{Finding, Problem};
use crate::facts::Facts;
use crate::facts::gpu::NvmlFacts;
use crate::finding::{Outcome, Owner};
use crate::policy::Policy;
use crate::predict::Prediction;

pub const ID: &str = "pod-placement";

fn fix(node_gpus: usize) -> String {
    format!(
        "Run one pod per node with all its GPUs and one process per GPU:
  resources:
    limits:
      nvidia.com/gpu: {node_gpus}
  torchrun --nproc_per_node={node_gpus} ...   (PyTorchJob: nprocPerNode: \"{node_gpus}\"; MPIJob: slotsPerWorker: {node_gpus})"
    )
}

/// True when a visible GPU has NVLinks to GPUs or switches beyond this container.
fn nvlink_leaves_container(nvml: &NvmlFacts) -> bool {
    let visible: Vec<&String> = nvml
        .gpus
        .iter()
        .filter_map(|g| g.pci_bus_id.value())
        .collect();
    nvml.gpus.iter().flat_map(|g| &g.nvlinks).any(|l| {
        l.active
            && (l.remote_type.value().is_some_and(|t| t == "switch")
                || l.remote_pci_bus_id
                    .value()
                    .is_some_and(|b| !visible.contains(&b)))
    })
}

/// What ranks in separate pods of one node do instead of NVLink or PCIe: the path NCCL
/// takes between them (it sees two hosts: src/misc/utils.cc getHostHash), in words and
/// as the outcome, unless the whole job runs in this pod.
fn split_outcome(facts: &Facts, nvlink: bool) -> (String, Outcome) {
    let rdma = facts.rdma.devices.value().is_some_and(|d| !d.is_empty());
    let cost = cost(nvlink, rdma);
    let path = match (nvlink, rdma) {
        (true, true) => "NET over the RDMA NIC between pods instead of NVLink",
        (true, false) => "NET/Socket (TCP) between pods instead of NVLink",
        (false, true) => "NET over the RDMA NIC between pods instead of PCIe peer access",
        (false, false) => {
            "NET/Socket (TCP) between pods instead of PCIe peer access or shared memory"
        }
    };
    let outcome = if crate::layout::span(facts) == crate::layout::Span::Single {
        // The job is this pod: no rank runs in another pod of this node.
        Outcome::Unaffected
    } else {
        Outcome::degraded(path, cost.clone())
    };
    (cost, outcome)
}

fn cost(nvlink: bool, rdma: bool) -> String {
    match (nvlink, rdma) {
        (true, false) => "without an RDMA NIC, ranks in separate pods use TCP sockets: measured 3.3 GB/s instead of ~295 GB/s over NVLink (90x)".into(),
        (true, true) => "over an RDMA NIC with GPUDirect RDMA the loss can be small, or none (a p4d field report, Llama-3-8B with DeepSpeed ZeRO-3: 4 pods x 1 GPU x 1 EFA over NET/Libfabric/GDRDMA finished in 28:15, 1 pod x 4 GPUs in 29:47); it costs NVLink's bandwidth only where the job is bound by GPU-to-GPU traffic, so measure before you change it (nccl-preflight bench)".into(),
        (false, false) => "ranks in separate pods use TCP sockets instead of PCIe peer access or shared memory".into(),
        (false, true) => "ranks in separate pods go through the RDMA NIC instead of PCIe peer access".into(),
    }
}

const ALIGN_FIX: &str = "\
Keep a pod's GPUs on one CPU socket: set the kubelet's topology manager to align them
(--topology-manager-policy=single-numa-node, or restricted, with the NVIDIA device plugin's
topology hints), or request every GPU of the node.";

/// Pairs of this pod's GPUs that NCCL joins through host memory across CPU sockets: path
/// SYS, where ncclTopoCheckP2p allows P2P only up to PXB by default (src/graph/paths.cc,
/// v2.28.9-1; AMD CPUs with two GPUs allow SYS, and the facts do not say the CPU's vendor),
/// so SHM, whose buffers cross the inter-socket link. Where one socket of the node has
/// room for all the pod's GPUs the kubelet could have kept them together: degraded, the
/// kubelet's; where none has, that is the node's layout: a note.
fn across_sockets(facts: &Facts, predicted: &Prediction, visible: usize) -> Option<Problem> {
    let far_pairs: Vec<&crate::predict::PairTransport> = predicted
        .intra_node
        .iter()
        .filter(|p| p.path == "SYS" && !p.transport.starts_with("P2P"))
        .collect();
    let far: Vec<String> = far_pairs
        .iter()
        .map(|p| format!("GPU {} - GPU {}: {} ({})", p.a, p.b, p.transport, p.why))
        .collect();
    let first = far.first()?;
    let mut per_socket: std::collections::BTreeMap<u32, usize> = Default::default();
    for g in facts.gpus.pci_gpus.value()? {
        *per_socket.entry(g.numa_node?).or_default() += 1;
    }
    let room = per_socket.values().max().copied().unwrap_or(0);
    let outcome = if visible <= room {
        Outcome::degraded(
            format!(
                "{} across CPU sockets for {} GPU pair(s), not P2P",
                transports(&far_pairs),
                far.len()
            ),
            "every byte between them crosses the inter-socket link as well as host memory, which GPUs on one socket (PCIe P2P within NCCL_P2P_LEVEL, or SHM within one socket) do not",
        )
    } else {
        Outcome::Unaffected
    };
    let mut p = Problem::predicts(
        outcome,
        format!(
            "this pod's GPUs sit on {} CPU sockets: NCCL joins {} pair(s) across them over {}, not P2P (first: {first})",
            per_socket.len().min(visible),
            far.len(),
            transports(&far_pairs)
        ),
        ALIGN_FIX,
    )
    .blamed(Owner::Kubelet);
    p.evidence = far.iter().take(8).cloned().collect();
    p.evidence.push(format!(
        "the node's GPUs per NUMA node: {}",
        per_socket
            .iter()
            .map(|(n, c)| format!("{n}: {c}"))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    Some(p)
}

/// The transports NCCL takes between `pairs`, once each (`SHM`, `NET`).
fn transports(pairs: &[&crate::predict::PairTransport]) -> String {
    let mut t: Vec<&str> = pairs.iter().map(|p| p.transport.as_str()).collect();
    t.sort_unstable();
    t.dedup();
    t.join(" or ")
}

/// How many GPUs CUDA shows the trainer, and from what: CUDA's own device list when
/// libcuda was probed, else NVML's GPUs narrowed by CUDA_VISIBLE_DEVICES as CUDA reads it.
fn cuda_visible(facts: &Facts, nvml: &NvmlFacts) -> (usize, String) {
    // A CUDA that failed to initialise lists nothing: gpu-devices reports that, not this check.
    if let Some(cuda) = facts.gpus.cuda.loaded().filter(|c| c.init_result == 0) {
        return (cuda.devices.len(), "the CUDA driver's device count".into());
    }
    match facts.launcher.get("CUDA_VISIBLE_DEVICES") {
        Some(v) => {
            let uuids: Vec<(u32, String)> = nvml
                .gpus
                .iter()
                .map(|g| (g.index, g.uuid.value().cloned().unwrap_or_default()))
                .collect();
            let n = crate::topology::visible::select(&v.value, &uuids)
                .gpus
                .len();
            (n, format!("CUDA_VISIBLE_DEVICES={:?}", v.value))
        }
        None => (nvml.gpus.len(), "NVML".into()),
    }
}

pub fn judge(facts: &Facts, predicted: &Prediction, _policy: &Policy) -> Finding {
    let Some(nvml) = facts.gpus.nvml.loaded() else {
        return Finding::skip(ID, "no NVML: placement not checked");
    };
    let visible = nvml.gpus.len();
    let node = facts.gpus.pci_gpus.value().map(Vec::len);
    let mut evidence = vec![format!(
        "this container sees {visible} GPU(s); the node's PCI bus lists {}",
        node.map_or("?".into(), |n| n.to_string())
    )];
    let mut problems = Vec::new();
    let nvlink = crate::topology::matrix::has_nvlink(nvml);
    if let Some(n) = node
        && n > visible
        && visible > 0
    {
        let leaves = nvlink_leaves_container(nvml);
        let (cost, outcome) = split_outcome(facts, leaves);
        problems.push(Problem::predicts(
            outcome,
            format!(
                "this container sees {visible} of the node's {n} GPUs{}: {}",
                if leaves {
                    ", which share NVLink with GPUs it cannot see"
                } else {
                    ""
                },
                cost
            ),
            fix(n),
        ));
    }
    problems.extend(across_sockets(facts, predicted, visible));
    let per_pod = facts
        .launcher
        .get("LOCAL_WORLD_SIZE")
        .or_else(|| facts.launcher.get("PET_NPROC_PER_NODE"))
        .and_then(|v| v.value.trim().parse::<usize>().ok());
    if let Some(k) = per_pod {
        evidence.push(format!("launcher: {k} process(es) per pod"));
        let (cuda_visible, basis) = cuda_visible(facts, nvml);
        if k > cuda_visible {
            // Each local rank calls cudaSetDevice(local_rank): ranks past the last ordinal die.
            problems.push(Problem::predicts(
                Outcome::init_fails(format!(
                    "cudaSetDevice(local rank) fails with \"invalid device ordinal\" on ranks {cuda_visible}..{}",
                    k - 1
                )),
                format!(
                    "the launcher starts {k} process(es) but CUDA shows {cuda_visible} GPU(s) ({basis}): ranks {cuda_visible}..{} fail with \"invalid device ordinal\"",
                    k - 1
                ),
                format!(
                    "Start one process per visible GPU (torchrun --nproc_per_node={cuda_visible}; PyTorchJob nprocPerNode: \"{cuda_visible}\"), or give the pod {k} GPUs (nvidia.com/gpu: {k}) and a CUDA_VISIBLE_DEVICES that names them all (or none)."
                ),
            ));
        }
        if k < visible {
            problems.push(Problem::predicts(
                Outcome::degraded(
                    format!("{k} of the pod's {visible} GPUs"),
                    format!("{} GPU(s) idle; the job's ranks meet across pods instead of over the pod's own links", visible - k),
                ),
                format!(
                    "the launcher starts {k} process(es) in a pod with {visible} GPUs: {} GPU(s) sit idle{}",
                    visible - k,
                    if k == 1 && nvlink { ", and the job spreads across pods instead of NVLink" } else { "" }
                ),
                fix(node.unwrap_or(visible).max(visible)),
            ));
        }
    }
    let summary = match node {
        Some(n) if n <= visible => format!("this container sees all {visible} GPU(s) of the node"),
        _ => format!("this container sees {visible} GPU(s)"),
    };
    super::combine(ID, summary, evidence, problems)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::gpu::LibraryState;
    use crate::finding::Status;
    use crate::test_facts::{healthy, with_env};

    /// The judge as the run calls it, with the prediction made from the same facts.
    fn judge(facts: &Facts, policy: &Policy) -> Finding {
        crate::test_facts::judged(super::judge, facts, policy)
    }

    /// The pod sees GPU 0 of a 2-GPU NVSwitch node.
    fn one_gpu_pod() -> Facts {
        let mut f = healthy();
        if let LibraryState::Loaded(n) = &mut f.gpus.nvml.state {
            n.gpus.truncate(1);
            n.pairs.clear();
        }
        f
    }

    /// The healthy pair without NVLink, on two CPU sockets (NVML: SYSTEM), on a node of
    /// `node_gpus` GPUs split evenly over two NUMA nodes.
    fn across_two_sockets(node_gpus: usize) -> Facts {
        let mut f = healthy();
        if let LibraryState::Loaded(n) = &mut f.gpus.nvml.state {
            for g in &mut n.gpus {
                g.nvlinks.clear();
            }
            for p in &mut n.pairs {
                p.common_ancestor = Some(crate::facts::Observed::Value("SYSTEM".into()));
            }
        }
        if let crate::facts::Observed::Value(gpus) = &mut f.gpus.pci_gpus {
            let first = gpus[0].clone();
            gpus.resize(node_gpus, first);
            for (i, g) in gpus.iter_mut().enumerate() {
                g.numa_node = Some((i % 2) as u32);
                if i >= 2 {
                    g.bus_id = format!("0000:{:02x}:00.0", 0x80 + i);
                }
            }
        }
        f
    }

    /// Locality (issue 36), the verdict written from NVIDIA/nccl v2.28.9-1
    /// src/graph/paths.cc ncclTopoCheckP2p before the judge ran: two GPUs of one pod on
    /// different sockets have path SYS, beyond the default P2P level PXB, so NCCL joins
    /// them over SHM across the sockets. Where one socket had room for both, the kubelet's
    /// topology manager could have kept them together: degraded, the node's (kubelet).
    /// Where no socket has room, that is the node's layout: a note.
    #[test]
    fn a_pods_gpus_on_two_sockets_go_through_host_memory() {
        let one = with_env(across_two_sockets(4), &[("PET_NNODES", "1")]);
        let f = crate::judge::blame(judge(&one, &Policy::default()));
        assert_eq!(f.status(), Status::Warn, "{f:?}");
        assert!(f.summary.contains("sit on 2 CPU sockets"), "{}", f.summary);
        assert_eq!(f.blame(), Some(crate::finding::Blame::Node), "{f:?}");
        assert!(
            matches!(f.outcome(), Some(Outcome::Degraded { path, .. }) if path.contains("across CPU sockets")),
            "{f:?}"
        );
        assert!(f.remediation().unwrap().contains("single-numa-node"));
        // A node of two GPUs, one per socket: no socket holds both, a note.
        let f = judge(&across_two_sockets(2), &Policy::default());
        assert_eq!(f.status(), Status::Pass, "{f:?}");
        assert!(
            f.summary
                .contains("note: this pod's GPUs sit on 2 CPU sockets"),
            "{}",
            f.summary
        );
        // NVLink between them: the socket does not matter.
        assert_eq!(judge(&healthy(), &Policy::default()).status(), Status::Pass);
    }

    #[test]
    fn one_gpu_of_an_nvlink_node_warns_with_the_measured_cost() {
        assert_eq!(judge(&healthy(), &Policy::default()).status(), Status::Pass);
        let f = judge(&one_gpu_pod(), &Policy::default());
        assert_eq!(f.status(), Status::Warn);
        assert!(
            f.summary
                .contains("1 of the node's 2 GPUs, which share NVLink"),
            "{}",
            f.summary
        );
        assert!(f.summary.contains("3.3 GB/s"));
        assert!(f.remediation().unwrap().contains("nproc_per_node=2"));
        let rdma = one_gpu_pod();
        let rdma = crate::test_facts::with_efa(rdma);
        assert!(
            judge(&rdma, &Policy::default())
                .summary
                .contains("field report")
        );
    }

    #[test]
    fn regression_more_ranks_than_cuda_shows_fails() {
        let f = judge(
            &with_env(healthy(), &[("LOCAL_WORLD_SIZE", "4")]),
            &Policy::default(),
        );
        assert_eq!(f.status(), Status::Fail, "{f:?}");
        assert!(
            f.summary.contains("invalid device ordinal"),
            "{}",
            f.summary
        );
        // CUDA off: CUDA_VISIBLE_DEVICES as CUDA reads it; `7` names nothing and ends the list.
        let mut f = with_env(
            healthy(),
            &[("PET_NPROC_PER_NODE", "2"), ("CUDA_VISIBLE_DEVICES", "0,7")],
        );
        f.gpus.cuda.state = LibraryState::Skipped {
            reason: "--cuda off".into(),
        };
        let finding = judge(&f, &Policy::default());
        assert_eq!(finding.status(), Status::Fail, "{finding:?}");
        assert!(
            finding.summary.contains("CUDA shows 1 GPU(s)"),
            "{}",
            finding.summary
        );
    }

    #[test]
    fn one_process_for_many_gpus_warns() {
        let f = judge(
            &with_env(healthy(), &[("LOCAL_WORLD_SIZE", "1")]),
            &Policy::default(),
        );
        assert_eq!(f.status(), Status::Warn);
        assert!(f.summary.contains("1 GPU(s) sit idle"), "{}", f.summary);
        let ok = judge(
            &with_env(healthy(), &[("PET_NPROC_PER_NODE", "2")]),
            &Policy::default(),
        );
        assert_eq!(ok.status(), Status::Pass);
    }
}
