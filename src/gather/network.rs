//! Network facts: interfaces and addresses (getifaddrs), link kinds (rtnetlink),
//! default routes (/proc/net/route, /proc/net/ipv6_route) and the addresses
//! /etc/hosts gives this host's name (kubelet writes the pod IP there).

use super::host::Host;
use super::kernel::Kernel;
use crate::facts::{DefaultRoute, FactError, Family, Interface, NetworkFacts, Observed};

const RTF_UP: u32 = 0x0001;
/// Unreachable/prohibit routes (the kernel's IPv6 table lists one on lo).
const RTF_REJECT: u32 = 0x0200;

/// IPv4 default routes from /proc/net/route: destination and mask 0, route up.
fn parse_route_v4(text: &str) -> Result<Vec<DefaultRoute>, String> {
    let mut routes = Vec::new();
    for (n, line) in text.lines().enumerate().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.is_empty() {
            continue;
        }
        if f.len() < 8 {
            return Err(format!("line {}: expected at least 8 fields", n + 1));
        }
        let hex = |s: &str| {
            u32::from_str_radix(s, 16).map_err(|_| format!("line {}: bad hex {s:?}", n + 1))
        };
        let (dest, flags, metric, mask) = (hex(f[1])?, hex(f[3])?, f[6], hex(f[7])?);
        let metric: u32 = metric
            .parse()
            .map_err(|_| format!("line {}: bad metric {metric:?}", n + 1))?;
        if dest == 0 && mask == 0 && flags & RTF_UP != 0 && flags & RTF_REJECT == 0 {
            routes.push(DefaultRoute {
                interface: f[0].to_string(),
                family: Family::Inet,
                metric,
            });
        }
    }
    Ok(routes)
}

/// IPv6 default routes from /proc/net/ipv6_route: ::/0, up, not a reject route.
fn parse_route_v6(text: &str) -> Result<Vec<DefaultRoute>, String> {
    let mut routes = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.is_empty() {
            continue;
        }
        if f.len() < 10 {
            return Err(format!("line {}: expected 10 fields", n + 1));
        }
        let hex = |s: &str| {
            u32::from_str_radix(s, 16).map_err(|_| format!("line {}: bad hex {s:?}", n + 1))
        };
        let (metric, flags) = (hex(f[5])?, hex(f[8])?);
        let default = f[0].bytes().all(|c| c == b'0') && f[1] == "00";
        if default && flags & RTF_UP != 0 && flags & RTF_REJECT == 0 && f[9] != "lo" {
            routes.push(DefaultRoute {
                interface: f[9].to_string(),
                family: Family::Inet6,
                metric,
            });
        }
    }
    Ok(routes)
}

/// Addresses /etc/hosts lists for `hostname` (first field of each matching line).
fn parse_hosts(text: &str, hostname: &str) -> Vec<String> {
    let mut found = Vec::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("");
        let mut fields = line.split_whitespace();
        let Some(address) = fields.next() else {
            continue;
        };
        if fields.any(|name| name == hostname) && !found.iter().any(|a| a == address) {
            found.push(address.to_string());
        }
    }
    found
}

fn routes(host: &Host) -> Observed<Vec<DefaultRoute>> {
    let mut all = Vec::new();
    for (abs, parse) in [
        (
            "/proc/net/route",
            parse_route_v4 as fn(&str) -> Result<Vec<DefaultRoute>, String>,
        ),
        ("/proc/net/ipv6_route", parse_route_v6),
    ] {
        match host.read(abs) {
            // No IPv6 in this kernel or namespace: no IPv6 routes.
            Ok(None) => {}
            Ok(Some(text)) => match parse(&text) {
                Ok(mut r) => all.append(&mut r),
                Err(e) => {
                    return Observed::Error(FactError::new(
                        host.path(abs).display().to_string(),
                        e,
                    ));
                }
            },
            Err(e) => return Observed::Error(e),
        }
    }
    // Lowest metric wins, IPv4 before IPv6 at equal metric (NCCL prefers the first address family found).
    all.sort_by_key(|r| (r.metric, r.family));
    Observed::Value(all)
}

/// An interface's link speed in Mb/s from /sys/class/net/<name>/speed, None where
/// the kernel gives none (-1, EINVAL for virtual links, no such file) or the name
/// is not a plain interface name. Read on demand for the gang's socket figure.
pub fn link_speed_mbps(host: &Host, name: &str) -> Option<u64> {
    if name.is_empty() || name.contains('/') || name.starts_with('.') {
        return None;
    }
    host.read(&format!("/sys/class/net/{name}/speed"))
        .ok()
        .flatten()
        .and_then(|t| t.trim().parse::<i64>().ok())
        .filter(|&s| s > 0)
        .map(|s| s as u64)
}

pub fn gather(host: &Host, kernel: &dyn Kernel, hostname: Option<&str>) -> NetworkFacts {
    // A failed kind query leaves every kind unknown and says why in `errors`: a
    // virtual interface must not pass for a physical one without a trace.
    let (kinds, errors) = match kernel.link_kinds() {
        Ok(kinds) => (kinds, Vec::new()),
        Err(e) => (Default::default(), vec![e]),
    };
    let (interfaces, addresses) = match kernel.interfaces() {
        Ok(list) => {
            let interfaces = list
                .links
                .into_iter()
                .map(|l| Interface {
                    kind: kinds.get(&l.name).cloned(),
                    name: l.name,
                    up: l.up,
                    running: l.running,
                    loopback: l.loopback,
                })
                .collect();
            (Observed::Value(interfaces), Observed::Value(list.addresses))
        }
        Err(e) => (Observed::Error(e.clone()), Observed::Error(e)),
    };
    let hosts_entries = match (host.read("/etc/hosts"), hostname) {
        (Ok(Some(text)), Some(name)) => Observed::Value(parse_hosts(&text, name)),
        (Ok(_), _) => Observed::Value(Vec::new()),
        (Err(e), _) => Observed::Error(e),
    };
    NetworkFacts {
        interfaces,
        addresses,
        default_routes: routes(host),
        hosts_entries,
        errors,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROUTE: &str = "\
Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT
eth1\t00000000\t0101A8C0\t0003\t0\t0\t200\t00000000\t0\t0\t0
eth0\t00000000\t010011AC\t0003\t0\t0\t100\t00000000\t0\t0\t0
eth0\t000011AC\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0
";

    #[test]
    fn v4_defaults_only() {
        let r = parse_route_v4(ROUTE).unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!((r[1].interface.as_str(), r[1].metric), ("eth0", 100));
        assert!(parse_route_v4("Iface\nbad line\n").is_err());
        assert_eq!(parse_route_v4("").unwrap(), vec![]);
    }

    #[test]
    fn v6_default_skips_reject_routes_on_lo() {
        let text = "\
00000000000000000000000000000000 00 00000000000000000000000000000000 00 fe800000000000000000000000000001 00000400 00000001 00000000 00000003 eth0
00000000000000000000000000000000 00 00000000000000000000000000000000 00 00000000000000000000000000000000 ffffffff 00000001 00000000 00200200 lo
fe800000000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001 eth0
";
        let r = parse_route_v6(text).unwrap();
        assert_eq!(r.len(), 1);
        assert_eq!((r[0].interface.as_str(), r[0].metric), ("eth0", 1024));
        assert!(parse_route_v6("zz 00\n").is_err());
    }

    #[test]
    fn failed_link_kind_query_is_recorded_not_dropped() {
        use crate::gather::kernel::{InterfaceList, Link};
        use crate::gather::replay::{Recording, ReplayKernel};
        let root = tempfile::tempdir().unwrap();
        let eth0 = Link {
            name: "eth0".into(),
            up: true,
            running: true,
            loopback: false,
        };
        let recording = Recording {
            interfaces: Some(Observed::Value(InterfaceList {
                links: vec![eth0],
                addresses: Vec::new(),
            })),
            link_kinds: Some(Observed::Error(
                FactError::new("rtnetlink RTM_GETLINK", "EACCES: Permission denied")
                    .with_errno(libc::EACCES),
            )),
            ..Recording::default()
        };
        let kernel = ReplayKernel::new(recording, root.path());
        let facts = gather(&Host::new(root.path()), &kernel, None);
        let interfaces = facts.interfaces.value().unwrap();
        assert_eq!(interfaces[0].name, "eth0");
        assert_eq!(interfaces[0].kind, None);
        assert_eq!(facts.errors.len(), 1);
        assert_eq!(facts.errors[0].errno, Some(libc::EACCES));
        assert_eq!(facts.errors[0].source, "rtnetlink RTM_GETLINK");
        // The error is in the facts document, not just in memory.
        let json = serde_json::to_value(&facts).unwrap();
        assert_eq!(json["errors"][0]["message"], "EACCES: Permission denied");
    }

    #[test]
    fn hosts_lookup() {
        let hosts = "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n10.1.2.3\ttrainer-0 # pod\nfe80::1 trainer-0\n10.1.2.3 trainer-0.svc\n";
        assert_eq!(parse_hosts(hosts, "trainer-0"), vec!["10.1.2.3", "fe80::1"]);
        assert!(parse_hosts(hosts, "other").is_empty());
    }
}
