//! `gdr`: GPUDirect RDMA for GPU-NIC pairs that share a PCIe switch (PIX or
//! PXB, where NCCL uses it by default). It needs nvidia-peermem, or dma-buf
//! (kernel 5.12+ with the NVIDIA open kernel modules). aws-ofi-nccl refuses to
//! run without it on p4d/p5-class instances ("GDR disabled on GDR-supported
//! instance type", FACTS.md section 2).

use super::rdma_scope::Scope;
use super::{Finding, Problem};
use crate::facts::Facts;
use crate::finding::{Outcome, Owner};
use crate::policy::Policy;
use crate::predict::{GdrPair, Prediction};

pub const ID: &str = "gdr";

const FIX: &str = "\
Enable GPUDirect RDMA on the node: load nvidia-peermem (modprobe nvidia-peermem; GPU operator:
driver.rdma.enabled=true), or use dma-buf with the NVIDIA open kernel modules on a 5.12+ kernel
(GPU operator: driver.useOpenKernelModules=true). On EFA: the EFA installer's efa_nv_peermem
(efa_installer.sh --enable-gdr; modprobe efa_nv_peermem).";

/// What was found of GPUDirect RDMA's providers, as evidence (the decision is the
/// prediction's: crate::predict's GDR rule, with its dma-buf gate and PXN).
fn provider_evidence(facts: &Facts, evidence: &mut Vec<String>) {
    let g = &facts.rdma.gdr;
    evidence.push(format!(
        "peer-memory module: {}; kernel {}; NVIDIA open kernel modules: {}",
        g.peermem_module
            .value()
            .cloned()
            .flatten()
            .as_deref()
            .unwrap_or("none"),
        g.kernel_release.value().map_or("?", String::as_str),
        match g.nvidia_open_modules.value().cloned().flatten() {
            Some(true) => "yes",
            Some(false) => "no",
            None => "unknown",
        }
    ));
    // EFA's own driver can reach GPU memory without nvidia-peermem: efa.ko built by the EFA
    // installer reports its peer-memory provider in sysfs (amzn-drivers efa_sysfs.c: `p2p`,
    // `gdr` before it).
    if let Some(d) = facts
        .rdma
        .devices
        .value()
        .and_then(|d| d.iter().find(|d| d.efa_p2p.is_some()))
    {
        evidence.push(format!(
            "EFA peer-memory provider ({}): {}",
            d.name,
            d.efa_p2p.as_deref().unwrap_or("")
        ));
    }
}

/// GPUDirect RDMA unavailable for `pairs` close pairs. Where the instance type requires
/// it, aws-ofi-nccl's init refuses ("GDR disabled on GDR-supported instance type",
/// src/platform-aws.cpp) and NCCL drops the plugin for its next network (src/net.cc
/// ncclNetInit skips a network whose init failed): TCP. Elsewhere NCCL stages inter-node
/// traffic through host memory. Either only where NCCL's traffic crosses nodes.
fn unavailable(facts: &Facts, pairs: usize, near: &str) -> Problem {
    let scope = Scope::of(facts);
    let platform = crate::platform::of(facts).is_some_and(|p| p.gdr_required);
    let across = if platform {
        Scope::tcp_instead(
            "EFA: aws-ofi-nccl refuses this instance type without GPUDirect RDMA (\"GDR disabled on GDR-supported instance type\")",
        )
    } else {
        staged("every buffer")
    };
    Problem::predicts(
        scope.in_use_outcome(false, across),
        format!(
            "{} GPU-NIC pair(s) {near} but GPUDirect RDMA is unavailable (no nvidia-peermem, no dma-buf){}",
            pairs,
            if platform {
                ": aws-ofi-nccl refuses to run on this instance type without it"
            } else {
                ": NCCL stages through host memory"
            }
        ),
        FIX,
    )
}

/// NCCL's NET transport without GPUDirect RDMA for `what`: staged through host memory.
fn staged(what: &str) -> Outcome {
    Outcome::degraded(
        format!("NET over RDMA with {what} staged through host memory"),
        "a copy through host memory on each send and receive: lower inter-node bandwidth, higher latency",
    )
}

/// ACS redirection above the close GPUs: GPUDirect RDMA between a GPU and a NIC below one
/// switch is peer traffic too, which redirection sends through the root complex
/// (topology::acs).
fn acs_redirection(
    facts: &Facts,
    close_gpus: &[String],
    evidence: &mut Vec<String>,
) -> Option<Problem> {
    let acs = crate::topology::acs::above(facts, close_gpus);
    if let Some(first) = acs.unreadable.first() {
        evidence.push(format!(
            "ACS of {} switch port(s) not read (first: {first})",
            acs.unreadable.len()
        ));
    }
    if acs.redirecting.is_empty() {
        return None;
    }
    let across = Outcome::degraded(
        "GPU-NIC traffic up through the root complex (ACS redirection)",
        "the root complex's bandwidth instead of the PCIe switch's, shared by every redirected pair",
    );
    let mut p = Problem::predicts(
        Scope::of(facts).in_use_outcome(false, across),
        format!(
            "ACS redirects peer traffic on {} PCIe switch port(s) above the GPUs that use GPUDirect RDMA: GPU-NIC traffic goes up through the root complex",
            acs.ports.len()
        ),
        crate::topology::acs::fix(&acs.ports),
    );
    p.evidence = acs.redirecting;
    Some(p)
}

/// GPUs NCCL reaches its NIC with beyond NCCL_NET_GDR_LEVEL (typically across CPU
/// sockets: SYS) while the node has a NIC within that level of the GPU which this
/// container was not given: the device plugins handed the pod a GPU and a NIC on
/// different sockets, so NCCL goes without GPUDirect RDMA for it and stages through host
/// memory over the inter-socket link (src/graph/paths.cc ncclTopoCheckGdr: distance >
/// netGdrLevel). The kubelet's topology manager keeps them together.
fn misaligned(facts: &Facts, predicted: &Prediction, level: &str) -> Option<Problem> {
    let m = crate::topology::affinity::matrix(facts)?;
    let within = |l: &str| crate::predict::path_rank(l) <= crate::predict::path_rank(level);
    let lines: Vec<String> = predicted
        .gdr
        .iter()
        .filter(|p| !p.in_reach)
        .filter_map(|p| {
            let row = m.gpus.iter().position(|g| *g == p.gpu)?;
            let (nic, l) = m
                .nics
                .iter()
                .zip(&m.levels[row])
                .find(|(n, l)| **n != p.nic && within(l))?;
            Some(format!(
                "GPU {} - {} at {} (the node's {nic} is at {l}, not this pod's)",
                p.gpu, p.nic, p.distance
            ))
        })
        .collect();
    let first = lines.first()?;
    let mut p = Problem::predicts(
        Scope::of(facts).in_use_outcome(
            false,
            staged("those GPUs' traffic, across the CPU sockets,"),
        ),
        format!(
            "{} GPU(s) reach this pod's NIC beyond NCCL_NET_GDR_LEVEL {level} while the node has a NIC near them: NCCL goes without GPUDirect RDMA for them (first: {first})",
            lines.len()
        ),
        "Give the pod the NICs next to its GPUs: set the kubelet's topology manager to align them \
(--topology-manager-policy=single-numa-node, or restricted, with topology hints from the GPU and RDMA \
device plugins), or request every NIC of the node.",
    )
    .blamed(Owner::Kubelet);
    p.evidence = lines;
    Some(p)
}

pub fn judge(facts: &Facts, predicted: &Prediction, _policy: &Policy) -> Finding {
    if predicted.gdr.is_empty() {
        return no_pair(facts, predicted);
    }
    let (level, user_set) = crate::predict::net_gdr_level(facts);
    let close: Vec<&GdrPair> = predicted.gdr.iter().filter(|p| p.in_reach).collect();
    let mut problems: Vec<Problem> = misaligned(facts, predicted, level).into_iter().collect();
    if close.is_empty() && problems.is_empty() {
        return Finding::skip(
            ID,
            format!(
                "no GPU within NCCL_NET_GDR_LEVEL{} of the NIC NCCL reaches it with: NCCL will not use GPUDirect RDMA here",
                if user_set {
                    format!("={level}")
                } else {
                    format!(" ({level})")
                }
            ),
        );
    }
    let (at, near) = if user_set {
        (
            format!("within NCCL_NET_GDR_LEVEL={level}"),
            format!("are within NCCL_NET_GDR_LEVEL={level}"),
        )
    } else {
        ("at PIX/PXB".to_string(), "share a PCIe switch".to_string())
    };
    let mut evidence: Vec<String> = close.iter().map(|p| pair_line(p)).collect();
    provider_evidence(facts, &mut evidence);
    let provider = close.iter().find_map(|p| p.provider.as_deref());
    match provider {
        Some(_) => {
            let gpus: Vec<String> = close.iter().map(|p| p.gpu.clone()).collect();
            problems.extend(acs_redirection(facts, &gpus, &mut evidence));
        }
        None if !close.is_empty() => problems.push(unavailable(facts, close.len(), &near)),
        None => {}
    }
    let summary = provider.map_or_else(
        || "NCCL uses no GPUDirect RDMA here".to_string(),
        |v| {
            format!(
                "GPUDirect RDMA through {v} for {} GPU-NIC pair(s) {at}",
                close.len()
            )
        },
    );
    super::combine(ID, summary, evidence, problems)
}

/// One GPU and the NIC NCCL reaches it with, as NCCL decides it.
fn pair_line(p: &GdrPair) -> String {
    let via = p
        .via
        .as_ref()
        .map_or(String::new(), |v| format!(" through NVLink peer {v} (PXN)"));
    format!("GPU {} - {}: {}{via}: {}", p.gpu, p.nic, p.distance, p.why)
}

/// No GPU-NIC pair to judge: a skip, unless one side could not be read while the other
/// is there (unreadable is not absent): the RDMA devices with GPUs present (issue 31 row
/// 8), or the GPUs' PCI functions with RDMA devices present (issue 39 re-run: "no GPU and
/// RDMA device pair" on a p5 whose /sys/bus/pci/devices was unreadable). Then could not
/// determine, failing when the job spans nodes. Both readable, with no pair NCCL would
/// use: NCCL's inter-node path does not go through an RDMA NIC.
fn no_pair(facts: &Facts, predicted: &Prediction) -> Finding {
    let gpus = facts.gpus.pci_gpus.value().is_some_and(|g| !g.is_empty())
        || facts.gpus.nvml.loaded().is_some_and(|n| !n.gpus.is_empty());
    let nics = facts.rdma.devices.value().is_some_and(|d| !d.is_empty());
    let readable = "readable in the container (sysfs mounted read-only is enough)";
    let (what, e) = match (facts.rdma.devices.error(), facts.gpus.pci_gpus.error()) {
        (Some(e), _) if gpus => ("/sys/class/infiniband", e),
        (_, Some(e)) if nics => ("/sys/bus/pci/devices (the GPUs' PCI functions)", e),
        _ if nics && gpus => {
            return Finding::skip(
                ID,
                format!(
                    "NCCL sends no inter-node traffic through an RDMA NIC here ({}): GPUDirect RDMA is not used",
                    predicted.inter_node.why
                ),
            );
        }
        _ => return Finding::skip(ID, "no GPU and RDMA device pair on this node"),
    };
    let scope = super::rdma_scope::Scope::of(facts);
    Finding::predicts(
        ID,
        Outcome::undetermined("whether NCCL's NICs reach the GPUs' memory directly"),
        format!(
            "could not determine whether GPUDirect RDMA is possible: {what} could not be read; {}",
            scope.span_words()
        ),
        format!(
            "Make {} {readable}.",
            what.split(' ').next().unwrap_or(what)
        ),
    )
    .evidence(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::Observed;
    use crate::finding::Status;
    use crate::test_facts::{healthy, rdma_device, with_rdma};

    /// The judge as the run calls it, with the prediction made from the same facts.
    fn judge(facts: &Facts, policy: &Policy) -> Finding {
        crate::test_facts::judged(super::judge, facts, policy)
    }

    /// Issue 39, re-run of unreadable sysfs: /sys/bus/pci/devices unreadable on a node
    /// with RDMA devices said "no GPU and RDMA device pair on this node". Expected: could
    /// not determine, naming the directory, a warning in a job of 16 nodes; the RDMA side
    /// unreadable still says so (issue 31 row 8).
    #[test]
    fn unreadable_gpu_pci_functions_beside_rdma_devices_are_could_not_determine() {
        let mut f = close_pair();
        f.gpus.pci_gpus = Observed::Error(crate::facts::FactError::new(
            "/sys/bus/pci/devices",
            "Permission denied (os error 13)",
        ));
        f.nodes = Some(16);
        let j = judge(&f, &Policy::default());
        // Issue 36: undetermined, a warning by the outcome mapping.
        assert_eq!(j.status(), Status::Warn, "{j:?}");
        assert!(j.is_undetermined());
        assert!(
            j.summary.starts_with(
                "could not determine whether GPUDirect RDMA is possible: /sys/bus/pci/devices (the GPUs' PCI functions) could not be read"
            ),
            "{}",
            j.summary
        );
    }

    /// GPU 0 of the healthy node and a NIC behind the same switch.
    fn close_pair() -> Facts {
        let mut f = healthy();
        if let Observed::Value(g) = &mut f.gpus.pci_gpus {
            g[0].sysfs_path =
                Some("/sys/devices/pci0000:00/0000:00:01.0/0000:e0:00.0/0000:00:06.0".into());
        }
        with_rdma(
            f,
            vec![rdma_device(
                "mlx5_0",
                "mlx5_core",
                "0000:17:00.0",
                "/sys/devices/pci0000:00/0000:00:01.0/0000:e0:00.0/0000:17:00.0",
                "ACTIVE",
                "InfiniBand",
            )],
        )
    }

    /// Locality (issue 36), the verdict written from NVIDIA/nccl v2.28.9-1
    /// src/graph/paths.cc before the judge ran: GPU 0 shares a switch with mlx5_0, which
    /// this pod was not given; its NIC, mlx5_1, sits on the other CPU socket (SYS), beyond
    /// NCCL_NET_GDR_LEVEL's PXB, and no NVLink peer brings it closer (no PXN). NCCL goes
    /// without GPUDirect RDMA for it (ncclTopoCheckGdr), staging through host memory over
    /// the inter-socket link: degraded, the kubelet's (it handed out GPU and NIC apart).
    #[test]
    fn a_nic_across_the_socket_from_its_gpu_while_a_near_one_exists_warns() {
        let mut f = close_pair();
        if let crate::facts::gpu::LibraryState::Loaded(n) = &mut f.gpus.nvml.state {
            for g in &mut n.gpus {
                g.nvlinks.clear();
            }
        }
        let mut far = rdma_device(
            "mlx5_1",
            "mlx5_core",
            "0000:81:00.0",
            "/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0",
            "ACTIVE",
            "InfiniBand",
        );
        far.numa_node = Some(1);
        let mut devices = f.rdma.devices.value().cloned().unwrap_or_default();
        devices.push(far);
        let mut f = with_rdma(f, devices);
        if let Observed::Value(u) = &mut f.rdma.uverbs {
            u.retain(|n| n.ibdev.as_deref() == Some("mlx5_1"));
        }
        if let Observed::Value(g) = &mut f.gpus.pci_gpus {
            g[0].numa_node = Some(0);
        }
        let finding = crate::judge::blame(judge(&f, &Policy::default()));
        assert_eq!(finding.status(), Status::Warn, "{finding:?}");
        assert!(
            finding.summary.contains("beyond NCCL_NET_GDR_LEVEL PXB"),
            "{}",
            finding.summary
        );
        assert_eq!(
            finding.blame(),
            Some(crate::finding::Blame::Node),
            "{finding:?}"
        );
        assert!(finding.remediation().unwrap().contains("topology manager"));
        // Given mlx5_0 too, NCCL reaches GPU 0 through it at PIX: no locality problem.
        let mut given = f.clone();
        given.rdma.uverbs = close_pair().rdma.uverbs;
        if let Observed::Value(u) = &mut given.rdma.uverbs {
            u.push(crate::facts::rdma::UverbsNode {
                name: "uverbs1".into(),
                ibdev: Some("mlx5_1".into()),
                ibdev_error: None,
                open: Some(crate::facts::rdma::Openable { refused: None }),
            });
        }
        let finding = judge(&given, &Policy::default());
        assert!(
            !finding.summary.contains("beyond NCCL_NET_GDR_LEVEL"),
            "{finding:?}"
        );
    }

    #[test]
    fn needs_peermem_or_dmabuf() {
        assert_eq!(judge(&healthy(), &Policy::default()).status(), Status::Skip);
        let f = judge(&close_pair(), &Policy::default());
        assert_eq!(
            (f.status(), f.summary.contains("dma-buf")),
            (Status::Pass, true),
            "{f:?}"
        );
        let mut old = close_pair();
        old.rdma.gdr.kernel_release = Observed::Value("5.4.0-150-generic".into());
        assert_eq!(judge(&old, &Policy::default()).status(), Status::Warn);
        // Issue 36: on a p5 aws-ofi-nccl refuses to start without GDR and NCCL drops it
        // for its next network (src/net.cc ncclNetInit): TCP, a degraded run, not a failure.
        old.platform.product_name = Observed::Value(Some("p5.48xlarge".into()));
        let f = judge(&old, &Policy::default());
        assert_eq!(f.status(), Status::Warn);
        assert!(
            matches!(f.outcome(), Some(Outcome::Degraded { path, .. }) if path.contains("NET/Socket")),
            "{f:?}"
        );
        old.rdma.gdr.peermem_module = Observed::Value(Some("nvidia_peermem".into()));
        assert_eq!(judge(&old, &Policy::default()).status(), Status::Pass);
    }

    /// A p5 whose EFA driver brings its own GPU peer memory: no nvidia-peermem, no dma-buf.
    fn efa_p5(p2p: Option<&str>) -> Facts {
        let mut f = close_pair();
        if let Observed::Value(d) = &mut f.rdma.devices {
            d[0].name = "rdmap16s27".into();
            d[0].driver = Some("efa".into());
            d[0].efa_p2p = p2p.map(String::from);
        }
        if let Observed::Value(u) = &mut f.rdma.uverbs {
            u[0].ibdev = Some("rdmap16s27".into());
        }
        f.rdma.gdr.kernel_release = Observed::Value("5.10.0-1-aws".into());
        f.platform.product_name = Observed::Value(Some("p5.48xlarge".into()));
        crate::test_facts::with_ofi_plugin(f)
    }

    #[test]
    fn regression_efa_gdr_from_efas_own_driver() {
        let f = judge(&efa_p5(Some("NVIDIA")), &Policy::default());
        assert_eq!(f.status(), Status::Pass, "{f:?}");
        assert!(f.summary.contains("EFA's driver"), "{}", f.summary);
        assert_eq!(
            judge(&efa_p5(Some("gdr 1")), &Policy::default()).status(),
            Status::Pass
        );
        let f = judge(&efa_p5(None), &Policy::default());
        assert_eq!(f.status(), Status::Warn);
        assert!(f.remediation().unwrap().contains("efa_nv_peermem"));
        // One node: NCCL sends nothing through the NIC, so a missing GDR changes nothing.
        let single = crate::test_facts::with_env(efa_p5(None), &[("PET_NNODES", "1")]);
        assert_eq!(judge(&single, &Policy::default()).status(), Status::Pass);
    }
}
