//! NCCL_SOCKET_IFNAME: pin NCCL's bootstrap and socket traffic to the interface
//! that really routes between nodes.
//!
//! The default route's interface is the one the pod network routes through (or,
//! with no default route, the interface carrying the address /etc/hosts gives
//! this host: the pod IP). lo, docker*, virbr* and veth* are never chosen
//! (FACTS.md section 2). The `=` prefix makes NCCL match the exact name: plain
//! `eth0` would also match eth01 (FACTS.md section 3).

use super::{Setting, Source};
use crate::facts::Facts;
use crate::nccl::bootstrap::{self, SocketEnv};
pub use crate::nccl::interface::choose_interface;

pub const NAME: &str = "NCCL_SOCKET_IFNAME";

pub fn rule(facts: &Facts) -> Vec<Setting> {
    propose(facts).into_iter().collect()
}

fn propose(facts: &Facts) -> Option<Setting> {
    let choice = choose_interface(facts)?;
    // NCCL's own choice with the variable unset, by the loaded version's rules (down
    // interfaces count before 2.28, virbr is avoided from 2.28: nccl::bootstrap).
    let automatic = match (
        facts.network.interfaces.value(),
        facts.network.addresses.value(),
    ) {
        (Some(i), Some(a)) => {
            bootstrap::matching_names(crate::nccl::version(facts), SocketEnv::default(), i, a)
        }
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
    use crate::facts::{DefaultRoute, Family, Observed};
    use crate::test_facts::{healthy, iface, v4, with_env};

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

    #[test]
    fn the_tuned_interface_reason_uses_the_loaded_versions_choice() {
        // eth1 is down but addressed and comes first in getifaddrs order: 2.27's automatic
        // selection takes it, 2.28's skips it and agrees with the routed eth0.
        let mut f = healthy();
        let mut down = iface("eth1", None);
        down.running = false;
        if let Observed::Value(i) = &mut f.network.interfaces {
            i.push(down);
        }
        if let Observed::Value(a) = &mut f.network.addresses {
            a.insert(0, v4("eth1", "10.1.0.5"));
        }
        let reason = |v: &str| {
            let settings = crate::tune::tune(&{
                let mut g = f.clone();
                if let crate::facts::gpu::LibraryState::Loaded(l) = &mut g.rdma.nccl.library.state {
                    l.version = Observed::Value(v.into());
                }
                g
            });
            settings
                .into_iter()
                .find(|s| s.name == "NCCL_SOCKET_IFNAME")
                .map(|s| s.reason)
                .unwrap_or_default()
        };
        assert!(
            reason("2.27.7").contains("would bootstrap on eth1"),
            "{}",
            reason("2.27.7")
        );
        assert!(reason("2.28.9").contains("agrees"), "{}", reason("2.28.9"));
    }
}
