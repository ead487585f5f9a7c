//! NCCL_SOCKET_IFNAME semantics: the filter, the family, the address NCCL binds on an
//! interface. The selection itself, per NCCL version, is `crate::nccl::bootstrap`'s
//! (proven against real libnccl 2.13-2.32); every caller goes through it.
//!
//! From NVIDIA/nccl (src/misc/socket.cc ncclFindInterfaces, src/os/linux.cc
//! ncclOsFindInterfaces, src/misc/utils.cc parseStringList/matchIf, 2.28/2.29):
//! - a value of length <= 1 is ignored (automatic selection);
//! - a leading `^` excludes, then a leading `=` asks for exact names; the rest is a
//!   comma list whose entries are `prefix[:port]`, empty entries skipped;
//! - IPv6 loopback addresses are skipped, NCCL_SOCKET_FAMILY (AF_INET/AF_INET6)
//!   filters; interfaces are taken in getifaddrs order; bootstrap uses the first one.
//! - which interfaces count (IFF_RUNNING from 2.28) and the automatic selection's
//!   steps (virbr avoided from 2.28) depend on the version: `crate::nccl::bootstrap`.

use crate::facts::{Family, IfAddress};

/// How many interfaces NCCL's socket transport keeps: NVIDIA/nccl src/include/socket.h
/// `#define MAX_IFS 16` (2.12 to 2.29), passed by src/transport/net_socket.cc
/// ncclNetSocketInit to ncclFindInterfaces, which stops at that many. Interfaces
/// matched past the 16th carry no NCCL traffic.
pub const MAX_IFS: usize = 16;

/// The interfaces NCCL's socket transport drives, of `selected` (in NCCL's order).
pub fn socket_transport(selected: &[String]) -> &[String] {
    &selected[..selected.len().min(MAX_IFS)]
}

/// The address NCCL binds on `interface`: ncclFindInterfaces keeps the first address
/// of each interface in getifaddrs order that passes the family filter (and is not
/// IPv6 loopback), as [`select`] does.
pub fn used_address<'a>(
    interface: &str,
    addresses: &'a [IfAddress],
    family: Option<Family>,
) -> Option<&'a IfAddress> {
    addresses.iter().find(|a| {
        a.interface == interface
            && family.is_none_or(|f| f == a.family)
            && !(a.family == Family::Inet6 && a.address == "::1")
    })
}

/// Whether `address` is IPv4 link-local (169.254.0.0/16, RFC 3927): routers do not
/// forward it, and on EKS (Pod Identity's 169.254.170.23, the metadata endpoint's
/// 169.254.169.254) every node holds the same address, so another node cannot reach it.
pub fn is_ipv4_link_local(address: &IfAddress) -> bool {
    address.family == Family::Inet
        && address
            .address
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|a| a.is_link_local())
}

/// A parsed NCCL_SOCKET_IFNAME value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IfnameFilter {
    pub exclude: bool,
    pub exact: bool,
    /// Name prefixes (or exact names), port suffixes removed.
    pub names: Vec<String>,
}

impl IfnameFilter {
    /// Parses a value the way NCCL does; `None` when NCCL ignores it (length <= 1).
    pub fn parse(value: &str) -> Option<IfnameFilter> {
        if value.len() <= 1 {
            return None;
        }
        Some(Self::parse_list(value))
    }

    /// Parses a list text as NCCL's findInterfaces does, whatever its length.
    pub(crate) fn parse_list(value: &str) -> IfnameFilter {
        let (exclude, rest) = match value.strip_prefix('^') {
            Some(r) => (true, r),
            None => (false, value),
        };
        let (exact, rest) = match rest.strip_prefix('=') {
            Some(r) => (true, r),
            None => (false, rest),
        };
        let names = rest
            .split(',')
            .filter_map(|entry| entry.split(':').next())
            .filter(|p| !p.is_empty())
            .map(String::from)
            .collect();
        IfnameFilter {
            exclude,
            exact,
            names,
        }
    }

    /// Whether NCCL would consider interface `name` under this filter.
    pub fn admits(&self, name: &str) -> bool {
        // An empty list matches everything (matchIfList's exception), before negation.
        let listed = self.names.is_empty()
            || self.names.iter().any(|p| {
                if self.exact {
                    name == p
                } else {
                    name.starts_with(p.as_str())
                }
            });
        listed != self.exclude
    }
}

/// Parses NCCL_SOCKET_FAMILY: `AF_INET` or `AF_INET6`; anything else is ignored by NCCL.
pub fn socket_family(value: Option<&str>) -> Option<Family> {
    match value {
        Some("AF_INET") => Some(Family::Inet),
        Some("AF_INET6") => Some(Family::Inet6),
        _ => None,
    }
}

/// Names NCCL's automatic selection avoids, and `veth*` (host-side container
/// links, where NCCL traffic hangs: FACTS.md section 2).
pub fn is_unsuitable_name(name: &str) -> bool {
    ["lo", "docker", "virbr", "veth"]
        .iter()
        .any(|p| name.starts_with(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(name: &str, family: Family, address: &str) -> IfAddress {
        IfAddress {
            interface: name.into(),
            family,
            address: address.into(),
            prefix_len: None,
        }
    }

    fn node() -> Vec<IfAddress> {
        vec![
            addr("lo", Family::Inet, "127.0.0.1"),
            addr("eth0", Family::Inet, "10.0.0.5"),
            addr("docker0", Family::Inet, "172.17.0.1"),
            addr("eth10", Family::Inet, "10.9.0.5"),
            addr("net1", Family::Inet6, "fd00::5"),
            addr("lo", Family::Inet6, "::1"),
        ]
    }

    #[test]
    fn parse_follows_ncc_syntax() {
        assert_eq!(IfnameFilter::parse("e"), None);
        assert_eq!(IfnameFilter::parse(""), None);
        let f = IfnameFilter::parse("^=eth0:1,,net").unwrap();
        assert!(f.exclude && f.exact);
        assert_eq!(f.names, ["eth0", "net"]);
        // `=^` is an exact match on a name starting with ^, as in NCCL.
        let g = IfnameFilter::parse("=^eth0").unwrap();
        assert!(!g.exclude && g.exact);
    }

    #[test]
    fn the_socket_transport_keeps_sixteen_interfaces_and_the_first_address_of_each() {
        let names: Vec<String> = (0..20).map(|i| format!("eth{i}")).collect();
        assert_eq!(socket_transport(&names).len(), MAX_IFS);
        assert_eq!(socket_transport(&names[..3]), &names[..3]);
        let a = node();
        let lo = used_address("lo", &a, None).unwrap();
        assert_eq!(lo.address, "127.0.0.1");
        assert_eq!(used_address("net1", &a, Some(Family::Inet)), None);
        let link_local = addr("pod-id-link0", Family::Inet, "169.254.170.23");
        assert!(is_ipv4_link_local(&link_local));
        assert!(!is_ipv4_link_local(&addr("eth0", Family::Inet, "10.0.0.5")));
        assert!(!is_ipv4_link_local(&addr("x", Family::Inet, "169.254.x")));
        assert!(!is_ipv4_link_local(&addr("x", Family::Inet6, "fe80::1")));
    }

    #[test]
    fn families() {
        assert_eq!(socket_family(Some("AF_INET6")), Some(Family::Inet6));
        assert_eq!(socket_family(Some("inet")), None);
    }
}
