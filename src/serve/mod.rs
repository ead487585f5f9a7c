//! `serve`: the checks on an interval in the background, and a small HTTP server
//! answering from the last result: /healthz (alive, last run not stale), /readyz
//! (last verdict not fail, no XID that needs a reset), /metrics (Prometheus text via
//! prometheus-client), /report (the last JSON report). A request never waits on a
//! check or a driver. An XID event makes the checks run again at once.

pub(crate) mod http;
pub(crate) mod metrics;
pub(crate) mod probe;
pub(crate) mod ras;
pub(crate) mod resident;
pub(crate) mod taint;
pub(crate) mod xid;

use crate::cli::ServeArgs;
use crate::finding::{Finding, Status};
use crate::gather::Probed;
use crate::policy::Policy;
use crate::report::Report;
use crate::run::Exit;
use anyhow::{Context, Result};
use std::ffi::OsString;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// What the last finished run left for the endpoints.
#[derive(Default)]
pub struct Snapshot {
    pub finished: Option<Instant>,
    /// When it finished, for /metrics.
    pub at: Option<SystemTime>,
    /// How long it took.
    pub took: Duration,
    /// Runs since the server started.
    pub runs: u64,
    /// The report of the checks (the `gpu-xid` finding is added per request, live).
    pub report: Option<Report>,
    /// Why the checks could not run at all.
    pub error: Option<String>,
    /// Set when a vendor call hung: checks stop (the process cannot use the driver
    /// again), readiness fails, and liveness goes stale so the kubelet restarts us.
    pub halted: Option<String>,
}

/// Why the pod is not ready, from the last run and the XIDs seen up to now
/// (an XID that fails readiness does so at once, not at the next run).
fn readiness(snapshot: &Snapshot, xid: &Finding) -> Result<(), String> {
    if let Some(h) = &snapshot.halted {
        return Err(h.clone());
    }
    let mut failures: Vec<String> = Vec::new();
    if xid.status() == Status::Fail {
        failures.push(format!("{}: {}", xid.id, xid.summary));
    }
    match (&snapshot.report, &snapshot.error) {
        (Some(report), _) => failures.extend(
            report
                .checks
                .iter()
                .filter(|c| c.status() == Status::Fail)
                .map(|c| format!("{}: {}", c.id, c.summary)),
        ),
        (None, Some(e)) => failures.push(e.clone()),
        (None, None) if failures.is_empty() => return Err("first check running".into()),
        (None, None) => {}
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("\n"))
    }
}

/// A flag that SIGTERM and SIGINT set (signal-hook's handler only stores to the
/// atomic, which is async-signal-safe); every thread of `serve` stops on it. It lives
/// for the rest of the process (one `Arc` handed to signal-hook, one leaked here), so
/// the threads that are never joined can hold it as `&'static`.
pub(crate) fn stop_on_signals() -> Result<&'static AtomicBool> {
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(signal, Arc::clone(&stop))
            .context("installing the SIGTERM and SIGINT handlers")?;
    }
    let kept: &'static Arc<AtomicBool> = Box::leak(Box::new(stop));
    Ok(kept)
}

/// What a request reads: the last run, and the XIDs seen up to now.
pub struct Live<'a> {
    pub snapshot: &'a Snapshot,
    pub xids: &'a xid::Xids,
    /// The `gpu-xid` finding for `xids`, under `--ignore`.
    pub xid: Finding,
    /// The job as NCCL's RAS shows it, with `--watch-nccl`.
    pub job: Option<ras::JobView>,
}

impl Live<'_> {
    /// The last run's report with the live `gpu-xid` finding and the verdict it makes.
    fn report(&self) -> Option<Report> {
        let mut report = self.snapshot.report.clone()?;
        report.checks.push(self.xid.clone());
        if let Some(job) = &self.job {
            report.checks.push(ras::finding(job));
            report.checks.extend(job.diagnostics.clone());
        }
        report.rejudge();
        Some(report)
    }
}

/// Answers one path.
pub(crate) fn route(
    live: &Live<'_>,
    path: &str,
    stale_after: Duration,
    started: Instant,
) -> http::Response {
    let snapshot = live.snapshot;
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
        "/readyz" => match readiness(snapshot, &live.xid) {
            Ok(()) => http::Response::text(200, "ready\n"),
            Err(why) => http::Response::text(503, format!("not ready: {why}\n")),
        },
        "/metrics" => http::Response {
            status: 200,
            content_type: "application/openmetrics-text; version=1.0.0; charset=utf-8",
            body: metrics::render(
                snapshot,
                &live.xid,
                live.xids,
                readiness(snapshot, &live.xid).is_ok(),
                live.job.as_ref(),
            ),
        },
        "/job" => ras::job_response(live.job.as_ref()),
        "/job/livez" => ras::liveness_response(live.job.as_ref()),
        "/report" => match live.report() {
            Some(report) => http::Response {
                status: 200,
                content_type: "application/json",
                body: crate::render::json::render(&report),
            },
            None => http::Response::text(503, "no check has finished yet\n"),
        },
        _ => http::Response::text(
            404,
            "not found: try /healthz, /readyz, /metrics, /report, /job, /job/livez\n",
        ),
    }
}

/// What the check thread and the request handlers share.
struct Shared {
    state: Mutex<Snapshot>,
    xids: Arc<Mutex<xid::Xids>>,
    policy: Policy,
    xid_policy: xid::XidPolicy,
    /// With `--watch-nccl`: the job watcher's view.
    job: std::sync::OnceLock<Arc<ras::Watching>>,
    /// Bumped by the job watcher when a hang starts: the checks run at once, so the
    /// report's node state is that moment's.
    rerun: std::sync::atomic::AtomicU64,
}

impl Shared {
    fn xids(&self) -> xid::Xids {
        self.xids.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The `gpu-xid` finding for `xids`, under `--ignore`.
    fn xid_finding(&self, xids: &xid::Xids) -> Finding {
        self.policy.settle(xid::finding(xids, &self.xid_policy))
    }

    /// The last run's report with the live `gpu-xid` finding, as /report shows it.
    fn verdict(&self) -> Option<Report> {
        let xids = self.xids();
        let snapshot = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let mut report = snapshot.report.clone()?;
        report.checks.push(self.xid_finding(&xids));
        report.rejudge();
        Some(report)
    }

    /// XID events seen so far: a change makes the checks run again.
    fn xid_events(&self) -> u64 {
        let xids = self.xids.lock().unwrap_or_else(|p| p.into_inner());
        xids.counts.values().sum()
    }
}

/// The run's facts gathered by a child and judged here; None where the child could
/// not (saved facts are judged here as they are).
fn gathered_in_child(
    args: &ServeArgs,
    env: &[(OsString, OsString)],
    shared: &Shared,
    probed: &Option<Probed>,
) -> Option<(crate::report::Report, crate::gather::gpu::HungCall)> {
    if args.check.facts.is_some() {
        return None;
    }
    let request = probe::Request {
        gather: args.check.gather.clone(),
        probe_all: shared.policy.require.any_rdma(),
        probed: probed.clone(),
    };
    match probe::in_child(env, &request) {
        Ok(gathered) => {
            let mut report = crate::run::judge_gathered(
                &args.check,
                gathered.facts,
                &shared.policy,
                args.tune.flight_recorder.as_deref(),
            );
            report.generated = Some(crate::run::generated(env, &report.facts));
            Some((report, crate::gather::gpu::HungCall(gathered.hung)))
        }
        Err(e) => {
            crate::diagnostic::line(format_args!(
                "nccl-preflight: gathering in a child process: {e:#}; gathering in this process"
            ));
            None
        }
    }
}

/// One run of the checks into the shared snapshot; false when a vendor call hung.
/// The run gathers in a child process (`probe`) and judges what the child found; the
/// image's library facts, once they answer cleanly, stay in `probed` and the children
/// of later runs reuse them. Where the child fails, the run gathers in this process.
fn run_once(
    args: &ServeArgs,
    env: &[(OsString, OsString)],
    shared: &Shared,
    runs: u64,
    probed: &mut Option<Probed>,
) -> bool {
    let started = Instant::now();
    let outcome = match gathered_in_child(args, env, shared, probed) {
        Some(judged) => Ok(judged),
        None => {
            let how = crate::run::Evaluation {
                probed: probed.as_ref(),
                cuda: crate::gather::gpu::CudaProbe::Off,
                ..crate::run::Evaluation::under(&shared.policy)
            };
            crate::run::evaluate(&args.check, env, how.tune(&args.tune))
        }
    };
    let mut next = Snapshot {
        took: started.elapsed(),
        runs,
        ..Snapshot::default()
    };
    let mut hung = false;
    match outcome {
        Ok((report, hung_call)) => {
            hung = hung_call.0;
            if hung {
                let failures: Vec<String> = report
                    .checks
                    .iter()
                    .filter(|c| c.status() == Status::Fail)
                    .map(|c| format!("{}: {}", c.id, c.summary))
                    .collect();
                next.halted = Some(format!(
                    "a driver call hung; checks stopped ({})",
                    failures.join("; ")
                ));
            }
            if probed.is_none() && !hung {
                *probed = Probed::settled(&report.facts);
            }
            next.report = Some(report);
        }
        // The tool could not run its checks (bad flags were caught before serving):
        // keep serving, not ready, and say why.
        Err(e) => next.error = Some(format!("nccl-preflight: {e:#}")),
    }
    next.finished = Some(Instant::now());
    next.at = Some(SystemTime::now());
    *shared.state.lock().unwrap_or_else(|p| p.into_inner()) = next;
    !hung
}

/// The checks `serve` runs: those of `check`, without the CUDA driver (each gather
/// `serve` asks for, here or in `facts-child`, says `CudaProbe::Off`). cuInit maps
/// libcuda for good (it cannot be unloaded once initialised) and starts its threads in
/// a process that lives as long as the pod, for what NVML shows as well: a stopped
/// fabric manager is NVML's fabric state on Hopper and later and every NVLink to the
/// NVSwitches down before (gpu-devices). cuInit alone took 410-530 ms on the 2x H200
/// (driver 580, tests/data/h200x2/nvml/perf.txt and trace-check.txt). `check` and
/// `init` keep the CUDA checks (peer access, CUDA_VISIBLE_DEVICES).
///
/// It reads the facts no check judges too (NVLink error counters for /metrics).
///
/// serve loads no RDMA, NCCL or CUDA runtime library itself: a child process probes
/// them on the first run (see `probe` and `gather::Probed`), and each interval reads
/// NVML, sysfs, procfs and the device nodes only. What the later runs do not re-check: libibverbs' device opens and
/// memory registration (memlock cannot change inside a running container), the
/// libfabric providers, the libnccl version and the net plugin (files of an image
/// that does not change while the pod lives).
fn served(args: &ServeArgs) -> ServeArgs {
    let mut args = args.clone();
    args.check.gather = crate::run::describing(&args.check.gather);
    args
}

/// One malloc arena for the whole server. glibc gives each thread that allocates
/// while another holds the lock an arena of its own, and keeps what the thread freed
/// there: with the fake NVML, serve's anonymous memory was 2.7 MB with an arena per
/// thread and 1.7 MB with one. serve's threads are idle nearly all the time, so sharing
/// one arena costs them nothing.
fn one_malloc_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes the allocator's tunables; called before any thread starts.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// Gives the memory a run freed back to the kernel, so serve stays at its size between
/// runs instead of keeping its largest run's heap.
fn hand_back_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free pages of the allocator's own heap.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The check thread: a run every --interval, or at once after a new XID event,
/// until `stop`.
fn start_checks(
    shared: &Arc<Shared>,
    env: &[(OsString, OsString)],
    args: &ServeArgs,
    stop: &'static AtomicBool,
    mut tainter: Option<taint::Tainter>,
) -> Result<std::thread::JoinHandle<()>> {
    let (shared, env, args) = (Arc::clone(shared), env.to_vec(), args.clone());
    std::thread::Builder::new()
        .name("checks".into())
        .spawn(move || {
            let mut runs = 0u64;
            let mut probed = None;
            while !stop.load(Ordering::Relaxed) {
                runs += 1;
                let seen = (shared.xid_events(), shared.rerun.load(Ordering::Relaxed));
                if !run_once(&args, &env, &shared, runs, &mut probed) {
                    return;
                }
                if let Some(t) = tainter.as_mut() {
                    t.observe(shared.verdict().as_ref());
                }
                if runs == 1 {
                    // Start-up's code and data, touched once, need not stay resident.
                    resident::page_out_start_up();
                }
                hand_back_freed_memory();
                let next = Instant::now() + args.interval;
                while !stop.load(Ordering::Relaxed)
                    && Instant::now() < next
                    && (shared.xid_events(), shared.rerun.load(Ordering::Relaxed)) == seen
                {
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        })
        .context("starting the check thread")
}

/// With `--watch-nccl`, starts the job watcher (it runs until `stop`, and is not waited
/// for). Its NCCL version, until RAS's own reply names it, is the trainer's libnccl as
/// the last run of the checks found it (facts.rdma.nccl.library).
/// `POST /job/diagnose` (ras::diagnose); any other POST is refused.
fn diagnose(watching: Option<&ras::Watching>, path: &str) -> http::Response {
    match (path, watching) {
        ("/job/diagnose", None) => http::Response::text(
            404,
            "not watching the job: start serve with --watch-nccl (NCCL_PREFLIGHT_WATCH_NCCL=1)\n",
        ),
        ("/job/diagnose", Some(w)) => {
            let version = w.view().and_then(|v| v.nccl_version);
            let run = |addr: &str| {
                let d = ras::diagnose::query(addr)?;
                if !d.lines.is_empty() {
                    w.set_diagnostics(d.finding("on demand"));
                }
                Ok(d)
            };
            ras::diagnose::respond(&w.gate, &w.addr, version.as_deref(), &run)
        }
        _ => http::Response::text(405, "only GET and HEAD (and POST /job/diagnose)\n"),
    }
}

/// The pod's /etc/hosts (the kubelet writes the pod's own address and its hostAliases
/// there), at most 1 MiB of it; empty where it cannot be read.
fn etc_hosts() -> String {
    use std::io::Read;
    let mut text = String::new();
    if let Ok(f) = std::fs::File::open("/etc/hosts") {
        let _ = f.take(1 << 20).read_to_string(&mut text);
    }
    text
}

/// This pod's addresses (the sidecar shares the pod's network namespace): where RAS
/// places a rank of this pod.
fn local_addresses() -> std::collections::BTreeSet<std::net::IpAddr> {
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        return Default::default();
    };
    addrs
        .filter_map(|a| {
            let a = a.address?;
            a.as_sockaddr_in()
                .map(|v4| std::net::IpAddr::V4(v4.ip()))
                .or_else(|| a.as_sockaddr_in6().map(|v6| std::net::IpAddr::V6(v6.ip())))
        })
        .collect()
}

/// The node as the hang report reads it (the last run's facts and failed checks, the
/// XIDs so far), and a run of the checks now.
fn node_hooks(shared: &Arc<Shared>) -> ras::NodeHooks {
    let (reader, rerun) = (Arc::downgrade(shared), Arc::downgrade(shared));
    ras::NodeHooks {
        read: Box::new(move || {
            let shared = reader.upgrade()?;
            let xids = shared.xids().counts;
            let state = shared.state.lock().unwrap_or_else(|p| p.into_inner());
            let report = state.report.as_ref()?;
            Some(ras::node::reading(
                Some(&report.facts),
                &report.checks,
                &xids,
            ))
        }),
        rerun: Box::new(move || {
            if let Some(shared) = rerun.upgrade() {
                shared.rerun.fetch_add(1, Ordering::Relaxed);
            }
        }),
    }
}

/// What each request gets: POST /job/diagnose outside the state's lock, the rest from
/// the last snapshot (`route`).
fn routes(
    shared: &Arc<Shared>,
    stale_after: Duration,
    started: Instant,
) -> Arc<dyn Fn(&str) -> http::Response + Send + Sync> {
    let shared = Arc::clone(shared);
    Arc::new(move |path: &str| {
        if let Some(post) = path.strip_prefix("POST ") {
            // Outside the state's lock: a diagnostics run may take seconds.
            return diagnose(shared.job.get().map(|w| &**w), post);
        }
        let xids = shared.xids();
        // A copy of the job's view only for the paths that show it: /healthz and
        // /readyz never touch the watcher's lock. Taken before the state's lock: the
        // hang report reads the last run's facts under it.
        let job = matches!(path, "/job" | "/job/livez" | "/metrics" | "/report")
            .then(|| shared.job.get().and_then(|w| w.view()))
            .flatten();
        let live = Live {
            snapshot: &shared.state.lock().unwrap_or_else(|p| p.into_inner()),
            xid: shared.xid_finding(&xids),
            xids: &xids,
            job,
        };
        route(&live, path, stale_after, started)
    })
}

fn start_watching(args: &ServeArgs, shared: &Arc<Shared>, stop: &'static AtomicBool) -> Result<()> {
    let w = &args.watch;
    if !w.watch_nccl {
        return Ok(());
    }
    let config = ras::Config {
        addr: w.ras_addr.clone(),
        interval: w.watch_interval,
        hang_after: w.hang_after,
        init_grace: w.watch_init_grace,
        pods: ras::pods::from_etc_hosts(&etc_hosts()),
        local: local_addresses(),
        flight_dir: args.tune.flight_recorder.clone(),
    };
    let weak = Arc::downgrade(shared);
    let hint = Box::new(move || {
        let shared = weak.upgrade()?;
        let state = shared.state.lock().unwrap_or_else(|p| p.into_inner());
        let library = state.report.as_ref()?.facts.rdma.nccl.library.loaded()?;
        crate::nccl::Version::parse(library.version.value()?)
    });
    let log = Arc::new(|line: String| crate::diagnostic::line(format_args!("{line}")));
    let (watching, _thread) = ras::watch::start(config, hint, Some(node_hooks(shared)), log, stop)
        .context("starting the RAS watcher")?;
    let _ = shared.job.set(watching);
    Ok(())
}

pub fn serve(args: &ServeArgs, env: &[(OsString, OsString)]) -> Result<Exit> {
    if args.interval < Duration::from_secs(1) {
        anyhow::bail!("--interval {:?}: at least 1s", args.interval);
    }
    if args.watch.watch_interval < Duration::from_secs(1) {
        anyhow::bail!(
            "--watch-interval {:?}: at least 1s",
            args.watch.watch_interval
        );
    }
    let args = &served(args);
    // Flags are validated (and --ignore notes printed) once, before serving.
    let policy = crate::run::build_policy(&args.check)?;
    let tainter = taint::Tainter::new(&args.taint, env).map_err(anyhow::Error::msg)?;
    let stale_after = args
        .stale_after
        .unwrap_or(args.interval * 3 + args.check.gather.libs.timeout * 2);
    let listener = std::net::TcpListener::bind(&args.listen)
        .with_context(|| format!("serve --listen {}", args.listen))?;
    let stop = stop_on_signals()?;
    one_malloc_arena();
    // Log lines never panic: stderr may be a closed pipe.
    let log = |line: String| crate::diagnostic::line(format_args!("{line}"));
    log(format!(
        "nccl-preflight: serving /healthz /readyz /metrics /report{} on {} (checks every {:.0} s, through NVML: serve does not call cuInit)",
        if args.watch.watch_nccl {
            " /job /job/livez"
        } else {
            ""
        },
        listener
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_else(|_| args.listen.clone()),
        args.interval.as_secs_f64()
    ));
    let shared = Arc::new(Shared {
        state: Mutex::new(Snapshot::default()),
        xids: Arc::new(Mutex::new(xid::Xids::default())),
        policy,
        xid_policy: xid::XidPolicy::new(&args.xid_not_ready, &args.xid_ignore),
        job: std::sync::OnceLock::new(),
        rerun: std::sync::atomic::AtomicU64::new(0),
    });
    start_watching(args, &shared, stop)?;
    let watcher = {
        let (xids, library) = (
            Arc::clone(&shared.xids),
            args.check.gather.libs.nvml_lib.clone(),
        );
        let deadline = args.check.gather.libs.timeout;
        std::thread::Builder::new()
            .name("xid".into())
            .spawn(move || xid::watch(&library, deadline, &xids, stop))
            .context("starting the XID thread")?
    };
    let started = Instant::now();
    let checker = start_checks(&shared, env, args, stop, tainter)?;
    let routes = routes(&shared, stale_after, started);
    // The kubelet's probes (and the trainer's, /job/livez) are answered on the accept
    // loop itself: their handlers only read prepared state.
    http::serve(
        listener,
        stop,
        routes,
        &["/healthz", "/readyz", "/job/livez"],
    )
    .context("serving")?;
    log(String::from("nccl-preflight: stopping"));
    // A check in progress may be inside a driver call: do not wait for it.
    // The XID watcher may sit in NVML's wait for up to a second: leave with _exit
    // rather than wait for it (or for a check inside a driver call).
    // A watcher that gave up on a hung NVML call left its worker inside it.
    let hung = !checker.is_finished() || !watcher.is_finished() || shared.xids().hung.is_some();
    Ok(Exit { code: 0, hung })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(checks: Vec<Finding>) -> Report {
        let facts = crate::test_facts::healthy();
        let prediction = crate::predict::predict(&facts);
        Report::new(facts, prediction, checks, Vec::new())
    }

    #[test]
    fn readiness_lists_every_failure_and_a_hang_overrides_them() {
        let pass_xid = Finding::pass("gpu-xid", "none");
        let first = Snapshot::default();
        assert_eq!(
            readiness(&first, &pass_xid),
            Err("first check running".into())
        );
        let ok = Snapshot {
            report: Some(report(vec![Finding::warn(
                "dev-shm",
                "small",
                "mount a larger /dev/shm",
            )])),
            ..Snapshot::default()
        };
        assert_eq!(readiness(&ok, &pass_xid), Ok(()));
        let failing = Snapshot {
            report: Some(report(vec![
                Finding::fail("dev-shm", "/dev/shm is 64 MiB", "mount a larger /dev/shm"),
                Finding::pass("memlock", "unlimited"),
            ])),
            ..Snapshot::default()
        };
        let fatal_xid = Finding::fail("gpu-xid", "GPU 2: XID 79", "reboot");
        assert_eq!(
            readiness(&failing, &fatal_xid),
            Err("gpu-xid: GPU 2: XID 79\ndev-shm: /dev/shm is 64 MiB".into())
        );
        // An XID fails readiness before the first run finishes.
        assert_eq!(
            readiness(&first, &fatal_xid),
            Err("gpu-xid: GPU 2: XID 79".into())
        );
        let errored = Snapshot {
            error: Some("nccl-preflight: --facts x.json: no such file".into()),
            ..Snapshot::default()
        };
        assert_eq!(
            readiness(&errored, &pass_xid),
            Err("nccl-preflight: --facts x.json: no such file".into())
        );
        let halted = Snapshot {
            halted: Some("a driver call hung; checks stopped (gpu-devices: hung)".into()),
            ..failing
        };
        assert_eq!(
            readiness(&halted, &fatal_xid),
            Err("a driver call hung; checks stopped (gpu-devices: hung)".into())
        );
    }

    #[test]
    fn route_answers_each_endpoint_from_the_snapshot() {
        let xids = xid::Xids::default();
        let hour = Duration::from_secs(3600);
        let ask = |snapshot: &Snapshot, xid: Finding, path: &str, started: Instant| {
            let live = Live {
                snapshot,
                xids: &xids,
                xid,
                job: None,
            };
            route(&live, path, hour, started)
        };
        let pass_xid = || Finding::pass("gpu-xid", "none");
        let now = Instant::now();
        // Before the first run: alive while the server is young, no report yet.
        let first = Snapshot::default();
        let r = ask(&first, pass_xid(), "/healthz", now);
        assert_eq!(
            (r.status, r.body.as_str()),
            (200, "ok: first check running\n")
        );
        let Some(long_ago) = now.checked_sub(hour * 2) else {
            return; // a machine up for less than two hours cannot date the stale cases
        };
        let r = ask(&first, pass_xid(), "/healthz", long_ago);
        assert_eq!(
            (r.status, r.body.as_str()),
            (503, "stale: no check has finished yet\n")
        );
        let r = ask(&first, pass_xid(), "/report", now);
        assert_eq!(r.status, 503);
        // A fresh run: alive, ready, and /report carries the live gpu-xid finding.
        let fresh = Snapshot {
            finished: Some(now),
            report: Some(report(vec![Finding::pass("memlock", "unlimited")])),
            ..Snapshot::default()
        };
        assert_eq!(ask(&fresh, pass_xid(), "/healthz", now).status, 200);
        let r = ask(&fresh, pass_xid(), "/readyz", now);
        assert_eq!((r.status, r.body.as_str()), (200, "ready\n"));
        let fatal = Finding::fail("gpu-xid", "GPU 0: XID 79", "reboot");
        let r = ask(&fresh, fatal.clone(), "/readyz", now);
        assert_eq!(
            (r.status, r.body.as_str()),
            (503, "not ready: gpu-xid: GPU 0: XID 79\n")
        );
        let r = ask(&fresh, fatal, "/report", now);
        assert_eq!((r.status, r.content_type), (200, "application/json"));
        let json: serde_json::Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(json["verdict"], "fail", "the XID finding makes the verdict");
        assert_eq!(json["checks"][1]["id"], "gpu-xid");
        let r = ask(&fresh, pass_xid(), "/metrics", now);
        assert_eq!(r.status, 200);
        assert!(r.content_type.starts_with("application/openmetrics-text"));
        assert!(r.body.ends_with("# EOF\n"), "{}", r.body);
        // A run that finished long ago, halted by a hung call: stale, saying why.
        let halted = Snapshot {
            finished: Some(long_ago),
            halted: Some("a driver call hung".into()),
            ..Snapshot::default()
        };
        let r = ask(&halted, pass_xid(), "/healthz", long_ago);
        assert_eq!(r.status, 503);
        assert!(
            r.body.starts_with("stale: the last check finished "),
            "{}",
            r.body
        );
        assert!(
            r.body.ends_with("(limit 3600 s); a driver call hung\n"),
            "{}",
            r.body
        );
        let r = ask(&halted, pass_xid(), "/nope", now);
        assert_eq!(
            (r.status, r.body.as_str()),
            (
                404,
                "not found: try /healthz, /readyz, /metrics, /report, /job, /job/livez\n"
            )
        );
    }
}
