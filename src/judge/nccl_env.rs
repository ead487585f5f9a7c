//! `nccl-env`: the user's own NCCL variables, checked against this node before
//! NCCL trips on them.
//!
//! Rules so far (FACTS.md sections 2 and 3, NCCL's socket.cc): NCCL_SOCKET_IFNAME
//! that matches no running interface (NCCL 2.28.9 measured: every rank fails at
//! init with "Bootstrap : no socket interface found", even on one node), that
//! leaves lo, docker* or virbr* as the bootstrap interface (fine on one node,
//! broken across nodes), that picks veth* (hangs), or that NCCL ignores (one
//! character); NCCL_SOCKET_FAMILY that NCCL does not understand.

use super::{Finding, Problem, Status};
use crate::facts::{EnvValue, Facts, Observed};
use crate::layout;
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

pub fn judge(facts: &Facts, _policy: &Policy) -> Finding {
    let env = &facts.nccl_env;
    let mut lints = Vec::new();
    if let Some(v) = env.get("NCCL_SOCKET_IFNAME") {
        lints.extend(lint_socket_ifname(facts, v));
    }
    if let Some(v) = env.get("NCCL_SOCKET_FAMILY") {
        lints.extend(lint_socket_family(v));
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
}
