//! `init --bench`: the bench runs as a child process of this binary (`bench-child`, in
//! the child protocol of `crate::child`), under a wall-clock limit; its findings join
//! the report.
//!
//! One process initialises CUDA, not two. The child starts before init gathers and
//! reads the CUDA driver's facts for init's checks first (`Part::Links`' `cuda_facts`:
//! cuInit, devices, peer access, sent as an early frame), then creates its contexts and
//! measures; init's own gather takes those facts instead of calling cuInit itself
//! (`gather::gpu::CudaProbe::Elsewhere`). On 4x H100 two processes' cuInit at once
//! took 1.1 s each against 0.5 s alone (tests/data/h100x4/scale/cuinit-perf.txt),
//! and a process holding CUDA tears its contexts down on exit: with one CUDA process,
//! init itself never pays either.
//!
//! Peer copies read no NCCL variable, so that child runs with init's own environment.
//! NCCL's all-reduce (`--bench-nccl`) needs the tuned settings the trainer will get,
//! known only once the checks are judged: then init reads CUDA itself as `check` does,
//! and one child started after the checks measures both with those settings. (A second
//! child after the first cost its own cuInit and contexts again: 4.0 s against 2.6 s
//! for this order on 4x H100, tests/data/h100x4/scale/gate-run1.txt.)

use crate::child::{Ended, Frames, Started};
use crate::cli::{BenchArgs, BenchLimits, GatherArgs, InitArgs};
use crate::facts::FactError;
use crate::facts::gpu::{CudaFacts, LibraryState, NvmlFacts};
use crate::finding::Finding;
use crate::finding::ids;
use crate::gather::gpu::{Elsewhere, cuda};
use crate::vendor::deadline::{self, Hung};
use serde::{Deserialize, Serialize};
use std::ffi::OsString;
use std::time::{Duration, Instant};

fn failed(summary: impl Into<String>, evidence: impl Into<String>) -> Finding {
    Finding::fail(
        ids::GPU_BANDWIDTH,
        summary,
        "nccl-preflight bench   # run it by hand to see every figure",
    )
    .evidence(evidence)
}

/// A bench started and not yet waited for.
pub struct Pending {
    started: Result<Started, String>,
    /// The bench's own budget and deadlines, and a margin: this limit only catches a
    /// child that ignores both.
    limit: Duration,
    trace: bool,
}

/// The peer-copy size of init's bench unless NCCL_PREFLIGHT_BENCH_SIZE says otherwise
/// (`bench` alone keeps 256 MiB). On 4x H100 (NV18, tests/data/h100x4/scale/
/// p2p-sizes-perf.txt) 64 MiB gives 388-390 GB/s one way against 396-397 at 256 MiB
/// (98%) and 750-757 both ways against 776-779 (97%), as steady from run to run, for a
/// quarter of the bytes: a pass or fail at the 50% threshold does not change, and each
/// pair costs about 50 ms less (6 pairs at 4 GPUs, 28 at 8). Slower links reach their
/// figure with fewer bytes still.
const GATE_P2P_SIZE: u64 = 64 << 20;

/// What the child measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Part {
    /// Peer copies, replied unjudged (`Links`); with the CUDA driver's facts first, as
    /// an early frame, when init wants them.
    Links { cuda_facts: bool },
    /// Peer copies and NCCL's all-reduce, replied as the bench's report.
    All,
}

/// What `bench-child` is asked (the child protocol's request, `crate::child`).
#[derive(Debug, Serialize, Deserialize)]
pub struct Request {
    pub part: Part,
    /// init's gather flags, whole.
    pub gather: GatherArgs,
    /// init's `--bench-seconds` and `--min-bandwidth-fraction`.
    pub limits: BenchLimits,
}

impl Request {
    /// The child's side: `bench`'s arguments for this request. What init has no flag for
    /// (sizes, iterations) is read as `bench` reads it, from its defaults and the
    /// `NCCL_PREFLIGHT_*` variables of the environment init passed on; peer copies use
    /// `GATE_P2P_SIZE` unless NCCL_PREFLIGHT_BENCH_SIZE says otherwise.
    pub fn bench_args(&self, env: &[(OsString, OsString)]) -> Result<BenchArgs, String> {
        use clap::{Args, FromArgMatches};
        let what = match self.part {
            Part::Links { .. } => "p2p",
            Part::All => "all",
        };
        let mut args = BenchArgs::augment_args(clap::Command::new("bench"))
            .try_get_matches_from(["bench", what])
            .and_then(|m| BenchArgs::from_arg_matches(&m))
            .map_err(|e| e.to_string())?;
        if !env.iter().any(|(k, _)| k == "NCCL_PREFLIGHT_BENCH_SIZE") {
            args.size = GATE_P2P_SIZE;
        }
        args.gather = self.gather.clone();
        args.limits = self.limits.clone();
        Ok(args)
    }
}

fn start(args: &InitArgs, env: Vec<(OsString, OsString)>, part: Part) -> Pending {
    let g = &args.check.gather;
    let limit = args.bench_limits.bench_seconds + 3 * g.timeout + Duration::from_secs(5);
    let request = Request {
        part,
        gather: g.clone(),
        limits: args.bench_limits.clone(),
    };
    let started = std::env::current_exe()
        .map_err(|e| format!("current_exe: {e}"))
        .and_then(|exe| crate::child::start(&exe, "bench-child", &request, env));
    Pending {
        started,
        limit,
        trace: g.trace,
    }
}

/// Starts the peer-copy bench with this process's environment `env`. With
/// `cuda_facts` the child reads the CUDA driver's facts first, and the returned
/// source hands them to init's gather.
pub fn start_links(
    args: &InitArgs,
    env: Vec<(OsString, OsString)>,
    cuda_facts: bool,
) -> (Pending, Option<Elsewhere>) {
    let mut pending = start(args, env, Part::Links { cuda_facts });
    let frames = match (&mut pending.started, cuda_facts) {
        (Ok(started), true) => started.frames(),
        _ => None,
    };
    let g = &args.check.gather;
    let (library, timeout, trace) = (g.cuda_lib.clone(), g.timeout, g.trace);
    let source = cuda_facts.then(|| {
        Elsewhere::new(move || match frames {
            Some(frames) => cuda_facts_of(&frames, timeout, (&library, trace)),
            // The child could not start: this process reads them itself.
            None => probe_here(&library, timeout, trace),
        })
    });
    (pending, source)
}

/// Starts peer copies and NCCL's all-reduce with exactly `env` (this process's
/// environment and the tuned settings, `run::exec_environment`).
pub fn start_all(args: &InitArgs, env: Vec<(OsString, OsString)>) -> Pending {
    start(args, env, Part::All)
}

/// The CUDA facts frame: `{"cuda": ...}`, told apart from the bench report.
#[derive(Debug, Serialize, Deserialize)]
struct CudaFrame {
    cuda: CudaSaid,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum CudaSaid {
    State(LibraryState<CudaFacts>),
    /// A driver call did not return within the child's deadline.
    Hung {
        call: String,
        deadline_ms: u64,
        not_started: bool,
    },
}

/// The child's side: the frame for what reading the CUDA driver gave.
fn cuda_frame(read: &Result<cuda::Outcome, Hung>) -> Vec<u8> {
    let said = match read {
        Err(h) => CudaSaid::Hung {
            call: h.call.clone(),
            deadline_ms: u64::try_from(h.deadline.as_millis()).unwrap_or(u64::MAX),
            not_started: h.not_started,
        },
        Ok(cuda::Outcome::NotFound(message)) => CudaSaid::State(LibraryState::NotFound {
            message: message.clone(),
        }),
        Ok(cuda::Outcome::Failed(e)) => CudaSaid::State(LibraryState::Failed(e.clone())),
        Ok(cuda::Outcome::Loaded(f)) => CudaSaid::State(LibraryState::Loaded(f.clone())),
    };
    serde_json::to_vec(&CudaFrame { cuda: said }).unwrap_or_default()
}

/// The child's side: reads the CUDA driver under the deadline and sends the frame;
/// the `Hung` when a call did not return (the process must then leave).
pub fn send_cuda_facts(library: &str, timeout: Duration, trace: bool) -> Option<Hung> {
    let read = probe_here(library, timeout, trace);
    crate::child::reply(&cuda_frame(&read));
    read.err()
}

fn probe_here(library: &str, timeout: Duration, trace: bool) -> Result<cuda::Outcome, Hung> {
    let library = library.to_string();
    deadline::run("cuda", timeout, trace, move |w| cuda::gather(w, &library))
}

/// The parent's side: the child's first frame as the probe here would have said it.
/// The child bounds its own driver calls by `timeout`; a child silent past that and a
/// margin for its start is a hung driver call too.
fn cuda_facts_of(
    frames: &Frames,
    timeout: Duration,
    (library, trace): (&str, bool),
) -> Result<cuda::Outcome, Hung> {
    let started = Instant::now();
    let frame = match frames.next(timeout + Duration::from_secs(5)) {
        Ok(frame) => frame,
        Err(crate::child::NoFrame::Closed) => return probe_here(library, timeout, trace),
        Err(crate::child::NoFrame::TimedOut) => {
            return Err(Hung {
                call: "cuInit (in the bench's process)".into(),
                deadline: timeout,
                not_started: false,
            });
        }
    };
    if trace {
        crate::diagnostic::line(format_args!(
            "nccl-preflight: trace: the CUDA facts from the bench's process: {:.3} ms",
            started.elapsed().as_secs_f64() * 1e3
        ));
    }
    match serde_json::from_slice::<CudaFrame>(&frame).map(|f| f.cuda) {
        Ok(CudaSaid::Hung {
            call,
            deadline_ms,
            not_started,
        }) => Err(Hung {
            call,
            deadline: Duration::from_millis(deadline_ms),
            not_started,
        }),
        Ok(CudaSaid::State(state)) => Ok(match state {
            LibraryState::NotFound { message } => cuda::Outcome::NotFound(message),
            LibraryState::Failed(e) => cuda::Outcome::Failed(e),
            LibraryState::Loaded(f) => cuda::Outcome::Loaded(f),
            LibraryState::Skipped { reason } => {
                cuda::Outcome::Failed(FactError::new("the bench's process", reason))
            }
        }),
        // Not the CUDA frame (a child of another version): read them here.
        Err(_) => probe_here(library, timeout, trace),
    }
}

/// What the peer-copy child measured, unjudged (`Part::Links`): init judges it
/// against its own NVML facts, so the child reads no NVML beside its contexts (on
/// 4x H100 its NVML init slowed the first context from about 120 to 200-270 ms).
#[derive(Debug, Serialize, Deserialize)]
pub struct Links {
    no_driver: Option<String>,
    driver_error: Option<FactError>,
    gpus: Vec<(u32, String)>,
    pairs: Option<Vec<super::p2p::PairResult>>,
    p2p_bytes: u64,
    iterations: u32,
    wall_ms: f64,
}

#[derive(Debug, Serialize, Deserialize)]
struct LinksFrame {
    links: Links,
}

impl Links {
    /// The child's side.
    pub fn of(m: super::Measured, settings: &super::Settings, wall: Duration) -> Links {
        Links {
            no_driver: m.no_driver,
            driver_error: m.driver_error,
            gpus: m.gpus,
            pairs: m.p2p,
            p2p_bytes: settings.p2p_bytes as u64,
            iterations: settings.iterations,
            wall_ms: wall.as_secs_f64() * 1e3,
        }
    }

    pub fn frame(self) -> Vec<u8> {
        serde_json::to_vec(&LinksFrame { links: self }).unwrap_or_default()
    }

    /// The parent's side: gpu-bandwidth, judged as `bench p2p` judges it.
    fn judge(self, nvml: Option<&NvmlFacts>, min_fraction: f64) -> Vec<Finding> {
        let settings = super::Settings {
            p2p_bytes: usize::try_from(self.p2p_bytes).unwrap_or(usize::MAX),
            nccl_sizes: Vec::new(),
            iterations: self.iterations,
            min_fraction,
            budget: Duration::ZERO,
            nccl_candidates: Vec::new(),
        };
        let measured = super::Measured {
            no_driver: self.no_driver,
            driver_error: self.driver_error,
            gpus: self.gpus,
            p2p: Some(self.pairs.unwrap_or_default()),
            nccl: None,
        };
        let wall = Duration::from_secs_f64(self.wall_ms.max(0.0) / 1e3);
        super::judge(measured, nvml, (&settings, wall)).findings
    }
}

/// Waits for the peer-copy bench and judges what it measured against `nvml`'s link
/// figures (this process's facts); a child that failed to start, overran or replied
/// nothing readable becomes one failing finding.
pub fn finish_links(pending: Pending, nvml: Option<&NvmlFacts>, min_fraction: f64) -> Vec<Finding> {
    let reply = match reply_of(pending) {
        Ok(reply) => reply,
        Err(failed) => return vec![failed],
    };
    match serde_json::from_slice::<LinksFrame>(&reply) {
        Ok(frame) => frame.links.judge(nvml, min_fraction),
        Err(_) => vec![failed(
            "the bench could not run",
            "its report is not readable",
        )],
    }
}

/// Waits for the bench and returns its findings; a child that failed to start,
/// overran or replied nothing readable becomes one failing finding.
pub fn finish(pending: Pending) -> Vec<Finding> {
    let reply = match reply_of(pending) {
        Ok(reply) => reply,
        Err(failed) => return vec![failed],
    };
    // A report whose verdict is skip (nothing to measure) keeps its skips' meaning
    // inside `init --bench`.
    let parsed: Option<Vec<Finding>> = serde_json::from_slice::<serde_json::Value>(&reply)
        .ok()
        .and_then(|v| serde_json::from_value(v.get("findings")?.clone()).ok());
    parsed.unwrap_or_else(|| {
        vec![failed(
            "the bench could not run",
            "its report is not readable",
        )]
    })
}

/// The child's reply, or the finding that says why there is none.
fn reply_of(pending: Pending) -> Result<Vec<u8>, Finding> {
    let started = match pending.started {
        Ok(s) => s,
        Err(e) => return Err(failed("the bench could not start", e)),
    };
    let ended = started.finish(pending.limit);
    if pending.trace
        && let Ended::Replied { stderr, .. } | Ended::Silent { stderr, .. } = &ended
        && !stderr.trim().is_empty()
    {
        // The child's own `--trace` lines, each escaped: they carry library names.
        for line in stderr.trim_end().lines() {
            crate::diagnostic::line(format_args!("{}", crate::render::visible(line)));
        }
    }
    match ended {
        Ended::Replied { reply, .. } => Ok(reply),
        Ended::Killed { after } => Err(failed(
            "the bench did not finish",
            format!("killed after {:.1} s", after.as_secs_f64()),
        )),
        Ended::Silent { status, stderr } => Err(failed(
            "the bench could not run",
            format!(
                "exit {}: {}",
                status
                    .code()
                    .map_or("by signal".to_string(), |c| c.to_string()),
                stderr.trim()
            ),
        )),
        Ended::Failed(e) => Err(failed("the bench could not be waited for", e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Args, FromArgMatches};

    /// The child measures with init's gather flags and limits, the bench's own knobs at
    /// their defaults (no NCCL_PREFLIGHT_* variable here) and peer copies of the gate's
    /// size; the part picks what it measures.
    #[test]
    fn the_request_gives_the_child_inits_flags_and_the_gate_size() {
        let command = GatherArgs::augment_args(clap::Command::new("gather"));
        let mut gather = GatherArgs::from_arg_matches(&command.get_matches_from(["g"])).unwrap();
        gather.host_root = "/host root".into();
        gather.cuda_lib = "/opt/libcuda.so.1".into();
        gather.timeout = Duration::from_millis(2500);
        let limits = BenchLimits {
            bench_seconds: Duration::from_secs(7),
            min_bandwidth_fraction: 0.75,
        };
        for (part, what) in [
            (Part::Links { cuda_facts: true }, crate::cli::BenchKind::P2p),
            (Part::All, crate::cli::BenchKind::All),
        ] {
            let request = Request {
                part,
                gather: gather.clone(),
                limits: limits.clone(),
            };
            let args = request.bench_args(&[]).unwrap();
            assert_eq!(args.what, what);
            assert_eq!(args.size, 64 << 20);
            assert_eq!(args.iterations, 10);
            assert_eq!(
                format!("{:?}{:?}", args.gather, args.limits),
                format!("{gather:?}{limits:?}")
            );
        }
    }
}
