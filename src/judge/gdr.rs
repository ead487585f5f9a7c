//! `gdr`: GPUDirect RDMA for GPU-NIC pairs that share a PCIe switch (PIX or
//! PXB, where NCCL uses it by default). It needs nvidia-peermem, or dma-buf
//! (kernel 5.12+ with the NVIDIA open kernel modules). aws-ofi-nccl refuses to
//! run without it on p4d/p5-class instances ("GDR disabled on GDR-supported
//! instance type", FACTS.md section 2).

use super::Finding;
use crate::facts::Facts;
use crate::facts::rdma::kernel_version;
use crate::finding::Severity;
use crate::policy::Policy;
use crate::topology::affinity;

pub const ID: &str = "gdr";

const FIX: &str = "\
Enable GPUDirect RDMA on the node: load nvidia-peermem (modprobe nvidia-peermem; GPU operator:
driver.rdma.enabled=true), or use dma-buf with the NVIDIA open kernel modules on a 5.12+ kernel
(GPU operator: driver.useOpenKernelModules=true). On EFA: the EFA installer's efa_nv_peermem
(efa_installer.sh --enable-gdr; modprobe efa_nv_peermem).";

/// GPU-NIC pairs within `level` (NCCL_NET_GDR_LEVEL, PXB by default: those sharing a
/// PCIe switch), as lines, and their GPUs. ncclTopoCheckGdr (src/graph/paths.cc, every
/// release 2.13-2.30) tries GPUDirect RDMA exactly where distance <= level.
fn close_pairs(m: &affinity::AffinityMatrix, level: &str) -> (Vec<String>, Vec<String>) {
    let mut close = Vec::new();
    let mut close_gpus = Vec::new();
    let within = |l: &str| crate::predict::path_rank(l) <= crate::predict::path_rank(level);
    for (i, gpu) in m.gpus.iter().enumerate() {
        for (j, nic) in m.nics.iter().enumerate() {
            if within(&m.levels[i][j]) {
                close.push(format!("GPU {gpu} - {nic}: {}", m.levels[i][j]));
                if !close_gpus.contains(gpu) {
                    close_gpus.push(gpu.clone());
                }
            }
        }
    }
    (close, close_gpus)
}

/// How GPUDirect RDMA would work here (the peer-memory module, EFA's own provider, or
/// dma-buf), with what was found as evidence; `None` when nothing provides it.
fn gdr_path(facts: &Facts, evidence: &mut Vec<String>) -> Option<String> {
    let g = &facts.rdma.gdr;
    let peermem = g.peermem_module.value().cloned().flatten();
    let kernel = g.kernel_release.value().cloned();
    let dmabuf_kernel = kernel
        .as_deref()
        .and_then(kernel_version)
        .is_some_and(|v| v >= (5, 12));
    let open_modules = g.nvidia_open_modules.value().cloned().flatten() == Some(true);
    evidence.push(format!(
        "peer-memory module: {}; kernel {}; NVIDIA open kernel modules: {}",
        peermem.as_deref().unwrap_or("none"),
        kernel.as_deref().unwrap_or("?"),
        match g.nvidia_open_modules.value().cloned().flatten() {
            Some(true) => "yes",
            Some(false) => "no",
            None => "unknown",
        }
    ));
    // EFA's own driver can reach GPU memory without nvidia-peermem: efa.ko built by the EFA
    // installer reports its peer-memory provider in sysfs (amzn-drivers efa_sysfs.c: `p2p`,
    // `gdr` before it); a provider naming NVIDIA is what aws-ofi-nccl's GDR needs.
    let efa_p2p = facts.rdma.devices.value().and_then(|d| {
        d.iter().find_map(|d| {
            d.efa_p2p
                .as_deref()
                .filter(|p| p.to_ascii_uppercase().contains("NVIDIA") || *p == "gdr 1")
                .map(|p| format!("EFA's driver ({}: {p})", d.name))
        })
    });
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
    if let Some(m) = &peermem {
        Some(m.clone())
    } else if let Some(efa) = efa_p2p {
        Some(efa)
    } else if dmabuf_kernel && open_modules {
        Some("dma-buf".to_string())
    } else {
        None
    }
}

/// GPUDirect RDMA unavailable for `pairs` close pairs: a failure where the instance type
/// requires it and the job crosses nodes through a NIC this container uses.
fn unavailable(facts: &Facts, pairs: usize, near: &str) -> Finding {
    // GDR matters where NCCL's traffic crosses nodes through a NIC this container uses.
    let scope = super::rdma_scope::Scope::of(facts);
    let required = crate::platform::of(facts).is_some_and(|p| p.gdr_required)
        && scope.in_use()
        && scope.in_use_status(false) == Severity::Fail;
    Finding::flagged(
        ID,
        if required {
            Severity::Fail
        } else {
            Severity::Warn
        },
        format!(
            "{} GPU-NIC pair(s) {near} but GPUDirect RDMA is unavailable (no nvidia-peermem, no dma-buf){}",
            pairs,
            if required {
                ": aws-ofi-nccl refuses to run on this instance type without it"
            } else {
                ": NCCL stages through host memory"
            }
        ),
        FIX,
    )
}

/// ACS redirection above the close GPUs: GPUDirect RDMA between a GPU and a NIC below one
/// switch is peer traffic too, which redirection sends through the root complex
/// (topology::acs). A pass becomes a warning.
fn acs_redirection(
    facts: &Facts,
    mut f: Finding,
    close_gpus: &[String],
    evidence: &mut Vec<String>,
) -> Finding {
    let acs = crate::topology::acs::above(facts, close_gpus);
    if !acs.redirecting.is_empty() {
        evidence.extend(acs.redirecting.iter().cloned());
        if f.status() == crate::finding::Status::Pass {
            f = Finding::warn(
                ID,
                format!(
                    "{}, but ACS redirects peer traffic on {} PCIe switch port(s) above those GPUs: GPU-NIC traffic goes up through the root complex",
                    f.summary,
                    acs.ports.len()
                ),
                crate::topology::acs::fix(&acs.ports),
            );
        }
    }
    if let Some(first) = acs.unreadable.first() {
        evidence.push(format!(
            "ACS of {} switch port(s) not read (first: {first})",
            acs.unreadable.len()
        ));
    }
    f
}

pub fn judge(facts: &Facts, _policy: &Policy) -> Finding {
    let Some(m) = affinity::matrix(facts) else {
        return no_pair(facts);
    };
    let (level, user_set) = crate::predict::net_gdr_level(facts);
    let (close, close_gpus) = close_pairs(&m, level);
    if close.is_empty() {
        return Finding::skip(
            ID,
            if user_set {
                format!(
                    "no GPU-NIC pair within NCCL_NET_GDR_LEVEL={level}: NCCL will not use GPUDirect RDMA here"
                )
            } else {
                "no GPU shares a PCIe switch with an RDMA device: NCCL will not use GPUDirect RDMA here".to_string()
            },
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
    let mut evidence = close.clone();
    let f = match gdr_path(facts, &mut evidence) {
        Some(v) => Finding::pass(
            ID,
            format!(
                "GPUDirect RDMA possible through {v} for {} GPU-NIC pair(s) {at}",
                close.len()
            ),
        ),
        None => unavailable(facts, close.len(), &near),
    };
    let mut f = acs_redirection(facts, f, &close_gpus, &mut evidence);
    f.evidence = evidence;
    f
}

/// No GPU-NIC pair to judge: a skip, unless one side could not be read while the other
/// is there (unreadable is not absent): the RDMA devices with GPUs present (issue 31 row
/// 8), or the GPUs' PCI functions with RDMA devices present (issue 39 re-run: "no GPU and
/// RDMA device pair" on a p5 whose /sys/bus/pci/devices was unreadable). Then could not
/// determine, failing when the job spans nodes.
fn no_pair(facts: &Facts) -> Finding {
    let gpus = facts.gpus.pci_gpus.value().is_some_and(|g| !g.is_empty())
        || facts.gpus.nvml.loaded().is_some_and(|n| !n.gpus.is_empty());
    let nics = facts.rdma.devices.value().is_some_and(|d| !d.is_empty());
    let readable = "readable in the container (sysfs mounted read-only is enough)";
    let (what, e) = match (facts.rdma.devices.error(), facts.gpus.pci_gpus.error()) {
        (Some(e), _) if gpus => ("/sys/class/infiniband", e),
        (_, Some(e)) if nics => ("/sys/bus/pci/devices (the GPUs' PCI functions)", e),
        _ => return Finding::skip(ID, "no GPU and RDMA device pair on this node"),
    };
    let scope = super::rdma_scope::Scope::of(facts);
    Finding::flagged(
        ID,
        scope.missing_status(false),
        format!(
            "could not determine whether GPUDirect RDMA is possible: {what} could not be read; {}",
            scope.span_words()
        ),
        format!(
            "Make {} {readable}.",
            what.split(' ').next().unwrap_or(what)
        ),
    )
    .undetermined()
    .evidence(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::Observed;
    use crate::finding::Status;
    use crate::test_facts::{healthy, rdma_device, with_rdma};

    /// Issue 39, re-run of unreadable sysfs: /sys/bus/pci/devices unreadable on a node
    /// with RDMA devices said "no GPU and RDMA device pair on this node". Expected: could
    /// not determine, naming the directory, a failure in a job of 16 nodes; the RDMA side
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
        assert_eq!(j.status(), Status::Fail, "{j:?}");
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
        old.platform.product_name = Observed::Value(Some("p5.48xlarge".into()));
        assert_eq!(judge(&old, &Policy::default()).status(), Status::Fail);
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
        f
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
        assert_eq!(f.status(), Status::Fail);
        assert!(f.remediation().unwrap().contains("efa_nv_peermem"));
        // One node: NCCL sends nothing through the NIC, so a missing GDR only warns.
        let single = crate::test_facts::with_env(efa_p5(None), &[("PET_NNODES", "1")]);
        assert_eq!(judge(&single, &Policy::default()).status(), Status::Warn);
    }
}
