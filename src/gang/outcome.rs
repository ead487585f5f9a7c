//! The rendezvous's second round, after NCCL: every pod sends how its NCCL run
//! ended (joined or not, why) to rank 0 on the gang port again (NCCL's root has
//! let it go with the worker) and gets every pod's back, so every pod names the
//! same pods and the same cause when NCCL's join fails on some of them. A pod
//! that cannot reach rank 0 in this round judges from its own outcome alone.

use super::rendezvous;
use super::worker::{self, WorkerResult};
use crate::layout::GangIdentity;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// How one pod's NCCL run ended, as sent to its peers.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    pub joined: bool,
    pub timed_out: bool,
    /// NCCL cannot run there (no libnccl, no GPU).
    pub unavailable: Option<String>,
    pub error: Option<String>,
    pub stage: String,
}

/// Longest error text an outcome carries, characters.
const TEXT_CHARS: usize = 1000;

impl Outcome {
    pub fn of(r: &WorkerResult) -> Outcome {
        let cut = |s: &Option<String>| s.as_ref().map(|t| t.chars().take(TEXT_CHARS).collect());
        Outcome {
            joined: r.joined,
            timed_out: r.timed_out,
            unavailable: cut(&r.unavailable),
            error: cut(&r.error).or_else(|| cut(&r.last_error)),
            stage: r.stage.chars().take(TEXT_CHARS).collect(),
        }
    }

    /// A peer's outcome, its strings escaped; None when it does not parse.
    fn decode(bytes: &[u8]) -> Option<Outcome> {
        let o: Outcome = serde_json::from_slice(bytes).ok()?;
        let v = |s: String| crate::render::visible(&s).into_owned();
        Some(Outcome {
            unavailable: o.unavailable.map(v),
            error: o.error.map(v),
            stage: v(o.stage),
            ..o
        })
    }
}

/// The second round's job key: the job's, so a pod of another job or attempt
/// is refused, and never the first round's, so a late first-round hello is too.
fn key(identity: &GangIdentity) -> u64 {
    super::handle::magic(identity) ^ 0x6f75_7463_6f6d_6521
}

/// A non-root pod's side: rank 0's NCCL root may still hold the port and close
/// this hello unread (NCCL drops a connection with a foreign magic), so a
/// closed connection is tried again until `deadline`.
fn join_until(
    identity: &GangIdentity,
    root: SocketAddr,
    own: &[u8],
    deadline: Instant,
) -> Result<rendezvous::Table, rendezvous::Failure> {
    loop {
        let within = deadline.saturating_duration_since(Instant::now()) + Duration::from_secs(5);
        let tried = rendezvous::join(
            root,
            key(identity),
            identity.node_rank,
            identity.nodes,
            own,
            deadline,
            within,
        );
        match tried {
            Err(rendezvous::Failure::NoTable(_)) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(200));
            }
            other => return other,
        }
    }
}

/// Every pod's outcome (None where a pod sent none), this pod's own included.
/// `worker_started` is when this pod's worker began: every worker ends within
/// the timeout and its grace after the table, so the round waits that long.
pub fn exchange(
    identity: &GangIdentity,
    timeout: Duration,
    root: SocketAddr,
    mine: &Outcome,
    worker_started: Instant,
) -> Vec<Option<Outcome>> {
    let nodes = identity.nodes as usize;
    let own = serde_json::to_vec(mine).unwrap_or_default();
    let deadline = worker_started + timeout + worker::GRACE + Duration::from_secs(10);
    let table = if identity.node_rank == 0 {
        rendezvous::serve(root, key(identity), identity.nodes, &own, deadline)
    } else {
        join_until(identity, root, &own, deadline)
    };
    let mut out: Vec<Option<Outcome>> = match table {
        Ok(t) => t
            .records
            .iter()
            .map(|r| r.as_deref().and_then(Outcome::decode))
            .collect(),
        Err(_) => vec![None; nodes],
    };
    out.resize(nodes, None);
    if let Some(slot) = out.get_mut(identity.node_rank as usize) {
        *slot = Some(mine.clone());
    }
    out
}
