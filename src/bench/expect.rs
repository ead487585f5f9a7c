//! What a link between two GPUs should carry one way: NVLink count x per-link
//! speed (NVML's figure, per direction), or the PCIe link both GPUs share.

use crate::facts::gpu::{NvmlFacts, NvmlGpu};

#[derive(Debug, Clone, PartialEq)]
pub struct LinkFigure {
    /// GB/s one way.
    pub gbps: f64,
    /// `18 NVLinks x 26.562 GB/s`, `PCIe Gen4 x16`.
    pub basis: String,
    pub nvlink: bool,
}

/// GB/s per lane and direction after line coding, by PCIe generation.
fn pcie_lane_gbps(generation: u32) -> Option<f64> {
    Some(match generation {
        1 => 0.25,
        2 => 0.5,
        3 => 0.985,
        4 => 1.969,
        5 => 3.938,
        6 => 7.563,
        _ => return None,
    })
}

fn find<'a>(nvml: &'a NvmlFacts, bus: &str) -> Option<&'a NvmlGpu> {
    nvml.gpus
        .iter()
        .find(|g| g.pci_bus_id.value().map(String::as_str) == Some(bus))
}

fn active_links(gpu: &NvmlGpu, to: impl Fn(&crate::facts::gpu::NvLink) -> bool) -> u32 {
    gpu.nvlinks.iter().filter(|l| l.active && to(l)).count() as u32
}

/// The figure for GPUs at bus ids `a` and `b` (normalized), or None when NVML
/// does not know them or gave no speed.
pub fn link(nvml: &NvmlFacts, a: &str, b: &str) -> Option<LinkFigure> {
    let (ga, gb) = (find(nvml, a)?, find(nvml, b)?);
    let direct = active_links(ga, |l| {
        l.remote_pci_bus_id.value().map(String::as_str) == Some(b)
    });
    let is_switch =
        |l: &crate::facts::gpu::NvLink| l.remote_type.value().map(String::as_str) == Some("switch");
    let switched = active_links(ga, is_switch).min(active_links(gb, is_switch));
    let links = if direct > 0 { direct } else { switched };
    if links > 0 {
        let speed = (*ga.nvlink_speed_mbps.value()?).min(*gb.nvlink_speed_mbps.value()?);
        let per_link = f64::from(speed) / 1000.0;
        let via = if direct > 0 { "" } else { " through NVSwitch" };
        return Some(LinkFigure {
            gbps: f64::from(links) * per_link,
            basis: format!("{links} NVLinks x {per_link:.3} GB/s{via}"),
            nvlink: true,
        });
    }
    let generation = (*ga.pcie_max_generation.value()?).min(*gb.pcie_max_generation.value()?);
    let width = (*ga.pcie_max_width.value()?).min(*gb.pcie_max_width.value()?);
    let lane = pcie_lane_gbps(generation)?;
    Some(LinkFigure {
        gbps: lane * f64::from(width),
        basis: format!("PCIe Gen{generation} x{width}"),
        nvlink: false,
    })
}

/// The slowest link between any two of `n` GPUs: what bounds NCCL's ring. None
/// when any pair's figure is unknown.
pub fn slowest(n: u32, figure: impl Fn(u32, u32) -> Option<LinkFigure>) -> Option<LinkFigure> {
    let mut worst: Option<LinkFigure> = None;
    for a in 0..n {
        for b in (0..n).filter(|b| *b != a) {
            let f = figure(a, b)?;
            if worst.as_ref().is_none_or(|w| f.gbps < w.gbps) {
                worst = Some(f);
            }
        }
    }
    worst
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::Observed;
    use crate::facts::gpu::NvLink;
    use crate::topology::matrix::fixtures::{gpu, link as nvlink};

    fn facts(gpus: Vec<NvmlGpu>) -> NvmlFacts {
        NvmlFacts {
            driver_version: Observed::Value("580".into()),
            cuda_driver_version: Observed::Value(13000),
            gpus,
            pairs: Vec::new(),
        }
    }

    #[test]
    fn direct_links_count_only_active_ones_to_that_peer() {
        let (a, b, c) = ("0000:1b:00.0", "0000:43:00.0", "0000:52:00.0");
        let mut links: Vec<NvLink> = (0..18).map(|l| nvlink(l, true, b, "gpu")).collect();
        links[3].active = false;
        links[4].remote_pci_bus_id = Observed::Value(c.into());
        let f = facts(vec![
            gpu(0, a, links),
            gpu(1, b, Vec::new()),
            gpu(2, c, Vec::new()),
        ]);
        let fig = link(&f, a, b).unwrap();
        assert_eq!(fig.basis, "16 NVLinks x 26.562 GB/s");
        assert!((fig.gbps - 16.0 * 26.562).abs() < 1e-9);
        assert!(fig.nvlink);
        // No link from c to a: PCIe Gen5 x16.
        let pcie = link(&f, c, a).unwrap();
        assert_eq!(pcie.basis, "PCIe Gen5 x16");
        assert!(!pcie.nvlink);
        assert!((pcie.gbps - 63.008).abs() < 1e-6);
        assert_eq!(link(&f, a, "0000:99:00.0"), None);
    }

    #[test]
    fn switched_links_take_the_smaller_side_and_the_slowest_pair_wins() {
        let (a, b) = ("0000:1b:00.0", "0000:43:00.0");
        let sw = |n: u32| {
            (0..n)
                .map(|l| nvlink(l, true, "0000:05:00.0", "switch"))
                .collect()
        };
        let f = facts(vec![gpu(0, a, sw(18)), gpu(1, b, sw(12))]);
        let fig = link(&f, a, b).unwrap();
        assert_eq!(fig.basis, "12 NVLinks x 26.562 GB/s through NVSwitch");
        let buses = [a, b];
        let worst = slowest(2, |x, y| link(&f, buses[x as usize], buses[y as usize])).unwrap();
        assert_eq!(worst.basis, fig.basis);
        assert_eq!(
            slowest(3, |x, y| link(
                &f,
                buses.get(x as usize)?,
                buses.get(y as usize)?
            )),
            None
        );
    }
}
