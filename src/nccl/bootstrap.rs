//! The interface and address NCCL's bootstrap binds, and the interfaces its socket
//! transport (NET/Socket) drives, per NCCL version: the pure function the prediction
//! calls, proven against real libnccl builds from 2.13 to 2.32 in
//! tests/integration/nccl_oracle.rs (ncclGetUniqueId in network namespaces).
//!
//! NCCL's code, per tag of NVIDIA/nccl:
//! - src/bootstrap.cc bootstrapNetInit: with NCCL_COMM_ID set, the first getifaddrs
//!   address of the same family and subnet as its address (src/misc/socket.cc
//!   ncclFindInterfaceMatchSubnet, matchSubnet: NCCL_SOCKET_IFNAME, NCCL_SOCKET_FAMILY,
//!   loopback and link state play no part; an IPv6 address also needs the same scope,
//!   so a link-local one matches only `[fe80::...%IF]`), none being
//!   `WARN("NET/Socket : No usable listening interface found")` and ncclSystemError, and
//!   a value ncclSocketGetAddrFromString cannot read `Invalid NCCL_COMM_ID` and
//!   ncclInvalidArgument. NCCL 2.29 (src/os/linux.cc matchSubnet, v2.29.2-1 to
//!   v2.29.7-1; fixed in v2.30.3-1) inverts the IPv4 test: it binds the first IPv4
//!   address *outside* NCCL_COMM_ID's subnet (found by the oracle test); else
//!   ncclFindInterfaces(..., maxIfs = 1), and none found is
//!   `WARN("Bootstrap : no socket interface found")`, returning ncclInternalError (3)
//!   up to v2.23.4-1 and ncclInvalidUsage (5) from v2.24.3-1.
//! - src/misc/socket.cc ncclFindInterfaces (v2.13.4-1 to v2.30.7-1): a
//!   NCCL_SOCKET_IFNAME longer than one byte is the filter; otherwise `ib`, then
//!   `^docker,lo`, `docker`, `lo` (v2.13.4-1 to v2.27.7-1), with `virbr` kept out of
//!   the second step and tried last from v2.28.3-1.
//! - findInterfaces (src/misc/socket.cc; src/os/linux.cc ncclOsFindInterfaces from
//!   v2.29.2-1): walks getifaddrs, keeps IPv4/IPv6 entries passing NCCL_SOCKET_FAMILY,
//!   skips IPv6 loopback, and from v2.28.3-1 skips interfaces without IFF_RUNNING
//!   (before, a down interface with an address counted); the first entry of each
//!   interface name gives its address.
//! - src/misc/utils.cc parseStringList: at most MAX_IFS (16) list entries are read.

use crate::facts::{Family, IfAddress, Interface};
use crate::nccl::Version;
use crate::nccl::socket_ifname::{self, IfnameFilter, MAX_IFS};
use crate::nccl::version::{BOOTSTRAP_INVALID_USAGE, RUNNING_INTERFACES};

/// The variables NCCL's interface selection reads, as NCCL would see them (the
/// process environment with the config files applied: ncclGetEnv).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SocketEnv<'a> {
    /// NCCL_SOCKET_IFNAME, as set (unset: `None`).
    pub ifname: Option<&'a str>,
    /// NCCL_SOCKET_FAMILY, as set.
    pub family: Option<&'a str>,
    /// NCCL_COMM_ID, as set.
    pub comm_id: Option<&'a str>,
}

impl<'a> SocketEnv<'a> {
    /// The three variables, read through `get` (a name -> value lookup).
    pub fn from_lookup(get: impl Fn(&str) -> Option<&'a str>) -> SocketEnv<'a> {
        SocketEnv {
            ifname: get("NCCL_SOCKET_IFNAME"),
            family: get("NCCL_SOCKET_FAMILY"),
            comm_id: get("NCCL_COMM_ID"),
        }
    }
}

/// An interface NCCL uses and the address it binds there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub interface: String,
    pub address: IfAddress,
}

/// What bootstrapNetInit does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bootstrap {
    /// Binds `Endpoint` (printed as `Bootstrap : Using <name>:<address><0>`).
    Uses(Endpoint),
    /// Fails init: no interface passes the selection.
    NoInterface(BootstrapFailure),
    /// NCCL_COMM_ID names a host: NCCL resolves it (getaddrinfo) and takes the interface
    /// in its subnet, which this function does not predict.
    ByCommId,
}

/// How NCCL reports a bootstrap without an interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BootstrapFailure {
    /// The WARN text.
    pub warning: &'static str,
    /// The ncclResult_t that ncclGetUniqueId (and init) returns.
    pub result: i32,
}

/// The WARN NCCL prints when no interface is left (src/bootstrap.cc, every release).
pub const NO_INTERFACE: &str = "Bootstrap : no socket interface found";

/// The WARN when no address shares NCCL_COMM_ID's subnet (src/bootstrap.cc).
const NO_LISTENING: &str = "NET/Socket : No usable listening interface found";
/// The WARN for an NCCL_COMM_ID ncclSocketGetAddrFromString cannot read.
pub(crate) const INVALID_COMM_ID: &str = "Invalid NCCL_COMM_ID";

/// NCCL_COMM_ID's address as ncclSocketGetAddrFromString reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum CommId {
    V4(std::net::Ipv4Addr),
    /// `[addr]:port`, or `[addr%IF]:port` (link scope, on interface IF).
    V6(std::net::Ipv6Addr, Option<String>),
    /// A host name: resolved by getaddrinfo, not predicted.
    Host,
    Invalid,
}

fn comm_id(value: &str) -> CommId {
    if value.len() <= 1 {
        return CommId::Invalid;
    }
    if let Some(rest) = value.strip_prefix('[') {
        let Some((inside, _port)) = rest.split_once(']') else {
            return CommId::Invalid;
        };
        let (addr, scope) = match inside.split_once('%') {
            Some((a, s)) => (a, Some(s.to_string())),
            None => (inside, None),
        };
        return addr
            .parse()
            .map_or(CommId::Invalid, |a| CommId::V6(a, scope));
    }
    // parseStringList: `<host>:<port>`, the part before the first ':'.
    let host = value.split(':').next().unwrap_or("");
    if host.is_empty() {
        return CommId::Invalid;
    }
    match host.parse::<std::net::Ipv4Addr>() {
        Ok(a) => CommId::V4(a),
        Err(_) => CommId::Host,
    }
}

/// matchSubnet (src/misc/socket.cc): same family, and the same bits under the local
/// address's netmask; for IPv6 the same scope too (a link-local local address carries
/// its interface's index, a global one 0).
fn same_subnet(id: &CommId, local: &IfAddress, inverted_v4: bool) -> bool {
    let bits = |len: u32| local.prefix_len.map_or(len, |p| u32::from(p).min(len));
    let text = local.address.split('%').next().unwrap_or(&local.address);
    match (id, local.family) {
        (CommId::V4(remote), Family::Inet) => {
            let Ok(here) = text.parse::<std::net::Ipv4Addr>() else {
                return false;
            };
            let mask = u32::MAX.checked_shl(32 - bits(32)).unwrap_or(0);
            (u32::from(here) & mask == u32::from(*remote) & mask) != inverted_v4
        }
        (CommId::V6(remote, scope), Family::Inet6) => {
            let Ok(here) = text.parse::<std::net::Ipv6Addr>() else {
                return false;
            };
            let mask = u128::MAX.checked_shl(128 - bits(128)).unwrap_or(0);
            let link_local = here.segments()[0] & 0xffc0 == 0xfe80;
            let scoped = match scope {
                Some(iface) => link_local && *iface == local.interface,
                None => !link_local,
            };
            scoped && u128::from(here) & mask == u128::from(*remote) & mask
        }
        _ => false,
    }
}

/// The releases whose matchSubnet inverts the IPv4 comparison (v2.29.2-1 to v2.29.7-1).
fn inverts_ipv4_subnet(version: Option<Version>) -> bool {
    version.is_some_and(|v| v.series() == crate::nccl::version::COMM_ID_SUBNET_INVERTED)
}

/// What bootstrapNetInit does with NCCL_COMM_ID set.
fn by_comm_id(version: Option<Version>, value: &str, addresses: &[IfAddress]) -> Bootstrap {
    let id = comm_id(value);
    let fail = |warning, result| Bootstrap::NoInterface(BootstrapFailure { warning, result });
    match id {
        CommId::Host => Bootstrap::ByCommId,
        // ncclInvalidArgument
        CommId::Invalid => fail(INVALID_COMM_ID, 4),
        _ => match addresses
            .iter()
            .find(|a| same_subnet(&id, a, inverts_ipv4_subnet(version)))
        {
            Some(a) => Bootstrap::Uses(Endpoint {
                interface: a.interface.clone(),
                address: a.clone(),
            }),
            // ncclSystemError
            None => fail(NO_LISTENING, 2),
        },
    }
}

/// Whether `version` (None: the newest) skips interfaces without IFF_RUNNING
/// (findInterfaces, from v2.28.3-1).
pub(crate) fn running_only(version: Option<Version>) -> bool {
    version.is_none_or(|v| v >= RUNNING_INTERFACES)
}

/// Whether `version`'s findInterfaces counts `link` at all (given an address): before
/// v2.28.3-1 a down or carrier-less interface with an address counts.
pub(crate) fn counts(version: Option<Version>, link: &Interface) -> bool {
    link.running || !running_only(version)
}

/// The names of [`find_interfaces`]' endpoints, every match (no maximum): what a filter
/// matches, of which NET/Socket drives the first MAX_IFS.
pub(crate) fn matching_names(
    version: Option<Version>,
    env: SocketEnv,
    interfaces: &[Interface],
    addresses: &[IfAddress],
) -> Vec<String> {
    find_interfaces(version, env, interfaces, addresses, usize::MAX)
        .into_iter()
        .map(|e| e.interface)
        .collect()
}

/// The automatic selection's steps (ncclFindInterfaces with NCCL_SOCKET_IFNAME unset):
/// `virbr` joined the avoided names in v2.28.3-1.
fn automatic_steps(version: Option<Version>) -> &'static [&'static str] {
    if version.is_none_or(|v| v >= RUNNING_INTERFACES) {
        &["ib", "^docker,lo,virbr", "docker", "lo", "virbr"]
    } else {
        &["ib", "^docker,lo", "docker", "lo"]
    }
}

/// NCCL's filter for a list text (`^`, `=`, entries), reading only the first MAX_IFS
/// entries as parseStringList does.
fn filter_of(text: &str) -> IfnameFilter {
    let mut filter = IfnameFilter::parse_list(text);
    filter.names.truncate(MAX_IFS);
    filter
}

/// findInterfaces: up to `max` interfaces passing `filter`, each with the first address
/// that passes, in getifaddrs order.
fn find(
    version: Option<Version>,
    filter: &IfnameFilter,
    family: Option<Family>,
    interfaces: &[Interface],
    addresses: &[IfAddress],
    max: usize,
) -> Vec<Endpoint> {
    // Indexed once (a search per address is quadratic on nodes with many interfaces);
    // the first of a name wins.
    let mut links: std::collections::HashMap<&str, &Interface> = std::collections::HashMap::new();
    for i in interfaces {
        links.entry(i.name.as_str()).or_insert(i);
    }
    let mut found: Vec<Endpoint> = Vec::new();
    for a in addresses {
        if found.len() >= max {
            break;
        }
        // Every getifaddrs entry carries its interface's flags; an address of an
        // interface missing from the list is not one getifaddrs gave.
        let Some(link) = links.get(a.interface.as_str()) else {
            continue;
        };
        if !counts(version, link) {
            continue;
        }
        if family.is_some_and(|f| f != a.family)
            || (a.family == Family::Inet6 && a.address == "::1")
        {
            continue;
        }
        if filter.admits(&a.interface) && !found.iter().any(|e| e.interface == a.interface) {
            found.push(Endpoint {
                interface: a.interface.clone(),
                address: a.clone(),
            });
        }
    }
    found
}

/// ncclFindInterfaces (NCCL_COMM_ID's subnet step aside): up to `max` interfaces.
pub(crate) fn find_interfaces(
    version: Option<Version>,
    env: SocketEnv,
    interfaces: &[Interface],
    addresses: &[IfAddress],
    max: usize,
) -> Vec<Endpoint> {
    let family = socket_ifname::socket_family(env.family);
    if let Some(value) = env.ifname.filter(|v| v.len() > 1) {
        return find(
            version,
            &filter_of(value),
            family,
            interfaces,
            addresses,
            max,
        );
    }
    for step in automatic_steps(version) {
        let found = find(
            version,
            &filter_of(step),
            family,
            interfaces,
            addresses,
            max,
        );
        if !found.is_empty() {
            return found;
        }
    }
    Vec::new()
}

/// What NCCL's bootstrap binds on this node, or how it fails, for NCCL `version`
/// (None: the newest rules).
pub fn bootstrap(
    version: Option<Version>,
    env: SocketEnv,
    interfaces: &[Interface],
    addresses: &[IfAddress],
) -> Bootstrap {
    if let Some(id) = env.comm_id {
        return by_comm_id(version, id, addresses);
    }
    match find_interfaces(version, env, interfaces, addresses, 1).pop() {
        Some(endpoint) => Bootstrap::Uses(endpoint),
        None => Bootstrap::NoInterface(BootstrapFailure {
            warning: NO_INTERFACE,
            result: if version.is_some_and(|v| v < BOOTSTRAP_INVALID_USAGE) {
                3
            } else {
                5
            },
        }),
    }
}

/// The interfaces NET/Socket drives (src/transport/net_socket.cc ncclNetSocketInit:
/// ncclFindInterfaces with MAX_IFS), in NCCL's order.
pub(crate) fn socket_transport(
    version: Option<Version>,
    env: SocketEnv,
    interfaces: &[Interface],
    addresses: &[IfAddress],
) -> Vec<Endpoint> {
    find_interfaces(version, env, interfaces, addresses, MAX_IFS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(name: &str, running: bool) -> Interface {
        Interface {
            name: name.into(),
            up: running,
            running,
            loopback: name == "lo",
            kind: None,
        }
    }

    fn addr(name: &str, family: Family, address: &str) -> IfAddress {
        IfAddress {
            interface: name.into(),
            family,
            address: address.into(),
            prefix_len: None,
        }
    }

    fn node() -> (Vec<Interface>, Vec<IfAddress>) {
        let links = vec![
            link("lo", true),
            link("eth0", false),
            link("virbr0", true),
            link("docker0", true),
        ];
        let addrs = vec![
            addr("lo", Family::Inet, "127.0.0.1"),
            addr("eth0", Family::Inet, "10.0.0.5"),
            addr("virbr0", Family::Inet, "192.168.122.1"),
            addr("docker0", Family::Inet, "172.17.0.1"),
            addr("lo", Family::Inet6, "::1"),
            addr("virbr0", Family::Inet6, "fe80::1"),
        ];
        (links, addrs)
    }

    fn uses(b: Bootstrap) -> String {
        match b {
            Bootstrap::Uses(e) => format!("{}:{}", e.interface, e.address.address),
            other => format!("{other:?}"),
        }
    }

    #[test]
    fn down_interfaces_count_before_2_28_and_virbr_is_avoided_from_2_28() {
        let (l, a) = node();
        let env = SocketEnv::default();
        // 2.27: eth0 is down but has an address, and NCCL took it.
        assert_eq!(
            uses(bootstrap(Some(Version::new(2, 27, 7)), env, &l, &a)),
            "eth0:10.0.0.5"
        );
        // 2.28: eth0 is skipped; virbr0 is avoided; docker0 comes before lo.
        assert_eq!(
            uses(bootstrap(Some(Version::new(2, 28, 9)), env, &l, &a)),
            "docker0:172.17.0.1"
        );
        let no_docker: Vec<IfAddress> = a
            .iter()
            .filter(|x| x.interface != "docker0")
            .cloned()
            .collect();
        assert_eq!(uses(bootstrap(None, env, &l, &no_docker)), "lo:127.0.0.1");
        let env = SocketEnv {
            ifname: Some("^lo,docker"),
            family: Some("AF_INET6"),
            comm_id: None,
        };
        assert_eq!(uses(bootstrap(None, env, &l, &a)), "virbr0:fe80::1");
    }

    #[test]
    fn failure_result_follows_the_version() {
        let (l, a) = node();
        let env = SocketEnv {
            ifname: Some("nonexist0"),
            ..SocketEnv::default()
        };
        let failure = |v| match bootstrap(Some(v), env, &l, &a) {
            Bootstrap::NoInterface(f) => (f.warning, f.result),
            other => panic!("{other:?}"),
        };
        assert_eq!(failure(Version::new(2, 21, 5)), (NO_INTERFACE, 3));
        assert_eq!(failure(Version::new(2, 24, 3)), (NO_INTERFACE, 5));
        let comm = SocketEnv {
            comm_id: Some("10.0.0.1:1234"),
            ..env
        };
        assert_eq!(
            bootstrap(None, comm, &l, &a),
            Bootstrap::NoInterface(BootstrapFailure {
                warning: NO_LISTENING,
                result: 2
            }),
            "no mask known: the whole address must match"
        );
        // One byte is no filter at all: automatic selection.
        let one = SocketEnv {
            ifname: Some("x"),
            ..SocketEnv::default()
        };
        assert_eq!(uses(bootstrap(None, one, &l, &a)), "docker0:172.17.0.1");
    }

    #[test]
    fn nccl_comm_id_takes_the_first_address_in_its_subnet_whatever_the_filters() {
        // Written from src/misc/socket.cc matchSubnet (v2.28.9-1) before the tool ran.
        let (l, mut a) = node();
        for x in &mut a {
            x.prefix_len = Some(if x.family == Family::Inet { 24 } else { 64 });
        }
        let with = |id: &'static str| SocketEnv {
            ifname: Some("=nonexist0"),
            family: Some("AF_INET6"),
            comm_id: Some(id),
        };
        // The down eth0 and the filters do not matter.
        assert_eq!(
            uses(bootstrap(None, with("10.0.0.77:29500"), &l, &a)),
            "eth0:10.0.0.5"
        );
        assert_eq!(
            uses(bootstrap(None, with("127.0.0.9:1"), &l, &a)),
            "lo:127.0.0.1"
        );
        let failed = |id| match bootstrap(None, with(id), &l, &a) {
            Bootstrap::NoInterface(f) => (f.warning, f.result),
            other => panic!("{id}: {other:?}"),
        };
        assert_eq!(failed("203.0.113.9:29500"), (NO_LISTENING, 2));
        // A link-local IPv6 address matches only with its interface's scope.
        assert_eq!(failed("[fe80::2]:29500"), (NO_LISTENING, 2));
        assert_eq!(
            uses(bootstrap(None, with("[fe80::2%virbr0]:29500"), &l, &a)),
            "virbr0:fe80::1"
        );
        assert_eq!(failed("[fe80::2:29500"), (INVALID_COMM_ID, 4));
        assert_eq!(failed(":29500"), (INVALID_COMM_ID, 4));
        assert_eq!(
            bootstrap(None, with("master-0:29500"), &l, &a),
            Bootstrap::ByCommId
        );
    }

    fn names(
        version: Option<Version>,
        env: SocketEnv,
        l: &[Interface],
        a: &[IfAddress],
    ) -> Vec<String> {
        socket_transport(version, env, l, a)
            .into_iter()
            .map(|e| e.interface)
            .collect()
    }

    fn filtered(value: &str) -> SocketEnv<'_> {
        SocketEnv {
            ifname: Some(value),
            ..SocketEnv::default()
        }
    }

    #[test]
    fn prefix_exact_exclusion_and_family() {
        let l = vec![
            link("lo", true),
            link("eth0", true),
            link("docker0", true),
            link("eth10", false),
            link("net1", true),
        ];
        let a = vec![
            addr("lo", Family::Inet, "127.0.0.1"),
            addr("eth0", Family::Inet, "10.0.0.5"),
            addr("docker0", Family::Inet, "172.17.0.1"),
            addr("eth10", Family::Inet, "10.9.0.5"),
            addr("net1", Family::Inet6, "fd00::5"),
            addr("lo", Family::Inet6, "::1"),
        ];
        let new = Some(Version::new(2, 28, 9));
        let pick = |v: &str| names(new, filtered(v), &l, &a);
        assert_eq!(pick("eth"), ["eth0"]); // eth10 is not running
        // Before 2.28 a down interface with an address counts.
        assert_eq!(
            names(Some(Version::new(2, 27, 7)), filtered("eth"), &l, &a),
            ["eth0", "eth10"]
        );
        assert_eq!(pick("=eth"), Vec::<String>::new());
        assert_eq!(pick("==eth0"), Vec::<String>::new()); // exact name "=eth0"
        assert_eq!(pick("=eth0,net1"), ["eth0", "net1"]);
        // ^docker0 alone leaves lo first: the trap FACTS.md section 2 describes.
        assert_eq!(pick("^docker0"), ["lo", "eth0", "net1"]);
        assert_eq!(pick("^docker0,lo"), ["eth0", "net1"]);
        assert_eq!(pick("nonexist0"), Vec::<String>::new());
        let six = SocketEnv {
            ifname: Some("^lo"),
            family: Some("AF_INET6"),
            comm_id: None,
        };
        assert_eq!(names(new, six, &l, &a), ["net1"]);
        assert_eq!(names(new, SocketEnv::default(), &l, &a), ["eth0", "net1"]);
        let only_lo = vec![link("lo", true)];
        assert_eq!(names(new, SocketEnv::default(), &only_lo, &a), ["lo"]);
    }

    #[test]
    fn only_sixteen_list_entries_are_read() {
        let names: Vec<String> = (0..18).map(|i| format!("e{i:02}")).collect();
        let links: Vec<Interface> = names.iter().map(|n| link(n, true)).collect();
        let addrs: Vec<IfAddress> = names
            .iter()
            .enumerate()
            .map(|(i, n)| addr(n, Family::Inet, &format!("10.0.0.{i}")))
            .collect();
        let value = format!("={}", names[..].join(","));
        let env = SocketEnv {
            ifname: Some(&value),
            ..SocketEnv::default()
        };
        let used = socket_transport(None, env, &links, &addrs);
        assert_eq!(used.len(), 16);
        assert_eq!(used[15].interface, "e15");
        // The seventeenth entry is never read: an exclusion of it excludes nothing.
        let exclude = format!("^{}", names[..17].join(","));
        let env = SocketEnv {
            ifname: Some(&exclude),
            ..SocketEnv::default()
        };
        assert_eq!(uses(bootstrap(None, env, &links, &addrs)), "e16:10.0.0.16");
    }
}
