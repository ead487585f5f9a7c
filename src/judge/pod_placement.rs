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
use crate::finding::Severity;
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

fn cost(facts: &Facts, nvlink: bool) -> String {
    let rdma = facts.rdma.devices.value().is_some_and(|d| !d.is_empty());
    match (nvlink, rdma) {
        (true, false) => "without an RDMA NIC, ranks in separate pods use TCP sockets: measured 3.3 GB/s instead of ~295 GB/s over NVLink (90x)".into(),
        (true, true) => "over an RDMA NIC with GPUDirect RDMA the loss can be small, or none (a p4d field report, Llama-3-8B with DeepSpeed ZeRO-3: 4 pods x 1 GPU x 1 EFA over NET/Libfabric/GDRDMA finished in 28:15, 1 pod x 4 GPUs in 29:47); it costs NVLink's bandwidth only where the job is bound by GPU-to-GPU traffic, so measure before you change it (nccl-preflight bench)".into(),
        (false, false) => "ranks in separate pods use TCP sockets instead of PCIe peer access or shared memory".into(),
        (false, true) => "ranks in separate pods go through the RDMA NIC instead of PCIe peer access".into(),
    }
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

pub fn judge(facts: &Facts, _prediction: &Prediction, _policy: &Policy) -> Finding {
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
        problems.push(Problem::new(
            Severity::Warn,
            format!(
                "this container sees {visible} of the node's {n} GPUs{}: {}",
                if leaves {
                    ", which share NVLink with GPUs it cannot see"
                } else {
                    ""
                },
                cost(facts, leaves)
            ),
            fix(n),
        ));
    }
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
            problems.push(Problem::new(
                Severity::Fail,
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
            problems.push(Problem::new(
                Severity::Warn,
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
