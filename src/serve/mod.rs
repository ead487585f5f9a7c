//! `serve`: the checks on an interval in the background, and a small HTTP server
//! answering from the last result: /healthz (alive, last run not stale), /readyz
//! (last verdict not fail), /metrics (Prometheus text via prometheus-client),
//! /report (the last JSON report). A request never waits on a check or a driver.

pub mod http;
pub mod metrics;
pub mod xid;

use crate::cli::ServeArgs;
use crate::commands::Exit;
use crate::judge::Status;
use anyhow::{Context, Result};
use std::ffi::OsString;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// What the last finished run left for the endpoints.
#[derive(Default)]
pub struct Snapshot {
    pub finished: Option<Instant>,
    pub verdict: Option<Status>,
    /// `ID: summary` per failed check.
    pub failures: Vec<String>,
    pub report_json: Option<String>,
    pub metrics: String,
    /// Set when a vendor call hung: checks stop (the process cannot use the driver
    /// again), readiness fails, and liveness goes stale so the kubelet restarts us.
    pub halted: Option<String>,
}

/// Set by SIGTERM and SIGINT.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

fn install_signal_handlers() -> Result<()> {
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};
    let action = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::empty(),
        SigSet::empty(),
    );
    for signal in [Signal::SIGTERM, Signal::SIGINT] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { sigaction(signal, &action) }.context("installing the SIGTERM handler")?;
    }
    Ok(())
}

/// Answers one path from the snapshot.
pub fn route(
    snapshot: &Snapshot,
    path: &str,
    stale_after: Duration,
    started: Instant,
) -> http::Response {
    let age = snapshot.finished.map(|t| t.elapsed());
    match path {
        "/healthz" => match age {
            Some(a) if a <= stale_after => http::Response::text(200, "ok\n"),
            Some(a) => http::Response::text(
                503,
                format!(
                    "stale: the last check finished {:.0} s ago (limit {:.0} s){}\n",
                    a.as_secs_f64(),
                    stale_after.as_secs_f64(),
                    snapshot
                        .halted
                        .as_deref()
                        .map(|h| format!("; {h}"))
                        .unwrap_or_default()
                ),
            ),
            None if started.elapsed() <= stale_after => {
                http::Response::text(200, "ok: first check running\n")
            }
            None => http::Response::text(503, "stale: no check has finished yet\n"),
        },
        "/readyz" => match (&snapshot.halted, snapshot.verdict) {
            (Some(h), _) => http::Response::text(503, format!("not ready: {h}\n")),
            (None, None) => http::Response::text(503, "not ready: first check running\n"),
            (None, Some(Status::Fail)) => http::Response::text(
                503,
                format!("not ready: {}\n", snapshot.failures.join("\n")),
            ),
            (None, Some(_)) => http::Response::text(200, "ready\n"),
        },
        "/metrics" => http::Response {
            status: 200,
            content_type: "application/openmetrics-text; version=1.0.0; charset=utf-8",
            body: snapshot.metrics.clone(),
        },
        "/report" => match &snapshot.report_json {
            Some(json) => http::Response {
                status: 200,
                content_type: "application/json",
                body: json.clone(),
            },
            None => http::Response::text(503, "no check has finished yet\n"),
        },
        _ => http::Response::text(404, "not found: try /healthz, /readyz, /metrics, /report\n"),
    }
}

/// One run of the checks into the shared snapshot; false when a vendor call hung.
fn run_once(
    args: &ServeArgs,
    env: &[(OsString, OsString)],
    state: &Mutex<Snapshot>,
    xids: &Mutex<xid::Xids>,
    runs: u64,
) -> bool {
    let started = Instant::now();
    let outcome = crate::commands::evaluate(&args.check, env, false);
    let xids = xids.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let took = started.elapsed();
    let mut next = Snapshot::default();
    let mut hung = false;
    match outcome {
        Ok((report, hung_call)) => {
            hung = hung_call.0;
            next.verdict = Some(report.verdict);
            next.failures = report
                .checks
                .iter()
                .filter(|c| c.status == Status::Fail)
                .map(|c| format!("{}: {}", c.id, c.summary))
                .collect();
            next.report_json = Some(crate::render::json::render(&report));
            next.metrics =
                metrics::render(Some(&report), took, SystemTime::now(), (runs, hung), &xids);
            if hung {
                next.halted = Some(format!(
                    "a driver call hung; checks stopped ({})",
                    next.failures.join("; ")
                ));
            }
        }
        Err(e) => {
            // The tool could not run its checks (bad flags were caught before serving):
            // keep serving, not ready, and say why.
            next.verdict = Some(Status::Fail);
            next.failures = vec![format!("nccl-preflight: {e:#}")];
            next.metrics = metrics::render(None, took, SystemTime::now(), (runs, false), &xids);
        }
    }
    next.finished = Some(Instant::now());
    *state.lock().unwrap_or_else(|p| p.into_inner()) = next;
    !hung
}

pub fn serve(args: &ServeArgs, env: &[(OsString, OsString)]) -> Result<Exit> {
    if args.interval < Duration::from_secs(1) {
        anyhow::bail!("--interval {:?}: at least 1s", args.interval);
    }
    let stale_after = args
        .stale_after
        .unwrap_or(args.interval * 3 + args.check.gather.timeout * 2);
    let listener = std::net::TcpListener::bind(&args.listen)
        .with_context(|| format!("serve --listen {}", args.listen))?;
    install_signal_handlers()?;
    // Log lines never panic: stderr may be a closed pipe.
    let log = |line: String| {
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), "{line}");
    };
    log(format!(
        "nccl-preflight: serving /healthz /readyz /metrics /report on {} (checks every {:.0} s)",
        listener
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_else(|_| args.listen.clone()),
        args.interval.as_secs_f64()
    ));
    let state = Arc::new(Mutex::new(Snapshot::default()));
    let xids = Arc::new(Mutex::new(xid::Xids::default()));
    let watcher = {
        let (xids, library) = (Arc::clone(&xids), args.check.gather.nvml_lib.clone());
        std::thread::Builder::new()
            .name("xid".into())
            .spawn(move || xid::watch(&library, &xids, &STOP))
            .context("starting the XID thread")?
    };
    let started = Instant::now();
    let checker = {
        let (state, env, xids) = (Arc::clone(&state), env.to_vec(), Arc::clone(&xids));
        let args = args.clone();
        std::thread::Builder::new()
            .name("checks".into())
            .spawn(move || {
                let mut runs = 0u64;
                while !STOP.load(Ordering::Relaxed) {
                    runs += 1;
                    if !run_once(&args, &env, &state, &xids, runs) {
                        return;
                    }
                    let next = Instant::now() + args.interval;
                    while !STOP.load(Ordering::Relaxed) && Instant::now() < next {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                }
            })
            .context("starting the check thread")?
    };
    let route_state = Arc::clone(&state);
    let routes: Arc<dyn Fn(&str) -> http::Response + Send + Sync> = Arc::new(move |path: &str| {
        let snapshot = route_state.lock().unwrap_or_else(|p| p.into_inner());
        route(&snapshot, path, stale_after, started)
    });
    http::serve(listener, &STOP, routes).context("serving")?;
    log(String::from("nccl-preflight: stopping"));
    // A check in progress may be inside a driver call: do not wait for it.
    // The XID watcher may sit in NVML's wait for up to a second: leave with _exit
    // rather than wait for it (or for a check inside a driver call).
    let hung = !checker.is_finished() || !watcher.is_finished();
    Ok(Exit { code: 0, hung })
}
