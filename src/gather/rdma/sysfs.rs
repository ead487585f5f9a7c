//! RDMA devices from sysfs: /sys/class/infiniband/<dev>/{device,fw_ver,
//! node_guid,ports/<n>/{state,phys_state,link_layer,rate,gids/*,gid_attrs/*}},
//! the uverbs nodes in /dev/infiniband, and rdma_cm. Odd attribute content is
//! recorded, never fatal; tables are bounded so hundreds of devices stay cheap.

use crate::facts::rdma::{Gid, Openable, RdmaDevice, RdmaPort, UverbsNode};
use crate::facts::{FactError, Observed};
use crate::gather::host::Host;

const CLASS: &str = "/sys/class/infiniband";
/// GID entries read per port: RoCE ports use a handful, IB ports one; the table can be 256+.
const MAX_GIDS: usize = 256;
const MAX_PORTS: usize = 64;

/// `4: ACTIVE` -> `ACTIVE`; text without a number is kept as it is.
pub fn state_name(raw: &str) -> String {
    let raw = raw.trim();
    raw.split_once(':')
        .map_or(raw, |(_, name)| name.trim())
        .to_string()
}

/// True for an unused GID slot (all zeros).
pub fn is_zero_gid(gid: &str) -> bool {
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

/// The IB port error counters (sysfs `ports/N/counters/`) that mean a sick link:
/// the port went down, lost symbols or dropped packets.
pub const ERROR_COUNTERS: &[&str] = &[
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

fn ports(host: &Host, dev: &str, unreadable: &mut Vec<FactError>) -> Vec<RdmaPort> {
    let base = format!("{CLASS}/{dev}/ports");
    let names = match host.list_dir(&base) {
        Ok(Some(n)) => n,
        Ok(None) => Vec::new(),
        Err(e) => {
            unreadable.push(e);
            Vec::new()
        }
    };
    let mut ports: Vec<RdmaPort> = names
        .iter()
        .filter_map(|n| n.parse::<u32>().ok())
        .take(MAX_PORTS)
        .map(|port| {
            let p = format!("{base}/{port}");
            let mut gids = Vec::new();
            let mut indices: Vec<u32> = match host.list_dir(&format!("{p}/gids")) {
                Ok(Some(n)) => n.iter().filter_map(|i| i.parse().ok()).collect(),
                _ => Vec::new(),
            };
            indices.sort_unstable();
            for index in indices.into_iter().take(MAX_GIDS) {
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
            RdmaPort {
                port,
                state: attr(host, &format!("{p}/state"), unreadable).map(|s| state_name(&s)),
                phys_state: attr(host, &format!("{p}/phys_state"), unreadable)
                    .map(|s| state_name(&s)),
                link_layer: attr(host, &format!("{p}/link_layer"), unreadable),
                rate: attr(host, &format!("{p}/rate"), unreadable),
                gids,
                error_counters: error_counters(host, &p, unreadable),
            }
        })
        .collect();
    ports.sort_by_key(|p| p.port);
    ports
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
        Ok(Some(target)) => target.rsplit('/').next().map(String::from),
        _ => None,
    };
    let netdevs = match host.list_dir(&format!("{dev}/device/net")) {
        Ok(Some(n)) => n,
        _ => Vec::new(),
    };
    let numa_node = attr(host, &format!("{dev}/device/numa_node"), &mut unreadable)
        .and_then(|n| n.parse().ok());
    let ports = ports(host, name, &mut unreadable);
    // The EFA driver of the EFA installer (amzn-drivers efa_sysfs.c) says on the PCI device
    // which GPU peer-memory provider it has: `p2p` (e.g. `NVIDIA`, `NVIDIA peermem`), or `gdr`
    // in older releases. Read only for EFA devices: other drivers have neither file.
    let pcie = {
        let mut read = |name: &str| attr(host, &format!("{dev}/device/{name}"), &mut unreadable);
        let link = crate::facts::rdma::PcieLink {
            current_speed: read("current_link_speed"),
            max_speed: read("max_link_speed"),
            current_width: read("current_link_width").and_then(|w| w.parse().ok()),
            max_width: read("max_link_width").and_then(|w| w.parse().ok()),
        };
        (link.current_speed.is_some() || link.current_width.is_some()).then_some(link)
    };
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
            .map(|name| UverbsNode {
                ibdev: host
                    .read(&format!("/sys/class/infiniband_verbs/{name}/ibdev"))
                    .ok()
                    .flatten()
                    .map(|s| s.trim().to_string()),
                open: openable(host, &format!("/dev/infiniband/{name}")),
                name,
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

    #[test]
    fn states_and_gids() {
        assert_eq!(state_name("4: ACTIVE\n"), "ACTIVE");
        assert_eq!(state_name("5: LinkUp"), "LinkUp");
        assert_eq!(state_name("garbage"), "garbage");
        assert!(is_zero_gid("0000:0000:0000:0000:0000:0000:0000:0000\n"));
        assert!(!is_zero_gid("fe80:0000:0000:0000:0a00:27ff:fe4e:1b2c"));
    }
}
