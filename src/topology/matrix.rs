//! Pair links in nvidia-smi's notation: `X` (self), `NV#` (# bonded NVLinks),
//! `PIX`, `PXB`, `PHB`, `NODE`, `SYS` (FACTS.md section 6), from NVML's common
//! ancestor and the GPUs' active NVLinks.

use crate::facts::gpu::{GpuPair, NvmlFacts, NvmlGpu};

/// nvidia-smi's label for NVML's common-ancestor level.
fn pcie_label(level: &str) -> &'static str {
    match level {
        "INTERNAL" => "X",
        "SINGLE" => "PIX",
        "MULTIPLE" => "PXB",
        "HOSTBRIDGE" => "PHB",
        "NODE" => "NODE",
        "SYSTEM" => "SYS",
        _ => "?",
    }
}

fn active_links(gpu: &NvmlGpu) -> impl Iterator<Item = &crate::facts::gpu::NvLink> {
    gpu.nvlinks.iter().filter(|l| l.active)
}

fn switch_links(gpu: &NvmlGpu) -> usize {
    active_links(gpu)
        .filter(|l| l.remote_type.value().is_some_and(|t| t == "switch"))
        .count()
}

/// NVLinks between `a` and `b`: direct links from `a` whose far end is `b`, or,
/// when both reach NVSwitches, the smaller of their switch link counts (an
/// NVSwitch fabric joins every pair with all of them, which nvidia-smi prints
/// as NV18 on H100/H200; a GPU with a link down limits every pair it is in).
pub fn nvlinks_between(a: &NvmlGpu, b: &NvmlGpu) -> usize {
    let Some(b_bus) = b.pci_bus_id.value() else {
        return 0;
    };
    let direct = active_links(a)
        .filter(|l| l.remote_pci_bus_id.value() == Some(b_bus))
        .count();
    if direct > 0 {
        return direct;
    }
    switch_links(a).min(switch_links(b))
}

/// The label for the ordered pair (a, b).
pub fn link_label(facts: &NvmlFacts, a: u32, b: u32) -> String {
    if a == b {
        return "X".into();
    }
    let (Some(ga), Some(gb)) = (gpu(facts, a), gpu(facts, b)) else {
        return "?".into();
    };
    let n = nvlinks_between(ga, gb);
    if n > 0 {
        return format!("NV{n}");
    }
    // No link read between them is no link only where every link state was read.
    if ga.nvlinks_unread.is_some() || gb.nvlinks_unread.is_some() {
        return "?".into();
    }
    pair(facts, a, b)
        .and_then(|p| p.common_ancestor.as_ref()?.value())
        .map_or("?".into(), |l| pcie_label(l).to_string())
}

pub fn gpu(facts: &NvmlFacts, index: u32) -> Option<&NvmlGpu> {
    facts.gpus.iter().find(|g| g.index == index)
}

pub fn pair(facts: &NvmlFacts, a: u32, b: u32) -> Option<&GpuPair> {
    facts.pairs.iter().find(|p| p.a == a && p.b == b)
}

/// True when any two visible GPUs share NVLink.
pub fn has_nvlink(facts: &NvmlFacts) -> bool {
    facts.gpus.iter().any(|g| active_links(g).next().is_some())
}

#[cfg(test)]
pub(crate) mod fixtures {
    //! Literal NVML facts for unit tests.
    use crate::facts::Observed;
    use crate::facts::gpu::*;

    pub fn gpu(index: u32, bus: &str, links: Vec<NvLink>) -> NvmlGpu {
        NvmlGpu {
            index,
            name: Observed::Value("NVIDIA H200".into()),
            uuid: Observed::Value(format!("GPU-{index:08}")),
            pci_bus_id: Observed::Value(bus.into()),
            compute_capability: Observed::Value("9.0".into()),
            memory_bytes: Observed::Value(150_754_820_096),
            numa_node: Observed::Value(0),
            numa_affinity: Some(Observed::Value("0".into())),
            cpu_affinity: Some(Observed::Value("0-31".into())),
            persistence_mode: Observed::Value(true),
            mig_mode: Observed::Value(false),
            nvlink_speed_mbps: Observed::Value(26562),
            pcie_max_generation: Observed::Value(5),
            pcie_max_width: Observed::Value(16),
            fabric_state: Observed::Value(crate::facts::gpu::FabricState::Completed),
            fabric_clique: None,
            nvlinks: links,
            nvlinks_unread: None,
            read_paths: Default::default(),
            health: Some(GpuHealth {
                ecc_uncorrected_volatile: Observed::Value(0),
                remapped_rows: Observed::Value(RemappedRows {
                    correctable: 0,
                    uncorrectable: 0,
                    pending: false,
                    failure: false,
                }),
                retired_pages_pending: Observed::Value(false),
                recovery_action: Observed::Value(0),
            }),
        }
    }

    pub fn link(link: u32, active: bool, remote: &str, kind: &str) -> NvLink {
        NvLink {
            link,
            active,
            version: Observed::Value("4.0".into()),
            remote_pci_bus_id: Observed::Value(remote.into()),
            remote_type: Observed::Value(kind.into()),
            error_counters: Default::default(),
        }
    }

    pub fn pair(a: u32, b: u32, ancestor: &str, read: &str, write: &str) -> GpuPair {
        let v = |s: &str| {
            Observed::Value(
                crate::facts::gpu::P2pStatus::from_label(s)
                    .unwrap_or(crate::facts::gpu::P2pStatus::Unknown),
            )
        };
        GpuPair {
            a,
            b,
            common_ancestor: Some(Observed::Value(ancestor.to_string())),
            p2p_read: v(read),
            p2p_write: v(write),
            p2p_nvlink: Some(v(if read == "OK" { "OK" } else { "NS" })),
            p2p_atomics: Some(v(read)),
            p2p_prop: Some(v(read)),
        }
    }

    /// Two H200s on an NVSwitch fabric (18 links each), as on the lent 2x H200 machine.
    pub fn h200x2() -> NvmlFacts {
        let links = |_: u32| {
            (0..18)
                .map(|l| link(l, true, "0000:00:0f.0", "switch"))
                .collect()
        };
        NvmlFacts {
            driver_version: Observed::Value("580.159.04".into()),
            cuda_driver_version: Observed::Value(13000),
            gpus: vec![
                gpu(0, "0000:00:06.0", links(0)),
                gpu(1, "0000:00:07.0", links(1)),
            ],
            pairs: vec![
                pair(0, 1, "HOSTBRIDGE", "OK", "OK"),
                pair(1, 0, "HOSTBRIDGE", "OK", "OK"),
            ],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::*;
    use super::*;

    #[test]
    fn switch_fabric_counts_all_links() {
        let f = h200x2();
        assert_eq!(link_label(&f, 0, 1), "NV18");
        assert_eq!(link_label(&f, 1, 1), "X");
        assert!(has_nvlink(&f));
    }

    #[test]
    fn direct_links_and_pcie_levels() {
        let mut f = h200x2();
        f.gpus[0].nvlinks = vec![
            link(0, true, "0000:00:07.0", "gpu"),
            link(1, true, "0000:00:07.0", "gpu"),
            link(2, false, "0000:00:07.0", "gpu"),
        ];
        f.gpus[1].nvlinks = vec![];
        assert_eq!(link_label(&f, 0, 1), "NV2");
        assert_eq!(link_label(&f, 1, 0), "PHB");
        f.gpus[0].nvlinks.clear();
        f.pairs[0].common_ancestor = Some(crate::facts::Observed::Value("SINGLE".into()));
        assert_eq!(link_label(&f, 0, 1), "PIX");
        assert_eq!(link_label(&f, 0, 7), "?");
        assert!(!has_nvlink(&f));
    }
}

/// The most GPUs a matrix covers. The matrices are square, so their size grows
/// with the square of the GPU count: 2,000 GPUs in saved facts took 59 s and
/// 1.85 GB to print 200 MB of `doctor` output. Real nodes have at most 8 or 16
/// (an NVL72 rack's 72 GPUs are still within this); past it, the first
/// `MAX_MATRIX_GPUS` are shown and the rest counted in `gpus_left_out`.
const MAX_MATRIX_GPUS: usize = 128;

/// Look-ups by NVML index, built once per set of matrices (a linear search per
/// cell made the matrices cubic in the GPU count).
struct Index<'a> {
    gpus: std::collections::BTreeMap<u32, &'a NvmlGpu>,
    pairs: std::collections::BTreeMap<(u32, u32), &'a GpuPair>,
}

impl<'a> Index<'a> {
    fn new(facts: &'a NvmlFacts) -> Index<'a> {
        Index {
            gpus: facts.gpus.iter().map(|g| (g.index, g)).collect(),
            pairs: facts.pairs.iter().map(|p| ((p.a, p.b), p)).collect(),
        }
    }

    fn pair(&self, a: u32, b: u32) -> Option<&'a GpuPair> {
        self.pairs.get(&(a, b)).copied()
    }

    /// `link_label` without the linear searches.
    fn link_label(&self, a: u32, b: u32) -> String {
        if a == b {
            return "X".into();
        }
        let (Some(ga), Some(gb)) = (self.gpus.get(&a), self.gpus.get(&b)) else {
            return "?".into();
        };
        let n = nvlinks_between(ga, gb);
        if n > 0 {
            return format!("NV{n}");
        }
        self.pair(a, b)
            .and_then(|p| p.common_ancestor.as_ref()?.value())
            .map_or("?".into(), |l| pcie_label(l).to_string())
    }
}

/// Every matrix `doctor` prints, indexed by NVML GPU index order.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Matrices {
    /// NVML indices, the order of rows and columns (at most `MAX_MATRIX_GPUS`).
    pub gpus: Vec<u32>,
    /// GPUs past `MAX_MATRIX_GPUS`, not in the matrices.
    #[serde(skip_serializing_if = "is_zero")]
    pub gpus_left_out: usize,
    /// `nvidia-smi topo -m` notation.
    pub topology: Vec<Vec<String>>,
    /// `nvidia-smi topo -p2p r|w|n|a` notation; `X` on the diagonal.
    pub p2p_read: Vec<Vec<String>>,
    pub p2p_write: Vec<Vec<String>>,
    pub p2p_nvlink: Vec<Vec<String>>,
    pub p2p_atomics: Vec<Vec<String>>,
    /// Read and write together, as `nvidia-smi topo -p2p rw` prints them: OK when both are.
    pub p2p_read_write: Vec<Vec<String>>,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// One cell per ordered pair of the shown GPUs, in NVML index order.
fn grid(order: &[u32], cell: impl Fn(u32, u32) -> String) -> Vec<Vec<String>> {
    order
        .iter()
        .map(|&a| order.iter().map(|&b| cell(a, b)).collect())
        .collect()
}

/// A P2P matrix: X on the diagonal, `cell` of each pair's facts elsewhere.
fn square(order: &[u32], index: &Index<'_>, cell: impl Fn(&GpuPair) -> String) -> Vec<Vec<String>> {
    grid(order, |a, b| {
        if a == b {
            "X".to_string()
        } else {
            index.pair(a, b).map_or("?".into(), &cell)
        }
    })
}

/// A status's label; "?" where it failed or was not read.
fn status(o: Option<&crate::facts::Observed<crate::facts::gpu::P2pStatus>>) -> String {
    o.and_then(|o| o.value())
        .map_or("?", |s| s.label())
        .to_string()
}

pub fn matrices(facts: &NvmlFacts) -> Matrices {
    let index = Index::new(facts);
    let order: Vec<u32> = facts
        .gpus
        .iter()
        .map(|g| g.index)
        .take(MAX_MATRIX_GPUS)
        .collect();
    Matrices {
        gpus_left_out: facts.gpus.len() - order.len(),
        topology: grid(&order, |a, b| index.link_label(a, b)),
        p2p_read: square(&order, &index, |p| status(Some(&p.p2p_read))),
        p2p_write: square(&order, &index, |p| status(Some(&p.p2p_write))),
        p2p_nvlink: square(&order, &index, |p| status(p.p2p_nvlink.as_ref())),
        p2p_atomics: square(&order, &index, |p| status(p.p2p_atomics.as_ref())),
        p2p_read_write: square(&order, &index, |p| {
            let (r, w) = (status(Some(&p.p2p_read)), status(Some(&p.p2p_write)));
            if r != "OK" { r } else { w }
        }),
        gpus: order,
    }
}

#[cfg(test)]
mod matrix_tests {
    use super::fixtures::*;
    use super::*;

    #[test]
    fn matrices_follow_nvidia_smi() {
        let mut f = h200x2();
        f.pairs[1].p2p_write =
            crate::facts::Observed::Value(crate::facts::gpu::P2pStatus::NotSupported);
        let m = matrices(&f);
        assert_eq!(m.topology, [["X", "NV18"], ["NV18", "X"]]);
        assert_eq!(m.p2p_read_write, [["X", "OK"], ["NS", "X"]]);
        assert_eq!(m.p2p_write[1][0], "NS");
        assert_eq!(m.gpus_left_out, 0);
    }

    #[test]
    fn two_thousand_gpus_make_capped_matrices() {
        // Issue 18: 2,000 GPUs in `doctor --facts` took 59 s and 1.85 GB.
        let mut f = h200x2();
        let template = f.gpus[0].clone();
        f.gpus = (0..2000)
            .map(|i| {
                let mut g = template.clone();
                g.index = i;
                g
            })
            .collect();
        let m = matrices(&f);
        assert_eq!(m.gpus.len(), MAX_MATRIX_GPUS);
        assert_eq!(m.gpus_left_out, 2000 - MAX_MATRIX_GPUS);
        assert_eq!(m.topology.len(), MAX_MATRIX_GPUS);
        assert!(m.topology.iter().all(|r| r.len() == MAX_MATRIX_GPUS));
    }
}
