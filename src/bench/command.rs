//! The `bench` subcommand: set up NCCL's log capture, read NVML's link
//! figures, measure on a watched worker thread, judge, print.

use super::child::Part;
use super::{Budget, Measured, Settings, nccl, p2p};
use crate::cli::{BenchArgs, BenchKind, Format};
use crate::finding::Status;
use crate::gather::gpu::{self, GpuOptions};
use crate::gather::host::Host;
use crate::run::Exit;
use crate::vendor::cuda::{Driver, Opened};
use crate::vendor::deadline::{self, Watch};
use anyhow::{Context, Result, anyhow, bail};
use std::ffi::OsString;
use std::time::Instant;

/// NCCL writes its INFO log to this file while the bench runs; explain-log's
/// parser reads the transports back from it.
struct NcclLog {
    /// Made by tempfile: exclusive (O_EXCL), private (0600), a random name that no
    /// earlier run's leftover can hold; removed on drop.
    file: tempfile::NamedTempFile,
}

impl NcclLog {
    /// Points NCCL's log at a fresh private file. Must run before any thread starts:
    /// it changes this process's environment.
    fn capture() -> Result<NcclLog> {
        // Created here, exclusively and private, so NCCL writes into our file and
        // never through a link someone else planted. The random part is alphanumeric:
        // no `%h`/`%p`, which NCCL would expand in NCCL_DEBUG_FILE.
        let file = tempfile::Builder::new()
            .prefix("nccl-preflight-bench.")
            .suffix(".log")
            .tempfile()
            .with_context(|| {
                format!(
                    "creating NCCL's log file in {}",
                    std::env::temp_dir().display()
                )
            })?;
        let path = file.path().to_path_buf();
        for (name, value) in [
            ("NCCL_DEBUG", std::ffi::OsStr::new("INFO")),
            ("NCCL_DEBUG_SUBSYS", std::ffi::OsStr::new("INIT,ENV")),
            ("NCCL_DEBUG_FILE", path.as_os_str()),
        ] {
            // SAFETY: called from `bench` before it starts any thread (the first is
            // NVML's worker, after this), so nothing reads the environment concurrently.
            unsafe { std::env::set_var(name, value) };
        }
        Ok(NcclLog { file })
    }

    /// Connections per transport NCCL logged.
    fn transports(&self) -> std::collections::BTreeMap<String, u64> {
        std::fs::File::open(self.file.path())
            .ok()
            .and_then(|f| crate::explain::summarize(f).ok())
            .map(|s| s.transport_counts)
            .unwrap_or_default()
    }
}

fn settings(args: &BenchArgs, env: &[(OsString, OsString)]) -> Result<Settings> {
    let mib = p2p::CHUNK as u64;
    if args.size < mib || !args.size.is_multiple_of(mib) {
        bail!(
            "--size {}: must be a whole number of MiB, at least 1MiB",
            args.size
        );
    }
    if args.nccl_sizes.is_empty()
        || args
            .nccl_sizes
            .iter()
            .any(|s| *s < 4 || !s.is_multiple_of(4))
    {
        bail!("--nccl-sizes: every size must be a multiple of 4 bytes (float32 elements)");
    }
    Ok(Settings {
        p2p_bytes: usize::try_from(args.size).context("--size does not fit in memory")?,
        nccl_sizes: args.nccl_sizes.clone(),
        iterations: args.iterations,
        min_fraction: args.limits.min_bandwidth_fraction,
        budget: args.limits.bench_seconds,
        nccl_candidates: crate::gather::rdma::nccl::names(&crate::gather::rdma::nccl::locations(
            args.gather.nccl_lib.as_deref(),
            env,
        )),
    })
}

/// `--trace`: one phase of the bench, with its time and when it ended.
fn phase(trace: bool, name: &str, since: Instant, origin: Instant) {
    if trace {
        crate::diagnostic::line(format_args!(
            "nccl-preflight: trace: phase {name}: {:.1} ms (ended at {:.1} ms)",
            since.elapsed().as_secs_f64() * 1e3,
            origin.elapsed().as_secs_f64() * 1e3
        ));
    }
}

struct Job<'a> {
    cuda_lib: &'a str,
    /// `init`'s child (`bench-child`): NCCL's communicators are left to the process's end.
    child: bool,
    kind: BenchKind,
    settings: &'a Settings,
    trace: bool,
    origin: Instant,
}

fn measure(watch: &Watch, job: &Job<'_>, budget: &Budget) -> Measured {
    let (kind, s) = (job.kind, job.settings);
    let want_p2p = kind != BenchKind::Nccl;
    let want_nccl = kind != BenchKind::P2p;
    let mut m = Measured {
        p2p: want_p2p.then(Vec::new),
        nccl: want_nccl.then_some(None),
        ..Measured::default()
    };
    let at = Instant::now();
    let driver = match Driver::open(watch, job.cuda_lib) {
        Opened::NotFound(why) => {
            m.no_driver = Some(why);
            return m;
        }
        Opened::Failed(e) => {
            m.driver_error = Some(e);
            return m;
        }
        Opened::Ready(d) => d,
    };
    let gpus = match driver.gpus() {
        Ok(g) => g,
        Err(e) => {
            m.driver_error = Some(e);
            return m;
        }
    };
    phase(job.trace, "cuInit and GPUs", at, job.origin);
    m.gpus = gpus.iter().map(|g| (g.ordinal, g.bus_id.clone())).collect();
    if gpus.len() < 2 {
        return m;
    }
    if want_p2p {
        let at = Instant::now();
        m.p2p = Some(p2p::run(&driver, &gpus, s.p2p_bytes, s.iterations, budget));
        phase(job.trace, "p2p", at, job.origin);
    }
    if !want_nccl {
        return m;
    }
    let plan = nccl::Plan {
        candidates: &s.nccl_candidates,
        sizes: &s.nccl_sizes,
        iterations: s.iterations,
        leave_comms: job.child,
    };
    let at = Instant::now();
    m.nccl = Some(nccl::run(&driver, watch, &gpus, &plan, budget));
    phase(job.trace, "nccl", at, job.origin);
    m
}

/// One line on standard error as the measuring starts, where someone watches
/// (`diagnostic::progress`): the bench can take its whole `--bench-seconds`.
fn say_what_it_measures(args: &BenchArgs, budget: std::time::Duration) {
    let what = match args.what {
        BenchKind::P2p => "peer copies",
        BenchKind::Nccl => "NCCL all-reduce",
        BenchKind::All => "peer copies and NCCL all-reduce",
    };
    crate::diagnostic::progress(
        args.gather.trace,
        format_args!(
            "nccl-preflight: bench: measuring {what} for up to {:.0} s (--bench-seconds)",
            budget.as_secs_f64()
        ),
    );
}

/// Measures on a watched thread while NVML's link figures are read on this one (none
/// for init's peer-copy child: init judges with its own).
fn measure_beside_nvml(
    args: &BenchArgs,
    child: Option<Part>,
    settings: &Settings,
    origin: Instant,
) -> (
    Result<Measured, deadline::Hung>,
    Option<crate::facts::gpu::GpuFacts>,
    bool,
) {
    let budget = Budget::new(settings.budget);
    let (cuda_lib, kind, s) = (args.gather.cuda_lib.clone(), args.what, settings.clone());
    let (timeout, trace) = (args.gather.timeout, args.gather.trace);
    let raw = matches!(child, Some(Part::Links { .. }));
    let child = child.is_some();
    let measuring = std::thread::Builder::new()
        .name("bench-wait".into())
        .spawn(move || {
            deadline::run("bench", timeout, trace, move |watch| {
                let job = Job {
                    cuda_lib: &cuda_lib,
                    child,
                    kind,
                    settings: &s,
                    trace,
                    origin,
                };
                measure(watch, &job, &budget)
            })
        });
    let at = Instant::now();
    let nvml = (!raw).then(|| {
        gpu::gather(
            &Host::new(&args.gather.host_root),
            &GpuOptions {
                nvml_library: args.gather.nvml_lib.clone(),
                cuda_library: args.gather.cuda_lib.clone(),
                call_timeout: args.gather.timeout,
                trace: args.gather.trace,
                cuda: gpu::CudaProbe::Off,
                // The link figures need NVLink state and speed, not error counts.
                unjudged: false,
                cudart: Err("bench dates no CUDA runtime".into()),
                cudart_probed: None,
            },
        )
    });
    if nvml.is_some() {
        phase(trace, "nvml", at, origin);
    }
    // The waiter returns on its own deadline, so joining it cannot hang.
    let outcome = match measuring.map(|h| h.join()) {
        Ok(Ok(outcome)) => outcome,
        Ok(Err(_)) => Err(deadline::Hung {
            call: String::from("the bench thread (it panicked)"),
            deadline: std::time::Duration::ZERO,
            not_started: false,
        }),
        Err(e) => Err(deadline::Hung {
            call: format!("starting the bench thread ({e})"),
            deadline: std::time::Duration::ZERO,
            not_started: true,
        }),
    };
    let nvml_hung = nvml.as_ref().is_some_and(|(_, hung)| hung.0);
    (outcome, nvml.map(|(facts, _)| facts), nvml_hung)
}

pub fn bench(args: &BenchArgs, env: &[(OsString, OsString)]) -> Result<Exit> {
    measure_and_answer(args, env, None)
}

/// `bench-child`: init's bench (`bench::child`), asked and answered in the child
/// protocol (`crate::child`).
pub fn bench_child(env: &[(OsString, OsString)]) -> Result<Exit> {
    let request: super::child::Request =
        crate::child::request().map_err(|e| anyhow!("bench-child: {e}"))?;
    let args = request
        .bench_args(env)
        .map_err(|e| anyhow!("bench-child: {e}"))?;
    measure_and_answer(&args, env, Some(request.part))
}

/// The bench, for a person (`child` None: it prints) or as init's child (it replies).
fn measure_and_answer(
    args: &BenchArgs,
    env: &[(OsString, OsString)],
    child: Option<Part>,
) -> Result<Exit> {
    let started = Instant::now();
    let settings = settings(args, env)?;
    let log = match args.what {
        BenchKind::P2p => None,
        _ => Some(NcclLog::capture()?),
    };
    say_what_it_measures(args, settings.budget);
    let kind = args.what;
    // init's peer-copy child reads init's CUDA facts first; a hung driver ends it here.
    let early = (child == Some(Part::Links { cuda_facts: true })).then(|| {
        let g = &args.gather;
        super::child::send_cuda_facts(&g.cuda_lib, g.timeout, g.trace)
    });
    let (outcome, facts, nvml_hung) = match early.flatten() {
        Some(hung) => (Err(hung), None, false),
        None => measure_beside_nvml(args, child, &settings, started),
    };
    let (mut measured, hung) = match outcome {
        Ok(m) => (m, false),
        Err(h) => (
            Measured {
                driver_error: Some(crate::facts::FactError::new(&h.call, h.to_string())),
                p2p: (kind != BenchKind::Nccl).then(Vec::new),
                nccl: (kind != BenchKind::P2p).then_some(None),
                ..Measured::default()
            },
            true,
        ),
    };
    if let (Some(log), Some(Some(result))) = (&log, measured.nccl.as_mut()) {
        result.transports = log.transports();
    }
    drop(log);
    if let Some(Part::Links { .. }) = child {
        let links = super::child::Links::of(measured, &settings, started.elapsed());
        crate::child::reply(&links.frame());
        crate::child::hang_up();
        return Ok(Exit { code: 0, hung });
    }
    let report = super::judge(
        measured,
        facts.as_ref().and_then(|f| f.nvml.loaded()),
        (&settings, started.elapsed()),
    );
    reply_or_print(args, env, child.is_some(), &report)?;
    Ok(Exit {
        code: bench_exit(&report),
        hung: hung || nvml_hung,
    })
}

/// `init`'s child replies in the child protocol and hangs up; `bench` prints.
fn reply_or_print(
    args: &BenchArgs,
    env: &[(OsString, OsString)],
    child: bool,
    report: &super::BenchReport,
) -> Result<()> {
    if child {
        let text = serde_json::to_vec(report).context("serializing the bench report")?;
        crate::child::reply(&text);
        crate::child::hang_up();
        return Ok(());
    }
    match args.format {
        Format::Human => {
            crate::run::emit(&super::render::human(report, crate::run::use_color(env)))
        }
        Format::Json => {
            let mut text =
                serde_json::to_string_pretty(report).context("serializing the bench report")?;
            text.push('\n');
            crate::run::emit(&text)
        }
    }
}

fn bench_exit(report: &super::BenchReport) -> u8 {
    match report.verdict {
        Status::Fail => crate::run::fault_exit(report.fault),
        // A bench that measured nothing could not do its job: exit 2, as for any tool error.
        Status::Skip => {
            crate::diagnostic::line(format_args!(
                "nccl-preflight: bench: nothing was measured (see the skips above)"
            ));
            2
        }
        _ => 0,
    }
}
