//! The watcher thread: a STATUS query every `--watch-interval` (sooner after a MONITOR
//! event), reconnects with backoff while nothing listens (the trainer starting or
//! restarting), one log line per change of the job's state, and the view published for
//! the request handlers.
//!
//! The hang report's timing (docs/job-watch.md, "Time to report"): a communicator that
//! disagrees or misses a rank and has not moved for half of --hang-after starts an
//! episode: the checks run at once (so the node's state is current), and each rank of
//! this pod is asked for a flight recorder dump (at most once per episode and per
//! `FLIGHT_GAP`), which its monitor writes within about a second. When the hang is named
//! at --hang-after, the dumps are in. The node is read at the job's start (the first
//! healthy reply) and compared at the moment of the report.

use super::judge::{Events, JobView, Outcome, State, Watch};
use super::node::NodeNow;
use super::reply::Member;
use super::report::{self, Flight};
use super::version::{self, Version};
use super::{client, flight, judge_view, monitor};
use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Clone, Debug)]
pub struct Config {
    /// Where the trainer's RAS listens (`localhost:28028`).
    pub addr: String,
    pub interval: Duration,
    pub hang_after: Duration,
    /// nccl#1669 (NCCL before 2.27.3): how long RAS must have been up, and since a reply
    /// last showed a communicator initialising, before a query.
    pub init_grace: Duration,
    /// Pod names by address, from the pod's /etc/hosts (pods.rs).
    pub pods: std::collections::BTreeMap<String, String>,
    /// This pod's addresses: a rank RAS places at one of them runs here.
    pub local: BTreeSet<IpAddr>,
    /// Where the trainer's flight recorder pipes and dumps are (`--flight-recorder`).
    pub flight_dir: Option<PathBuf>,
}

/// How serve's own state reaches the watcher: the node now, and a run of the checks now.
pub struct NodeHooks {
    pub read: Box<dyn Fn() -> Option<NodeNow> + Send + Sync>,
    pub rerun: Box<dyn Fn() + Send + Sync>,
}

/// The most MONITOR lines logged between two queries (the newest; every peer they name
/// is judged).
const PENDING: usize = 64;

/// The least time between two flight recorder requests.
const FLIGHT_GAP: Duration = Duration::from_secs(30);

/// What the watcher and the request handlers share.
pub struct Watching {
    view: Mutex<Option<JobView>>,
    /// MONITOR events not yet judged: every dead or disconnected peer, and the newest
    /// `PENDING` lines (each once, counted) to log.
    events: Mutex<Events>,
    /// A MONITOR event asks for a query now.
    wake: AtomicBool,
    /// Where the trainer's RAS listens, for `POST /job/diagnose`.
    pub addr: String,
    /// One on-demand diagnostics run at a time (`diagnose`).
    pub gate: super::diagnose::Gate,
    /// The last on-demand diagnostics' finding.
    diagnostics: Mutex<Option<crate::finding::Finding>>,
    /// This episode's flight recorder answers, and when they were last asked for.
    flight: Mutex<(Flight, Option<Instant>)>,
    flight_running: AtomicBool,
    /// The node when the job started.
    baseline: Mutex<Option<NodeNow>>,
    hooks: Option<NodeHooks>,
    local: BTreeSet<IpAddr>,
}

impl Watching {
    fn new(config: &Config, hooks: Option<NodeHooks>) -> Watching {
        Watching {
            view: Mutex::new(None),
            events: Mutex::new(Events::new(PENDING)),
            wake: AtomicBool::new(false),
            addr: config.addr.clone(),
            gate: super::diagnose::Gate::default(),
            diagnostics: Mutex::new(None),
            flight: Mutex::new((
                Flight {
                    dir: config.flight_dir.as_ref().map(|d| d.display().to_string()),
                    ..Flight::default()
                },
                None,
            )),
            flight_running: AtomicBool::new(false),
            baseline: Mutex::new(None),
            hooks,
            local: config.local.clone(),
        }
    }

    /// The last published view (a copy: the lock is held only to clone it), with the
    /// last on-demand diagnostics' finding and, while the job is in trouble, the report.
    pub fn view(&self) -> Option<JobView> {
        let mut view = self
            .view
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()?;
        view.diagnostics = self
            .diagnostics
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if view.state.fails_liveness() || view.troubled {
            view.report = Some(self.report(&view));
        }
        Some(view)
    }

    fn is_local(&self, m: &Member) -> bool {
        let host = m
            .host
            .as_deref()
            .map(|h| h.trim_start_matches('[').trim_end_matches(']'));
        host.and_then(|h| h.parse::<IpAddr>().ok())
            .is_some_and(|ip| self.local.contains(&ip))
    }

    fn report(&self, view: &JobView) -> report::HangReport {
        let flight = {
            let (f, asked) = &*self.flight.lock().unwrap_or_else(|p| p.into_inner());
            Flight {
                asked_secs_ago: asked.map(|t| t.elapsed().as_secs_f64()),
                ..f.clone()
            }
        };
        let now = self.hooks.as_ref().and_then(|h| (h.read)());
        let node = match &now {
            Some(now) => {
                let baseline = self.baseline.lock().unwrap_or_else(|p| p.into_inner());
                let (mut lines, fault) = super::node::lines(now, baseline.as_ref());
                if lines.is_empty() {
                    lines.push("no XID, no NVLink or RDMA port down or with rising errors, no newly failing check since the job started".into());
                }
                (lines, fault)
            }
            None => (
                vec!["not read yet: the checks have not finished a run".into()],
                false,
            ),
        };
        report::assemble(&view.causes, &flight, node, &|m| self.is_local(m))
    }

    /// Keeps the finding of an on-demand diagnostics run for /job and /report.
    pub fn set_diagnostics(&self, finding: crate::finding::Finding) {
        *self.diagnostics.lock().unwrap_or_else(|p| p.into_inner()) = Some(finding);
    }

    fn publish(&self, view: JobView) {
        *self.view.lock().unwrap_or_else(|p| p.into_inner()) = Some(view);
    }

    fn push_event(&self, line: &str) {
        // Bounded: the same event once, counted; a flood of distinct ones keeps the newest
        // lines and every peer they name (`MAX_PEERS` at most).
        let mut events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        if events.push(line, 1) {
            self.wake.store(true, Ordering::Relaxed);
        }
    }

    fn take_events(&self) -> Events {
        let mut events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        std::mem::replace(&mut events, Events::new(PENDING))
    }

    /// The node at the job's start, read again when the job starts again.
    fn set_baseline(&self, start: bool) {
        let mut baseline = self.baseline.lock().unwrap_or_else(|p| p.into_inner());
        if !start {
            *baseline = None;
        } else if baseline.is_none() {
            *baseline = self.hooks.as_ref().and_then(|h| (h.read)());
        }
    }

    /// Asks this pod's ranks for flight recorder dumps, on a thread of its own: not
    /// while one is asking, nor within `FLIGHT_GAP` of the last.
    fn ask_flight_recorder(
        self: &Arc<Self>,
        dir: &std::path::Path,
        log: &Log,
        stop: &'static AtomicBool,
    ) {
        {
            let mut guard = self.flight.lock().unwrap_or_else(|p| p.into_inner());
            if guard.1.is_some_and(|t| t.elapsed() < FLIGHT_GAP) {
                return;
            }
            if self.flight_running.swap(true, Ordering::AcqRel) {
                return;
            }
            guard.0.ranks.clear();
            guard.0.error = None;
            guard.1 = Some(Instant::now());
        }
        let (me, dir, log) = (Arc::clone(self), dir.to_path_buf(), Arc::clone(log));
        let spawned = std::thread::Builder::new()
            .name("flight-recorder".into())
            .spawn(move || {
                let set = |rank: u32, a: flight::Answer| {
                    let mut guard = me.flight.lock().unwrap_or_else(|p| p.into_inner());
                    guard.0.ranks.insert(rank, a);
                };
                let result =
                    flight::collect(&dir, &|| stop.load(Ordering::Relaxed), &mut |r, a| {
                        set(r, a)
                    });
                let lines = {
                    let mut guard = me.flight.lock().unwrap_or_else(|p| p.into_inner());
                    guard.0.error = result.err();
                    guard.0.asked_secs_ago = guard.1.map(|t| t.elapsed().as_secs_f64());
                    guard.0.lines()
                };
                for line in lines {
                    log(format!("nccl-preflight: job: flight recorder: {line}"));
                }
                me.flight_running.store(false, Ordering::Release);
            });
        if spawned.is_err() {
            self.flight_running.store(false, Ordering::Release);
        }
    }
}

type Log = Arc<dyn Fn(String) + Send + Sync>;
type VersionHint = Box<dyn Fn() -> Option<Version> + Send>;

/// When the text query of an NCCL before 2.27.3 may be sent (nccl#1669).
struct InitGuard {
    grace: Duration,
    /// When RAS was first reached since it last refused.
    up_since: Option<Instant>,
    /// When a reply last showed a communicator initialising.
    init_seen: Option<Instant>,
}

impl InitGuard {
    fn check(&mut self, now: Instant) -> Result<(), String> {
        let up = *self.up_since.get_or_insert(now);
        let quiet = self.init_seen.map_or(up, |t| t.max(up));
        let waited = now.saturating_duration_since(quiet);
        if waited >= self.grace {
            return Ok(());
        }
        Err(format!(
            "not querying yet: on NCCL before 2.27.3 a query during communicator init can crash the trainer (nccl#1669); waiting {:.0} s more",
            (self.grace - waited).as_secs_f64()
        ))
    }
}

struct Loop {
    config: Config,
    shared: Arc<Watching>,
    log: Log,
    hint: VersionHint,
    watch: Watch,
    guard: InitGuard,
    headline: String,
    monitor: Option<std::thread::JoinHandle<()>>,
    /// In a trouble episode (the checks re-run, the flight recorder asked).
    episode: bool,
}

impl Loop {
    /// One query, judged and published; the time until the next.
    fn poll(&mut self, stop: &'static AtomicBool) -> Duration {
        let known = self.watch.version().or_else(|| (self.hint)());
        // The trainer's libnccl, as the checks found it, may say RAS cannot exist; where
        // something answers anyway, RAS itself is the better witness.
        let (plan, too_old) = match version::plan(known) {
            Ok(plan) => (plan, None),
            Err(why) => (version::careful(), Some(why)),
        };
        self.watch.warnings = plan.warnings.clone();
        let guard = &mut self.guard;
        let outcome = match (
            client::query(&self.config.addr, &plan, || guard.check(Instant::now())),
            too_old,
        ) {
            (Outcome::Refused, Some(why)) => Outcome::Unwatchable(why),
            (outcome, _) => outcome,
        };
        let mut outcome = outcome;
        if let Outcome::Reply(s) = &mut outcome {
            super::pods::name(s, &self.config.pods);
        }
        let now = Instant::now();
        let next = match &outcome {
            Outcome::Refused => {
                self.guard.up_since = None;
                None
            }
            Outcome::Unwatchable(_) => Some(self.config.interval),
            Outcome::Failed(_) => None,
            Outcome::Reply(s) if s.initializing => {
                self.guard.init_seen = Some(now);
                Some(self.config.interval)
            }
            _ => Some(self.config.interval),
        };
        self.watch.observe(now, outcome);
        let events = self.shared.take_events();
        for line in events.log.lines() {
            (self.log)(format!("nccl-preflight: job: RAS event: {line}"));
        }
        self.watch.events(events);
        self.publish(stop);
        // The first reply names the version: MONITOR from then on where it has it.
        let monitor = self
            .watch
            .version()
            .and_then(|v| version::plan(Some(v)).ok())
            .is_some_and(|p| p.monitor);
        if monitor && self.monitor.is_none() {
            self.monitor = self.start_monitor(stop);
        }
        next.unwrap_or(Duration::ZERO)
    }

    fn publish(&mut self, stop: &'static AtomicBool) {
        let view = judge_view::view(&self.watch, Instant::now());
        if view.headline != self.headline {
            (self.log)(format!("nccl-preflight: job: {}", view.headline));
            for cause in view.causes.iter().skip(1) {
                (self.log)(format!("nccl-preflight: job:   {}", cause.line));
            }
            self.headline = view.headline.clone();
        }
        self.episode(&view, stop);
        self.shared.publish(view);
    }

    /// Starts a trouble episode (checks now, flight recorder asked) or ends one; keeps
    /// the node's reading at the job's start.
    fn episode(&mut self, view: &JobView, stop: &'static AtomicBool) {
        match view.state {
            State::Healthy => {
                self.episode = false;
                self.shared.set_baseline(true);
            }
            State::Gone | State::Waiting => {
                self.episode = false;
                self.shared.set_baseline(false);
            }
            _ => {}
        }
        if !(view.troubled || view.state.fails_liveness()) {
            return;
        }
        if !self.episode {
            self.episode = true;
            if let Some(h) = &self.shared.hooks {
                (h.rerun)();
            }
        }
        if let Some(dir) = &self.config.flight_dir {
            self.shared.ask_flight_recorder(dir, &self.log, stop);
        }
    }

    fn start_monitor(&self, stop: &'static AtomicBool) -> Option<std::thread::JoinHandle<()>> {
        let (addr, shared) = (self.config.addr.clone(), Arc::clone(&self.shared));
        std::thread::Builder::new()
            .name("ras-monitor".into())
            .spawn(move || monitor::run(&addr, stop, &mut |line| shared.push_event(&line)))
            .ok()
    }
}

/// Sleeps until `until`, a MONITOR event, or `stop`; an event wakes it no sooner than
/// `MIN_GAP` after the last query, so a storm of events cannot turn into a storm of queries.
fn wait(shared: &Watching, until: Instant, stop: &AtomicBool) {
    let earliest = Instant::now() + MIN_GAP;
    while !stop.load(Ordering::Relaxed) && Instant::now() < until {
        if Instant::now() >= earliest && shared.wake.swap(false, Ordering::Relaxed) {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The shortest time between two queries that a MONITOR event asks for.
const MIN_GAP: Duration = Duration::from_secs(1);

/// Starts the watcher thread; it runs until `stop`.
pub fn start(
    config: Config,
    hint: VersionHint,
    hooks: Option<NodeHooks>,
    log: Log,
    stop: &'static AtomicBool,
) -> std::io::Result<(Arc<Watching>, std::thread::JoinHandle<()>)> {
    let shared = Arc::new(Watching::new(&config, hooks));
    let mut state = Loop {
        guard: InitGuard {
            grace: config.init_grace,
            up_since: None,
            init_seen: None,
        },
        watch: Watch::new(config.hang_after),
        config,
        shared: Arc::clone(&shared),
        log,
        hint,
        headline: String::new(),
        monitor: None,
        episode: false,
    };
    state.publish(stop);
    let thread = std::thread::Builder::new()
        .name("ras".into())
        .spawn(move || {
            let mut backoff = Duration::from_secs(1);
            while !stop.load(Ordering::Relaxed) {
                let mut next = state.poll(stop);
                // Nothing answering (the trainer starting or restarting): retry sooner, with
                // backoff, up to the interval.
                if next.is_zero() {
                    next = backoff.min(state.config.interval);
                    backoff = (backoff * 2).min(state.config.interval);
                } else {
                    backoff = Duration::from_secs(1);
                }
                wait(&state.shared, Instant::now() + next, stop);
            }
        })?;
    Ok((shared, thread))
}
