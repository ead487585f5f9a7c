//! The interface bootstrap binds and the interfaces NET/Socket drives, from the rules
//! in `crate::nccl::socket_ifname` (proven against real NCCL in the tests).

use super::{Decision, env};
use crate::facts::Facts;
use crate::nccl::socket_ifname::{self, IfnameFilter};
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
    /// The first one: bootstrap's; `None`: NCCL fails at init ("Bootstrap : no socket
    /// interface found").
    pub bootstrap: Option<Endpoint>,
    /// Every interface NET/Socket drives, in NCCL's order (at most 16).
    pub interfaces: Vec<Endpoint>,
    /// True when NCCL chose by itself (NCCL_SOCKET_IFNAME unset, or a value of one
    /// character or less, which NCCL ignores).
    pub automatic: bool,
}

pub(super) fn predict(facts: &Facts) -> Decision<SocketInterfaces> {
    let (Some(interfaces), Some(addresses)) = (
        facts.network.interfaces.value(),
        facts.network.addresses.value(),
    ) else {
        return Decision::new(
            SocketInterfaces {
                bootstrap: None,
                interfaces: Vec::new(),
                automatic: true,
            },
            "the interface list is unreadable: not predicted",
            SOURCE,
        );
    };
    let family = socket_ifname::socket_family(env(facts, "NCCL_SOCKET_FAMILY"));
    let value = env(facts, "NCCL_SOCKET_IFNAME");
    let filter = value.and_then(IfnameFilter::parse);
    let selected = match &filter {
        Some(f) => socket_ifname::select(f, interfaces, addresses, family),
        None => socket_ifname::select_automatic(interfaces, addresses, family),
    };
    let endpoints: Vec<Endpoint> = socket_ifname::socket_transport(&selected)
        .iter()
        .filter_map(|name| {
            let a = socket_ifname::used_address(name, addresses, family)?;
            Some(Endpoint {
                interface: name.clone(),
                address: a.address.clone(),
            })
        })
        .collect();
    let why = match (value, &filter) {
        (Some(v), Some(_)) => format!("NCCL_SOCKET_IFNAME={v:?} selects them"),
        (Some(v), None) => format!(
            "NCCL_SOCKET_IFNAME={v:?} is one character or less, which NCCL ignores: automatic selection (ib*, then anything but docker*, lo, virbr*)"
        ),
        (None, _) => {
            "NCCL_SOCKET_IFNAME unset: automatic selection (ib*, then anything but docker*, lo, virbr*)"
                .to_string()
        }
    };
    Decision::new(
        SocketInterfaces {
            bootstrap: endpoints.first().cloned(),
            interfaces: endpoints,
            automatic: filter.is_none(),
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
        let auto = predict(&f).value;
        assert!(auto.automatic);
        assert_eq!(auto.bootstrap.unwrap().interface, "eth0");
        let lo = predict(&test_facts::with_env(
            f.clone(),
            &[("NCCL_SOCKET_IFNAME", "lo")],
        ))
        .value;
        assert_eq!(lo.bootstrap.unwrap().address, "127.0.0.1");
        let none = predict(&test_facts::with_env(
            f.clone(),
            &[("NCCL_SOCKET_IFNAME", "x0")],
        ));
        assert_eq!(none.value.bootstrap, None);
        let ignored = predict(&test_facts::with_env(f, &[("NCCL_SOCKET_IFNAME", "")]));
        assert!(ignored.value.automatic && ignored.why.contains("ignores"));
    }
}
