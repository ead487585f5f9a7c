//! This pod's NCCL run: the worker's plan, environment and log, the child
//! (`gang-worker`, through the child protocol of `crate::child`), and what
//! came back.

use super::Settings;
use super::environment::worker_env;
use super::handle;
use super::log::NcclLog;
use super::worker::{self, Plan, WorkerResult};
use crate::child::{Ended, call};
use crate::layout::GangIdentity;
use crate::nccl::ras_diagnostics::Diagnostics;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

/// The probe's pairwise size: small enough to cost little on a slow link, big
/// enough to be more than latency on a fast one.
pub const PROBE_BYTES: u64 = 1 << 20;

/// The plan for this pod.
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

/// Runs the worker and reads its result, NCCL's transports and its `NCCL DIAG` lines
/// from its log.
pub fn run(
    identity: &GangIdentity,
    settings: &Settings<'_>,
    root: SocketAddr,
) -> (WorkerResult, BTreeMap<String, u64>, Diagnostics) {
    let opts = settings.opts;
    let log = match NcclLog::create() {
        Ok(l) => l,
        Err(e) => return (failed(e), BTreeMap::new(), Diagnostics::default()),
    };
    let plan = plan(identity, settings, root);
    let comm_id = handle::comm_id(root);
    let env = worker_env(
        &settings.trainer_env,
        (identity.node_rank == 0).then_some(comm_id.as_str()),
        &log.path(),
        opts.gang_timeout,
        settings.ras_diagnostics,
    );
    let limit = opts.gang_timeout + worker::GRACE + Duration::from_secs(5);
    let result = match std::env::current_exe() {
        Err(e) => failed(format!("current_exe: {e}")),
        Ok(exe) => read(call(&exe, "gang-worker", &plan, env, limit), limit),
    };
    (result, log.transports(), log.diagnostics())
}

/// The worker's result from how the child ended.
fn read(ended: Ended, limit: Duration) -> WorkerResult {
    match ended {
        Ended::Replied { reply, .. } => serde_json::from_slice(&reply)
            .unwrap_or_else(|e| failed(format!("the gang worker's result is not readable: {e}"))),
        Ended::Killed { .. } => failed(format!(
            "the gang worker did not finish within {:.1} s and was killed",
            limit.as_secs_f64()
        )),
        Ended::Silent { status, stderr } => failed(format!(
            "the gang worker ended ({status}) without a result: {}",
            crate::render::visible(stderr.trim())
        )),
        Ended::Failed(e) => failed(e),
    }
}
