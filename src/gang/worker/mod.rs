//! The gang's NCCL child (`nccl-preflight gang-worker`, hidden): reads its plan
//! as JSON on standard input, drives every local GPU through libnccl
//! (`comms`), measures (`measure`, under the `budget`), and replies through the
//! child protocol (`crate::child`): a small frame at each stage, a snapshot of the
//! result after each measurement (what the parent keeps if it must stop this
//! process early, when a peer left), and the result last. It never returns to a
//! caller that could exec the trainer: it leaves with `_exit`, so NCCL's sockets (created
//! without SOCK_CLOEXEC, NVIDIA/nccl v2.28.9-1 src/misc/socket.cc) and its
//! detached root thread (src/bootstrap.cc `bootstrapCreateRoot`) die with it.
//!
//! Every wait is bounded by the plan's deadline: init is non-blocking
//! (`ncclConfig_t.blocking = 0`, src/nccl.h.in since v2.14.3-1) and polled with
//! `ncclCommGetAsyncError` every few ms (the recipe of NVIDIA/nccl#1677);
//! collectives are enqueued (a non-blocking communicator may answer
//! ncclInProgress, src/group.cc) and their streams polled with cuStreamQuery,
//! never synchronised. On timeout or error every communicator is aborted inside
//! one group (grouped abort since v2.22.3-1, one by one before). A watchdog
//! thread writes what is known and `_exit`s a few seconds after the deadline
//! whatever NCCL does: abort itself can hang (NVIDIA/nccl#1777, #863).
//!
//! Measurements run under the budget the deadline leaves: a pairwise probe of
//! every node pair at a small size first, then, from what the probe says of the
//! slowest link, the all-reduce sizes and a larger pairwise size that fit what
//! is left. Every rank decides from the same all-gathered numbers, so every
//! rank runs the same collectives. What was measured before a stop is kept.

pub(crate) mod budget;
mod comms;
mod measure;

use super::handle;
use super::verdict::bandwidth::SizeRow;
use crate::vendor::cuda::{Driver, Gpu, Opened};
use crate::vendor::deadline::Watch;
use crate::vendor::nccl::{self as libnccl, LoadFailure, Nccl, Ranked, SUCCESS, UniqueId};
use comms::{Gang, Stop, barrier, join};
use serde::{Deserialize, Serialize};
use std::ffi::c_int;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long after the deadline the watchdog ends the worker.
pub(crate) const GRACE: Duration = Duration::from_secs(3);
/// A snapshot frame larger than this is not sent (the result at the end still
/// is): the parent keeps at most 4 MiB of a child's output.
const SNAPSHOT_BYTES: usize = 256 << 10;

/// What the parent asks the worker to do.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Plan {
    /// The 128-byte handle, hex.
    pub handle: String,
    pub node_rank: u64,
    pub nodes: u64,
    /// All-reduce sizes, bytes, run where the budget allows.
    pub sizes: Vec<u64>,
    pub iterations: u32,
    /// Bytes each end of a pair sends per exchange in the probe.
    pub probe_bytes: u64,
    /// The larger pairwise size, run where the budget allows.
    pub p2p_bytes: u64,
    /// Everything (init and every collective) must end within this, from the start.
    pub timeout_ms: u64,
    pub cuda_lib: String,
    pub nccl_candidates: Vec<String>,
}

/// What the worker brings back.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct WorkerResult {
    pub library: Option<String>,
    /// ncclGetVersion's code (22809).
    pub nccl_version: Option<i32>,
    /// GPUs this worker drove.
    pub local_gpus: u32,
    pub nranks: u64,
    /// Every local communicator finished init.
    pub joined: bool,
    pub join_seconds: Option<f64>,
    /// What the worker was doing when it stopped.
    pub stage: String,
    pub error: Option<String>,
    /// ncclGetLastError's text (NCCL's last WARN).
    pub last_error: Option<String>,
    /// The deadline ran out (the watchdog wrote this result when `stage` is unfinished).
    pub timed_out: bool,
    /// Libnccl, libcuda or a GPU is missing: the gang cannot run here.
    pub unavailable: Option<String>,
    pub allreduce: Vec<SizeRow>,
    /// Each node's time per all-reduce, seconds: `[size][node]`, sizes as in
    /// `allreduce`; None where a node sent a time that is no number.
    pub allreduce_seconds: Vec<Vec<Option<f64>>>,
    /// Bytes each end sent per pairwise exchange for `round_seconds`.
    pub p2p_bytes: u64,
    /// Each node's pairwise round times, seconds: `[node][r]`, r indexing
    /// `verdict::schedule(N)` (0 where the node sat the round out): the largest
    /// pairwise size measured (the probe's when nothing larger fit); None where a
    /// node sent a time that is no number.
    pub round_seconds: Vec<Vec<Option<f64>>>,
    /// Measurements the budget left out, with why.
    pub skipped: Vec<String>,
    pub done: bool,
}

/// What the worker writes, in order: its stage as it changes, a snapshot of the
/// result after each measurement, the result last.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "frame", rename_all = "snake_case")]
pub(crate) enum Frame {
    Stage { stage: String },
    Snapshot { result: WorkerResult },
    Result { result: WorkerResult },
}

fn send(frame: &Frame) {
    crate::child::reply(&serde_json::to_vec(frame).unwrap_or_default());
}

/// The worker's shared result: the main thread fills it in, the watchdog or the
/// main thread prints it once.
struct Shared {
    result: Mutex<(WorkerResult, bool)>,
}

impl Shared {
    /// Changes the result; a new stage is sent at once.
    fn update(&self, f: impl FnOnce(&mut WorkerResult)) {
        let mut slot = self.result.lock().unwrap_or_else(|p| p.into_inner());
        let before = slot.0.stage.clone();
        f(&mut slot.0);
        if slot.0.stage != before && !slot.1 {
            send(&Frame::Stage {
                stage: slot.0.stage.clone(),
            });
        }
    }

    /// Changes the result with a measurement, and sends a snapshot of it.
    fn snapshot(&self, f: impl FnOnce(&mut WorkerResult)) {
        let mut slot = self.result.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut slot.0);
        let frame = Frame::Snapshot {
            result: slot.0.clone(),
        };
        let text = serde_json::to_vec(&frame).unwrap_or_default();
        if !slot.1 && text.len() <= SNAPSHOT_BYTES {
            crate::child::reply(&text);
        }
    }

    /// Prints the result once and leaves the process.
    fn finish(&self, timed_out: bool) -> ! {
        let mut slot = self.result.lock().unwrap_or_else(|p| p.into_inner());
        if !slot.1 {
            slot.1 = true;
            if timed_out {
                slot.0.timed_out = true;
            }
            send(&Frame::Result {
                result: slot.0.clone(),
            });
        }
        // SAFETY: _exit ends the process at once; the result was flushed above. No
        // library destructor runs against NCCL's threads.
        unsafe { libc::_exit(0) }
    }
}

/// `gang-worker`: never returns.
pub fn main() -> ! {
    let plan: Result<Plan, String> = crate::child::request();
    let shared = Arc::new(Shared {
        result: Mutex::new((WorkerResult::default(), false)),
    });
    let plan = match plan {
        Ok(p) => p,
        Err(e) => {
            shared.update(|r| r.error = Some(format!("gang-worker: bad plan: {e}")));
            shared.finish(false)
        }
    };
    let deadline = Instant::now() + Duration::from_millis(plan.timeout_ms);
    let dog = Arc::clone(&shared);
    let spawned = std::thread::Builder::new()
        .name("gang-watchdog".into())
        .spawn(move || {
            std::thread::sleep(Duration::from_millis(plan.timeout_ms) + GRACE);
            dog.finish(true)
        });
    if let Err(e) = spawned {
        shared.update(|r| r.error = Some(format!("starting the watchdog: {e}")));
        shared.finish(false)
    }
    run(&plan, deadline, &shared);
    shared.finish(false)
}

/// Why the worker stopped before joining.
enum Halt {
    /// Libnccl, libcuda or a GPU is missing: the gang cannot run here.
    Unavailable(String),
    Failed(String),
}

fn run(plan: &Plan, deadline: Instant, shared: &Shared) {
    let stage = |s: &str| shared.update(|r| r.stage = s.to_string());
    let watch = Watch::default();
    stage("loading libnccl");
    let prepared = open_nccl(&watch, plan, shared).and_then(|(nccl, code)| {
        stage("opening the CUDA driver");
        let (driver, gpus) = open_gpus(&watch, plan, shared)?;
        let id = unique_id(&nccl, code, plan, shared)?;
        Ok((nccl, code, driver, gpus, id))
    });
    let (nccl, code, driver, gpus, id) = match prepared {
        Ok(p) => p,
        Err(Halt::Unavailable(why)) => return shared.update(|r| r.unavailable = Some(why)),
        Err(Halt::Failed(why)) => return shared.update(|r| r.error = Some(why)),
    };
    let mut gang = Gang {
        nccl: &nccl,
        driver: &driver,
        gpus: &gpus,
        comms: Vec::new(),
        deadline,
        grouped_abort: code >= 22200,
    };
    stage("joining (ncclCommInitRankConfig)");
    let started = Instant::now();
    if let Err(stop) = join_and_measure(&mut gang, plan, id, shared, started) {
        let last = nccl.last_error();
        shared.update(|r| {
            r.last_error = last;
            match stop {
                Stop::Error(e) => r.error = Some(e),
                Stop::Timeout(what) => {
                    r.timed_out = true;
                    r.error = Some(format!(
                        "{what}: not done within {:.1} s",
                        plan.timeout_ms as f64 / 1e3
                    ));
                }
            }
        });
        stage("aborting");
        gang.abort();
    }
}

/// How a halt for a missing libnccl begins: the image's, so the gang blames the job.
pub(crate) const NO_LIBNCCL: &str = "no libnccl: ";
/// What a halt for an NCCL older than 2.16 says: the image's, so the gang blames the job.
pub(crate) const NCCL_TOO_OLD: &str = "is older than 2.16, whose uniqueId layout";

/// Loads libnccl and records its name and version; NCCL older than 2.16 halts.
fn open_nccl<'w>(
    watch: &'w Watch,
    plan: &Plan,
    shared: &Shared,
) -> Result<(Nccl<'w, Ranked>, c_int), Halt> {
    let nccl: Nccl<'w, Ranked> = match libnccl::load(watch, &plan.nccl_candidates) {
        Ok(n) => n,
        Err(LoadFailure::Missing(why)) => {
            return Err(Halt::Unavailable(format!("{NO_LIBNCCL}{why}")));
        }
        Err(LoadFailure::Failed(e)) => {
            return Err(Halt::Failed(format!("libnccl could not be loaded: {e}")));
        }
    };
    let mut code: c_int = 0;
    nccl.version(&mut code);
    shared.update(|r| {
        r.library = Some(nccl.library().to_string());
        r.nccl_version = Some(code);
    });
    // Before 2.16 the uniqueId is a bare sockaddr at offset 0, with no magic
    // (v2.14.3-1 src/bootstrap.cc bootstrapGetUniqueId): not the handle built here.
    if code < 21600 {
        return Err(Halt::Failed(format!(
            "NCCL {} {NCCL_TOO_OLD} the gang builds; the gang needs NCCL 2.16 or later",
            crate::nccl::Version::code_text(code.into())
        )));
    }
    Ok((nccl, code))
}

/// Opens the CUDA driver and the GPUs this phase drives, and records the rank count.
fn open_gpus<'w>(
    watch: &'w Watch,
    plan: &Plan,
    shared: &Shared,
) -> Result<(Driver<'w>, Vec<Gpu>), Halt> {
    let driver = match Driver::open(watch, &plan.cuda_lib) {
        Opened::Ready(d) => d,
        Opened::NotFound(why) => return Err(Halt::Unavailable(format!("no CUDA driver: {why}"))),
        Opened::Failed(e) => return Err(Halt::Failed(format!("the CUDA driver failed: {e}"))),
    };
    let gpus = driver
        .gpus()
        .map_err(|e| Halt::Failed(format!("listing GPUs: {e}")))?;
    if gpus.is_empty() {
        return Err(Halt::Unavailable(
            "no GPU visible to the CUDA driver".into(),
        ));
    }
    // Every local GPU, nranks = pods x GPUs, as the trainer's communicator.
    let local = gpus.len() as u64;
    let nranks = plan.nodes.saturating_mul(local);
    if nranks > c_int::MAX as u64 {
        return Err(Halt::Failed(format!(
            "{} pods x {local} GPUs is more ranks than NCCL counts (an int)",
            plan.nodes
        )));
    }
    shared.update(|r| {
        r.local_gpus = local as u32;
        r.nranks = nranks;
    });
    Ok((driver, gpus))
}

/// The plan's handle as an ncclUniqueId, cross-checked on rank 0 against NCCL's own.
fn unique_id(
    nccl: &Nccl<'_, Ranked>,
    code: c_int,
    plan: &Plan,
    shared: &Shared,
) -> Result<UniqueId, Halt> {
    let Some(id) = handle::from_hex(&plan.handle).and_then(|b| UniqueId::from_bytes(&b)) else {
        return Err(Halt::Failed(
            "gang-worker: the handle is not 128 bytes of hex".into(),
        ));
    };
    // Rank 0 on NCCL >= 2.22: NCCL's own id for NCCL_COMM_ID must carry the same
    // address bytes (src/bootstrap.cc bootstrapGetUniqueId) - a layout self-check.
    if plan.node_rank != 0 || code < 22200 {
        return Ok(id);
    }
    shared.update(|r| r.stage = "checking ncclGetUniqueId's layout".into());
    if let Some((SUCCESS, own)) = nccl.unique_id()
        && handle::address_bytes(own.bytes()) != handle::address_bytes(id.bytes())
    {
        return Err(Halt::Failed(format!(
            "unknown NCCL uniqueId layout: ncclGetUniqueId for NCCL_COMM_ID gave address bytes {} where the gang built {}",
            handle::to_hex(handle::address_bytes(own.bytes())),
            handle::to_hex(handle::address_bytes(id.bytes()))
        )));
    }
    Ok(id)
}

fn join_and_measure(
    gang: &mut Gang<'_>,
    plan: &Plan,
    id: UniqueId,
    shared: &Shared,
    started: Instant,
) -> Result<(), Stop> {
    join(gang, plan, id)?;
    shared.snapshot(|r| {
        r.joined = true;
        r.join_seconds = Some(started.elapsed().as_secs_f64());
    });
    measure::measure(gang, plan, shared)?;
    // A last tiny all-reduce as a barrier: no rank leaves while a peer still needs it.
    shared.update(|r| r.stage = "final barrier".into());
    barrier(gang)?;
    shared.update(|r| {
        r.done = true;
        r.stage = "done".into();
    });
    Ok(())
}
