//! The interface NCCL's sockets should use on this node: the one that really routes
//! between nodes. Shared by the tuner (which writes NCCL_SOCKET_IFNAME) and the linter
//! (which suggests it when the user's value is wrong).
//!
//! The default route's interface is the one the pod network routes through (or,
//! with no default route, the interface carrying the address /etc/hosts gives
//! this host: the pod IP). lo, docker*, virbr* and veth* are never chosen
//! (FACTS.md section 2).

use crate::facts::{Facts, Family};
use crate::nccl::socket_ifname::is_unsuitable_name;

/// The interface chosen and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    pub name: String,
    pub why: String,
}

fn usable_interface(facts: &Facts, name: &str) -> bool {
    let running = facts
        .network
        .interfaces
        .value()
        .is_some_and(|l| l.iter().any(|i| i.name == name && i.running && !i.loopback));
    let addressed = facts
        .network
        .addresses
        .value()
        .is_some_and(|a| a.iter().any(|a| a.interface == name));
    running && addressed && !is_unsuitable_name(name)
}

/// The netdev of an RDMA NIC on an Ethernet (RoCE) port that is up with an address:
/// on RoCE and Multus nodes NCCL's traffic belongs on that network (e.g. net1),
/// not on the pod network the default route points to.
fn roce_netdev(facts: &Facts) -> Option<Choice> {
    let devices = facts.rdma.devices.value()?;
    let usable = facts.rdma.uverbs.value().cloned().unwrap_or_default();
    devices
        .iter()
        .filter(|d| {
            usable.iter().any(|u| {
                u.ibdev.as_deref() == Some(&d.name)
                    && u.open.as_ref().is_some_and(|o| o.refused.is_none())
            })
        })
        .filter(|d| {
            d.ports.iter().any(|p| {
                p.state.as_deref() == Some("ACTIVE") && p.link_layer.as_deref() == Some("Ethernet")
            })
        })
        .flat_map(|d| {
            let gid_netdevs = d
                .ports
                .iter()
                .flat_map(|p| p.gids.iter().filter_map(|g| g.netdev.clone()));
            d.netdevs
                .iter()
                .cloned()
                .chain(gid_netdevs)
                .map(move |n| (d.name.clone(), n))
        })
        .find(|(_, n)| usable_interface(facts, n))
        .map(|(dev, n)| Choice {
            why: format!("{n} is the netdev of RoCE device {dev}, the network RDMA traffic uses"),
            name: n,
        })
}

/// The interface NCCL should use on this node, if one qualifies.
pub fn choose_interface(facts: &Facts) -> Option<Choice> {
    if let Some(c) = roce_netdev(facts) {
        return Some(c);
    }
    let by_route = facts.network.default_routes.value().and_then(|routes| {
        routes
            .iter()
            .find(|r| usable_interface(facts, &r.interface))
    });
    if let Some(r) = by_route {
        let family = match r.family {
            Family::Inet => "IPv4",
            Family::Inet6 => "IPv6",
        };
        return Some(Choice {
            name: r.interface.clone(),
            why: format!(
                "{} carries the default route ({family}, metric {})",
                r.interface, r.metric
            ),
        });
    }
    let hosts = facts.network.hosts_entries.value()?;
    let addresses = facts.network.addresses.value()?;
    hosts.iter().find_map(|ip| {
        let a = addresses
            .iter()
            .find(|a| &a.address == ip && usable_interface(facts, &a.interface))?;
        Some(Choice {
            name: a.interface.clone(),
            why: format!(
                "{} carries {ip}, the address /etc/hosts gives this host (the pod IP)",
                a.interface
            ),
        })
    })
}
