//! NVIDIA GPUs on the PCI bus, from sysfs. sysfs is not namespaced, so inside a
//! container this shows every GPU of the node, which NVML (limited to the
//! container's devices) does not: the difference is the pod-placement signal.

use crate::facts::gpu::{BridgeAcs, PciGpu};
use crate::facts::{FactError, Observed};
use crate::gather::host::Host;

const DEVICES: &str = "/sys/bus/pci/devices";
const NVIDIA: &str = "0x10de";

/// True for a display or 3D controller class (0x0300xx VGA, 0x0302xx 3D); NVSwitches are bridges (0x0680xx).
fn is_gpu_class(class: &str) -> bool {
    let c = class.trim().to_ascii_lowercase();
    c.starts_with("0x0300") || c.starts_with("0x0302")
}

fn attr(host: &Host, dev: &str, name: &str) -> Result<Option<String>, FactError> {
    Ok(host
        .read(&format!("{DEVICES}/{dev}/{name}"))?
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty()))
}

/// The NVIDIA functions on the PCI bus whose class `is_class` takes. A device whose
/// vendor, or an NVIDIA device whose class, exists but cannot be read (a read stuck in
/// a hung driver's attribute, permissions) makes the list unknown: it may be one of
/// them (issue 39 re-run: a GPU whose attributes hung was left out, and a p5 read as
/// "8 GPUs but the PCI bus lists 7: a GPU has fallen off the bus").
fn nvidia_functions(host: &Host, is_class: fn(&str) -> bool) -> Observed<Vec<String>> {
    let entries = match host.list_dir(DEVICES) {
        Ok(Some(e)) => e,
        Ok(None) => return Observed::Value(Vec::new()),
        Err(e) => return Observed::Error(e),
    };
    let mut out = Vec::new();
    for dev in entries {
        let class = match attr(host, &dev, "vendor") {
            Ok(Some(v)) if v == NVIDIA => attr(host, &dev, "class"),
            Ok(_) => continue,
            Err(e) => return Observed::Error(e),
        };
        match class {
            Ok(Some(c)) if is_class(&c) => out.push(dev),
            Ok(_) => {}
            Err(e) => return Observed::Error(e),
        }
    }
    Observed::Value(out)
}

/// A GPU's attributes, read one by one; those that exist but cannot be read or parsed
/// are kept with their path and error, so a fact left empty says why.
struct Attributes<'a> {
    host: &'a Host,
    dev: &'a str,
    unreadable: Vec<FactError>,
}

impl Attributes<'_> {
    /// The attribute's text, trimmed; `None` when the file is absent or empty (an error
    /// is recorded when it exists but cannot be read).
    fn text(&mut self, name: &str) -> Option<String> {
        match self.host.read(&format!("{DEVICES}/{}/{name}", self.dev)) {
            Ok(text) => text.map(|s| s.trim().to_string()).filter(|s| !s.is_empty()),
            Err(e) => {
                self.unreadable.push(e);
                None
            }
        }
    }

    /// The attribute as a number; text that is not one is recorded as unreadable.
    fn number<T: std::str::FromStr>(&mut self, name: &str) -> Option<T> {
        let text = self.text(name)?;
        match text.parse() {
            Ok(n) => Some(n),
            Err(_) => {
                self.unreadable.push(FactError::new(
                    self.host
                        .path(&format!("{DEVICES}/{}/{name}", self.dev))
                        .display()
                        .to_string(),
                    format!("{text:?} is not a number"),
                ));
                None
            }
        }
    }
}

/// True for the bridge class NVSwitches have (0x0680xx, "other bridge").
fn is_nvswitch_class(class: &str) -> bool {
    class.trim().to_ascii_lowercase().starts_with("0x0680")
}

/// The NVIDIA NVSwitch functions on the PCI bus, by bus id (sorted, as sysfs lists them).
/// The fabric-manager check on pre-Hopper NVSwitch systems keys on them.
pub fn nvswitches(host: &Host) -> Observed<Vec<String>> {
    nvidia_functions(host, is_nvswitch_class)
}

pub fn gather(host: &Host) -> Observed<Vec<PciGpu>> {
    nvidia_functions(host, is_gpu_class)
        .map(|devs| devs.into_iter().map(|d| gpu(host, d)).collect())
}

/// One NVIDIA GPU function's facts.
fn gpu(host: &Host, dev: String) -> PciGpu {
    let mut a = Attributes {
        host,
        dev: &dev,
        unreadable: Vec::new(),
    };
    let sysfs_path = match host.real_path(&format!("{DEVICES}/{dev}")) {
        Ok(p) => p,
        Err(e) => {
            a.unreadable.push(e);
            None
        }
    };
    let upstream_acs = sysfs_path
        .as_deref()
        .map(|p| upstream_acs(host, p))
        .unwrap_or_default();
    let device_id = a.text("device").unwrap_or_default();
    // The kernel prints -1 when it does not know the node: a number, and no node.
    let numa_node = a
        .number::<i64>("numa_node")
        .and_then(|n| u32::try_from(n).ok());
    let max_link_speed = a.text("max_link_speed");
    let max_link_width = a.number("max_link_width");
    let current_link_speed = a.text("current_link_speed");
    let current_link_width = a.number("current_link_width");
    PciGpu {
        device_id,
        sysfs_path,
        numa_node,
        max_link_speed,
        max_link_width,
        current_link_speed,
        current_link_width,
        upstream_acs,
        unreadable: a.unreadable,
        bus_id: dev,
    }
}

/// PCI Express extended capability id of Access Control Services (PCIe base spec
/// 7.7.11; Linux include/uapi/linux/pci_regs.h PCI_EXT_CAP_ID_ACS).
const ACS_CAP_ID: u16 = 0x000d;
/// The ACS control register's offset in the capability (pci_regs.h PCI_ACS_CTRL).
const ACS_CTRL: usize = 6;
/// Extended capabilities start here, after the 256 bytes of conventional space.
const EXTENDED_START: usize = 0x100;

/// Whether a path component is a PCI function (`0000:e0:00.0`).
fn is_bus_id(name: &str) -> bool {
    let b = name.as_bytes();
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && name
            .bytes()
            .enumerate()
            .all(|(i, c)| matches!(i, 4 | 7 | 10) || c.is_ascii_hexdigit())
}

/// The bridges between the host bridge and the GPU at `sysfs_path`, root port first,
/// with their ACS control registers.
fn upstream_acs(host: &Host, sysfs_path: &str) -> Vec<BridgeAcs> {
    let parts: Vec<&str> = sysfs_path.split('/').collect();
    let mut out = Vec::new();
    // The last component is the GPU itself.
    let functions = parts.len().saturating_sub(1);
    for (i, part) in parts.iter().enumerate().take(functions) {
        if !is_bus_id(part) {
            continue;
        }
        let dir = parts[..=i].join("/");
        let path = format!("{dir}/config");
        let control = match host.read_bytes(&path) {
            Ok(Some(config)) => match acs_control(&config) {
                Ok(c) => Observed::Value(c),
                Err(why) => {
                    Observed::Error(FactError::new(host.path(&path).display().to_string(), why))
                }
            },
            Ok(None) => Observed::Error(FactError::new(
                host.path(&path).display().to_string(),
                "no config file",
            )),
            Err(e) => Observed::Error(e),
        };
        out.push(BridgeAcs {
            bus_id: part.to_string(),
            root_port: out.is_empty(),
            control,
        });
    }
    out
}

/// The ACS control register from a function's config space (`config` in sysfs):
/// `Ok(None)` when its extended capability list has no ACS. Walks the list as
/// lspci does (PCIe base spec 7.6.3: a 32-bit header of id, version and the next
/// offset, a zero header or offset ending it), with a bound on the hops so a
/// looping list ends. A config space of 256 bytes or less has no extended space to
/// read: sysfs gives non-root readers only the first 64 bytes.
fn acs_control(config: &[u8]) -> Result<Option<u16>, String> {
    if config.len() <= EXTENDED_START {
        return Err(format!(
            "{} bytes of config space, the extended capabilities start at byte 256 (sysfs gives the whole space to root only)",
            config.len()
        ));
    }
    let word = |at: usize| -> Option<u32> {
        let b = config.get(at..at + 4)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let mut at = EXTENDED_START;
    // 4096 bytes hold at most 960 four-byte-aligned headers past 0x100.
    for _ in 0..960 {
        let Some(header) = word(at) else {
            return Err(format!(
                "extended capability at {at:#x} lies past the {} bytes read",
                config.len()
            ));
        };
        if header == 0 || header == u32::MAX {
            return Ok(None);
        }
        if header as u16 == ACS_CAP_ID {
            let b = config
                .get(at + ACS_CTRL..at + ACS_CTRL + 2)
                .ok_or_else(|| {
                    format!("the ACS capability at {at:#x} is cut off by the end of config space")
                })?;
            return Ok(Some(u16::from_le_bytes([b[0], b[1]])));
        }
        let next = (header >> 20) as usize & !3;
        if next < EXTENDED_START {
            return Ok(None);
        }
        at = next;
    }
    Err("the extended capability list loops".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 4 KiB config space whose extended capabilities are `caps` ((id, control), each
    /// 16 bytes apart from 0x100).
    fn config(caps: &[(u16, u16)]) -> Vec<u8> {
        let mut c = vec![0u8; 4096];
        for (i, (id, control)) in caps.iter().enumerate() {
            let at = 0x100 + i * 16;
            let next = if i + 1 < caps.len() { at + 16 } else { 0 };
            let header = u32::from(*id) | (1 << 16) | ((next as u32) << 20);
            c[at..at + 4].copy_from_slice(&header.to_le_bytes());
            c[at + 6..at + 8].copy_from_slice(&control.to_le_bytes());
        }
        c
    }

    #[test]
    fn acs_control_is_found_on_the_extended_capability_list() {
        // AER (0x0001), then ACS with ReqRedir+ CmpltRedir+ SrcValid+.
        assert_eq!(
            acs_control(&config(&[(1, 0), (0x0d, 0x0d)])),
            Ok(Some(0x0d))
        );
        assert_eq!(acs_control(&config(&[(1, 0), (0x0b, 0)])), Ok(None));
        assert_eq!(acs_control(&config(&[])), Ok(None));
    }

    #[test]
    fn short_looping_or_cut_config_spaces_say_why() {
        // What a non-root reader gets from sysfs.
        let e = acs_control(&[0u8; 64]).unwrap_err();
        assert!(e.contains("64 bytes") && e.contains("root"), "{e}");
        assert!(acs_control(&[0u8; 256]).is_err());
        // A header pointing at itself.
        let mut looping = vec![0u8; 4096];
        looping[0x100..0x104].copy_from_slice(&(1u32 | (0x100 << 20)).to_le_bytes());
        assert_eq!(
            acs_control(&looping),
            Err("the extended capability list loops".into())
        );
        // ACS header in the last bytes read, its control register cut off.
        let mut cut = config(&[(0x0d, 0x04)]);
        cut.truncate(0x104);
        assert!(acs_control(&cut).unwrap_err().contains("cut off"));
        // A next pointer past the end of what was read.
        let mut past = vec![0u8; 0x110];
        past[0x100..0x104].copy_from_slice(&(1u32 | (0x800 << 20)).to_le_bytes());
        assert!(acs_control(&past).unwrap_err().contains("past the"));
        // All ones: a function that vanished (a GPU off the bus reads 0xff...).
        assert_eq!(acs_control(&vec![0xffu8; 4096]), Ok(None));
    }

    #[test]
    fn bus_ids_in_sysfs_paths() {
        assert!(is_bus_id("0000:e0:00.0") && is_bus_id("0000:00:1c.7"));
        assert!(!is_bus_id("pci0000:00") && !is_bus_id("devices") && !is_bus_id("0000:zz:00.0"));
    }

    /// A sysfs tree under a temp root with one NVIDIA GPU whose attributes are `attrs`,
    /// over its vendor and class (a value of `None` makes the attribute a directory: it
    /// exists, and reading fails).
    fn one_gpu(attrs: &[(&str, Option<&str>)]) -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        let dev = root.path().join("sys/bus/pci/devices/0000:10:00.0");
        std::fs::create_dir_all(&dev).unwrap();
        let base = [("vendor", Some("0x10de\n")), ("class", Some("0x030200\n"))];
        let kept = base
            .iter()
            .filter(|(n, _)| !attrs.iter().any(|(a, _)| a == n));
        for (name, value) in kept.chain(attrs) {
            match value {
                Some(v) => std::fs::write(dev.join(name), v).unwrap(),
                None => std::fs::create_dir(dev.join(name)).unwrap(),
            }
        }
        root
    }

    #[test]
    fn regression_unreadable_or_garbage_pci_attributes_are_kept_with_their_path() {
        let root = one_gpu(&[
            ("device", Some("0x2335\n")),
            ("numa_node", Some("-1\n")),
            ("max_link_speed", Some("32.0 GT/s PCIe\n")),
            ("max_link_width", Some("sixteen\n")),
            ("current_link_width", None),
        ]);
        let Observed::Value(gpus) = gather(&Host::new(root.path())) else {
            panic!("the devices directory reads")
        };
        let g = &gpus[0];
        assert_eq!(g.device_id, "0x2335");
        assert_eq!(g.max_link_speed.as_deref(), Some("32.0 GT/s PCIe"));
        // -1 is the kernel's "no node": no value, and no error.
        assert_eq!(g.numa_node, None);
        assert_eq!((g.max_link_width, g.current_link_width), (None, None));
        // Absent (current_link_speed) is not unreadable; garbage and a failed read are.
        assert_eq!(g.unreadable.len(), 2, "{:?}", g.unreadable);
        let width = &g.unreadable[0];
        assert!(
            width.source.ends_with("0000:10:00.0/max_link_width")
                && width.message.contains("\"sixteen\" is not a number"),
            "{width}"
        );
        assert!(
            g.unreadable[1]
                .source
                .ends_with("0000:10:00.0/current_link_width"),
            "{}",
            g.unreadable[1]
        );
        // A GPU read cleanly saves no `unreadable` at all: older goldens stay as they were.
        let clean = one_gpu(&[("max_link_width", Some("16\n"))]);
        let Observed::Value(gpus) = gather(&Host::new(clean.path())) else {
            panic!("the devices directory reads")
        };
        assert!(gpus[0].unreadable.is_empty());
        assert!(
            !serde_json::to_string(&gpus[0])
                .unwrap()
                .contains("unreadable")
        );
    }

    /// Issue 39, re-run of a read stuck in the kernel: a GPU whose `class` could not be
    /// read was taken for no GPU, so the PCI bus "listed 7" of a p5's 8 and gpu-devices
    /// failed the node ("a GPU has fallen off the bus"). An NVIDIA function whose class,
    /// or any function whose vendor, cannot be read makes the list unknown; one whose
    /// vendor is another's is left out without reading its class.
    #[test]
    fn regression_an_unreadable_vendor_or_class_is_an_unknown_list_not_a_missing_gpu() {
        for unreadable in ["class", "vendor"] {
            let root = one_gpu(&[(unreadable, None)]);
            let got = gather(&Host::new(root.path()));
            let e = got
                .error()
                .unwrap_or_else(|| panic!("{unreadable}: a list"));
            assert!(
                e.source.ends_with(&format!("0000:10:00.0/{unreadable}")),
                "{e}"
            );
            assert!(nvswitches(&Host::new(root.path())).error().is_some());
        }
        let other = one_gpu(&[("vendor", Some("0x8086\n")), ("class", None)]);
        assert_eq!(
            gather(&Host::new(other.path())).value().map(Vec::len),
            Some(0)
        );
    }

    #[test]
    fn gpu_classes() {
        assert!(
            is_gpu_class("0x030200") && is_gpu_class("0x030000\n") && !is_gpu_class("0x068000")
        );
        assert!(is_nvswitch_class("0x068000\n") && !is_nvswitch_class("0x030200"));
    }
}
