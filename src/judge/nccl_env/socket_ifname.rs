//! NCCL_SOCKET_IFNAME and NCCL_SOCKET_FAMILY against this pod's interfaces, with the
//! selection rules of the libnccl the trainer loads (`crate::nccl::bootstrap`, proven
//! against real NCCL 2.13-2.32; the newest rules when no libnccl is found).
//!
//! NCCL (src/misc/socket.cc ncclFindInterfaces, 2.28): bootstrap takes the first
//! matching interface (bootstrap.cc asks for 1), but the socket NET transport
//! (src/transport/net_socket.cc) asks for up to MAX_IFS = 16 and drives every
//! match as a separate NIC. A prefix that matches a bridge or a second network
//! therefore puts NCCL's traffic on it too, and one that cannot reach other nodes
//! (an IPv4 link-local address) breaks the job even when bootstrap is fine.

use super::Problem;
use crate::facts::{EnvValue, Facts, Interface, Observed};
use crate::finding::Outcome;
use crate::layout;
use crate::nccl::bootstrap::{self, SocketEnv};
use crate::nccl::interface::choose_interface;
use crate::nccl::socket_ifname::{self, IfnameFilter};

pub(super) fn suggestion(facts: &Facts) -> String {
    match choose_interface(facts) {
        Some(choice) => format!(
            "NCCL_SOCKET_IFNAME='={}' ({}), or unset it and let NCCL choose",
            choice.name, choice.why
        ),
        None => {
            "unset NCCL_SOCKET_IFNAME, or name an interface that is up and has an address".into()
        }
    }
}

/// A value NCCL cannot use as a filter at all: not UTF-8, or one character or less.
fn unusable_value(facts: &Facts, value: &EnvValue, shown: &str) -> Option<Problem> {
    let summary = if value.not_utf8 {
        format!("{shown} is not valid UTF-8 and cannot name an interface NCCL will find")
    } else if IfnameFilter::parse(&value.value).is_none() {
        format!(
            "{shown} is ignored by NCCL (values of one character or less mean automatic selection)"
        )
    } else {
        return None;
    };
    // Bytes that are not UTF-8 match no interface name; a short value NCCL ignores and
    // selects by itself (then judged as that selection: `ignored_value`).
    let outcome = if value.not_utf8 {
        Outcome::undetermined(
            "which interface, if any, a name with bytes that are not UTF-8 matches",
        )
    } else {
        Outcome::Unaffected
    };
    Some(Problem::predicts(outcome, summary, suggestion(facts)))
}

/// What an interface other nodes cannot reach does to this job's bootstrap: NCCL
/// advertises its address, ranks elsewhere connect to their own copy of it ("Connection
/// refused", src/misc/socket.cc ncclSocketConnect gives up after its retries) or wait on
/// it: across nodes init fails; one node is unaffected.
fn unreachable_bootstrap(facts: &Facts, first: &str) -> Outcome {
    crate::judge::across_nodes(
        facts,
        Outcome::init_fails(format!(
            "ranks on other nodes cannot connect to {first}'s address during bootstrap (\"Connection refused\" or a timeout)"
        )),
    )
}

/// The value without its spaces, when a name has one (NCCL keeps it: utils.cc
/// parseStringList copies every byte).
fn spaced(filter: &IfnameFilter) -> Option<String> {
    if !filter.names.iter().any(|n| n.trim() != n) {
        return None;
    }
    let names: Vec<&str> = filter.names.iter().map(|n| n.trim()).collect();
    Some(format!(
        "{}{}{}",
        if filter.exclude { "^" } else { "" },
        if filter.exact { "=" } else { "" },
        names.join(",")
    ))
}

/// An empty (or one-character) NCCL_SOCKET_IFNAME: NCCL ignores it and selects
/// automatically, and the tuner keeps it because it is set. The automatic choice is
/// judged as a value would be, and the fix names the empty variable.
fn ignored_value(facts: &Facts, value: &EnvValue, shown: &str) -> Vec<Problem> {
    let (Observed::Value(interfaces), Observed::Value(addresses)) =
        (&facts.network.interfaces, &facts.network.addresses)
    else {
        return Vec::new();
    };
    let family_var = facts
        .nccl_env
        .get("NCCL_SOCKET_FAMILY")
        .map(|v| v.value.as_str());
    let family = socket_ifname::socket_family(family_var);
    let automatic = SocketEnv {
        ifname: None,
        family: family_var,
        comm_id: None,
    };
    let selected = bootstrap::matching_names(
        crate::nccl::version(facts),
        automatic,
        interfaces,
        addresses,
    );
    let any = IfnameFilter::parse("^docker,lo,virbr").unwrap_or(IfnameFilter {
        exclude: true,
        exact: false,
        names: Vec::new(),
    });
    let evidence = vec![format!(
        "NCCL's automatic selection: {}",
        selected.join(", ")
    )];
    let auto = format!("{shown}, which NCCL ignores (automatic selection),");
    let mut out: Vec<Problem> = selected
        .first()
        .and_then(|first| {
            lint_bootstrap_interface(facts, &auto, &any, first, interfaces, &evidence)
        })
        .into_iter()
        .collect();
    let plain = IfnameFilter {
        exclude: false,
        ..any
    };
    out.extend(lint_link_local(
        &auto, &plain, &selected, addresses, family, &evidence, facts,
    ));
    for p in &mut out {
        let what = if value.value.is_empty() {
            "set but empty".to_string()
        } else {
            format!("set to {:?}, one character", value.value)
        };
        p.remediation = format!(
            "NCCL_SOCKET_IFNAME is {what}: NCCL ignores it, and this tool keeps values the user set. Set it, e.g. {}",
            suggestion(facts)
        );
    }
    out
}

fn unreadable_interfaces(facts: &Facts, shown: &str) -> Problem {
    let mut p = Problem::predicts(
        Outcome::undetermined("which interface NCCL selects: the interface list is unreadable"),
        format!("could not check {shown}: the interface list is unreadable"),
        "Run the check where getifaddrs works (the pod's own network namespace).",
    );
    p.evidence
        .extend(facts.network.interfaces.error().map(|e| e.to_string()));
    p
}

/// Why an interface only one node reaches fails or not, for summaries.
fn reach(facts: &Facts) -> &'static str {
    if layout::is_multi_node(facts) {
        "the job spans several nodes, so ranks on other nodes cannot reach it"
    } else {
        "this works on one node only"
    }
}

/// The interface bootstrap takes: loopback or a local bridge (fails across nodes), or a veth.
fn lint_bootstrap_interface(
    facts: &Facts,
    shown: &str,
    filter: &IfnameFilter,
    first: &str,
    interfaces: &[Interface],
    evidence: &[String],
) -> Option<Problem> {
    let link = interfaces.iter().find(|i| i.name == first);
    let is_loopback = link.is_some_and(|l| l.loopback) || first.starts_with("lo");
    if is_loopback || first.starts_with("docker") || first.starts_with("virbr") {
        let what = if is_loopback {
            "loopback"
        } else {
            "a local bridge whose address every node shares"
        };
        let reach = reach(facts);
        let fix = if filter.exclude && !filter.names.iter().any(|n| first.starts_with(n.as_str())) {
            format!(
                "NCCL_SOCKET_IFNAME='^{}{},{first}' (exclude {first} too), or {}",
                if filter.exact { "=" } else { "" },
                filter.names.join(","),
                suggestion(facts)
            )
        } else {
            suggestion(facts)
        };
        let mut p = Problem::predicts(
            unreachable_bootstrap(facts, first),
            format!("{shown} makes NCCL bootstrap over {first} ({what}): {reach}"),
            fix,
        );
        p.evidence = evidence.to_vec();
        Some(p)
    } else if link.is_some_and(|l| !l.running) {
        // Only NCCL before 2.28 gets here: findInterfaces checks IFF_RUNNING from
        // v2.28.3-1 (src/misc/socket.cc), so older releases bind a down interface that
        // still has an address. Its own address answers locally (the kernel routes local
        // addresses through lo), so one node works; other nodes cannot reach it.
        let mut p = Problem::predicts(
            unreachable_bootstrap(facts, first),
            format!(
                "{shown} makes NCCL bootstrap over {first}, which is down or has no carrier (this NCCL counts such interfaces; 2.28 and later skip them): {}",
                reach(facts)
            ),
            suggestion(facts),
        );
        p.evidence = evidence.to_vec();
        Some(p)
    } else if first.starts_with("veth") {
        // FACTS.md section 2: NCCL traffic over a veth* interface hangs across nodes.
        let mut p = Problem::predicts(
            crate::judge::across_nodes(
                facts,
                Outcome::hangs(format!(
                    "NCCL's connections over {first} (a veth) to other nodes"
                )),
            ),
            format!("{shown} makes NCCL use {first}: NCCL traffic over veth* interfaces hangs"),
            suggestion(facts),
        );
        p.evidence = evidence.to_vec();
        Some(p)
    } else {
        None
    }
}

/// A prefix that matches several interfaces: NCCL's socket transport drives them all.
fn lint_prefix_matches(
    facts: &Facts,
    shown: &str,
    filter: &IfnameFilter,
    selected: &[String],
    evidence: Vec<String>,
) -> Option<Problem> {
    if filter.exclude || filter.exact || selected.len() <= 1 {
        return None;
    }
    let first = selected.first()?;
    // The exact value keeps the interface the tuner would pick when it is
    // among the matches, else the one bootstrap already uses.
    let keep = choose_interface(facts)
        .map(|c| c.name)
        .filter(|n| selected.contains(n))
        .unwrap_or_else(|| first.clone());
    let mut p = Problem::predicts(
        Outcome::undetermined(format!(
            "whether every one of {} reaches the other nodes: NCCL's socket transport connects over each",
            selected.join(", ")
        )),
        format!(
            "{shown} is a prefix that matches {} interfaces ({}): bootstrap uses {first}, and NCCL's socket transport sends over every one of them",
            selected.len(),
            selected.join(", ")
        ),
        format!("NCCL_SOCKET_IFNAME='={keep}' (exact name: only {keep})"),
    );
    p.evidence = evidence;
    Some(p)
}

/// The interfaces this version counts (IFF_RUNNING only from 2.28) with an address, in
/// NCCL's order, and the version whose rules chose them, as evidence lines.
fn counted_evidence(
    version: Option<crate::nccl::Version>,
    interfaces: &[Interface],
    addresses: &[crate::facts::IfAddress],
) -> Vec<String> {
    let counted: Vec<&str> = interfaces
        .iter()
        .filter(|i| {
            bootstrap::counts(version, i) && addresses.iter().any(|a| a.interface == i.name)
        })
        .map(|i| i.name.as_str())
        .collect();
    let what = if bootstrap::running_only(version) {
        "running interfaces with an address"
    } else {
        "interfaces with an address (this NCCL counts down ones too)"
    };
    let mut evidence = vec![format!("{what}, in NCCL's order: {}", counted.join(", "))];
    if let Some(v) = version {
        evidence.push(format!(
            "selection rules of NCCL {}, the libnccl this image loads",
            v
        ));
    }
    evidence
}

pub(super) fn lint_socket_ifname(facts: &Facts, value: &EnvValue) -> Vec<Problem> {
    let shown = format!("NCCL_SOCKET_IFNAME={:?}", value.value);
    if let Some(p) = unusable_value(facts, value, &shown) {
        let worse = if value.not_utf8 {
            Vec::new()
        } else {
            ignored_value(facts, value, &shown)
        };
        return if worse.is_empty() { vec![p] } else { worse };
    }
    let Some(filter) = IfnameFilter::parse(&value.value) else {
        return Vec::new();
    };
    let (Observed::Value(interfaces), Observed::Value(addresses)) =
        (&facts.network.interfaces, &facts.network.addresses)
    else {
        return vec![unreadable_interfaces(facts, &shown)];
    };
    let family_var = facts
        .nccl_env
        .get("NCCL_SOCKET_FAMILY")
        .map(|v| v.value.as_str());
    let family = socket_ifname::socket_family(family_var);
    let version = crate::nccl::version(facts);
    let env = SocketEnv {
        ifname: Some(&value.value),
        family: family_var,
        comm_id: None,
    };
    let selected = bootstrap::matching_names(version, env, interfaces, addresses);
    let mut evidence = counted_evidence(version, interfaces, addresses);
    if let Some(nodes) = layout::nodes(facts) {
        evidence.push(format!("launcher: {nodes} node(s)"));
    }
    let Some(first) = selected.first() else {
        return vec![no_match(facts, (&shown, &filter), (version, env), evidence)];
    };
    evidence.push(format!(
        "NCCL would use: {} (bootstrap on {first})",
        selected.join(", ")
    ));
    let mut lints: Vec<Problem> =
        lint_bootstrap_interface(facts, &shown, &filter, first, interfaces, &evidence)
            .into_iter()
            .collect();
    lints.extend(lint_link_local(
        &shown, &filter, &selected, addresses, family, &evidence, facts,
    ));
    lints.extend(lint_prefix_matches(
        facts, &shown, &filter, &selected, evidence,
    ));
    lints
}

/// A filter that leaves no interface: every rank fails bootstrap.
fn no_match(
    facts: &Facts,
    (shown, filter): (&str, &IfnameFilter),
    (version, env): (Option<crate::nccl::Version>, SocketEnv),
    evidence: Vec<String>,
) -> Problem {
    let (Observed::Value(interfaces), Observed::Value(addresses)) =
        (&facts.network.interfaces, &facts.network.addresses)
    else {
        return unreadable_interfaces(facts, shown);
    };
    let failure = bootstrap::bootstrap(version, env, interfaces, addresses);
    let code = match failure {
        bootstrap::Bootstrap::NoInterface(f) => f.result,
        _ => 5,
    };
    let mut p = Problem::predicts(
        Outcome::init_fails(format!(
            "\"{}\" ({}, {code}) on every rank, even where all traffic would stay on NVLink",
            bootstrap::NO_INTERFACE,
            if code == 3 {
                "ncclInternalError"
            } else {
                "ncclInvalidUsage"
            }
        )),
        format!(
            "{shown} matches no {}interface with an address: NCCL fails at init with \"Bootstrap : no socket interface found\"",
            if bootstrap::running_only(version) {
                "running "
            } else {
                ""
            }
        ),
        match (missing_multus(filter, interfaces), spaced(filter)) {
            (Some(name), _) => multus_fix(&name),
            (None, Some(fixed)) => format!(
                "Remove the space: NCCL_SOCKET_IFNAME='{fixed}' (NCCL does not trim names, so a name with a space matches no interface), or {}",
                suggestion(facts)
            ),
            (None, None) => suggestion(facts),
        },
    );
    p.evidence = evidence;
    p
}

/// Interfaces of the socket transport's (the first [`socket_ifname::MAX_IFS`] that
/// the filter leaves) whose address is IPv4 link-local. NCCL drives each as a NIC
/// and spreads connections over all of them, so one that other nodes cannot reach
/// stalls the job ("connect refused" or a hang across nodes, as EKS Pod Identity's
/// pod-id-link0 did: aws-samples/aws-do-eks PR 54). Fails on a multi-node job, warns
/// when the launcher does not say, and is harmless on one node.
fn lint_link_local(
    shown: &str,
    filter: &IfnameFilter,
    selected: &[String],
    addresses: &[crate::facts::IfAddress],
    family: Option<crate::facts::Family>,
    evidence: &[String],
    facts: &Facts,
) -> Option<Problem> {
    let used = socket_ifname::socket_transport(selected);
    let link_local: Vec<(&str, &str)> = used
        .iter()
        .filter_map(|name| {
            let address = socket_ifname::used_address(name, addresses, family)?;
            socket_ifname::is_ipv4_link_local(address)
                .then_some((name.as_str(), address.address.as_str()))
        })
        .collect();
    if link_local.is_empty() {
        return None;
    }
    let multi_node = layout::is_multi_node(facts);
    if layout::nodes(facts) == Some(1) {
        return None;
    }
    let listed = link_local
        .iter()
        .map(|(n, a)| format!("{n} ({a})"))
        .collect::<Vec<_>>()
        .join(", ");
    let names: Vec<&str> = link_local.iter().map(|(n, _)| *n).collect();
    let reach = if multi_node {
        "the job spans several nodes, and ranks on other nodes cannot reach a link-local address"
    } else {
        "ranks on other nodes could not reach a link-local address (the launcher does not say how many nodes the job spans)"
    };
    let mut evidence = evidence.to_vec();
    if selected.len() > used.len() {
        evidence.push(format!(
            "NCCL's socket transport keeps the first {} of the {} matches (MAX_IFS)",
            used.len(),
            selected.len()
        ));
    }
    let remediation = if filter.exclude {
        format!(
            "NCCL_SOCKET_IFNAME='^{}{},{}' (exclude {} too), or {}",
            if filter.exact { "=" } else { "" },
            filter.names.join(","),
            names.join(","),
            names.join(", "),
            suggestion(facts)
        )
    } else {
        suggestion(facts)
    };
    let mut p = Problem::predicts(
        crate::judge::across_nodes(
            facts,
            Outcome::init_fails(format!(
                "connections to {listed} from other nodes are refused or hang: a link-local address does not route"
            )),
        ),
        format!(
            "{shown} leaves NCCL's socket transport {listed}, whose only address NCCL uses is IPv4 link-local: {reach}"
        ),
        remediation,
    );
    p.evidence = evidence;
    Some(p)
}

/// The first interface the filter names exactly or by prefix that looks like
/// a Multus attachment (`net1`, `net2`, ...: Multus names a pod's additional
/// networks netN in the order of the k8s.v1.cni.cncf.io/networks annotation)
/// and that this pod does not have at all.
fn missing_multus(filter: &IfnameFilter, interfaces: &[crate::facts::Interface]) -> Option<String> {
    if filter.exclude {
        return None;
    }
    filter
        .names
        .iter()
        .filter(|n| {
            n.strip_prefix("net")
                .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
        })
        .find(|n| !interfaces.iter().any(|i| i.name.starts_with(n.as_str())))
        .cloned()
}

fn multus_fix(name: &str) -> String {
    format!(
        "{name} is the interface Multus creates for the pod's additional network, and this pod has none: \
the network was not attached. Check the pod's annotation k8s.v1.cni.cncf.io/networks names a \
NetworkAttachmentDefinition that exists in the pod's namespace (kubectl get network-attachment-definitions -n <namespace>), \
that the Multus/SR-IOV CNI ran (kubectl describe pod: events), and on SR-IOV that the pod requests the network's resource \
(openshift.io/<resource> or rdma/<resource>). Switching NCCL to eth0 would move its traffic onto the pod network."
    )
}

pub(super) fn lint_socket_family(
    facts: &Facts,
    predicted: &crate::predict::Prediction,
    value: &EnvValue,
) -> Option<Problem> {
    let Some(family) = socket_ifname::socket_family(Some(&value.value)) else {
        // src/misc/socket.cc envSocketFamily: any other value is ignored (AF_UNSPEC).
        return Some(Problem::predicts(
            Outcome::Unaffected,
            format!(
                "NCCL_SOCKET_FAMILY={:?} is ignored by NCCL (it understands AF_INET and AF_INET6)",
                value.value
            ),
            "NCCL_SOCKET_FAMILY=AF_INET or AF_INET6, or unset it",
        ));
    };
    family_without_address(facts, predicted, value, family)
}

/// NCCL_SOCKET_FAMILY naming a family the interface that routes between nodes has no
/// address of: with NCCL_SOCKET_IFNAME pinned to it (as the tuner does) NCCL finds no
/// interface, and left automatic it falls back to loopback (ncclFindInterfaces skips
/// addresses of the other family).
fn family_without_address(
    facts: &Facts,
    predicted: &crate::predict::Prediction,
    value: &EnvValue,
    family: crate::facts::Family,
) -> Option<Problem> {
    if facts.nccl_env.contains_key("NCCL_SOCKET_IFNAME") {
        return None;
    }
    let routed = choose_interface(facts)?;
    let addresses = facts.network.addresses.value()?;
    if socket_ifname::used_address(&routed.name, addresses, Some(family)).is_some() {
        return None;
    }
    let predicted = predicted.sockets.value.bootstrap.as_ref();
    let outcome = match predicted {
        None => Outcome::init_fails(format!("\"{}\"", bootstrap::NO_INTERFACE)),
        Some(b) if b.interface.starts_with("lo") => unreachable_bootstrap(facts, &b.interface),
        Some(b) => crate::judge::across_nodes(
            facts,
            Outcome::undetermined(format!(
                "whether {} ({}), not the interface that routes between nodes, reaches the other nodes",
                b.interface, b.address
            )),
        ),
    };
    Some(Problem::predicts(
        outcome,
        format!(
            "NCCL_SOCKET_FAMILY={:?}, but {} ({}) has no address of that family: NCCL bootstraps on {}",
            value.value,
            routed.name,
            routed.why,
            predicted.map_or(
                "nothing (\"Bootstrap : no socket interface found\")".to_string(),
                |b| format!("{} ({})", b.interface, b.address)
            )
        ),
        format!(
            "Unset NCCL_SOCKET_FAMILY ({} has only the other family's addresses).",
            routed.name
        ),
    ))
}

/// NCCL_COMM_ID: bootstrap binds the first address in its subnet, whatever the
/// interface variables say (`crate::nccl::bootstrap`, proven against real NCCL).
/// None such, or a value NCCL cannot read, fails every rank at init; NCCL 2.29 binds
/// an address outside the subnet (its matchSubnet inverts the IPv4 test).
pub(super) fn lint_comm_id(facts: &Facts, value: &EnvValue) -> Option<Problem> {
    let (Observed::Value(interfaces), Observed::Value(addresses)) =
        (&facts.network.interfaces, &facts.network.addresses)
    else {
        return None;
    };
    let version = crate::nccl::version(facts);
    let env = SocketEnv {
        comm_id: Some(&value.value),
        ..SocketEnv::default()
    };
    let shown = format!("NCCL_COMM_ID={:?}", value.value);
    let (outcome, summary, fix) = match bootstrap::bootstrap(version, env, interfaces, addresses) {
        bootstrap::Bootstrap::NoInterface(f) if f.warning == bootstrap::INVALID_COMM_ID => (
            Outcome::init_fails(f.warning),
            format!("{shown} is not an address NCCL reads: every rank fails at init (\"{}\")", f.warning),
            "Write NCCL_COMM_ID as <ipv4>:<port>, [<ipv6>]:<port> or <hostname>:<port>.".to_string(),
        ),
        bootstrap::Bootstrap::NoInterface(f) => (
            Outcome::init_fails(f.warning),
            format!("{shown}: no address of this container is in its subnet (or of its family), so every rank fails at init (\"{}\")", f.warning),
            "Point NCCL_COMM_ID at rank 0's address on a network this pod has (its pod IP), or unset it.".to_string(),
        ),
        bootstrap::Bootstrap::Uses(e)
            if version.is_some_and(|v| v.series() == crate::nccl::version::COMM_ID_SUBNET_INVERTED) =>
        (
            Outcome::undetermined("whether the other ranks reach rank 0 on the interface bootstrap binds"),
            format!(
                "{shown}: NCCL {} binds bootstrap to {} ({}), outside NCCL_COMM_ID's subnet: this release inverts its IPv4 subnet test (src/os/linux.cc matchSubnet, fixed in 2.30.3)",
                version.unwrap_or_default(),
                e.interface,
                e.address.address
            ),
            "Use NCCL 2.30 or later (or 2.28), or drop NCCL_COMM_ID and let the launcher hand the unique id to every rank.".to_string(),
        ),
        _ => return None,
    };
    Some(Problem::predicts(outcome, summary, fix))
}
