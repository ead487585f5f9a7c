//! How close a GPU and a NIC are, from their places in the PCI tree (sysfs
//! paths under /sys/devices), in nvidia-smi's and NCCL's notation (FACTS.md
//! section 7): PIX (one PCIe switch), PXB (several), PHB (through the host
//! bridge), NODE (between host bridges of one NUMA node), SYS (across NUMA
//! nodes). GPUDirect RDMA pays off at PIX and PXB.

use crate::facts::Facts;

fn components(path: &str) -> Vec<&str> {
    path.trim_start_matches("/sys/devices/")
        .split('/')
        .filter(|c| !c.is_empty())
        .collect()
}

/// The link level between two PCI devices.
pub fn level(a: &str, b: &str, a_numa: Option<u32>, b_numa: Option<u32>) -> &'static str {
    let (pa, pb) = (components(a), components(b));
    let common = pa.iter().zip(&pb).take_while(|(x, y)| x == y).count();
    if common == 0 {
        // Different root complexes: the same NUMA node or not. A VM that hides
        // NUMA (-1) is one node as far as anything can tell.
        return match (a_numa, b_numa) {
            (Some(x), Some(y)) if x != y => "SYS",
            _ => "NODE",
        };
    }
    if common == 1 {
        return "PHB";
    }
    let hops = (pa.len() - common).max(pb.len() - common);
    if hops <= 2 { "PIX" } else { "PXB" }
}

/// True for the levels where GPUDirect RDMA is used (NCCL_NET_GDR_LEVEL defaults to PXB).
pub fn gdr_close(level: &str) -> bool {
    level == "PIX" || level == "PXB"
}

/// GPU-NIC levels: rows are the node's GPUs (sysfs), columns its RDMA devices.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct AffinityMatrix {
    pub gpus: Vec<String>,
    pub nics: Vec<String>,
    pub levels: Vec<Vec<String>>,
}

pub fn matrix(facts: &Facts) -> Option<AffinityMatrix> {
    let gpus = facts.gpus.pci_gpus.value()?;
    let nics = facts.rdma.devices.value()?;
    if gpus.is_empty() || nics.is_empty() {
        return None;
    }
    let levels = gpus
        .iter()
        .map(|g| {
            nics.iter()
                .map(|n| match (&g.sysfs_path, &n.sysfs_path) {
                    (Some(a), Some(b)) => level(a, b, g.numa_node, n.numa_node).to_string(),
                    _ => "?".to_string(),
                })
                .collect()
        })
        .collect();
    Some(AffinityMatrix {
        gpus: gpus.iter().map(|g| g.bus_id.clone()).collect(),
        nics: nics.iter().map(|n| n.name.clone()).collect(),
        levels,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROOT: &str = "/sys/devices/pci0000:00/0000:00:01.0/0000:e0:00.0";

    #[test]
    fn levels_from_paths() {
        let gpu = format!("{ROOT}/0000:10:1c.0");
        assert_eq!(
            level(&gpu, &format!("{ROOT}/0000:10:1b.0"), Some(0), Some(0)),
            "PIX"
        );
        assert_eq!(
            level(
                &gpu,
                "/sys/devices/pci0000:00/0000:00:02.0/0000:e1:00.0/0000:20:1b.0",
                Some(0),
                Some(0)
            ),
            "PHB"
        );
        assert_eq!(
            level(
                &gpu,
                "/sys/devices/pci0000:00/0000:00:01.0/0000:e0:00.0/0000:e5:00.0/0000:e6:00.0/0000:11:00.0",
                None,
                None
            ),
            "PXB"
        );
        assert_eq!(
            level(
                &gpu,
                "/sys/devices/pci0000:80/0000:80:01.0/0000:90:1b.0",
                Some(0),
                Some(1)
            ),
            "SYS"
        );
        assert_eq!(
            level(
                &gpu,
                "/sys/devices/pci0000:80/0000:80:01.0/0000:90:1b.0",
                Some(0),
                Some(0)
            ),
            "NODE"
        );
        assert!(gdr_close("PXB") && !gdr_close("PHB"));
    }
}
