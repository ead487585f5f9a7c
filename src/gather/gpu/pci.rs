//! NVIDIA GPUs on the PCI bus, from sysfs. sysfs is not namespaced, so inside a
//! container this shows every GPU of the node, which NVML (limited to the
//! container's devices) does not: the difference is the pod-placement signal.

use crate::facts::Observed;
use crate::facts::gpu::PciGpu;
use crate::gather::host::Host;

const DEVICES: &str = "/sys/bus/pci/devices";
const NVIDIA: &str = "0x10de";

/// True for a display or 3D controller class (0x0300xx VGA, 0x0302xx 3D); NVSwitches are bridges (0x0680xx).
fn is_gpu_class(class: &str) -> bool {
    let c = class.trim().to_ascii_lowercase();
    c.starts_with("0x0300") || c.starts_with("0x0302")
}

fn attr(host: &Host, dev: &str, name: &str) -> Option<String> {
    host.read(&format!("{DEVICES}/{dev}/{name}"))
        .ok()
        .flatten()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// True for the bridge class NVSwitches have (0x0680xx, "other bridge").
fn is_nvswitch_class(class: &str) -> bool {
    class.trim().to_ascii_lowercase().starts_with("0x0680")
}

/// The NVIDIA NVSwitch functions on the PCI bus, by bus id (sorted, as sysfs lists them).
/// The fabric-manager check on pre-Hopper NVSwitch systems keys on them.
pub fn nvswitches(host: &Host) -> Observed<Vec<String>> {
    let entries = match host.list_dir(DEVICES) {
        Ok(Some(e)) => e,
        Ok(None) => return Observed::Value(Vec::new()),
        Err(e) => return Observed::Error(e),
    };
    Observed::Value(
        entries
            .into_iter()
            .filter(|dev| {
                attr(host, dev, "vendor").as_deref() == Some(NVIDIA)
                    && attr(host, dev, "class").is_some_and(|c| is_nvswitch_class(&c))
            })
            .collect(),
    )
}

pub fn gather(host: &Host) -> Observed<Vec<PciGpu>> {
    let entries = match host.list_dir(DEVICES) {
        Ok(Some(e)) => e,
        Ok(None) => return Observed::Value(Vec::new()),
        Err(e) => return Observed::Error(e),
    };
    let mut gpus = Vec::new();
    for dev in entries {
        if attr(host, &dev, "vendor").as_deref() != Some(NVIDIA) {
            continue;
        }
        match attr(host, &dev, "class") {
            Some(class) if is_gpu_class(&class) => {}
            _ => continue,
        }
        let sysfs_path = host.real_path(&format!("{DEVICES}/{dev}")).ok().flatten();
        gpus.push(PciGpu {
            device_id: attr(host, &dev, "device").unwrap_or_default(),
            sysfs_path,
            // The kernel prints -1 when it does not know the node.
            numa_node: attr(host, &dev, "numa_node").and_then(|n| n.parse().ok()),
            max_link_speed: attr(host, &dev, "max_link_speed"),
            max_link_width: attr(host, &dev, "max_link_width").and_then(|n| n.parse().ok()),
            bus_id: dev,
        });
    }
    Observed::Value(gpus)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_classes() {
        assert!(
            is_gpu_class("0x030200") && is_gpu_class("0x030000\n") && !is_gpu_class("0x068000")
        );
        assert!(is_nvswitch_class("0x068000\n") && !is_nvswitch_class("0x030200"));
    }
}
