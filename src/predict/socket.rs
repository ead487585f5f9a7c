//! The interface bootstrap binds and the interfaces NET/Socket drives, per NCCL version,
//! from `crate::nccl::bootstrap` (proven against real libnccl 2.13-2.32 in
//! tests/integration/nccl_oracle.rs).

use super::{Decision, env};
use crate::facts::Facts;
use crate::nccl::Version;
use crate::nccl::bootstrap::{self, Bootstrap, SocketEnv};
use serde::{Deserialize, Serialize};

const SOURCE: &str = "src/misc/socket.cc ncclFindInterfaces (v2.12-v2.28; src/os/linux.cc ncclOsFindInterfaces in v2.29), src/bootstrap.cc bootstrapNetInit (one interface), src/transport/net_socket.cc ncclNetSocketInit (MAX_IFS = 16)";

/// An interface and the address NCCL binds on it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Endpoint {
    pub interface: String,
    pub address: String,
}

/// The socket interfaces NCCL uses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SocketInterfaces {
    /// The first one: bootstrap's (with NCCL_COMM_ID, the first address in its subnet);
    /// `None`: NCCL fails at init ("Bootstrap : no socket interface found", or with
    /// NCCL_COMM_ID "No usable listening interface found"), or NCCL_COMM_ID names a host
    /// (`comm_id`).
    pub bootstrap: Option<Endpoint>,
    /// Every interface NET/Socket drives, in NCCL's order (at most 16).
    pub interfaces: Vec<Endpoint>,
    /// True when NCCL chose by itself (NCCL_SOCKET_IFNAME unset, or a value of one
    /// character or less, which NCCL ignores).
    pub automatic: bool,
    /// NCCL_COMM_ID names a host: bootstrap binds the interface in the subnet of the
    /// address it resolves to, which is not predicted.
    pub comm_id: bool,
}

pub(super) fn predict(facts: &Facts, version: Option<Version>) -> Decision<SocketInterfaces> {
    let (Some(interfaces), Some(addresses)) = (
        facts.network.interfaces.value(),
        facts.network.addresses.value(),
    ) else {
        return Decision::new(
            SocketInterfaces {
                bootstrap: None,
                interfaces: Vec::new(),
                automatic: true,
                comm_id: false,
            },
            "the interface list is unreadable: not predicted",
            SOURCE,
        );
    };
    let socket_env = SocketEnv::from_lookup(|name| env(facts, name));
    let endpoint = |e: bootstrap::Endpoint| Endpoint {
        interface: e.interface,
        address: e.address.address,
    };
    let transport: Vec<Endpoint> =
        bootstrap::socket_transport(version, socket_env, interfaces, addresses)
            .into_iter()
            .map(endpoint)
            .collect();
    let (first, comm_id) = match bootstrap::bootstrap(version, socket_env, interfaces, addresses) {
        Bootstrap::Uses(e) => (Some(endpoint(e)), false),
        Bootstrap::NoInterface(_) => (None, false),
        Bootstrap::ByCommId => (None, true),
    };
    let value = socket_env.ifname;
    let automatic = value.is_none_or(|v| v.len() <= 1);
    let why = match value {
        _ if comm_id => "NCCL_COMM_ID names a host: bootstrap takes the interface in the subnet of its address (resolved at run time, not predicted here)".to_string(),
        Some(v) if !automatic => format!("NCCL_SOCKET_IFNAME={v:?} selects them"),
        Some(v) => format!(
            "NCCL_SOCKET_IFNAME={v:?} is one character or less, which NCCL ignores: automatic selection (ib*, then anything but docker*, lo, virbr*)"
        ),
        None => {
            "NCCL_SOCKET_IFNAME unset: automatic selection (ib*, then anything but docker*, lo, virbr*)"
                .to_string()
        }
    };
    Decision::new(
        SocketInterfaces {
            bootstrap: first,
            interfaces: transport,
            automatic,
            comm_id,
        },
        why,
        SOURCE,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_facts;

    #[test]
    fn automatic_explicit_and_ignored_values() {
        let f = test_facts::healthy();
        let auto = predict(&f, None).value;
        assert!(auto.automatic);
        assert_eq!(auto.bootstrap.unwrap().interface, "eth0");
        let with = |k: &str, v: &str| test_facts::with_env(f.clone(), &[(k, v)]);
        let lo = predict(&with("NCCL_SOCKET_IFNAME", "lo"), None).value;
        assert_eq!(lo.bootstrap.unwrap().address, "127.0.0.1");
        let none = predict(
            &with("NCCL_SOCKET_IFNAME", "x0"),
            Some(Version::new(2, 28, 9)),
        );
        assert_eq!(none.value.bootstrap, None);
        let ignored = predict(
            &test_facts::with_env(f.clone(), &[("NCCL_SOCKET_IFNAME", "")]),
            None,
        );
        assert!(ignored.value.automatic && ignored.why.contains("ignores"));
        // NCCL_COMM_ID: the address in its subnet (crate::nccl::bootstrap); a host name is
        // resolved at run time and not predicted.
        let id = predict(
            &test_facts::with_env(f.clone(), &[("NCCL_COMM_ID", "10.0.0.5:1234")]),
            None,
        );
        assert!(!id.value.comm_id);
        assert_eq!(id.value.bootstrap.map(|b| b.interface), Some("eth0".into()));
        let host = predict(
            &test_facts::with_env(f, &[("NCCL_COMM_ID", "master-0:1234")]),
            None,
        );
        assert!(host.value.comm_id && host.value.bootstrap.is_none());
    }
}
