//! `nccl-env`: the user's own NCCL variables, checked against this node before
//! NCCL trips on them.
//!
//! Rules (FACTS.md sections 1 to 4, NCCL's socket.cc and net_ib.cc):
//! NCCL_SOCKET_IFNAME that matches no running interface (NCCL 2.28.9 measured:
//! every rank fails at init with "Bootstrap : no socket interface found", even
//! on one node), that leaves lo, docker* or virbr* as the bootstrap interface
//! (fine on one node, broken across nodes), that picks veth* (hangs), or that
//! NCCL ignores (one character); NCCL_SOCKET_FAMILY NCCL does not understand;
//! NCCL_IB_HCA without `=` matching more devices than named, naming absent
//! devices or DOWN ports; P2P or SHM turned off where NVLink is; LL128 forced
//! without NVLink; NCCL_TOPO_FILE missing or another platform's; RDMA turned off
//! (NCCL_IB_DISABLE, NCCL_NET=Socket) or mis-chosen (NCCL_NET=IB on EFA,
//! FI_PROVIDER other than efa) where usable devices exist; NCCL_IB_GID_INDEX
//! with NCCL >= 2.21; NCCL_DEBUG=TRACE; values with line breaks.

use super::{Finding, Problem, Status};
use crate::facts::{EnvValue, Facts, Observed};
use crate::layout;
use crate::nccl::ib_hca::HcaFilter;
use crate::nccl::socket_ifname::{self, IfnameFilter};
use crate::policy::Policy;
use crate::tune::socket_ifname::choose_interface;

pub const ID: &str = "nccl-env";

fn suggestion(facts: &Facts) -> String {
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

fn lint_socket_ifname(facts: &Facts, value: &EnvValue) -> Vec<Problem> {
    let shown = format!("NCCL_SOCKET_IFNAME={:?}", value.value);
    if value.not_utf8 {
        return vec![Problem {
            status: Status::Warn,
            summary: format!(
                "{shown} is not valid UTF-8 and cannot name an interface NCCL will find"
            ),
            evidence: vec![],
            remediation: suggestion(facts),
        }];
    }
    let Some(filter) = IfnameFilter::parse(&value.value) else {
        return vec![Problem {
            status: Status::Warn,
            summary: format!(
                "{shown} is ignored by NCCL (values of one character or less mean automatic selection)"
            ),
            evidence: vec![],
            remediation: suggestion(facts),
        }];
    };
    let (Observed::Value(interfaces), Observed::Value(addresses)) =
        (&facts.network.interfaces, &facts.network.addresses)
    else {
        return vec![Problem {
            status: Status::Warn,
            summary: format!("could not check {shown}: the interface list is unreadable"),
            evidence: facts
                .network
                .interfaces
                .error()
                .map(|e| e.to_string())
                .into_iter()
                .collect(),
            remediation: "Run the check where getifaddrs works (the pod's own network namespace)."
                .into(),
        }];
    };
    let family_var = facts
        .nccl_env
        .get("NCCL_SOCKET_FAMILY")
        .map(|v| v.value.as_str());
    let family = socket_ifname::socket_family(family_var);
    let selected = socket_ifname::select(&filter, interfaces, addresses, family);
    let running: Vec<&str> = interfaces
        .iter()
        .filter(|i| i.running && addresses.iter().any(|a| a.interface == i.name))
        .map(|i| i.name.as_str())
        .collect();
    let mut evidence = vec![format!(
        "running interfaces with an address, in NCCL's order: {}",
        running.join(", ")
    )];
    let multi_node = layout::is_multi_node(&facts.launcher);
    if let Some(nodes) = layout::nodes(&facts.launcher) {
        evidence.push(format!("launcher: {nodes} node(s)"));
    }
    let Some(first) = selected.first() else {
        return vec![Problem {
            status: Status::Fail,
            summary: format!(
                "{shown} matches no running interface with an address: NCCL fails at init with \"Bootstrap : no socket interface found\""
            ),
            evidence,
            remediation: suggestion(facts),
        }];
    };
    evidence.push(format!(
        "NCCL would use: {} (bootstrap on {first})",
        selected.join(", ")
    ));
    let link = interfaces.iter().find(|i| &i.name == first);
    let is_loopback = link.is_some_and(|l| l.loopback) || first.starts_with("lo");
    let mut lints = Vec::new();
    if is_loopback || first.starts_with("docker") || first.starts_with("virbr") {
        let what = if is_loopback {
            "loopback"
        } else {
            "a local bridge whose address every node shares"
        };
        let (status, reach) = if multi_node {
            (
                Status::Fail,
                "the job spans several nodes, so ranks on other nodes cannot reach it",
            )
        } else {
            (Status::Warn, "this works on one node only")
        };
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
        lints.push(Problem {
            status,
            summary: format!("{shown} makes NCCL bootstrap over {first} ({what}): {reach}"),
            evidence: evidence.clone(),
            remediation: fix,
        });
    } else if first.starts_with("veth") {
        lints.push(Problem {
            status: Status::Warn,
            summary: format!(
                "{shown} makes NCCL use {first}: NCCL traffic over veth* interfaces hangs"
            ),
            evidence: evidence.clone(),
            remediation: suggestion(facts),
        });
    }
    lints
}

fn lint_socket_family(value: &EnvValue) -> Option<Problem> {
    if socket_ifname::socket_family(Some(&value.value)).is_some() {
        return None;
    }
    Some(Problem {
        status: Status::Warn,
        summary: format!(
            "NCCL_SOCKET_FAMILY={:?} is ignored by NCCL (it understands AF_INET and AF_INET6)",
            value.value
        ),
        evidence: vec![],
        remediation: "NCCL_SOCKET_FAMILY=AF_INET or AF_INET6, or unset it".into(),
    })
}

fn get<'a>(facts: &'a Facts, name: &str) -> Option<&'a str> {
    facts.nccl_env.get(name).map(|v| v.value.as_str())
}

/// RDMA devices this container can open, split into (EFA, IB/RoCE).
fn usable_rdma(facts: &Facts) -> (Vec<String>, Vec<&crate::facts::rdma::RdmaDevice>) {
    let open: Vec<String> = facts
        .rdma
        .uverbs
        .value()
        .map(|u| {
            u.iter()
                .filter(|n| n.open.as_ref().is_some_and(|o| o.refused.is_none()))
                .filter_map(|n| n.ibdev.clone())
                .collect()
        })
        .unwrap_or_default();
    let devices = facts.rdma.devices.value().map(Vec::as_slice).unwrap_or(&[]);
    let usable = devices.iter().filter(|d| open.contains(&d.name));
    let (efa, ib): (Vec<_>, Vec<_>) = usable.partition(|d| d.is_efa());
    (efa.into_iter().map(|d| d.name.clone()).collect(), ib)
}

fn lint_ib_hca(facts: &Facts) -> Vec<Problem> {
    let Some(value) = get(facts, "NCCL_IB_HCA") else {
        return Vec::new();
    };
    let filter = HcaFilter::parse(value);
    let devices = facts.rdma.devices.value().map(Vec::as_slice).unwrap_or(&[]);
    if devices.is_empty() {
        return Vec::new();
    }
    let mut out = Vec::new();
    let names: Vec<&str> = devices.iter().map(|d| d.name.as_str()).collect();
    for (entry, port) in &filter.entries {
        let matched: Vec<&str> = names
            .iter()
            .copied()
            .filter(|n| filter.entry_matches(entry, n))
            .collect();
        if matched.is_empty() {
            out.push(Problem::new(
                Status::Warn,
                format!("NCCL_IB_HCA entry {entry:?} names no RDMA device here (devices: {})", names.join(", ")),
                "Name the devices /sys/class/infiniband lists, with '=' and ports: NCCL_IB_HCA='=mlx5_0:1,mlx5_1:1'.",
            ));
        } else if !filter.exact && matched.len() > 1 && !filter.exclude {
            out.push(Problem::new(
                Status::Warn,
                format!(
                    "NCCL_IB_HCA entry {entry:?} is a prefix: it also matches {}",
                    matched
                        .iter()
                        .filter(|m| *m != entry)
                        .copied()
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                format!("Use exact names: NCCL_IB_HCA='={value}'"),
            ));
        }
        if let Some(p) = port {
            for d in devices
                .iter()
                .filter(|d| filter.entry_matches(entry, &d.name))
            {
                match d.ports.iter().find(|x| x.port == *p) {
                    Some(x) if x.state.as_deref() != Some("ACTIVE") => out.push(Problem::new(
                        Status::Warn,
                        format!(
                            "NCCL_IB_HCA names {}:{p}, which is {}",
                            d.name,
                            x.state.as_deref().unwrap_or("not ACTIVE")
                        ),
                        "Name only ACTIVE ports (rdma-devices lists them), or fix the link.",
                    )),
                    None => out.push(Problem::new(
                        Status::Warn,
                        format!(
                            "NCCL_IB_HCA names port {p} of {}, which has no such port",
                            d.name
                        ),
                        "Ports count from 1; see /sys/class/infiniband/<dev>/ports.",
                    )),
                    _ => {}
                }
            }
        }
    }
    out
}

fn lint_p2p_shm(facts: &Facts) -> Vec<Problem> {
    let nvlink = facts
        .gpus
        .nvml
        .loaded()
        .is_some_and(crate::topology::matrix::has_nvlink);
    let mut out = Vec::new();
    let p2p_off = get(facts, "NCCL_P2P_DISABLE") == Some("1");
    let level = get(facts, "NCCL_P2P_LEVEL").map(str::to_ascii_uppercase);
    if nvlink && p2p_off {
        out.push(Problem::new(
            Status::Warn,
            "NCCL_P2P_DISABLE=1 on an NVLink node: GPUs talk through host memory (measured 27 GB/s instead of ~295 GB/s on 2x H200)".to_string(),
            "Unset NCCL_P2P_DISABLE.",
        ));
    }
    if nvlink && matches!(level.as_deref(), Some("LOC") | Some("0")) {
        out.push(Problem::new(
            Status::Warn,
            "NCCL_P2P_LEVEL=LOC on an NVLink node turns peer access off between GPUs".to_string(),
            "Unset NCCL_P2P_LEVEL, or set it to NVL.",
        ));
    }
    if get(facts, "NCCL_SHM_DISABLE") == Some("1") && (p2p_off || !nvlink) {
        out.push(Problem::new(
            Status::Warn,
            "NCCL_SHM_DISABLE=1 without P2P between the GPUs: ranks of one node talk over the network (measured 3.7 GB/s on 2x H200)".to_string(),
            "Unset NCCL_SHM_DISABLE.",
        ));
    }
    if let Some(proto) = get(facts, "NCCL_PROTO") {
        let forced_ll128 = !proto.starts_with('^')
            && proto
                .to_ascii_uppercase()
                .split(',')
                .any(|p| p.trim() == "LL128");
        if forced_ll128 && !nvlink {
            out.push(Problem::new(
                Status::Warn,
                format!("NCCL_PROTO={proto:?} forces LL128 without NVLink, where NCCL does not enable it: it can corrupt data"),
                "Unset NCCL_PROTO, or exclude LL128 (NCCL_PROTO=^LL128) if a vendor asks you to.",
            ));
        }
    }
    out
}

fn lint_topo_file(facts: &Facts) -> Vec<Problem> {
    let Some(path) = get(facts, "NCCL_TOPO_FILE") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    if facts.named_files.get(path) == Some(&false) {
        out.push(Problem::new(
            Status::Warn,
            format!("NCCL_TOPO_FILE={path:?} does not exist in this container: NCCL falls back to its own detection"),
            "Point NCCL_TOPO_FILE at a file the training container has, or unset it.",
        ));
    }
    let product = facts
        .platform
        .product_name
        .value()
        .and_then(|p| p.as_deref())
        .unwrap_or("");
    for (marker, platform) in [
        ("p4de-24xl", "p4de.24xlarge"),
        ("p4d-24xl", "p4d.24xlarge"),
        ("g5.48xl", "g5.48xlarge"),
    ] {
        if path.contains(marker) {
            if product != platform {
                out.push(Problem::new(
                    Status::Warn,
                    format!(
                        "NCCL_TOPO_FILE={path:?} describes {platform}, but this node is {}",
                        if product.is_empty() {
                            "unknown"
                        } else {
                            product
                        }
                    ),
                    "Unset NCCL_TOPO_FILE, or use the file for this instance type.",
                ));
            }
            break;
        }
    }
    out
}

fn lint_net(facts: &Facts) -> Vec<Problem> {
    let (efa, ib) = usable_rdma(facts);
    let mut out = Vec::new();
    if !ib.is_empty() && get(facts, "NCCL_IB_DISABLE") == Some("1") {
        out.push(Problem::new(
            Status::Warn,
            format!("NCCL_IB_DISABLE=1 with {} usable RDMA device(s): NCCL uses TCP sockets between nodes", ib.len()),
            "Unset NCCL_IB_DISABLE.",
        ));
    }
    let net = get(facts, "NCCL_NET").map(str::to_ascii_lowercase);
    if (!ib.is_empty() || !efa.is_empty()) && net.as_deref() == Some("socket") {
        out.push(Problem::new(
            Status::Warn,
            "NCCL_NET=Socket with usable RDMA devices: NCCL uses TCP sockets between nodes"
                .to_string(),
            "Unset NCCL_NET.",
        ));
    }
    if !efa.is_empty() && net.as_deref() == Some("ib") {
        out.push(Problem::new(
            Status::Fail,
            "NCCL_NET=IB on EFA: NCCL's IB transport cannot drive EFA devices, so NCCL finds no network".to_string(),
            "Unset NCCL_NET (aws-ofi-nccl registers as \"Libfabric\" and NCCL picks it).",
        ));
    }
    if let Some(p) = get(facts, "FI_PROVIDER")
        && !efa.is_empty()
        && !p.split(',').any(|x| x.trim() == "efa")
    {
        out.push(Problem::new(
            Status::Warn,
            format!("FI_PROVIDER={p:?} on EFA: libfabric will not use the EFA devices"),
            "Unset FI_PROVIDER (aws-ofi-nccl >= 1.6 selects efa itself).",
        ));
    }
    out
}

fn lint_misc(facts: &Facts) -> Vec<Problem> {
    let mut out = Vec::new();
    if facts.nccl_env.contains_key("NCCL_IB_GID_INDEX")
        && crate::tune::nccl_version(facts).is_some_and(|v| v >= (2, 21, 0))
    {
        out.push(Problem::new(
            Status::Warn,
            "NCCL_IB_GID_INDEX is set, but this NCCL (>= 2.21) picks the RoCE v2 GID itself; a fixed index breaks where the table differs".to_string(),
            "Unset NCCL_IB_GID_INDEX.",
        ));
    }
    if get(facts, "NCCL_DEBUG").is_some_and(|d| d.eq_ignore_ascii_case("TRACE")) {
        out.push(Problem::new(
            Status::Warn,
            "NCCL_DEBUG=TRACE left on: every call is logged, which slows training and floods the logs".to_string(),
            "Use NCCL_DEBUG=INFO (or WARN) outside a debugging session.",
        ));
    }
    for (name, v) in &facts.nccl_env {
        if v.value.chars().any(|c| c.is_control()) {
            out.push(Problem::new(
                Status::Warn,
                format!("{name} contains a line break or control character: NCCL reads it as is, and no nccl.conf can carry it"),
                format!("Set {name} to a single-line value."),
            ));
        }
    }
    out
}

pub fn judge(facts: &Facts, _policy: &Policy) -> Finding {
    let env = &facts.nccl_env;
    let mut lints = Vec::new();
    if let Some(v) = env.get("NCCL_SOCKET_IFNAME") {
        lints.extend(lint_socket_ifname(facts, v));
    }
    if let Some(v) = env.get("NCCL_SOCKET_FAMILY") {
        lints.extend(lint_socket_family(v));
    }
    for lint in [
        lint_ib_hca,
        lint_p2p_shm,
        lint_topo_file,
        lint_net,
        lint_misc,
    ] {
        lints.extend(lint(facts));
    }
    let summary = if env.is_empty() {
        "no NCCL, libfabric or aws-ofi-nccl variables set".to_string()
    } else {
        format!(
            "{} variable(s) set, none conflicts with this node",
            env.len()
        )
    };
    let evidence = env
        .iter()
        .map(|(k, v)| format!("{k}={:?}", v.value))
        .collect();
    super::combine(ID, summary, evidence, lints)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::judge::test_facts::{healthy, iface, v4, with_env};

    fn docker_node() -> Facts {
        let mut f = healthy();
        f.network.interfaces = Observed::Value(vec![
            iface("lo", None),
            iface("eth0", Some("veth")),
            iface("docker0", Some("bridge")),
            iface("veth12ab", Some("veth")),
        ]);
        f.network.addresses = Observed::Value(vec![
            v4("lo", "127.0.0.1"),
            v4("eth0", "10.0.0.5"),
            v4("docker0", "172.17.0.1"),
            v4("veth12ab", "169.254.1.1"),
        ]);
        f
    }

    fn lint(pairs: &[(&str, &str)]) -> Finding {
        judge(&with_env(docker_node(), pairs), &Policy::default())
    }

    #[test]
    fn no_variables_pass() {
        let f = lint(&[]);
        assert_eq!(f.status, Status::Pass);
        let f = lint(&[("NCCL_SOCKET_IFNAME", "=eth0"), ("NCCL_DEBUG", "INFO")]);
        assert_eq!(f.status, Status::Pass, "{f:?}");
        assert_eq!(
            f.summary,
            "2 variable(s) set, none conflicts with this node"
        );
    }

    #[test]
    fn no_matching_interface_fails_with_the_nccl_error() {
        for value in ["nonexist0", "==eth1", "=eth"] {
            let f = lint(&[("NCCL_SOCKET_IFNAME", value)]);
            assert_eq!(f.status, Status::Fail, "{value}");
            assert!(f.summary.contains("Bootstrap : no socket interface found"));
            assert!(
                f.remediation
                    .unwrap()
                    .contains("NCCL_SOCKET_IFNAME='=eth0'")
            );
        }
    }

    #[test]
    fn loopback_warns_on_one_node_and_fails_across_nodes() {
        let f = lint(&[("NCCL_SOCKET_IFNAME", "lo")]);
        assert_eq!(f.status, Status::Warn);
        let f = lint(&[("NCCL_SOCKET_IFNAME", "lo"), ("PET_NNODES", "2")]);
        assert_eq!(f.status, Status::Fail);
        assert!(f.summary.contains("several nodes"));
    }

    #[test]
    fn exclusion_without_lo_suggests_adding_lo() {
        let f = lint(&[
            ("NCCL_SOCKET_IFNAME", "^docker0"),
            ("WORLD_SIZE", "16"),
            ("LOCAL_WORLD_SIZE", "8"),
        ]);
        assert_eq!(f.status, Status::Fail);
        assert!(
            f.remediation
                .unwrap()
                .starts_with("NCCL_SOCKET_IFNAME='^docker0,lo'")
        );
        assert_eq!(
            lint(&[("NCCL_SOCKET_IFNAME", "^docker0,lo")]).status,
            Status::Pass
        );
    }

    #[test]
    fn docker_veth_ignored_and_family() {
        assert_eq!(
            lint(&[("NCCL_SOCKET_IFNAME", "docker")]).status,
            Status::Warn
        );
        assert_eq!(
            lint(&[("NCCL_SOCKET_IFNAME", "docker"), ("PET_NNODES", "3")]).status,
            Status::Fail
        );
        let f = lint(&[("NCCL_SOCKET_IFNAME", "veth")]);
        assert!(f.summary.contains("hangs"), "{f:?}");
        let f = lint(&[("NCCL_SOCKET_IFNAME", "e")]);
        assert!(f.summary.contains("ignored by NCCL"));
        let f = lint(&[("NCCL_SOCKET_FAMILY", "inet6")]);
        assert_eq!(f.status, Status::Warn);
        // Family filter: no IPv6 addresses here, so AF_INET6 leaves nothing.
        let f = lint(&[
            ("NCCL_SOCKET_IFNAME", "eth0"),
            ("NCCL_SOCKET_FAMILY", "AF_INET6"),
        ]);
        assert_eq!(f.status, Status::Fail);
    }

    #[test]
    fn several_problems_are_all_reported() {
        let f = lint(&[
            ("NCCL_SOCKET_IFNAME", "nonexist0"),
            ("NCCL_SOCKET_FAMILY", "x"),
        ]);
        assert_eq!(f.status, Status::Fail);
        assert!(f.summary.starts_with("2 problems"));
        assert_eq!(f.remediation.unwrap().lines().count(), 2);
    }

    #[test]
    fn unreadable_interfaces_warn() {
        let mut f = with_env(healthy(), &[("NCCL_SOCKET_IFNAME", "eth0")]);
        f.network.interfaces = Observed::Error(crate::facts::FactError::new("getifaddrs", "EPERM"));
        assert_eq!(judge(&f, &Policy::default()).status, Status::Warn);
    }

    // One test per rule, each with the case that must pass and the case that must not.

    fn ib_node() -> Facts {
        use crate::judge::test_facts::{rdma_device, with_rdma};
        let mut devices: Vec<_> = (0..12)
            .map(|i| {
                rdma_device(
                    &format!("mlx5_{i}"),
                    "mlx5_core",
                    "0000:17:00.0",
                    "/sys/devices/x",
                    "ACTIVE",
                    "InfiniBand",
                )
            })
            .collect();
        devices[2].ports[0].state = Some("DOWN".into());
        with_rdma(healthy(), devices)
    }

    fn efa_node() -> Facts {
        crate::judge::test_facts::with_efa(healthy())
    }

    fn lint_on(f: Facts, pairs: &[(&str, &str)]) -> Finding {
        judge(&with_env(f, pairs), &Policy::default())
    }

    #[test]
    fn ib_hca_prefix_absent_and_down() {
        let f = lint_on(ib_node(), &[("NCCL_IB_HCA", "mlx5_1")]);
        assert!(
            f.summary.contains("also matches mlx5_10, mlx5_11"),
            "{}",
            f.summary
        );
        assert!(f.remediation.unwrap().contains("'=mlx5_1'"));
        assert_eq!(
            lint_on(ib_node(), &[("NCCL_IB_HCA", "=mlx5_1:1,mlx5_3:1")]).status,
            Status::Pass
        );
        assert!(
            lint_on(ib_node(), &[("NCCL_IB_HCA", "=mlx5_99")])
                .summary
                .contains("names no RDMA device")
        );
        assert!(
            lint_on(ib_node(), &[("NCCL_IB_HCA", "=mlx5_2:1")])
                .summary
                .contains("mlx5_2:1, which is DOWN")
        );
        assert_eq!(
            lint_on(healthy(), &[("NCCL_IB_HCA", "mlx5_1")]).status,
            Status::Pass,
            "no RDMA devices to check against"
        );
    }

    #[test]
    fn p2p_shm_and_ll128() {
        assert!(
            lint_on(healthy(), &[("NCCL_P2P_DISABLE", "1")])
                .summary
                .contains("27 GB/s")
        );
        assert_eq!(
            lint_on(healthy(), &[("NCCL_P2P_DISABLE", "0")]).status,
            Status::Pass
        );
        assert_eq!(
            lint_on(healthy(), &[("NCCL_P2P_LEVEL", "LOC")]).status,
            Status::Warn
        );
        assert_eq!(
            lint_on(healthy(), &[("NCCL_P2P_LEVEL", "NVL")]).status,
            Status::Pass
        );
        let both = lint_on(
            healthy(),
            &[("NCCL_P2P_DISABLE", "1"), ("NCCL_SHM_DISABLE", "1")],
        );
        assert!(both.summary.starts_with("2 problems"), "{}", both.summary);
        assert_eq!(
            lint_on(healthy(), &[("NCCL_SHM_DISABLE", "1")]).status,
            Status::Pass,
            "P2P over NVLink still works"
        );
        let mut pcie = healthy();
        pcie.gpus = crate::judge::test_facts::no_gpus();
        assert!(
            lint_on(pcie.clone(), &[("NCCL_PROTO", "LL128")])
                .summary
                .contains("corrupt")
        );
        assert_eq!(
            lint_on(pcie, &[("NCCL_PROTO", "^LL128")]).status,
            Status::Pass
        );
        assert_eq!(
            lint_on(healthy(), &[("NCCL_PROTO", "LL128")]).status,
            Status::Pass,
            "NVLink node"
        );
    }

    #[test]
    fn topo_file_missing_or_foreign() {
        let mut f = with_env(
            healthy(),
            &[(
                "NCCL_TOPO_FILE",
                "/opt/amazon/ofi-nccl/share/aws-ofi-nccl/xml/p4d-24xl-topo.xml",
            )],
        );
        f.named_files.insert(
            "/opt/amazon/ofi-nccl/share/aws-ofi-nccl/xml/p4d-24xl-topo.xml".into(),
            false,
        );
        let finding = judge(&f, &Policy::default());
        assert!(
            finding.summary.starts_with("2 problems"),
            "{}",
            finding.summary
        );
        f.named_files.insert(
            "/opt/amazon/ofi-nccl/share/aws-ofi-nccl/xml/p4d-24xl-topo.xml".into(),
            true,
        );
        f.platform.product_name = crate::facts::Observed::Value(Some("p4d.24xlarge".into()));
        assert_eq!(judge(&f, &Policy::default()).status, Status::Pass);
    }

    #[test]
    fn network_selection() {
        assert!(
            lint_on(ib_node(), &[("NCCL_IB_DISABLE", "1")])
                .summary
                .contains("TCP")
        );
        assert_eq!(
            lint_on(healthy(), &[("NCCL_IB_DISABLE", "1")]).status,
            Status::Pass,
            "no RDMA: nothing lost"
        );
        assert_eq!(
            lint_on(ib_node(), &[("NCCL_NET", "Socket")]).status,
            Status::Warn
        );
        assert_eq!(
            lint_on(efa_node(), &[("NCCL_NET", "IB")]).status,
            Status::Fail
        );
        assert_eq!(
            lint_on(ib_node(), &[("NCCL_NET", "IB")]).status,
            Status::Pass
        );
        assert_eq!(
            lint_on(efa_node(), &[("FI_PROVIDER", "tcp")]).status,
            Status::Warn
        );
        assert_eq!(
            lint_on(efa_node(), &[("FI_PROVIDER", "efa")]).status,
            Status::Pass
        );
    }

    #[test]
    fn gid_index_trace_and_line_breaks() {
        assert_eq!(
            lint_on(healthy(), &[("NCCL_IB_GID_INDEX", "3")]).status,
            Status::Warn,
            "NCCL 2.28.9"
        );
        let mut old = healthy();
        if let crate::facts::gpu::LibraryState::Loaded(l) = &mut old.rdma.nccl.library.state {
            l.version = crate::facts::Observed::Value("2.18.5".into());
        }
        assert_eq!(
            lint_on(old, &[("NCCL_IB_GID_INDEX", "3")]).status,
            Status::Pass
        );
        assert_eq!(
            lint_on(healthy(), &[("NCCL_DEBUG", "TRACE")]).status,
            Status::Warn
        );
        assert_eq!(
            lint_on(healthy(), &[("NCCL_DEBUG", "INFO")]).status,
            Status::Pass
        );
        assert!(
            lint_on(healthy(), &[("NCCL_ALGO", "Ring\nTree")])
                .summary
                .contains("line break")
        );
    }
}
