//! NCCL_SOCKET_IFNAME: pin NCCL's bootstrap and socket traffic to the interface
//! that really routes between nodes.
//!
//! The default route's interface is the one the pod network routes through (or,
//! with no default route, the interface carrying the address /etc/hosts gives
//! this host: the pod IP). lo, docker*, virbr* and veth* are never chosen
//! (FACTS.md section 2). The `=` prefix makes NCCL match the exact name: plain
//! `eth0` would also match eth01 (FACTS.md section 3).

use super::{Setting, Source};
use crate::facts::{Facts, Family};
use crate::nccl::socket_ifname::{is_unsuitable_name, select_automatic};

pub const NAME: &str = "NCCL_SOCKET_IFNAME";

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

pub fn rule(facts: &Facts) -> Vec<Setting> {
    propose(facts).into_iter().collect()
}

fn propose(facts: &Facts) -> Option<Setting> {
    let choice = choose_interface(facts)?;
    let automatic = match (
        facts.network.interfaces.value(),
        facts.network.addresses.value(),
    ) {
        (Some(i), Some(a)) => select_automatic(i, a, None),
        _ => Vec::new(),
    };
    let agreement = match automatic.first() {
        Some(first) if *first == choice.name => {
            "NCCL's automatic choice agrees here; pinning it keeps every rank on the routed interface".to_string()
        }
        Some(first) => format!("left alone, NCCL would bootstrap on {first}"),
        None => "left alone, NCCL would find no interface".to_string(),
    };
    Some(Setting {
        name: NAME.to_string(),
        value: format!("={}", choice.name),
        reason: format!(
            "{}; {agreement}; exact-name syntax, so no other interface starting with {} matches",
            choice.why, choice.name
        ),
        source: Source::Tuned,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::{DefaultRoute, Observed};
    use crate::judge::test_facts::{healthy, iface, v4, with_env};

    #[test]
    fn default_route_interface_exact_syntax() {
        let s = propose(&healthy()).unwrap();
        assert_eq!((s.value.as_str(), s.source), ("=eth0", Source::Tuned));
        assert!(s.reason.contains("default route"));
        assert!(s.reason.contains("agrees"));
    }

    #[test]
    fn user_value_is_kept() {
        let settings = crate::tune::tune(&with_env(healthy(), &[("NCCL_SOCKET_IFNAME", "lo")]));
        let s = settings.iter().find(|s| s.name == NAME).unwrap();
        assert_eq!((s.value.as_str(), s.source), ("lo", Source::User));
        assert!(
            s.reason.contains("nccl-preflight would set \"=eth0\""),
            "{}",
            s.reason
        );
    }

    #[test]
    fn never_docker_veth_or_lo_and_falls_back_to_pod_ip() {
        let mut f = healthy();
        f.network.interfaces = Observed::Value(vec![
            iface("lo", None),
            iface("docker0", None),
            iface("net1", None),
        ]);
        f.network.addresses = Observed::Value(vec![
            v4("lo", "127.0.0.1"),
            v4("docker0", "172.17.0.1"),
            v4("net1", "192.168.5.7"),
        ]);
        f.network.default_routes = Observed::Value(vec![DefaultRoute {
            interface: "docker0".into(),
            family: Family::Inet,
            metric: 0,
        }]);
        assert_eq!(propose(&f), None);
        f.network.hosts_entries = Observed::Value(vec!["192.168.5.7".into()]);
        let s = propose(&f).unwrap();
        assert_eq!(s.value, "=net1");
        assert!(s.reason.contains("pod IP"));
    }

    #[test]
    fn reason_says_when_nccl_would_choose_otherwise() {
        let mut f = healthy();
        f.network.interfaces = Observed::Value(vec![
            iface("lo", None),
            iface("ib0", None),
            iface("eth0", None),
        ]);
        f.network.addresses = Observed::Value(vec![
            v4("lo", "127.0.0.1"),
            v4("ib0", "10.9.0.1"),
            v4("eth0", "10.0.0.5"),
        ]);
        let s = propose(&f).unwrap();
        assert!(
            s.reason.contains("NCCL would bootstrap on ib0"),
            "{}",
            s.reason
        );
    }
}
