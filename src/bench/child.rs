//! `init --bench`: the bench runs as a child process of this binary (`bench --child`,
//! replying in the child protocol of `crate::child`) with the tuned settings in its
//! environment (what the trainer will run with), under a wall-clock limit; its
//! findings join the report. It starts once the checks are judged, not beside them:
//! on 4x H100 two processes' cuInit at once took 1.1 s each against 0.5 s alone, and
//! a cuInit beside a process that holds CUDA initialised (init's own probe, whose
//! libcuda stays loaded) 60-115 ms (tests/data/h100x4/scale/cuinit-perf.txt).

use crate::child::{Ended, Started};
use crate::cli::InitArgs;
use crate::finding::Finding;
use crate::finding::ids;
use std::ffi::OsString;
use std::time::Duration;

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
const GATE_P2P_SIZE: &str = "64MiB";

/// The bench's command line: every knob written out, as init was given it.
fn argv(args: &InitArgs, env: &[(OsString, OsString)]) -> Vec<String> {
    let g = &args.check.gather;
    let mut argv: Vec<String> = ["bench", "--child", "--format", "json"]
        .map(String::from)
        .to_vec();
    if !env.iter().any(|(k, _)| k == "NCCL_PREFLIGHT_BENCH_SIZE") {
        argv.extend(["--size".to_string(), GATE_P2P_SIZE.to_string()]);
    }
    let mut flag = |name: &str, value: String| {
        argv.push(name.into());
        argv.push(value);
    };
    flag(
        "--bench-seconds",
        format!("{}s", args.bench_limits.bench_seconds.as_secs_f64()),
    );
    flag(
        "--min-bandwidth-fraction",
        args.bench_limits.min_bandwidth_fraction.to_string(),
    );
    flag("--host-root", g.host_root.display().to_string());
    flag("--nvml-lib", g.nvml_lib.clone());
    flag("--cuda-lib", g.cuda_lib.clone());
    flag("--timeout", format!("{}s", g.timeout.as_secs_f64()));
    if let Some(lib) = &g.nccl_lib {
        flag("--nccl-lib", lib.clone());
    }
    if g.trace {
        argv.push("--trace".into());
    }
    argv
}

/// Starts the bench with exactly `env` (this process's environment and the tuned
/// settings, `run::exec_environment`).
pub fn start(args: &InitArgs, env: Vec<(OsString, OsString)>) -> Pending {
    let g = &args.check.gather;
    let limit = args.bench_limits.bench_seconds + 2 * g.timeout + Duration::from_secs(5);
    let started = std::env::current_exe()
        .map_err(|e| format!("current_exe: {e}"))
        .and_then(|exe| {
            let argv = argv(args, &env);
            crate::child::start(&exe, &argv, env)
        });
    Pending {
        started,
        limit,
        trace: g.trace,
    }
}

/// Waits for the bench and returns its findings; a child that failed to start,
/// overran or replied nothing readable becomes one failing finding.
pub fn finish(pending: Pending) -> Vec<Finding> {
    let started = match pending.started {
        Ok(s) => s,
        Err(e) => return vec![failed("the bench could not start", e)],
    };
    let ended = started.finish(b"", pending.limit);
    if pending.trace
        && let Ended::Replied { stderr, .. } | Ended::Silent { stderr, .. } = &ended
        && !stderr.trim().is_empty()
    {
        // The child's own `--trace` lines, each escaped: they carry library names.
        for line in stderr.trim_end().lines() {
            crate::diagnostic::line(format_args!("{}", crate::render::visible(line)));
        }
    }
    let reply = match ended {
        Ended::Replied { reply, .. } => reply,
        Ended::Killed { after } => {
            return vec![failed(
                "the bench did not finish",
                format!("killed after {:.1} s", after.as_secs_f64()),
            )];
        }
        Ended::Silent { status, stderr } => {
            return vec![failed(
                "the bench could not run",
                format!(
                    "exit {}: {}",
                    status
                        .code()
                        .map_or("by signal".to_string(), |c| c.to_string()),
                    stderr.trim()
                ),
            )];
        }
        Ended::Failed(e) => return vec![failed("the bench could not be waited for", e)],
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
