//! This pod's NCCL run: the worker's plan, environment and log, the child
//! (`gang-worker`, through the child protocol of `crate::child`), its stages passed
//! to the session as they come, and what came back. The session can stop the run
//! (a peer left): the worker is then ended and what it measured so far, from its
//! last snapshot, is the result.

use super::Settings;
use super::environment::worker_env;
use super::handle;
use super::log::NcclLog;
use super::outcome::Outcome;
use super::session::Live;
use super::worker::{self, Frame, Plan, WorkerResult};
use crate::child::{Ended, Frames, NoFrame};
use crate::layout::GangIdentity;
use crate::nccl::ras_diagnostics::Diagnostics;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The probe's pairwise size: small enough to cost little on a slow link, big
/// enough to be more than latency on a fast one.
pub const PROBE_BYTES: u64 = 1 << 20;

/// The plan for this pod; `root` is NCCL's root (rank 0's address, NCCL's port).
pub fn plan(identity: &GangIdentity, settings: &Settings<'_>, root: SocketAddr) -> Plan {
    let opts = settings.opts;
    let p2p_bytes = opts.gang_sizes.iter().copied().min().unwrap_or(4);
    Plan {
        handle: handle::to_hex(&handle::build(handle::magic(identity), root)),
        node_rank: identity.node_rank,
        nodes: identity.nodes,
        sizes: opts.gang_sizes.clone(),
        iterations: opts.gang_iterations,
        probe_bytes: PROBE_BYTES.min(p2p_bytes),
        p2p_bytes,
        timeout_ms: opts.gang_timeout.as_millis() as u64,
        cuda_lib: settings.cuda_lib.clone(),
        nccl_candidates: settings.nccl_candidates.clone(),
    }
}

/// A result that carries only an error.
fn failed(error: String) -> WorkerResult {
    WorkerResult {
        error: Some(error),
        ..WorkerResult::default()
    }
}

/// What this pod's NCCL run gave.
pub struct Ran {
    pub result: WorkerResult,
    pub transports: BTreeMap<String, u64>,
    pub diagnostics: Diagnostics,
    pub outcome: Outcome,
}

/// Runs the worker (NCCL's root at `root`) and reads its result, NCCL's transports
/// and its `NCCL DIAG` lines from its log; tells `live` its stages and how it ended.
pub fn run(identity: &GangIdentity, settings: &Settings<'_>, root: SocketAddr, live: &Live) -> Ran {
    let started = Instant::now();
    let (result, died, log) = match NcclLog::create() {
        Ok(log) => {
            let (result, died) = work(identity, settings, root, &log, live);
            (result, died, Some(log))
        }
        Err(e) => (failed(e), None, None),
    };
    let outcome = Outcome::of(&result, died, started.elapsed().as_secs_f64());
    live.end(outcome.clone(), outcome.early());
    Ran {
        transports: log.as_ref().map(NcclLog::transports).unwrap_or_default(),
        diagnostics: log.as_ref().map(NcclLog::diagnostics).unwrap_or_default(),
        result,
        outcome,
    }
}

/// The worker's run: its result, and how its process died when it gave none.
fn work(
    identity: &GangIdentity,
    settings: &Settings<'_>,
    root: SocketAddr,
    log: &NcclLog,
    live: &Live,
) -> (WorkerResult, Option<String>) {
    let opts = settings.opts;
    let comm_id = handle::comm_id(root);
    let env = worker_env(
        &settings.trainer_env,
        (identity.node_rank == 0).then_some(comm_id.as_str()),
        &log.path(),
        opts.gang_timeout,
        settings.ras_diagnostics,
    );
    let limit = opts.gang_timeout + worker::GRACE + Duration::from_secs(5);
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => return (failed(format!("current_exe: {e}")), None),
    };
    let plan = plan(identity, settings, root);
    let mut started = match crate::child::start(&exe, "gang-worker", &plan, env) {
        Ok(s) => s,
        Err(e) => return (failed(e), None),
    };
    let latest = Mutex::new(WorkerResult::default());
    let ended = std::thread::scope(|s| {
        if let Some(frames) = started.frames() {
            s.spawn(|| follow(frames, &latest, live));
        }
        started.finish_unless(limit, live.stop_flag())
    });
    let latest = latest.into_inner().unwrap_or_else(|p| p.into_inner());
    read(ended, latest, limit, live)
}

/// Passes each stage to the session and keeps the latest snapshot, until the
/// worker's output closes.
fn follow(frames: Frames, latest: &Mutex<WorkerResult>, live: &Live) {
    loop {
        let frame = match frames.next(Duration::from_secs(1)) {
            Ok(f) => f,
            Err(NoFrame::TimedOut) => continue,
            Err(NoFrame::Closed) => return,
        };
        let mut kept = latest.lock().unwrap_or_else(|p| p.into_inner());
        match serde_json::from_slice::<Frame>(&frame) {
            Ok(Frame::Stage { stage }) => {
                live.stage(&stage);
                kept.stage = stage;
            }
            Ok(Frame::Snapshot { result } | Frame::Result { result }) => {
                let stage = std::mem::take(&mut kept.stage);
                *kept = result;
                if kept.stage.is_empty() {
                    kept.stage = stage;
                }
            }
            Err(_) => {}
        }
    }
}

/// The worker's result from how it ended, and how its process died when it gave
/// none: its last snapshot then stands for what it measured.
fn read(
    ended: Ended,
    latest: WorkerResult,
    limit: Duration,
    live: &Live,
) -> (WorkerResult, Option<String>) {
    let partial = |why: String| WorkerResult {
        error: latest.error.clone().or(Some(why)),
        ..latest.clone()
    };
    match ended {
        Ended::Replied { reply, status, .. } => match serde_json::from_slice::<Frame>(&reply) {
            Ok(Frame::Result { result }) => (result, None),
            // A stage or a snapshot last: the process ended before its result.
            Ok(_) => {
                let how = status.map_or("ended".to_string(), |s| format!("ended ({s})"));
                let why = format!("the NCCL process {how} without a result");
                (partial(why.clone()), Some(why))
            }
            Err(e) => (
                failed(format!("the gang worker's result is not readable: {e}")),
                None,
            ),
        },
        Ended::Killed { .. } if live.stop_flag().load(std::sync::atomic::Ordering::SeqCst) => {
            let why = live.why().unwrap_or_else(|| "a pod left the gang".into());
            (partial(format!("stopped: {why}")), None)
        }
        Ended::Killed { .. } => {
            let why = format!(
                "the NCCL process did not finish within {:.1} s and was killed",
                limit.as_secs_f64()
            );
            (partial(why.clone()), Some(why))
        }
        Ended::Silent { status, stderr } => {
            let why = format!(
                "the NCCL process ended ({status}) without a result: {}",
                crate::render::visible(stderr.trim())
            );
            (partial(why.clone()), Some(why))
        }
        Ended::Failed(e) => (failed(e), None),
    }
}
