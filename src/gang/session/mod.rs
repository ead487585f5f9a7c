//! The gang's session: one TCP connection from every pod to rank 0 on the gang
//! port, held from the rendezvous to the end. First the rendezvous (before NCCL is
//! touched, as torchrun's c10d TCPStore and MPI's PMI exchange what they need before
//! the collective library starts): every pod sends its record and gets the whole
//! table back, so every pod judges the same table. Then, while NCCL runs, beats
//! both ways (`follow`): rank 0 learns at once which pod's connection closed, which
//! fell silent and which pod's NCCL run ended early, tells every pod, and every pod
//! stops its NCCL run, so a pod that dies is named on every surviving rank within
//! the timeout instead of after it. Last, every pod's outcome to rank 0 and all of
//! them back, on the same connection.
//!
//! Admission (`admission`): a connection's first 24 bytes carry the job key (derived
//! from the job's identity, `handle::magic`) before it counts for anything; until
//! then it is one of at most `PENDING_CAP` pending connections, and the one that has
//! sent the least for longest is dropped for a new one, so idle or foreign
//! connections cannot crowd out a pod. A pod whose connection is closed before any
//! answer tries again within its wait. Rank 0 keeps the gang port open to the end:
//! a pod that arrives after the gang went on is told why, and the job's verdict
//! counts it (two pods claiming one rank fail the job on every pod, the claimant's
//! too), so no pod ends with another exit code than its peers.
//!
//! Bounds: rank 0 holds the listener, at most one connection per pod and
//! `PENDING_CAP` pending ones (file descriptors: pods + 64 + a few); memory is the
//! records (16 KiB each at most) and one frame per connection. It is not a security
//! boundary: anyone who can reach the port and knows the job's identity can claim a
//! rank, as with NCCL's own bootstrap.

pub(crate) mod admission;
pub(crate) mod member;
pub(crate) mod root;

use super::outcome::Outcome;
use super::wire::{Duplicate, Table};
use crate::finding::Blame;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// A connection must deliver its hello within this.
pub const HELLO_WITHIN: Duration = Duration::from_secs(5);
/// How often each side beats while NCCL runs.
const BEAT_EVERY: Duration = Duration::from_secs(1);
/// The longest one wait for the network lasts before the loop looks again.
const TICK: Duration = Duration::from_millis(100);

/// How long a side may say nothing before it counts as gone: a third of the
/// timeout, within 3 to 10 s (beats come every second).
pub fn silence(timeout: Duration) -> Duration {
    (timeout / 3).clamp(Duration::from_secs(3), Duration::from_secs(10))
}

/// Why a pod got no table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// Rank 0 could not listen on the gang port.
    Listen(String),
    /// Nothing accepted a connection before the deadline.
    Unreachable(String),
    /// Rank 0 refused this pod, saying why, and whose fault that is.
    Refused { why: String, blame: Blame },
    /// Connected, then no table came (closed, timed out or malformed).
    NoTable(String),
}

/// How a pod left NCCL's run early.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum How {
    /// Its connection closed: its pod ended (killed, evicted, its node lost).
    Closed,
    /// Nothing came from it for this many seconds.
    Silent(f64),
}

/// A pod that left NCCL's run, as rank 0 saw it (or, for rank 0 itself, as the pod
/// that lost it saw it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Gone {
    pub node: u64,
    /// Seconds from the start of NCCL's run to when it was missed.
    pub seconds: Option<f64>,
    /// The last stage it reported.
    pub stage: String,
    pub how: How,
}

impl Gone {
    /// Its strings escaped and its numbers sane: a peer sent it.
    fn checked(self) -> Gone {
        let sane = |s: Option<f64>| s.filter(|t| t.is_finite() && *t >= 0.0);
        Gone {
            seconds: sane(self.seconds),
            stage: crate::render::visible(&self.stage).into_owned(),
            how: match self.how {
                How::Silent(s) => How::Silent(sane(Some(s)).unwrap_or(0.0)),
                h => h,
            },
            ..self
        }
    }
}

/// What a side says while NCCL runs: its stage and, once its NCCL run ended early,
/// why; rank 0 adds why every pod must stop and the pods it lost.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Beat {
    pub stage: String,
    pub ended: Option<String>,
    pub stop: Option<String>,
    pub gone: Vec<Gone>,
}

/// How the job's NCCL run ended, as every pod learns it from rank 0.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Outcomes {
    /// Each pod's outcome (None: it sent none).
    pub outcomes: Vec<Option<Outcome>>,
    pub gone: Vec<Gone>,
    /// Pods that claimed a taken rank after the gang went on.
    pub duplicates: Vec<Duplicate>,
    /// Pods that came after the gang went on without them, `address: rank`.
    pub late: Vec<String>,
}

impl Outcomes {
    /// A peer's outcomes, escaped and bounded to the gang's pods.
    fn checked(mut self, nodes: usize) -> Outcomes {
        self.outcomes.resize(nodes, None);
        self.outcomes = self
            .outcomes
            .into_iter()
            .map(|o| o.map(Outcome::checked))
            .collect();
        self.gone.retain(|g| (g.node as usize) < nodes);
        self.gone = self.gone.into_iter().map(Gone::checked).collect();
        self.duplicates.truncate(nodes);
        let v = |s: String| crate::render::visible(&s).into_owned();
        for d in &mut self.duplicates {
            d.kept = v(std::mem::take(&mut d.kept));
            d.refused = v(std::mem::take(&mut d.refused));
        }
        self.late.truncate(nodes);
        self.late = self.late.into_iter().map(v).collect();
        self
    }
}

/// What this pod's NCCL run and its session share while NCCL runs.
pub struct Live {
    /// Set by the session: a pod left, every pod stops its NCCL run.
    stop: AtomicBool,
    /// Why, as rank 0 said it (or as this pod saw rank 0 go).
    why: Mutex<Option<String>>,
    beat: Mutex<(Beat, bool)>,
    outcome: Mutex<Option<Outcome>>,
}

impl Default for Live {
    fn default() -> Self {
        Live {
            stop: AtomicBool::new(false),
            why: Mutex::new(None),
            beat: Mutex::new((Beat::default(), false)),
            outcome: Mutex::new(None),
        }
    }
}

impl Live {
    pub fn stop_flag(&self) -> &AtomicBool {
        &self.stop
    }

    fn stop(&self, why: &str) {
        let mut slot = self.why.lock().unwrap_or_else(|p| p.into_inner());
        slot.get_or_insert_with(|| crate::render::visible(why).into_owned());
        self.stop.store(true, Ordering::SeqCst);
    }

    /// Why the session stopped this pod's run, once it did.
    pub fn why(&self) -> Option<String> {
        self.why.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// This pod's stage, said in a beat at once: when the pod goes away, the stage it
    /// was at is what names it.
    pub fn stage(&self, stage: &str) {
        let mut b = self.beat.lock().unwrap_or_else(|p| p.into_inner());
        if b.0.stage != stage {
            b.0.stage = stage.chars().take(200).collect();
            b.1 = true;
        }
    }

    /// This pod's NCCL run ended: its outcome, and why when it ended early (said at once).
    pub fn end(&self, outcome: Outcome, early: Option<String>) {
        if let Some(why) = early {
            let mut b = self.beat.lock().unwrap_or_else(|p| p.into_inner());
            b.0.ended = Some(why.chars().take(400).collect());
            b.1 = true;
        }
        *self.outcome.lock().unwrap_or_else(|p| p.into_inner()) = Some(outcome);
    }

    /// The beat to send, and whether it changed in a way to send at once.
    fn beat(&self) -> (Beat, bool) {
        let mut b = self.beat.lock().unwrap_or_else(|p| p.into_inner());
        let urgent = std::mem::take(&mut b.1);
        (b.0.clone(), urgent)
    }

    fn outcome(&self) -> Option<Outcome> {
        self.outcome
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// A pod's side of the session.
pub enum Session {
    Root(root::Root),
    Member(member::Member),
}

/// Where and as whom this pod meets the others.
pub struct Meeting<'a> {
    pub root: SocketAddr,
    pub job: u64,
    pub rank: u64,
    pub nodes: u64,
    pub record: &'a [u8],
    /// The rendezvous ends here (rank 0 stops waiting for pods; a pod stops
    /// trying to reach rank 0).
    pub deadline: Instant,
    /// How long a pod waits for the table once it reached rank 0.
    pub table_within: Duration,
}

impl Session {
    /// The rendezvous: rank 0 serves it, every other pod joins it.
    pub fn meet(m: &Meeting<'_>) -> Result<(Session, Table), Failure> {
        if m.rank == 0 {
            root::Root::meet(m).map(|(r, t)| (Session::Root(r), t))
        } else {
            member::Member::meet(m).map(|(s, t)| (Session::Member(s), t))
        }
    }

    /// While NCCL runs, until `deadline`: beats, the pods that left, then every
    /// pod's outcome (this pod's own from `live` once its run ended).
    pub fn follow(&mut self, live: &Live, silence: Duration, deadline: Instant) -> Outcomes {
        match self {
            Session::Root(r) => r.follow(live, silence, deadline),
            Session::Member(m) => m.follow(live, silence, deadline),
        }
    }
}

/// Waits until one of `fds` is ready (`true`: for writing too) or `TICK` passes.
fn wait(fds: &[(std::os::fd::BorrowedFd<'_>, bool)]) -> Vec<bool> {
    use nix::poll::{PollFd, PollFlags, PollTimeout};
    let mut polled: Vec<PollFd<'_>> = fds
        .iter()
        .map(|(fd, write)| {
            let mut flags = PollFlags::POLLIN;
            if *write {
                flags |= PollFlags::POLLOUT;
            }
            PollFd::new(*fd, flags)
        })
        .collect();
    let timeout = PollTimeout::try_from(TICK.as_millis() as i32).unwrap_or(PollTimeout::MAX);
    if nix::poll::poll(&mut polled, timeout).is_err() {
        return vec![true; fds.len()];
    }
    polled
        .iter()
        .map(|p| p.revents().is_some_and(|r| !r.is_empty()))
        .collect()
}

#[cfg(test)]
mod tests;
