//! The judgement over successive RAS replies: which communicator is hung (its ranks'
//! counts disagree, or a rank is missing, and nothing moved for `--hang-after`), which
//! rank is dead, which reported an error. Pure: the watcher feeds it outcomes and the
//! time they came, and reads a [`JobView`] back.
//!
//! What RAS cannot show: its counts are collectives *launched*, not completed
//! (nccl#1730). A hang inside a kernel after every rank launched the same collective
//! leaves equal, frozen counts, which look the same as a job busy with something other
//! than NCCL (data loading, a checkpoint): this judgement never calls that hung.

use super::reply::{Comm, JobStatus, Member};
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// What one poll of RAS gave.
#[derive(Debug)]
pub enum Outcome {
    Reply(Box<JobStatus>),
    /// Nothing listens on the address: NCCL has not started RAS yet, or its processes ended.
    Refused,
    /// Connected, but no usable reply: a deadline, a cut, malformed text, a protocol error.
    Failed(String),
    /// Not queried, on purpose (nccl#1669's init guard).
    Guarded(String),
    /// This NCCL cannot be watched (too old).
    Unwatchable(String),
}

/// The job's state, worst last.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum State {
    /// Never answered yet: the trainer has not initialised NCCL.
    Waiting,
    Healthy,
    /// RAS answered once, and now nothing listens: the job's processes on this pod ended.
    Gone,
    /// This NCCL cannot be watched.
    Unwatchable,
    /// A rank is unresponsive but not yet dead, or queries fail: not yet a verdict.
    Suspect,
    /// A rank reported an asynchronous error, an init error or an abort.
    Error,
    Hung,
    Dead,
}

impl State {
    pub fn label(self) -> &'static str {
        match self {
            State::Waiting => "waiting",
            State::Healthy => "healthy",
            State::Gone => "gone",
            State::Unwatchable => "unwatchable",
            State::Suspect => "suspect",
            State::Error => "error",
            State::Hung => "hung",
            State::Dead => "dead",
        }
    }

    /// What the trainer's liveness endpoint fails on.
    pub fn fails_liveness(self) -> bool {
        matches!(self, State::Hung | State::Dead | State::Error)
    }
}

/// What the endpoints show, built from the judgement at a moment.
#[derive(Clone, Debug, Serialize)]
pub struct JobView {
    pub state: State,
    /// One line that changes only when the state or what is named changes (logged then).
    pub headline: String,
    /// One line per hung communicator, dead or missing rank, error; with the times.
    pub details: Vec<String>,
    pub nccl_version: Option<String>,
    pub format: Option<&'static str>,
    /// Hazards of this NCCL version that watching cannot avoid.
    pub warnings: Vec<String>,
    /// Distinct ranks (process and GPU) of the last reply, answering or not.
    pub ranks: u64,
    pub ranks_missing: u64,
    pub ranks_dead: u64,
    pub communicators: u64,
    pub communicators_hung: u64,
    /// Since any communicator's counts last moved.
    pub seconds_since_progress: Option<f64>,
    pub seconds_since_reply: Option<f64>,
    pub queries: u64,
    pub failed_queries: u64,
    pub last_error: Option<String>,
    /// The last MONITOR events (NCCL 2.29+), oldest first.
    pub events: Vec<String>,
    /// The last reply, parsed.
    pub last_reply: Option<JobStatus>,
    /// The `nccl-diagnostics` finding of the last `POST /job/diagnose` (NCCL 2.31+).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub diagnostics: Option<crate::finding::Finding>,
}

/// A communicator's counts and since when they have not moved.
struct Track {
    signature: String,
    since: Instant,
}

pub struct Watch {
    hang_after: Duration,
    last: Option<JobStatus>,
    last_reply: Option<Instant>,
    tracks: BTreeMap<String, Track>,
    last_progress: Option<Instant>,
    /// Failed queries in a row, and since when.
    failing_since: Option<Instant>,
    refused: bool,
    unwatchable: Option<String>,
    queries: u64,
    failed: u64,
    last_error: Option<String>,
    events: Vec<String>,
    /// Peers MONITOR reported dead since the last reply.
    dead_events: Vec<Member>,
    pub warnings: Vec<String>,
}

const MAX_EVENTS: usize = 16;

/// The counts of a communicator in one string: what "moved" compares.
fn signature(c: &Comm) -> String {
    let mut s = String::new();
    for r in &c.ranks {
        s.push_str(&format!("{:?}={:?};", r.member.rank, r.counts));
    }
    for g in &c.mismatch {
        s.push_str(&format!("{}:{}x{};", g.op, g.count, g.ranks));
    }
    for m in &c.missing {
        s.push_str(&format!("missing {:?};", m.member.rank));
    }
    s
}

impl Watch {
    pub fn new(hang_after: Duration) -> Watch {
        Watch {
            hang_after,
            last: None,
            last_reply: None,
            tracks: BTreeMap::new(),
            last_progress: None,
            failing_since: None,
            refused: false,
            unwatchable: None,
            queries: 0,
            failed: 0,
            last_error: None,
            events: Vec::new(),
            dead_events: Vec::new(),
            warnings: Vec::new(),
        }
    }

    /// The NCCL version of the last reply.
    pub fn version(&self) -> Option<super::version::Version> {
        self.last.as_ref().and_then(JobStatus::version)
    }

    pub fn observe(&mut self, now: Instant, outcome: Outcome) {
        self.queries += 1;
        match outcome {
            Outcome::Reply(status) => self.reply(now, *status),
            Outcome::Refused => {
                self.refused = true;
                self.failing_since = None;
            }
            Outcome::Failed(why) => {
                self.failed += 1;
                self.refused = false;
                self.failing_since.get_or_insert(now);
                self.last_error = Some(why);
            }
            Outcome::Guarded(why) => {
                self.queries -= 1;
                self.last_error = Some(why);
            }
            Outcome::Unwatchable(why) => {
                self.queries -= 1;
                self.unwatchable = Some(why);
            }
        }
    }

    fn reply(&mut self, now: Instant, status: JobStatus) {
        self.refused = false;
        self.unwatchable = None;
        self.failing_since = None;
        self.last_error = None;
        self.last_reply = Some(now);
        self.dead_events.clear();
        let mut tracks = BTreeMap::new();
        for c in &status.comms {
            let sig = signature(c);
            let since = match self.tracks.remove(&c.hash) {
                Some(t) if t.signature == sig => t.since,
                _ => {
                    self.last_progress = Some(now);
                    now
                }
            };
            tracks.insert(
                c.hash.clone(),
                Track {
                    signature: sig,
                    since,
                },
            );
        }
        if status.comms.is_empty() {
            self.last_progress = Some(now);
        }
        self.tracks = tracks;
        self.last = Some(status);
    }

    /// A MONITOR event line (`[time] PEER_DEAD: Process P on node H managing GPU G`).
    pub fn event(&mut self, line: &str) {
        let line = super::reply::safe(line.trim());
        if let Some((_, rest)) = line.split_once("] PEER_DEAD: ")
            && let Some(m) = super::reply_text::process_of(rest)
        {
            self.dead_events.push(m);
        }
        self.events.push(line);
        if self.events.len() > MAX_EVENTS {
            self.events.remove(0);
        }
    }
}

impl Watch {
    pub(super) fn parts(&self) -> Parts<'_> {
        Parts {
            hang_after: self.hang_after,
            last: self.last.as_ref(),
            last_reply: self.last_reply,
            tracks: self
                .tracks
                .iter()
                .map(|(k, t)| (k.as_str(), t.since))
                .collect(),
            last_progress: self.last_progress,
            failing_since: self.failing_since,
            refused: self.refused,
            unwatchable: self.unwatchable.as_deref(),
            queries: self.queries,
            failed: self.failed,
            last_error: self.last_error.as_deref(),
            events: &self.events,
            dead_events: &self.dead_events,
            warnings: &self.warnings,
        }
    }
}

/// The judgement's state, borrowed, for [`view`].
pub struct Parts<'a> {
    pub hang_after: Duration,
    pub last: Option<&'a JobStatus>,
    pub last_reply: Option<Instant>,
    /// Since when each communicator's counts have not moved.
    pub tracks: BTreeMap<&'a str, Instant>,
    pub last_progress: Option<Instant>,
    pub failing_since: Option<Instant>,
    pub refused: bool,
    pub unwatchable: Option<&'a str>,
    pub queries: u64,
    pub failed: u64,
    pub last_error: Option<&'a str>,
    pub events: &'a [String],
    pub dead_events: &'a [Member],
    pub warnings: &'a [String],
}
