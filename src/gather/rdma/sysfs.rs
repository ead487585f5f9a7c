//! RDMA devices from sysfs: /sys/class/infiniband/<dev>/{device,fw_ver,
//! node_guid,ports/<n>/{state,phys_state,link_layer,rate,gids/*,gid_attrs/*}},
//! the uverbs nodes in /dev/infiniband, and rdma_cm. Odd attribute content is
//! recorded, never fatal; tables are bounded so hundreds of devices stay cheap.

use crate::facts::rdma::{Gid, Openable, PcieLink, RdmaDevice, RdmaPort, UverbsNode};
use crate::facts::{FactError, Observed};
use crate::gather::host::Host;

const CLASS: &str = "/sys/class/infiniband";
/// GID entries read per port: RoCE ports use a handful, IB ports one; the table can be 256+.
const MAX_GIDS: usize = 256;
const MAX_PORTS: usize = 64;

/// `4: ACTIVE` -> `ACTIVE`; text without a number is kept as it is.
fn state_name(raw: &str) -> String {
    let raw = raw.trim();
    raw.split_once(':')
        .map_or(raw, |(_, name)| name.trim())
        .to_string()
}

/// True for an unused GID slot (all zeros).
fn is_zero_gid(gid: &str) -> bool {
    gid.trim().chars().all(|c| c == '0' || c == ':')
}

/// Reads an attribute: `None` when missing or blank, an entry in `unreadable` when it fails.
fn attr(host: &Host, path: &str, unreadable: &mut Vec<FactError>) -> Option<String> {
    match host.read(path) {
        Ok(Some(text)) => Some(text.trim().to_string()).filter(|t| !t.is_empty()),
        Ok(None) => None,
        Err(e) => {
            unreadable.push(e);
            None
        }
    }
}

/// Reads an attribute and parses it: `None` when missing or blank; text that does not
/// parse is recorded in `unreadable` with its path, never turned into `None` silently.
fn parsed<T>(
    host: &Host,
    path: &str,
    unreadable: &mut Vec<FactError>,
    parse: impl FnOnce(&str) -> Option<T>,
    what: &str,
) -> Option<T> {
    let text = attr(host, path, unreadable)?;
    let value = parse(&text);
    if value.is_none() {
        unreadable.push(FactError::new(path, format!("{text:?} is not {what}")));
    }
    value
}

/// A directory listing: `None` when missing, an entry in `unreadable` when it fails.
fn listing(host: &Host, path: &str, unreadable: &mut Vec<FactError>) -> Vec<String> {
    match host.list_dir(path) {
        Ok(Some(names)) => names,
        Ok(None) => Vec::new(),
        Err(e) => {
            unreadable.push(e);
            Vec::new()
        }
    }
}

/// Entries of a sysfs table directory (`ports`, `gids`) that are numbers, in order; any
/// other name is recorded (the kernel writes only numbers there).
fn numbered(host: &Host, path: &str, unreadable: &mut Vec<FactError>) -> Vec<u32> {
    let mut out = Vec::new();
    for name in listing(host, path, unreadable) {
        match name.parse() {
            Ok(n) => out.push(n),
            Err(_) => unreadable.push(FactError::new(
                path,
                format!("entry {name:?} is not a number"),
            )),
        }
    }
    out.sort_unstable();
    out
}

/// The IB port error counters (sysfs `ports/N/counters/`) that mean a sick link:
/// the port went down, lost symbols or dropped packets.
const ERROR_COUNTERS: &[&str] = &[
    "link_downed",
    "link_error_recovery",
    "symbol_error",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "port_xmit_discards",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
];

fn error_counters(
    host: &Host,
    port_dir: &str,
    unreadable: &mut Vec<FactError>,
) -> std::collections::BTreeMap<String, u64> {
    let mut out = std::collections::BTreeMap::new();
    for name in ERROR_COUNTERS {
        let path = format!("{port_dir}/counters/{name}");
        let Some(text) = attr(host, &path, unreadable) else {
            continue;
        };
        match text.parse::<u64>() {
            Ok(v) => {
                out.insert(name.to_string(), v);
            }
            Err(_) => unreadable.push(FactError::new(
                path,
                format!("{text:?} is not a counter value"),
            )),
        }
    }
    out
}

/// The non-zero GIDs of one port with their type and netdev.
fn gids(host: &Host, p: &str, unreadable: &mut Vec<FactError>) -> Vec<Gid> {
    let mut gids = Vec::new();
    for index in numbered(host, &format!("{p}/gids"), unreadable)
        .into_iter()
        .take(MAX_GIDS)
    {
        let Some(gid) = attr(host, &format!("{p}/gids/{index}"), unreadable) else {
            continue;
        };
        if is_zero_gid(&gid) {
            continue;
        }
        // The kernel answers EINVAL for the type of an unused entry; only used ones are read.
        gids.push(Gid {
            index,
            kind: attr(host, &format!("{p}/gid_attrs/types/{index}"), unreadable),
            netdev: attr(host, &format!("{p}/gid_attrs/ndevs/{index}"), unreadable),
            gid,
        });
    }
    gids
}

fn ports(host: &Host, dev: &str, unreadable: &mut Vec<FactError>) -> Vec<RdmaPort> {
    let base = format!("{CLASS}/{dev}/ports");
    numbered(host, &base, unreadable)
        .into_iter()
        .take(MAX_PORTS)
        .map(|port| {
            let p = format!("{base}/{port}");
            RdmaPort {
                port,
                state: attr(host, &format!("{p}/state"), unreadable).map(|s| state_name(&s)),
                phys_state: attr(host, &format!("{p}/phys_state"), unreadable)
                    .map(|s| state_name(&s)),
                link_layer: attr(host, &format!("{p}/link_layer"), unreadable),
                rate: attr(host, &format!("{p}/rate"), unreadable),
                gids: gids(host, &p, unreadable),
                error_counters: error_counters(host, &p, unreadable),
            }
        })
        .collect()
}

/// The PCIe link of the device's PCI function; `None` when sysfs has neither current value.
fn pcie(host: &Host, dev: &str, unreadable: &mut Vec<FactError>) -> Option<PcieLink> {
    let path = |name: &str| format!("{dev}/device/{name}");
    let width = |t: &str| t.parse::<u32>().ok();
    let link = PcieLink {
        current_speed: attr(host, &path("current_link_speed"), unreadable),
        max_speed: attr(host, &path("max_link_speed"), unreadable),
        current_width: parsed(
            host,
            &path("current_link_width"),
            unreadable,
            width,
            "a lane count",
        ),
        max_width: parsed(
            host,
            &path("max_link_width"),
            unreadable,
            width,
            "a lane count",
        ),
    };
    (link.current_speed.is_some() || link.current_width.is_some()).then_some(link)
}

/// The NUMA node of the device's PCI function; the kernel's `-1` (no NUMA affinity) is `None`.
fn numa_node(host: &Host, dev: &str, unreadable: &mut Vec<FactError>) -> Option<u32> {
    let parse = |t: &str| match t.parse::<i64>() {
        Ok(-1) => Some(None),
        Ok(n) => u32::try_from(n).ok().map(Some),
        Err(_) => None,
    };
    parsed(
        host,
        &format!("{dev}/device/numa_node"),
        unreadable,
        parse,
        "a NUMA node",
    )
    .flatten()
}

fn device(host: &Host, name: &str) -> RdmaDevice {
    let mut unreadable = Vec::new();
    let dev = format!("{CLASS}/{name}");
    // `device` links to the PCI function (through the class link); its own name is the bus id.
    let sysfs_path = match host.real_path(&format!("{dev}/device")) {
        Ok(p) => p,
        Err(e) => {
            unreadable.push(e);
            None
        }
    };
    let pci_bus_id = sysfs_path
        .as_deref()
        .and_then(|p| p.rsplit('/').next())
        .filter(|b| b.matches(':').count() == 2)
        .map(String::from);
    let driver = match host.read_link(&format!("{dev}/device/driver")) {
        Ok(target) => target.and_then(|t| t.rsplit('/').next().map(String::from)),
        Err(e) => {
            unreadable.push(e);
            None
        }
    };
    let netdevs = listing(host, &format!("{dev}/device/net"), &mut unreadable);
    let numa_node = numa_node(host, &dev, &mut unreadable);
    let ports = ports(host, name, &mut unreadable);
    let pcie = pcie(host, &dev, &mut unreadable);
    // The EFA driver of the EFA installer (amzn-drivers efa_sysfs.c) says on the PCI device
    // which GPU peer-memory provider it has: `p2p` (e.g. `NVIDIA`, `NVIDIA peermem`), or `gdr`
    // in older releases. Read only for EFA devices: other drivers have neither file.
    let efa_p2p = if driver.as_deref() == Some("efa") {
        attr(host, &format!("{dev}/device/p2p"), &mut unreadable).or_else(|| {
            attr(host, &format!("{dev}/device/gdr"), &mut unreadable).map(|g| format!("gdr {g}"))
        })
    } else {
        None
    };
    RdmaDevice {
        name: name.to_string(),
        driver,
        pci_bus_id,
        sysfs_path,
        numa_node,
        fw_ver: attr(host, &format!("{dev}/fw_ver"), &mut unreadable),
        node_guid: attr(host, &format!("{dev}/node_guid"), &mut unreadable),
        netdevs,
        ports,
        pcie,
        efa_p2p,
        unreadable,
    }
}

pub fn devices(host: &Host) -> Observed<Vec<RdmaDevice>> {
    match host.list_dir(CLASS) {
        Ok(Some(names)) => Observed::Value(names.iter().map(|n| device(host, n)).collect()),
        Ok(None) => Observed::Value(Vec::new()),
        Err(e) => Observed::Error(e),
    }
}

fn openable(host: &Host, abs: &str) -> Option<Openable> {
    host.try_open_rw(abs).map(|r| Openable { refused: r.err() })
}

/// /sys/class/infiniband_verbs/uverbsN with the device node each one has in /dev/infiniband.
pub fn uverbs(host: &Host) -> Observed<Vec<UverbsNode>> {
    let names = match host.list_dir("/sys/class/infiniband_verbs") {
        Ok(Some(n)) => n,
        Ok(None) => Vec::new(),
        Err(e) => return Observed::Error(e),
    };
    Observed::Value(
        names
            .into_iter()
            .filter(|n| n.starts_with("uverbs"))
            .map(|name| {
                let (ibdev, ibdev_error) =
                    match host.read(&format!("/sys/class/infiniband_verbs/{name}/ibdev")) {
                        Ok(text) => (text.map(|s| s.trim().to_string()), None),
                        Err(e) => (None, Some(e)),
                    };
                UverbsNode {
                    ibdev,
                    ibdev_error,
                    open: openable(host, &format!("/dev/infiniband/{name}")),
                    name,
                }
            })
            .collect(),
    )
}

pub fn rdma_cm(host: &Host) -> Observed<Option<Openable>> {
    Observed::Value(openable(host, "/dev/infiniband/rdma_cm"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes `text` at `rel` under `root`, creating the directories.
    fn put(root: &std::path::Path, rel: &str, text: &str) {
        let path = root.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    #[test]
    fn garbage_attributes_are_recorded_not_dropped() {
        let root = tempfile::tempdir().unwrap();
        let dev = "sys/class/infiniband/mlx5_0";
        put(
            root.path(),
            &format!("{dev}/device/current_link_width"),
            "garbage\n",
        );
        put(root.path(), &format!("{dev}/device/max_link_width"), "16\n");
        put(
            root.path(),
            &format!("{dev}/device/current_link_speed"),
            "16.0 GT/s PCIe\n",
        );
        put(root.path(), &format!("{dev}/device/numa_node"), "-1\n");
        put(root.path(), &format!("{dev}/ports/1/state"), "4: ACTIVE\n");
        std::fs::create_dir_all(root.path().join(format!("{dev}/ports/bogus"))).unwrap();
        // ibdev as a directory: it exists but is no attribute.
        std::fs::create_dir_all(root.path().join("sys/class/infiniband_verbs/uverbs0/ibdev"))
            .unwrap();
        let host = Host::new(root.path());
        let devices = devices(&host);
        let d = &devices.value().unwrap()[0];
        let pcie = d.pcie.as_ref().unwrap();
        assert_eq!((pcie.current_width, pcie.max_width), (None, Some(16)));
        // -1 is the kernel's "no NUMA affinity": absent, not an error.
        assert_eq!(d.numa_node, None);
        assert_eq!(d.ports.len(), 1);
        let errors: Vec<String> = d.unreadable.iter().map(|e| e.to_string()).collect();
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(
            errors.contains(&format!(
                "{CLASS}/mlx5_0/device/current_link_width: \"garbage\" is not a lane count"
            )),
            "{errors:?}"
        );
        assert!(
            errors.contains(&format!(
                "{CLASS}/mlx5_0/ports: entry \"bogus\" is not a number"
            )),
            "{errors:?}"
        );
        let nodes = uverbs(&host);
        let node = &nodes.value().unwrap()[0];
        assert_eq!(node.ibdev, None);
        assert!(
            node.ibdev_error
                .as_ref()
                .is_some_and(|e| e.source.ends_with("uverbs0/ibdev")),
            "{node:?}"
        );
    }

    #[test]
    fn states_and_gids() {
        assert_eq!(state_name("4: ACTIVE\n"), "ACTIVE");
        assert_eq!(state_name("5: LinkUp"), "LinkUp");
        assert_eq!(state_name("garbage"), "garbage");
        assert!(is_zero_gid("0000:0000:0000:0000:0000:0000:0000:0000\n"));
        assert!(!is_zero_gid("fe80:0000:0000:0000:0a00:27ff:fe4e:1b2c"));
    }
}
