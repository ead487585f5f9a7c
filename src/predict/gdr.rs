//! Whether GPUDirect RDMA is used between each GPU and the NIC NCCL reaches it with,
//! and why not, from src/graph/paths.cc ncclTopoCheckGdr (v2.12-v2.28): the NIC and
//! GPU must support it (nvidia-peermem, dma-buf, EFA's own provider), and their PCI
//! distance must be at most NCCL_NET_GDR_LEVEL (default PXB); a GPU that reaches the
//! NIC through an NVLink peer (PXN, since 2.12) counts the peer's distance.

use super::env;
use crate::facts::Facts;
use crate::facts::rdma::kernel_version;
use crate::nccl::Version;
use crate::nccl::version::{self, since};
use crate::topology::affinity;
use serde::{Deserialize, Serialize};

/// NCCL's path types in order (src/include/graph.h PATH_*, v2.28); NCCL_NET_GDR_LEVEL
/// and NCCL_P2P_LEVEL take these names.
pub(crate) const PATH_TYPES: [&str; 10] = [
    "LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "PXN", "P2C", "PHB", "SYS",
];

/// The numeric levels before names (paths.cc levelsOldToNew: LOC, PIX, PXB, PHB, SYS, SYS).
const OLD_LEVELS: [&str; 6] = ["LOC", "PIX", "PXB", "PHB", "SYS", "SYS"];

/// The rank of a path type name; nvidia-smi's NODE (between host bridges of one CPU)
/// is NCCL's PHB.
pub(crate) fn rank(name: &str) -> usize {
    let name = if name == "NODE" { "PHB" } else { name };
    PATH_TYPES
        .iter()
        .position(|p| *p == name)
        .unwrap_or(PATH_TYPES.len())
}

/// A level variable's value (ncclGetLevel): a path type name, or a legacy number.
pub(crate) fn user_level(value: &str) -> Option<&'static str> {
    let v = value.trim();
    if let Ok(n) = v.parse::<usize>() {
        return OLD_LEVELS.get(n).copied();
    }
    PATH_TYPES
        .iter()
        .find(|p| p.eq_ignore_ascii_case(v))
        .copied()
}

/// NCCL_NET_GDR_LEVEL as ncclTopoCheckGdr reads it (src/graph/paths.cc, v2.13-v2.30:
/// `netGdrLevel = PATH_PXB` unless the user's level parses): the level in force, and
/// whether the user set it.
pub fn net_gdr_level(facts: &Facts) -> (&'static str, bool) {
    match env(facts, "NCCL_NET_GDR_LEVEL").and_then(user_level) {
        Some(l) => (l, true),
        None => ("PXB", false),
    }
}

/// One GPU and the NIC its inter-node traffic uses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GdrPair {
    /// The GPU's PCI bus id.
    pub gpu: String,
    pub nic: String,
    /// The PCI distance NCCL compares (PIX, PXB, PHB, SYS).
    pub distance: String,
    /// The NVLink peer GPU whose distance counts (PXN), when there is one.
    pub via: Option<String>,
    /// Something lets the NIC reach GPU memory (nvidia-peermem, dma-buf, EFA's driver).
    pub supported: bool,
    /// What does: the peer-memory module, `EFA's driver (...)` or `dma-buf`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// The distance is within NCCL_NET_GDR_LEVEL: NCCL uses GPUDirect RDMA here when
    /// something provides it.
    #[serde(default)]
    pub in_reach: bool,
    pub used: bool,
    pub why: String,
}

/// What lets the NIC reach GPU memory, `None` when nothing does.
pub(crate) fn provider(facts: &Facts, version: Option<Version>) -> Option<String> {
    let g = &facts.rdma.gdr;
    if let Some(m) = g.peermem_module.value().cloned().flatten() {
        return Some(m);
    }
    let efa = facts.rdma.devices.value().and_then(|d| {
        d.iter()
            .find_map(|d| {
                d.efa_p2p
                    .as_deref()
                    .filter(|p| p.to_ascii_uppercase().contains("NVIDIA") || *p == "gdr 1")
            })
            .map(|p| format!("EFA's driver ({p})"))
    });
    if efa.is_some() {
        return efa;
    }
    // ncclIbDmaBufSupport: ibv_reg_dmabuf_mr (kernel 5.12+) and CUDA dma-buf handles
    // (the open kernel modules); NCCL reads them since 2.13.
    let kernel = g.kernel_release.value().and_then(|k| kernel_version(k));
    let open = g.nvidia_open_modules.value().cloned().flatten() == Some(true);
    (kernel.is_some_and(|k| k >= (5, 12)) && open && since(version, version::DMABUF))
        .then(|| "dma-buf".to_string())
}

pub(super) fn predict(facts: &Facts, version: Option<Version>, nics: &[String]) -> Vec<GdrPair> {
    let (Some(gpus), Some(devices)) = (facts.gpus.pci_gpus.value(), facts.rdma.devices.value())
    else {
        return Vec::new();
    };
    let used: Vec<_> = devices.iter().filter(|d| nics.contains(&d.name)).collect();
    let (level, _) = net_gdr_level(facts);
    let provider = provider(facts, version);
    let pxn = since(version, version::PXN)
        && env(facts, "NCCL_PXN_DISABLE").is_none_or(|v| v.trim() != "1");
    let distance = |g: &crate::facts::gpu::PciGpu, n: &crate::facts::rdma::RdmaDevice| match (
        &g.sysfs_path,
        &n.sysfs_path,
    ) {
        (Some(a), Some(b)) => affinity::level(a, b, g.numa_node, n.numa_node),
        _ => "SYS",
    };
    let nearest = |g: &crate::facts::gpu::PciGpu| {
        used.iter()
            .map(|n| (distance(g, n), n.name.clone()))
            .min_by_key(|(d, _)| rank(d))
    };
    gpus.iter()
        .filter_map(|g| {
            let (mut dist, nic) = nearest(g)?;
            let mut via = None;
            if pxn
                && rank(dist) > rank("PXB")
                && let Some((peer, d)) = nvlink_peer_near(facts, g, &nic, &distance)
            {
                via = Some(peer);
                dist = d;
            }
            let ok = rank(dist) <= rank(level);
            let why = match (&provider, ok) {
                (None, _) => {
                    "nothing lets the NIC reach GPU memory (no nvidia-peermem, no dma-buf)"
                        .to_string()
                }
                (Some(p), true) => format!(
                    "distance {dist} <= NCCL_NET_GDR_LEVEL {level}, through {p}; {}",
                    sends(facts, version, g)
                ),
                (Some(_), false) => format!(
                    "distance {dist} > NCCL_NET_GDR_LEVEL {level}: staged through host memory"
                ),
            };
            Some(GdrPair {
                gpu: g.bus_id.clone(),
                nic,
                distance: dist.to_string(),
                via,
                supported: provider.is_some(),
                provider: provider.clone(),
                in_reach: ok,
                used: provider.is_some() && ok,
                why,
            })
        })
        .collect()
}

/// Whether sends use GPUDirect RDMA too (GDR read), in words. ncclTopoCheckGdr's read
/// branch (src/graph/paths.cc): NCCL_NET_GDR_READ decides when set; by default, before
/// v2.19.1-1 only a GPU with an NVLink peer (or alone on the node) reads; from v2.19.1-1
/// every GPU of compute capability 8.0 or more does, older ones as before.
fn sends(facts: &Facts, version: Option<Version>, gpu: &crate::facts::gpu::PciGpu) -> &'static str {
    if let Some(v) = super::int_param(facts, "NCCL_NET_GDR_READ") {
        return if v != 0 {
            "sends too (NCCL_NET_GDR_READ)"
        } else {
            "receives only: sends staged (NCCL_NET_GDR_READ=0)"
        };
    }
    let nvml = facts.gpus.nvml.loaded();
    let me = nvml.and_then(|n| {
        n.gpus.iter().find(|x| {
            x.pci_bus_id
                .value()
                .is_some_and(|b| same_bus(b, &gpu.bus_id))
        })
    });
    let ampere_or_newer = me
        .and_then(|g| g.compute_capability.value())
        .and_then(|c| c.split('.').next()?.parse::<u32>().ok())
        .is_some_and(|major| major >= 8);
    let alone_or_nvlink = nvml.is_some_and(|n| {
        n.gpus.len() == 1
            || me.is_some_and(|m| {
                n.gpus.iter().any(|p| {
                    p.index != m.index && crate::topology::matrix::nvlinks_between(m, p) > 0
                })
            })
    });
    if (since(version, version::GDR_READ_SM80) && ampere_or_newer) || alone_or_nvlink {
        "sends too (GDR read)"
    } else {
        "receives only: sends staged through host memory (GDR read needs an NVLink peer before NCCL 2.19, or compute capability 8.0+ from 2.19)"
    }
}

/// An NVLink peer of `gpu` within PXB of `nic` (ncclTopoComputePaths' PXN rule), and
/// its distance.
fn nvlink_peer_near(
    facts: &Facts,
    gpu: &crate::facts::gpu::PciGpu,
    nic: &str,
    distance: &dyn Fn(&crate::facts::gpu::PciGpu, &crate::facts::rdma::RdmaDevice) -> &'static str,
) -> Option<(String, &'static str)> {
    let nvml = facts.gpus.nvml.loaded()?;
    let me = nvml.gpus.iter().find(|n| {
        n.pci_bus_id
            .value()
            .is_some_and(|b| same_bus(b, &gpu.bus_id))
    })?;
    let nic = facts.rdma.devices.value()?.iter().find(|d| d.name == nic)?;
    facts.gpus.pci_gpus.value()?.iter().find_map(|peer| {
        let p = nvml.gpus.iter().find(|n| {
            n.pci_bus_id
                .value()
                .is_some_and(|b| same_bus(b, &peer.bus_id))
        })?;
        let d = distance(peer, nic);
        (p.index != me.index
            && crate::topology::matrix::nvlinks_between(me, p) > 0
            && rank(d) <= rank("PXB"))
        .then(|| (peer.bus_id.clone(), d))
    })
}

/// NVML prints 8-digit domains (`00000000:53:00.0`), sysfs 4 (`0000:53:00.0`).
fn same_bus(nvml: &str, sysfs: &str) -> bool {
    nvml.to_ascii_lowercase()
        .ends_with(&sysfs.to_ascii_lowercase())
        || sysfs
            .to_ascii_lowercase()
            .ends_with(&nvml.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gdr_read_by_version_and_nvlink() {
        let mut f = crate::test_facts::healthy();
        let gpu = f.gpus.pci_gpus.value().unwrap()[0].clone();
        // H200 pair over NVLink: sends use GDR in every release.
        assert_eq!(
            sends(&f, Some(Version::new(2, 18, 3)), &gpu),
            "sends too (GDR read)"
        );
        // A PCIe-only L40S pair (sm_89): receives only before 2.19, sends too from 2.19.
        if let crate::facts::gpu::LibraryState::Loaded(n) = &mut f.gpus.nvml.state {
            for g in &mut n.gpus {
                g.nvlinks.clear();
                g.compute_capability = crate::facts::Observed::Value("8.9".into());
            }
        }
        assert!(sends(&f, Some(Version::new(2, 18, 3)), &gpu).starts_with("receives only"));
        assert_eq!(
            sends(&f, Some(Version::new(2, 19, 3)), &gpu),
            "sends too (GDR read)"
        );
        let off = crate::test_facts::with_env(f, &[("NCCL_NET_GDR_READ", "0")]);
        assert!(sends(&off, Some(Version::new(2, 28, 9)), &gpu).contains("NCCL_NET_GDR_READ=0"));
    }

    #[test]
    fn levels_and_ranks() {
        assert_eq!(user_level("pxb"), Some("PXB"));
        assert_eq!(user_level("2"), Some("PXB"));
        assert_eq!(user_level("5"), Some("SYS"));
        assert_eq!(user_level("bogus"), None);
        assert!(
            rank("PIX") < rank("PXB") && rank("PXB") < rank("NODE") && rank("NODE") < rank("SYS")
        );
        assert!(rank("NVL") < rank("PIX"));
        assert!(same_bus("00000000:53:00.0", "0000:53:00.0"));
    }
}
