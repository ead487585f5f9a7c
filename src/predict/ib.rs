//! The IB/RoCE devices and ports NCCL's IB transport uses, and the GID of each RoCE
//! port, from src/transport/net_ib.cc (ncclIbInitDevices, ncclIbGetGidIndex).

use super::{Decision, env, int_param};
use crate::facts::rdma::{Gid, RdmaDevice, RdmaPort};
use crate::facts::{Facts, ImageRole};
use crate::nccl::Version;
use crate::nccl::ib_hca::HcaFilter;
use crate::nccl::version::{DYNAMIC_GID, since};
use serde::{Deserialize, Serialize};
use std::net::Ipv6Addr;

const SOURCE: &str = "src/transport/net_ib.cc ncclIbInitDevices (v2.18-v2.28: NCCL_IB_DISABLE, ibv_open_device, IBV_PORT_ACTIVE, link layer IB or Ethernet, matchIfList of NCCL_IB_HCA) and ncclIbGetGidIndex (v2.21+; NCCL_IB_GID_INDEX, default 0, before)";

/// One port NCCL uses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IbPort {
    pub device: String,
    pub port: u32,
    /// `IB` or `RoCE`, as NCCL's log prints it.
    pub link_layer: String,
    /// The GID index NCCL uses on a RoCE port (always 0 on InfiniBand).
    pub gid_index: u32,
    /// That GID, when the facts list it.
    pub gid: Option<String>,
    /// False when the GID is link-local or not configured: RoCE traffic across subnets
    /// (or any, with an unconfigured GID) times out.
    pub routable: bool,
    pub gid_why: String,
}

/// A device or port NCCL leaves out, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkippedPort {
    pub device: String,
    /// `None`: the whole device.
    pub port: Option<u32>,
    pub why: String,
    /// True when the user's NCCL_IB_HCA left it out.
    pub by_filter: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IbPrediction {
    /// Ports NCCL's IB transport uses, in its order.
    pub used: Vec<IbPort>,
    pub skipped: Vec<SkippedPort>,
    /// Why the IB transport is off before any device is looked at.
    pub off: Option<String>,
}

/// Why NCCL's IB transport is off before looking at devices.
fn transport_off(facts: &Facts, has_ip_interface: bool) -> Option<String> {
    if int_param(facts, "NCCL_IB_DISABLE").is_some_and(|v| v != 0) {
        return Some("NCCL_IB_DISABLE=1 turns NCCL's IB transport off".into());
    }
    if facts.image == ImageRole::Trainer && facts.rdma.verbs.loaded().is_none() {
        return Some("libibverbs does not load in this image (wrap_ibv_symbols fails)".into());
    }
    if !has_ip_interface {
        return Some(
            "no IP interface for its out-of-band connection (\"NET/IB : No IP interface found\")"
                .into(),
        );
    }
    None
}

/// Why NCCL cannot open `d` (ibv_open_device), if it cannot.
fn unopenable(facts: &Facts, d: &RdmaDevice) -> Option<String> {
    let nodes = facts.rdma.uverbs.value()?;
    match nodes.iter().find(|n| n.ibdev.as_deref() == Some(&d.name)) {
        Some(n) => match &n.open {
            Some(o) => o.refused.as_ref().map(|r| {
                format!(
                    "ibv_open_device fails: /dev/infiniband/{} refused ({r})",
                    n.name
                )
            }),
            None => Some(format!("no /dev/infiniband/{} in this container", n.name)),
        },
        None => Some("no /dev/infiniband/uverbs* node for it in this container".into()),
    }
}

/// A port's verdict: used (with its GID) or skipped.
fn port(
    facts: &Facts,
    version: Option<Version>,
    filter: Option<&(String, HcaFilter)>,
    d: &RdmaDevice,
    p: &RdmaPort,
) -> Result<IbPort, SkippedPort> {
    let skip = |why: String, by_filter: bool| SkippedPort {
        device: d.name.clone(),
        port: Some(p.port),
        why,
        by_filter,
    };
    if p.state.as_deref() != Some("ACTIVE") {
        let state = p.state.as_deref().unwrap_or("unknown");
        return Err(skip(format!("port {state}, not ACTIVE"), false));
    }
    let link_layer = match p.link_layer.as_deref() {
        Some("InfiniBand") => "IB",
        Some("Ethernet") => "RoCE",
        other => {
            let ll = other.unwrap_or("unknown");
            return Err(skip(
                format!(
                    "link layer {ll}, neither InfiniBand nor Ethernet (EFA is driven by its net plugin)"
                ),
                false,
            ));
        }
    };
    if let Some((value, f)) = filter
        && !f.admits(&d.name, p.port)
    {
        return Err(skip(format!("left out by NCCL_IB_HCA={value:?}"), true));
    }
    let (gid_index, gid_why) = if link_layer == "IB" {
        (0, "InfiniBand: GID index 0".to_string())
    } else {
        roce_gid_index(facts, version, &p.gids)
    };
    let gid = p.gids.iter().find(|g| g.index == gid_index);
    let routable = link_layer == "IB" || gid.and_then(|g| parse_gid(&g.gid)).is_some_and(valid_gid);
    Ok(IbPort {
        device: d.name.clone(),
        port: p.port,
        link_layer: link_layer.into(),
        gid_index,
        gid: gid.map(|g| g.gid.clone()),
        routable,
        gid_why,
    })
}

pub(super) fn predict(
    facts: &Facts,
    version: Option<Version>,
    has_ip_interface: bool,
) -> Decision<IbPrediction> {
    let mut out = IbPrediction {
        used: Vec::new(),
        skipped: Vec::new(),
        off: transport_off(facts, has_ip_interface),
    };
    if let Some(off) = &out.off {
        let why = off.clone();
        return Decision::new(out, why, SOURCE);
    }
    let filter = env(facts, "NCCL_IB_HCA").map(|v| (v.to_string(), HcaFilter::parse(v)));
    let devices = facts.rdma.devices.value().map_or(&[][..], Vec::as_slice);
    for d in devices.iter().filter(|d| !d.is_efa()) {
        if let Some(why) = unopenable(facts, d) {
            out.skipped.push(SkippedPort {
                device: d.name.clone(),
                port: None,
                why,
                by_filter: false,
            });
            continue;
        }
        for p in &d.ports {
            match port(facts, version, filter.as_ref(), d, p) {
                Ok(used) => out.used.push(used),
                Err(skipped) => out.skipped.push(skipped),
            }
        }
    }
    let why = if out.used.is_empty() {
        "no IB or RoCE port qualifies (\"NET/IB : No device found\")".to_string()
    } else {
        let ports: Vec<String> = out
            .used
            .iter()
            .map(|p| format!("{}:{}/{}", p.device, p.port, p.link_layer))
            .collect();
        format!("NET/IB : Using {}", ports.join(" "))
    };
    Decision::new(out, why, SOURCE)
}

/// The GID index on a RoCE port and why.
fn roce_gid_index(facts: &Facts, version: Option<Version>, gids: &[Gid]) -> (u32, String) {
    if let Some(i) = int_param(facts, "NCCL_IB_GID_INDEX").filter(|i| *i >= 0) {
        let i = u32::try_from(i).unwrap_or(0);
        return (i, format!("NCCL_IB_GID_INDEX={i}"));
    }
    if !since(version, DYNAMIC_GID) {
        return (
            0,
            "NCCL_IB_GID_INDEX unset: index 0 (dynamic selection came in 2.21)".into(),
        );
    }
    let family_v6 = env(facts, "NCCL_IB_ADDR_FAMILY") == Some("AF_INET6");
    let roce_version = int_param(facts, "NCCL_IB_ROCE_VERSION_NUM").unwrap_or(2);
    let index = dynamic_gid(gids, family_v6, roce_version);
    let why = format!(
        "chosen by NCCL (2.21+) for {} and RoCE v{roce_version}",
        if family_v6 { "AF_INET6" } else { "AF_INET" }
    );
    (index, why)
}

/// A GID's text as 8 16-bit groups.
fn parse_gid(text: &str) -> Option<[u16; 8]> {
    text.parse::<Ipv6Addr>().ok().map(|a| a.segments())
}

/// getGidAddrFamily: IPv4-mapped GIDs are AF_INET (true here for v6).
fn is_v6(g: [u16; 8]) -> bool {
    !(g[..5].iter().all(|s| *s == 0) && g[5] == 0xffff)
}

/// configuredGid && !linkLocalGid.
fn valid_gid(g: [u16; 8]) -> bool {
    let trailer_zero = g[2..].iter().all(|s| *s == 0);
    let unset = g.iter().all(|s| *s == 0) || (g[0] == 0xfe80 && g[1] == 0 && trailer_zero);
    let link_local = g[0] == 0xfe80 && g[1] == 0 && g[2] == 0 && g[3] == 0;
    !unset && !link_local
}

/// The RoCE version of a GID from its sysfs type (ncclIbRoceGetVersionNum).
fn roce_version_of(g: Option<&Gid>) -> i64 {
    match g.and_then(|g| g.kind.as_deref()) {
        Some(k) if k.starts_with("IB/RoCE v1") || k.starts_with("RoCE v1") => 1,
        Some(k) if k.starts_with("RoCE v2") => 2,
        _ => -1,
    }
}

/// ncclIbGetGidIndex's walk over the table (ncclUpdateGidIndex), NCCL_IB_ADDR_RANGE
/// aside: a GID the facts do not list is the zero GID.
fn dynamic_gid(gids: &[Gid], family_v6: bool, roce_version: i64) -> u32 {
    let zero = [0u16; 8];
    let get = |i: u32| gids.iter().find(|g| g.index == i);
    let raw = |i: u32| get(i).and_then(|g| parse_gid(&g.gid)).unwrap_or(zero);
    let len = gids.iter().map(|g| g.index + 1).max().unwrap_or(0);
    let mut index = 0;
    for candidate in 1..len {
        let (gid, cand) = (raw(index), raw(candidate));
        if is_v6(cand) != is_v6(gid) && is_v6(cand) == family_v6 {
            index = candidate;
            continue;
        }
        if is_v6(cand) != family_v6 || !valid_gid(cand) {
            continue;
        }
        let (v, vc) = (roce_version_of(get(index)), roce_version_of(get(candidate)));
        if (v != vc || !valid_gid(gid)) && vc == roce_version {
            index = candidate;
        }
    }
    index
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_facts;

    fn gid(index: u32, gid: &str, kind: &str) -> Gid {
        Gid {
            index,
            gid: gid.into(),
            kind: Some(kind.into()),
            netdev: None,
        }
    }

    /// The RoCE port of NVIDIA/nccl#769: fe80 v1/v2 at 0/1, IPv4-mapped v1/v2 at 2/3.
    fn table() -> Vec<Gid> {
        vec![
            gid(0, "fe80:0000:0000:0000:0ac0:ebff:feda:1cfb", "IB/RoCE v1"),
            gid(1, "fe80:0000:0000:0000:0ac0:ebff:feda:1cfb", "RoCE v2"),
            gid(2, "0000:0000:0000:0000:0000:ffff:c800:d106", "IB/RoCE v1"),
            gid(3, "0000:0000:0000:0000:0000:ffff:c800:d106", "RoCE v2"),
        ]
    }

    #[test]
    fn dynamic_gid_selection_follows_nccl() {
        assert_eq!(dynamic_gid(&table(), false, 2), 3);
        assert_eq!(dynamic_gid(&table(), false, 1), 2);
        // AF_INET6 with only link-local IPv6 GIDs: nothing valid, index 0 stays.
        assert_eq!(dynamic_gid(&table(), true, 2), 0);
        let mut global = table();
        global.push(gid(
            4,
            "fd00:0000:0000:0000:0000:0000:0000:0005",
            "IB/RoCE v1",
        ));
        global.push(gid(5, "fd00:0000:0000:0000:0000:0000:0000:0005", "RoCE v2"));
        assert_eq!(dynamic_gid(&global, true, 2), 5);
        assert!(!valid_gid(parse_gid(&table()[0].gid).unwrap()));
        assert!(valid_gid(parse_gid(&table()[3].gid).unwrap()));
    }

    #[test]
    fn ports_filters_and_versions() {
        let f = test_facts::roce_two_nics("DOWN");
        let p = predict(&f, Some(Version::new(2, 23, 4)), true).value;
        assert_eq!(p.used.len(), 1, "{p:?}");
        assert!(p.skipped.iter().any(|s| s.why.contains("not ACTIVE")));
        let old = predict(&f, Some(Version::new(2, 18, 5)), true).value;
        assert_eq!(old.used[0].gid_index, 0);
        let excluded = test_facts::with_env(f.clone(), &[("NCCL_IB_HCA", "^mlx5")]);
        let p = predict(&excluded, Some(Version::new(2, 23, 4)), true).value;
        assert!(p.used.is_empty() && p.skipped.iter().any(|s| s.by_filter));
        let off = test_facts::with_env(f.clone(), &[("NCCL_IB_DISABLE", "1")]);
        assert!(predict(&off, None, true).value.off.is_some());
        assert!(predict(&f, None, false).value.off.is_some());
    }
}
