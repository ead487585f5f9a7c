//! `init --bench`: the bench runs as a child process of this binary, with the
//! tuned settings in its environment (what the trainer will run with), under a
//! wall-clock limit; its findings join the report.

use crate::cli::InitArgs;
use crate::finding::Finding;
use crate::finding::ids;
use std::ffi::OsString;
use std::process::{Command, Stdio};
use std::time::Duration;

fn failed(summary: impl Into<String>, evidence: impl Into<String>) -> Finding {
    Finding::fail(
        ids::GPU_BANDWIDTH,
        summary,
        "nccl-preflight bench   # run it by hand to see every figure",
    )
    .evidence(evidence)
}

/// Runs `bench` in a child and returns its findings; a child that fails to start,
/// overruns or reports nothing readable becomes one failing finding.
pub fn run(args: &InitArgs, env: Vec<(OsString, OsString)>) -> Vec<Finding> {
    let g = &args.check.gather;
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            return vec![failed(
                "the bench could not start",
                format!("current_exe: {e}"),
            )];
        }
    };
    let mut cmd = Command::new(exe);
    cmd.arg("bench")
        .args(["--format", "json"])
        .arg("--bench-seconds")
        .arg(format!(
            "{}s",
            args.bench_limits.bench_seconds.as_secs_f64()
        ))
        .arg("--min-bandwidth-fraction")
        .arg(args.bench_limits.min_bandwidth_fraction.to_string())
        .arg("--host-root")
        .arg(&g.host_root)
        .args(["--nvml-lib", &g.nvml_lib, "--cuda-lib", &g.cuda_lib])
        .arg("--timeout")
        .arg(format!("{}s", g.timeout.as_secs_f64()));
    if let Some(lib) = &g.nccl_lib {
        cmd.args(["--nccl-lib", lib]);
    }
    cmd.env_clear()
        .envs(env)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return vec![failed("the bench could not start", e.to_string())],
    };
    // The bench keeps its own budget and per-call deadlines; this limit only catches a
    // child that ignores both.
    let limit = args.bench_limits.bench_seconds + 2 * g.timeout + Duration::from_secs(5);
    let crate::run::Finished {
        status,
        stdout,
        stderr,
    } = match crate::run::wait_child(child, limit) {
        Ok(f) => f,
        Err(e) => return vec![failed("the bench could not be waited for", e.to_string())],
    };
    let Some(status) = status else {
        return vec![failed(
            "the bench did not finish",
            format!("killed after {:.1} s", limit.as_secs_f64()),
        )];
    };
    let parsed: Option<Vec<Finding>> = serde_json::from_str::<serde_json::Value>(&stdout)
        .ok()
        .and_then(|v| serde_json::from_value(v.get("findings")?.clone()).ok());
    match parsed {
        // Exit 2 with a report is a bench that had nothing to measure: its findings are
        // skips, which keep their skip meaning inside `init --bench`. 1 and 3 are failures
        // blamed on the job and on the node (docs/failure-policy.md).
        Some(findings) if matches!(status.code(), Some(0..=3)) => findings,
        _ => vec![failed(
            "the bench could not run",
            format!(
                "exit {}: {}",
                status
                    .code()
                    .map_or("by signal".to_string(), |c| c.to_string()),
                stderr.trim()
            ),
        )],
    }
}
