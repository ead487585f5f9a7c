//! The watcher thread: a STATUS query every `--watch-interval` (sooner after a MONITOR
//! event), reconnects with backoff while nothing listens (the trainer starting or
//! restarting), one log line per change of the job's state, and the view published for
//! the request handlers.

use super::judge::{JobView, Outcome, Watch};
use super::version::{self, Version};
use super::{client, judge_view, monitor};
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
}

/// What the watcher and the request handlers share.
#[derive(Default)]
pub struct Watching {
    view: Mutex<Option<JobView>>,
    /// MONITOR events not yet judged.
    events: Mutex<Vec<String>>,
    /// A MONITOR event asks for a query now.
    wake: AtomicBool,
    /// Where the trainer's RAS listens, for `POST /job/diagnose`.
    pub addr: String,
    /// One on-demand diagnostics run at a time (`diagnose`).
    pub gate: super::diagnose::Gate,
    /// The last on-demand diagnostics' finding.
    diagnostics: Mutex<Option<crate::finding::Finding>>,
}

impl Watching {
    /// The last published view (a copy: the lock is held only to clone it), with the
    /// last on-demand diagnostics' finding.
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
        Some(view)
    }

    /// Keeps the finding of an on-demand diagnostics run for /job and /report.
    pub fn set_diagnostics(&self, finding: crate::finding::Finding) {
        *self.diagnostics.lock().unwrap_or_else(|p| p.into_inner()) = Some(finding);
    }

    fn publish(&self, view: JobView) {
        *self.view.lock().unwrap_or_else(|p| p.into_inner()) = Some(view);
    }

    fn push_event(&self, line: String) {
        let mut events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        // Bounded: a flood of events between two polls keeps the newest.
        if events.len() >= 64 {
            events.remove(0);
        }
        events.push(line);
        self.wake.store(true, Ordering::Relaxed);
    }

    fn take_events(&self) -> Vec<String> {
        std::mem::take(&mut *self.events.lock().unwrap_or_else(|p| p.into_inner()))
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
        for event in self.shared.take_events() {
            (self.log)(format!(
                "nccl-preflight: job: RAS event: {}",
                super::reply::safe(&event)
            ));
            self.watch.event(&event);
        }
        self.publish();
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

    fn publish(&mut self) {
        let view = judge_view::view(&self.watch, Instant::now());
        if view.headline != self.headline {
            (self.log)(format!("nccl-preflight: job: {}", view.headline));
            self.headline = view.headline.clone();
        }
        self.shared.publish(view);
    }

    fn start_monitor(&self, stop: &'static AtomicBool) -> Option<std::thread::JoinHandle<()>> {
        let (addr, shared) = (self.config.addr.clone(), Arc::clone(&self.shared));
        std::thread::Builder::new()
            .name("ras-monitor".into())
            .spawn(move || monitor::run(&addr, stop, &mut |line| shared.push_event(line)))
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
    log: Log,
    stop: &'static AtomicBool,
) -> std::io::Result<(Arc<Watching>, std::thread::JoinHandle<()>)> {
    let shared = Arc::new(Watching {
        addr: config.addr.clone(),
        ..Watching::default()
    });
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
    };
    state.publish();
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
