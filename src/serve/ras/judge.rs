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
use std::collections::{BTreeMap, VecDeque};
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
    /// The last MONITOR events (NCCL 2.29+), oldest first; one repeated is kept once,
    /// with `(xN)`.
    pub events: Vec<String>,
    /// The last reply, summarized: every count and status, the first names of each
    /// list (a reply of 16,384 ranks is not copied into every /job).
    pub last_reply: Option<serde_json::Value>,
    /// Why the job hangs, the first cause first (diagnosis.rs).
    pub causes: Vec<super::diagnosis::Cause>,
    /// The hang report: the causes, each local rank's flight recorder, the node, blame.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub report: Option<super::report::HangReport>,
    /// A communicator disagrees or misses a rank and has not moved for half of
    /// --hang-after: time to ask the flight recorder, so its dumps are in when the
    /// hang is named.
    #[serde(skip)]
    pub troubled: bool,
    /// The `nccl-diagnostics` finding of the last `POST /job/diagnose` (NCCL 2.31+).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub diagnostics: Option<crate::finding::Finding>,
}

/// MONITOR events: the same event (its text after the time stamp) kept once, with how
/// often it came and its latest time, the newest `cap` of them.
#[derive(Clone, Debug, Default)]
pub struct EventLog {
    entries: VecDeque<(String, u64)>,
    cap: usize,
}

/// The text of an event without its `[time] ` prefix.
fn event_key(line: &str) -> &str {
    line.split_once("] ").map_or(line, |(_, rest)| rest)
}

impl EventLog {
    pub fn new(cap: usize) -> EventLog {
        EventLog {
            entries: VecDeque::new(),
            cap,
        }
    }

    /// Adds `times` occurrences of `line`; true when it was not there yet.
    pub fn push(&mut self, line: String, times: u64) -> bool {
        let key = event_key(&line).to_string();
        let old = self.entries.iter().position(|(l, _)| event_key(l) == key);
        let n = old
            .and_then(|at| self.entries.remove(at))
            .map_or(0, |(_, n)| n);
        self.entries.push_back((line, n + times));
        while self.entries.len() > self.cap {
            self.entries.pop_front();
        }
        old.is_none()
    }

    pub fn lines(&self) -> Vec<String> {
        self.entries
            .iter()
            .map(|(l, n)| {
                if *n > 1 {
                    format!("{l} (x{n})")
                } else {
                    l.clone()
                }
            })
            .collect()
    }
}

/// What MONITOR's events said: the newest lines (`EventLog`) and the processes reported
/// dead or disconnected, each once, `MAX_PEERS` at most. The peers are taken from each
/// line as it comes, never from the capped log: NCCL sends PEER_DEAD once per peer
/// (src/ras/peers.cc at v2.29.2-1, rasPeerDeclareDead and rasDeadPeersUpdate notify
/// only a peer not yet dead), so a line the log drops is a death no later event repeats.
#[derive(Clone, Debug, Default)]
pub struct Events {
    pub log: EventLog,
    dead: Vec<Member>,
    gone: Vec<Member>,
}

impl Events {
    pub fn new(cap: usize) -> Events {
        Events {
            log: EventLog::new(cap),
            ..Events::default()
        }
    }

    /// A MONITOR event line (`[time] PEER_DEAD: Process P on node H managing GPU G`),
    /// that came `times` times; true when its text was not in the log yet.
    pub fn push(&mut self, line: &str, times: u64) -> bool {
        let line = super::reply::safe(line.trim());
        for (kind, list) in [
            ("] PEER_DEAD: ", &mut self.dead),
            ("] PEER_DISCONNECTED: ", &mut self.gone),
        ] {
            if let Some((_, rest)) = line.split_once(kind)
                && let Some(m) = super::reply_text::process_of(rest)
            {
                add_peer(list, m);
            }
        }
        self.log.push(line, times)
    }

    /// Moves `newer` in: its lines after these, its peers added.
    pub fn absorb(&mut self, newer: Events) {
        for (line, times) in newer.log.entries {
            self.log.push(line, times);
        }
        for m in newer.dead {
            add_peer(&mut self.dead, m);
        }
        for m in newer.gone {
            add_peer(&mut self.gone, m);
        }
    }
}

/// A communicator's counts and since when they have not moved.
struct Track {
    signature: u64,
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
    /// MONITOR's events: the peers reported dead since the last reply, those whose RAS
    /// connection closed (PEER_DISCONNECTED) and have not answered since.
    events: Events,
    pub warnings: Vec<String>,
}

const MAX_EVENTS: usize = 16;
/// The most processes kept from MONITOR's events between two replies: a job's size.
const MAX_PEERS: usize = 16_384;

/// The counts of a communicator: what "moved" compares (a hash of every group's counts
/// and size, and of the missing ranks, so a job of any size keeps 8 bytes per
/// communicator).
fn signature(c: &Comm) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for g in &c.groups {
        (&g.counts, g.ranks).hash(&mut h);
    }
    for m in &c.missing {
        (m.member.rank, m.dead).hash(&mut h);
    }
    h.finish()
}

/// Adds `m` to `list` unless its process is there or the list is full.
fn add_peer(list: &mut Vec<Member>, m: Member) {
    if list.len() < MAX_PEERS
        && !list
            .iter()
            .any(|x| x.process() == m.process() && x.gpu == m.gpu)
    {
        list.push(m);
    }
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
            events: Events::new(MAX_EVENTS),
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
        // The reply says who is dead; a closed connection is news until the process
        // answers again.
        self.events.dead.clear();
        self.events.gone.retain(|g| {
            !status
                .comms
                .iter()
                .any(|c| c.ranks.iter().any(|r| r.member.process() == g.process()))
        });
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

    /// MONITOR's events since the last call, oldest first.
    pub fn events(&mut self, newer: Events) {
        self.events.absorb(newer);
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
            events: self.events.log.lines(),
            dead_events: &self.events.dead,
            gone_events: &self.events.gone,
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
    pub events: Vec<String>,
    pub dead_events: &'a [Member],
    pub gone_events: &'a [Member],
    pub warnings: &'a [String],
}
