//! The names the gang waits for: the root's (non-root ranks) and every peer's
//! where the launcher's naming is known, resolved concurrently by a bounded
//! pool of threads, so `--gang-wait` holds at any pod count and with a hung
//! resolver (getaddrinfo has no deadline of its own: a thread stuck in it is
//! left behind, and the wait ends on time without it).

use crate::layout::GangIdentity;
use crate::report::Report;
use serde::Serialize;
use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::mpsc::channel;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Resolver threads at once.
const POOL: usize = 16;
/// Between passes over the names still unresolved.
const PASS: Duration = Duration::from_secs(1);

/// How a peer's name resolved while the gang waited.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Peer {
    pub node: u64,
    pub name: String,
    pub address: Option<String>,
}

/// One lookup, preferring IPv4; an address literal needs none.
fn lookup(name: &str) -> Option<IpAddr> {
    if let Ok(ip) = name.trim_matches(['[', ']']).parse::<IpAddr>() {
        return Some(ip);
    }
    let all: Vec<SocketAddr> = (name, 0).to_socket_addrs().ok()?.collect();
    all.iter()
        .find(|a| a.is_ipv4())
        .or(all.first())
        .map(|a| a.ip())
}

/// Resolves every name of `names` once, POOL at a time, returning what
/// resolved before `deadline` (index, address).
fn resolve_all(names: &[String], deadline: Instant) -> Vec<(usize, IpAddr)> {
    let queue: Arc<Mutex<VecDeque<(usize, String)>>> =
        Arc::new(Mutex::new(names.iter().cloned().enumerate().collect()));
    let (tx, rx) = channel();
    for _ in 0..POOL.min(names.len()) {
        let (queue, tx) = (Arc::clone(&queue), tx.clone());
        let spawned = std::thread::Builder::new()
            .name("gang-resolve".into())
            .spawn(move || {
                loop {
                    let next = queue.lock().ok().and_then(|mut q| q.pop_front());
                    let Some((i, name)) = next else { return };
                    if tx.send((i, lookup(&name))).is_err() {
                        return;
                    }
                }
            });
        if spawned.is_err() {
            break;
        }
    }
    drop(tx);
    let mut out = Vec::new();
    let mut answered = 0;
    while answered < names.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((i, found)) => {
                answered += 1;
                out.extend(found.map(|ip| (i, ip)));
            }
            Err(_) => break,
        }
    }
    // Names nobody took yet are dropped with the queue's last owner.
    if let Ok(mut q) = queue.lock() {
        q.clear();
    }
    out
}

/// One lookup of `name` within `limit`.
pub fn resolve(name: &str, limit: Duration) -> Option<IpAddr> {
    resolve_all(&[name.to_string()], Instant::now() + limit)
        .first()
        .map(|(_, ip)| *ip)
}

/// Waits, a pass every second until `limit`, for the names this rank needs.
pub fn wait_for_names(identity: &GangIdentity, limit: Duration) -> Vec<Peer> {
    let me = identity.node_rank;
    let mut peers: Vec<Peer> = if identity.peers.is_empty() {
        vec![Peer {
            node: 0,
            name: identity.root.clone(),
            address: None,
        }]
    } else {
        identity
            .peers
            .iter()
            .enumerate()
            .map(|(i, n)| Peer {
                node: i as u64,
                name: if i == 0 {
                    identity.root.clone()
                } else {
                    n.clone()
                },
                address: None,
            })
            .collect()
    };
    // No rank needs its own name.
    peers.retain(|p| p.node != me);
    let deadline = Instant::now() + limit;
    loop {
        let pass_end = deadline.min(Instant::now() + PASS);
        let open: Vec<usize> = (0..peers.len())
            .filter(|&i| peers[i].address.is_none())
            .collect();
        let names: Vec<String> = open.iter().map(|&i| peers[i].name.clone()).collect();
        // A pass ends at the next second at the latest; a slow answer is taken next pass.
        for (k, ip) in resolve_all(
            &names,
            deadline.min(Instant::now() + Duration::from_secs(2)),
        ) {
            peers[open[k]].address = Some(ip.to_string());
        }
        if peers.iter().all(|p| p.address.is_some()) || Instant::now() >= deadline {
            return peers;
        }
        std::thread::sleep(pass_end.saturating_duration_since(Instant::now()));
    }
}

/// True when this host owns `ip` (a bind to it succeeds).
fn is_local(ip: IpAddr) -> bool {
    std::net::TcpListener::bind((ip, 0)).is_ok()
}

/// Rank 0's own address for the root: the root name's address when it is local,
/// else the address of the default route's interface (the pod IP).
pub fn root_address_here(root: &str, report: &Report) -> Option<IpAddr> {
    if let Some(ip) = resolve(root, Duration::from_secs(2)).filter(|ip| is_local(*ip)) {
        return Some(ip);
    }
    let net = &report.facts.network;
    let route = net.default_routes.value()?.first()?;
    net.addresses
        .value()?
        .iter()
        .filter(|a| a.interface == route.interface)
        .filter_map(|a| a.address.parse::<IpAddr>().ok())
        .find(|ip| ip.is_ipv4() && is_local(*ip))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regression_the_wait_holds_with_many_names_that_never_resolve() {
        // Issue 31 row 12: names were resolved one at a time, up to 2 s each, and the
        // wait checked after a whole pass (1,000 pods took 78 s with --gang-wait 2).
        let identity = GangIdentity {
            launcher: "flags".into(),
            node_rank: 0,
            nodes: 1000,
            root: "nobody-master-0.invalid".into(),
            port: 29501,
            peers: (0..1000).map(|i| format!("nobody-{i}.invalid")).collect(),
            sources: vec![],
            attempt: String::new(),
        };
        let started = Instant::now();
        let peers = wait_for_names(&identity, Duration::from_secs(2));
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(peers.len(), 999);
        assert!(peers.iter().all(|p| p.address.is_none()));
    }

    #[test]
    fn literals_and_localhost_resolve() {
        assert_eq!(
            resolve("10.1.2.3", Duration::from_secs(1)),
            Some("10.1.2.3".parse().unwrap())
        );
        assert_eq!(
            resolve("[::1]", Duration::from_secs(1)),
            Some("::1".parse().unwrap())
        );
        assert!(resolve("localhost", Duration::from_secs(2)).is_some());
    }
}
