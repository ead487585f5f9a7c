//! The gang's NCCL child (`nccl-preflight gang-worker`, hidden): reads its plan
//! as JSON on standard input, drives every local GPU through libnccl, and
//! replies with one JSON result, both through the child protocol (`crate::child`). It never returns to a caller that
//! could exec the trainer: it leaves with `_exit`, so NCCL's sockets (created
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

use super::handle;
use super::verdict::SizeRow;
use crate::vendor::cuda::{DeviceBuffer, Driver, Gpu, Opened};
use crate::vendor::deadline::Watch;
use crate::vendor::nccl::{
    self as libnccl, Code, Comm, DataType, IN_PROGRESS, LoadFailure, Nccl, Ranked, RedOp, SUCCESS,
    UniqueId,
};
use serde::{Deserialize, Serialize};
use std::ffi::c_int;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long after the deadline the watchdog ends the worker.
pub(crate) const GRACE: Duration = Duration::from_secs(3);
/// How often pending work is polled.
const POLL: Duration = Duration::from_millis(2);

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
    /// Each node's time per all-reduce, seconds: `[size][node]`, sizes as in `allreduce`.
    pub allreduce_seconds: Vec<Vec<f64>>,
    /// Bytes each end sent per pairwise exchange for `round_seconds`.
    pub p2p_bytes: u64,
    /// Each node's pairwise round times, seconds: `[node][r]`, r indexing
    /// `verdict::schedule(N)` (0 where the node sat the round out): the largest
    /// pairwise size measured (the probe's when nothing larger fit).
    pub round_seconds: Vec<Vec<f64>>,
    /// Measurements the budget left out, with why.
    pub skipped: Vec<String>,
    pub done: bool,
}

/// Why a step stopped.
enum Stop {
    Error(String),
    Timeout(String),
}

struct Gang<'a> {
    nccl: &'a Nccl<'a, Ranked>,
    driver: &'a Driver<'a>,
    gpus: &'a [Gpu],
    comms: Vec<Comm>,
    deadline: Instant,
    grouped_abort: bool,
}

impl Gang<'_> {
    fn nccl_error(&self, call: &str, rc: Code) -> Stop {
        let what = self.nccl.error_text(rc).unwrap_or_default();
        Stop::Error(format!("{call}: {what} ({rc})"))
    }

    fn check(&self, call: &str, rc: Code) -> Result<(), Stop> {
        if rc == SUCCESS || rc == IN_PROGRESS {
            Ok(())
        } else {
            Err(self.nccl_error(call, rc))
        }
    }

    /// Polls every communicator's asynchronous state and every stream until all
    /// are done, one fails, or the deadline passes.
    fn wait(&self, what: &str, streams: bool) -> Result<(), Stop> {
        loop {
            let mut pending = false;
            for (g, comm) in self.comms.iter().enumerate() {
                let mut state: Code = IN_PROGRESS;
                let rc = self.nccl.async_error(comm, &mut state);
                if rc != SUCCESS {
                    return Err(self.nccl_error("ncclCommGetAsyncError", rc));
                }
                if state == IN_PROGRESS {
                    pending = true;
                } else if state != SUCCESS {
                    return Err(self.nccl_error(&format!("{what} (GPU {g})"), state));
                }
            }
            if !pending && streams {
                for gpu in self.gpus {
                    match self.driver.stream_done(gpu) {
                        Ok(true) => {}
                        Ok(false) => pending = true,
                        Err(e) => return Err(Stop::Error(format!("{what}: {e}"))),
                    }
                }
            }
            if !pending {
                return Ok(());
            }
            if Instant::now() > self.deadline {
                return Err(Stop::Timeout(what.to_string()));
            }
            std::thread::sleep(POLL);
        }
    }

    /// One NCCL group: `each(g)` enqueues GPU g's part.
    fn group(&self, what: &str, each: impl Fn(usize) -> Code) -> Result<(), Stop> {
        self.check("ncclGroupStart", self.nccl.group_start())?;
        for g in 0..self.comms.len() {
            let rc = each(g);
            if rc != SUCCESS && rc != IN_PROGRESS {
                // Closes the group opened above; the first error is the one reported.
                self.nccl.group_end();
                return Err(self.nccl_error(what, rc));
            }
        }
        self.check(what, self.nccl.group_end())?;
        self.wait(what, true)
    }

    fn upload(&self, gpu: &Gpu, dst: &DeviceBuffer<'_, '_>, bytes: &[u8]) -> Result<(), Stop> {
        self.driver
            .upload(gpu, dst.all(), bytes)
            .map_err(|e| Stop::Error(e.to_string()))
    }

    /// Aborts every communicator (grouped where NCCL supports it).
    fn abort(&mut self) {
        if self.grouped_abort {
            self.nccl.group_start();
        }
        for comm in self.comms.drain(..) {
            self.nccl.abort(comm);
        }
        if self.grouped_abort {
            self.nccl.group_end();
        }
    }
}

/// The worker's shared result: the main thread fills it in, the watchdog or the
/// main thread prints it once.
struct Shared {
    result: Mutex<(WorkerResult, bool)>,
}

impl Shared {
    fn update(&self, f: impl FnOnce(&mut WorkerResult)) {
        let mut slot = self.result.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut slot.0);
    }

    /// Prints the result once and leaves the process.
    fn finish(&self, timed_out: bool) -> ! {
        let mut slot = self.result.lock().unwrap_or_else(|p| p.into_inner());
        if !slot.1 {
            slot.1 = true;
            if timed_out {
                slot.0.timed_out = true;
            }
            let text = serde_json::to_vec(&slot.0).unwrap_or_default();
            crate::child::reply(&text);
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
    shared.update(|r| {
        r.joined = true;
        r.join_seconds = Some(started.elapsed().as_secs_f64());
    });
    measure(gang, plan, shared)?;
    // A last tiny all-reduce as a barrier: no rank leaves while a peer still needs it.
    shared.update(|r| r.stage = "final barrier".into());
    barrier(gang)?;
    shared.update(|r| {
        r.done = true;
        r.stage = "done".into();
    });
    Ok(())
}

/// Every local GPU's ncclCommInitRankConfig in one group, then polled until joined.
fn join(gang: &mut Gang<'_>, plan: &Plan, id: UniqueId) -> Result<(), Stop> {
    let local = gang.gpus.len();
    let nranks = plan.nodes as usize * local;
    gang.comms = Vec::with_capacity(local);
    gang.check("ncclGroupStart", gang.nccl.group_start())?;
    for (g, gpu) in gang.gpus.iter().enumerate() {
        // NCCL takes the device from the calling thread's current context (src/init.cc).
        gang.driver
            .make_current(gpu)
            .map_err(|e| Stop::Error(e.to_string()))?;
        let rank = plan.node_rank as usize * local + g;
        let (rc, comm) = gang.nccl.init_rank(nranks, id, rank);
        gang.comms.push(comm);
        if rc != SUCCESS && rc != IN_PROGRESS {
            // Closes the group opened above; the init error is the one reported.
            gang.nccl.group_end();
            return Err(gang.nccl_error(
                &format!("ncclCommInitRankConfig(rank {rank} of {nranks})"),
                rc,
            ));
        }
    }
    gang.check("ncclCommInitRankConfig", gang.nccl.group_end())?;
    gang.wait("joining", false)
}

fn alloc<'d>(gang: &Gang<'d>, gpu: &Gpu, bytes: usize) -> Result<DeviceBuffer<'d, 'd>, Stop> {
    gang.driver
        .alloc(gpu, bytes.max(8))
        .map_err(|e| Stop::Error(e.to_string()))
}

fn read(gang: &Gang<'_>, src: &DeviceBuffer<'_, '_>, out: &mut [u8]) -> Result<(), Stop> {
    gang.driver
        .read_back(src.all(), out)
        .map_err(|e| Stop::Error(e.to_string()))
}

/// One buffer per local GPU holding `bytes`.
fn upload_all<'d>(gang: &Gang<'d>, bytes: &[u8]) -> Result<Vec<DeviceBuffer<'d, 'd>>, Stop> {
    gang.gpus
        .iter()
        .map(|gpu| {
            let b = alloc(gang, gpu, bytes.len())?;
            gang.upload(gpu, &b, bytes)?;
            Ok(b)
        })
        .collect()
}

fn barrier(gang: &Gang<'_>) -> Result<(), Stop> {
    let bufs = gang
        .gpus
        .iter()
        .map(|gpu| alloc(gang, gpu, 8))
        .collect::<Result<Vec<_>, _>>()?;
    gang.group("the final barrier all-reduce", |g| {
        let (buf, gpu) = (&bufs[g], &gang.gpus[g]);
        gang.nccl
            .all_reduce(buf, buf, 1, DataType::F64, RedOp::Max, &gang.comms[g], gpu)
    })
}

/// All-gathers `record` (the same on every local rank) over every rank and
/// returns each node's, as node i's is rank i x local's.
fn gather_per_node(
    gang: &Gang<'_>,
    record: &[u8],
    nodes: usize,
    what: &str,
) -> Result<Vec<Vec<u8>>, Stop> {
    let local = gang.gpus.len();
    let total = record.len() * nodes * local;
    let mut bufs = Vec::new();
    for (send, gpu) in upload_all(gang, record)?.into_iter().zip(gang.gpus) {
        bufs.push((send, alloc(gang, gpu, total)?));
    }
    gang.group(what, |g| {
        let (send, recv) = &bufs[g];
        gang.nccl
            .all_gather(send, recv, record.len(), &gang.comms[g], &gang.gpus[g])
    })?;
    let mut all = vec![0u8; total];
    read(gang, &bufs[0].1, &mut all)?;
    Ok((0..nodes)
        .map(|i| {
            let at = i * local * record.len();
            all[at..at + record.len()].to_vec()
        })
        .collect())
}

fn to_bytes(values: &[f64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_ne_bytes()).collect()
}

fn from_bytes(bytes: &[u8]) -> Vec<f64> {
    bytes
        .chunks_exact(8)
        .map(|c| f64::from_ne_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
        .collect()
}

/// Element-wise max over every rank of `values` (f64).
fn max_over_ranks(gang: &Gang<'_>, values: &[f64], what: &str) -> Result<Vec<f64>, Stop> {
    let bytes = to_bytes(values);
    let bufs = upload_all(gang, &bytes)?;
    gang.group(what, |g| {
        let (buf, gpu) = (&bufs[g], &gang.gpus[g]);
        gang.nccl.all_reduce(
            buf,
            buf,
            values.len(),
            DataType::F64,
            RedOp::Max,
            &gang.comms[g],
            gpu,
        )
    })?;
    let mut out = vec![0u8; bytes.len()];
    read(gang, &bufs[0], &mut out)?;
    Ok(from_bytes(&out))
}

type Pairs<'d> = [(DeviceBuffer<'d, 'd>, DeviceBuffer<'d, 'd>)];

/// Runs `op` once untimed, then `iterations` times; the mean time of one, seconds.
fn timed(
    gang: &Gang<'_>,
    iterations: u32,
    warm_up: &str,
    what: &str,
    op: impl Fn(usize) -> Code,
) -> Result<f64, Stop> {
    gang.group(warm_up, &op)?;
    let t0 = Instant::now();
    for _ in 0..iterations {
        gang.group(what, &op)?;
    }
    Ok(t0.elapsed().as_secs_f64() / f64::from(iterations))
}

/// Timed repetitions of the probe, after its warm-up.
const PROBE_ITERATIONS: u32 = 2;
/// Estimates are multiplied by this before they are held against the budget.
const SAFETY: f64 = 2.0;

/// Seconds left before the deadline on the rank with the least left (the same on
/// every rank: an all-reduce of the negated figure).
fn least_left(gang: &Gang<'_>) -> Result<f64, Stop> {
    let left = gang
        .deadline
        .saturating_duration_since(Instant::now())
        .as_secs_f64();
    let worst = max_over_ranks(gang, &[-left], "the budget exchange")?;
    Ok(-worst.first().copied().unwrap_or(0.0))
}

/// What the budget left, decided from numbers every rank shares.
struct Budget {
    /// Seconds still to spend on measurements.
    left: f64,
    /// The slowest link the probe saw, bytes per second.
    slowest: f64,
    /// The probe's slowest exchange, seconds: a floor for any exchange's time.
    latency: f64,
}

impl Budget {
    /// Takes `seconds` from the budget when they fit.
    fn take(&mut self, seconds: f64) -> bool {
        let cost = seconds * SAFETY;
        if cost.is_finite() && cost <= self.left {
            self.left -= cost;
            true
        } else {
            false
        }
    }
}

/// The pairwise probe, then the all-reduce sizes and the larger pairwise size
/// that fit the budget; everything measured is kept in `shared` as it comes.
fn measure(gang: &Gang<'_>, plan: &Plan, shared: &Shared) -> Result<(), Stop> {
    let largest = plan
        .sizes
        .iter()
        .copied()
        .chain([plan.p2p_bytes, plan.probe_bytes, 4])
        .max()
        .unwrap_or(4) as usize;
    let mut bufs = Vec::new();
    for gpu in gang.gpus {
        bufs.push((alloc(gang, gpu, largest)?, alloc(gang, gpu, largest)?));
    }
    let probe = pairwise_rounds(
        gang,
        plan,
        shared,
        &bufs,
        plan.probe_bytes,
        PROBE_ITERATIONS,
    )?;
    let per_node = share_rounds(gang, plan, &probe, plan.probe_bytes, shared)?;
    let links = super::verdict::links(&super::verdict::matrix(&per_node, plan.probe_bytes));
    let slowest_gbps = links.iter().copied().fold(f64::INFINITY, f64::min);
    let latency = per_node
        .iter()
        .flatten()
        .copied()
        .filter(|t| t.is_finite())
        .fold(0.0, f64::max);
    // Kept back for the exchanges after the last measurement and the final barrier.
    let reserve = 1.0 + plan.timeout_ms as f64 / 1e3 * 0.1;
    let mut budget = Budget {
        left: least_left(gang)? - reserve,
        slowest: slowest_gbps * 1e9,
        latency,
    };
    all_reduce_sizes(gang, plan, shared, &bufs, &mut budget)?;
    if plan.p2p_bytes > plan.probe_bytes {
        let rounds = super::verdict::schedule(plan.nodes as usize).len() as f64;
        let each = (plan.p2p_bytes as f64 / budget.slowest).max(budget.latency);
        let reps = f64::from(plan.iterations.max(1) + 1);
        budget.left = least_left(gang)? - reserve;
        if budget.take(rounds * reps * each) {
            let times =
                pairwise_rounds(gang, plan, shared, &bufs, plan.p2p_bytes, plan.iterations)?;
            share_rounds(gang, plan, &times, plan.p2p_bytes, shared)?;
        } else {
            shared.update(|r| {
                r.skipped.push(format!(
                    "pairwise exchanges of {}: about {:.1} s estimated from the probe, {:.1} s left",
                    crate::units::format_bytes(plan.p2p_bytes),
                    rounds * reps * each * SAFETY,
                    budget.left.max(0.0)
                ))
            });
        }
    }
    Ok(())
}

/// Every node's round times to every rank (an all-gather of R doubles per rank),
/// kept in `shared` as the matrix's source for `bytes`.
fn share_rounds(
    gang: &Gang<'_>,
    plan: &Plan,
    rounds: &[f64],
    bytes: u64,
    shared: &Shared,
) -> Result<Vec<Vec<f64>>, Stop> {
    let per_node: Vec<Vec<f64>> = gather_per_node(
        gang,
        &to_bytes(rounds),
        plan.nodes as usize,
        "the round-time all-gather",
    )?
    .iter()
    .map(|b| from_bytes(b))
    .collect();
    shared.update(|r| {
        r.p2p_bytes = bytes;
        r.round_seconds = per_node.clone();
    });
    Ok(per_node)
}

/// The all-reduce at each size the budget allows; every node's time is shared,
/// and the row keeps the slowest node's (nccl-tests averages; a straggler's view is the max).
fn all_reduce_sizes(
    gang: &Gang<'_>,
    plan: &Plan,
    shared: &Shared,
    bufs: &Pairs<'_>,
    budget: &mut Budget,
) -> Result<(), Stop> {
    let nodes = plan.nodes as usize;
    let nranks = (nodes * gang.gpus.len()) as u64;
    let mut sizes = plan.sizes.clone();
    sizes.sort_unstable();
    let reps = f64::from(plan.iterations.max(1) + 1);
    for bytes in sizes {
        // Ring all-reduce: each rank sends and receives 2(n-1)/n of the buffer (nccl-tests
        // src/all_reduce.cu), through the slowest link at worst.
        let moved = 2.0 * (nodes as f64 - 1.0) / nodes as f64 * bytes as f64;
        let each = (moved / budget.slowest).max(budget.latency);
        if !budget.take(reps * each) {
            shared.update(|r| {
                r.skipped.push(format!(
                    "all-reduce of {}: about {:.1} s estimated from the probe, {:.1} s left",
                    crate::units::format_bytes(bytes),
                    reps * each * SAFETY,
                    budget.left.max(0.0)
                ))
            });
            continue;
        }
        shared.update(|r| r.stage = format!("all-reduce of {bytes} bytes"));
        let count = bytes as usize / 4;
        let op = |g: usize| {
            let (send, recv) = &bufs[g];
            gang.nccl.all_reduce(
                send,
                recv,
                count,
                DataType::F32,
                RedOp::Sum,
                &gang.comms[g],
                &gang.gpus[g],
            )
        };
        let iterations = plan.iterations.max(1);
        let t = timed(
            gang,
            iterations,
            "a warm-up all-reduce",
            "an all-reduce",
            op,
        )?;
        let per_node =
            gather_per_node(gang, &to_bytes(&[t]), nodes, "the all-reduce time exchange")?;
        let times: Vec<f64> = per_node
            .iter()
            .map(|b| from_bytes(b).first().copied().unwrap_or(f64::NAN))
            .collect();
        let slowest = times
            .iter()
            .copied()
            .filter(|t| t.is_finite())
            .fold(0.0, f64::max);
        // The probe's small exchanges understate a fast link (latency dominates 1 MiB):
        // what the all-reduce just moved through the slowest rank is a better rate for
        // the next estimates, and every rank computes it from the same gathered times.
        if slowest > 0.0 {
            budget.slowest = budget.slowest.max(moved / slowest);
        }
        shared.update(|r| {
            r.allreduce
                .push(super::verdict::size_row(bytes, slowest, nranks));
            r.allreduce_seconds.push(times);
        });
    }
    Ok(())
}

/// Pairwise rounds (`verdict::schedule`): in each round the nodes meet in
/// disjoint pairs and both ends of a pair send to and receive from each other in
/// one group, GPU g to GPU g (rail-aligned), so a round's time is that link's
/// alone. One untimed warm-up per round: NCCL connects p2p peers lazily (since
/// v2.22.3-1), and the warm-up cannot end before the partner has finished its
/// previous round, which lines the pair up before the timed exchanges. A node
/// that sits the round out (odd N) records 0. Returns this node's round times.
fn pairwise_rounds(
    gang: &Gang<'_>,
    plan: &Plan,
    shared: &Shared,
    bufs: &Pairs<'_>,
    bytes: u64,
    iterations: u32,
) -> Result<Vec<f64>, Stop> {
    let local = gang.gpus.len();
    let n = plan.nodes as usize;
    let schedule = super::verdict::schedule(n);
    let mut rounds = vec![0f64; schedule.len().max(1)];
    let node = plan.node_rank as usize;
    let p2p = bytes as usize;
    for (r, slot) in rounds.iter_mut().enumerate().take(schedule.len()) {
        let Some(peer) = super::verdict::partner(n, r, node) else {
            continue;
        };
        shared.update(|res| res.stage = format!("pairwise round {} with node {peer}", r + 1));
        // Send and receive sit in one group, so the two ends of the pair do not deadlock.
        let op = |g: usize| {
            let (send, recv) = &bufs[g];
            let (comm, gpu) = (&gang.comms[g], &gang.gpus[g]);
            let rc = gang.nccl.send(send, p2p, peer * local + g, comm, gpu);
            if rc != SUCCESS && rc != IN_PROGRESS {
                return rc;
            }
            gang.nccl.recv(recv, p2p, peer * local + g, comm, gpu)
        };
        let iterations = iterations.max(1);
        *slot = timed(
            gang,
            iterations,
            "a warm-up pairwise exchange",
            "a pairwise exchange",
            op,
        )?;
    }
    Ok(rounds)
}
