//! The gang's NCCL child (`nccl-preflight gang-worker`, hidden): reads its plan
//! as JSON on standard input, drives every local GPU through libnccl, and
//! writes one JSON result on standard output. It never returns to a caller that
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

use super::handle::{self, Phase};
use super::verdict::SizeRow;
use crate::bench::driver::{DeviceBuffer, Driver, Gpu, Opened};
use crate::gather::deadline::Watch;
use crate::gather::dl::{Library, Symbol, is_missing};
use serde::{Deserialize, Serialize};
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::io::{Read, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long after the deadline the watchdog ends the worker.
pub const GRACE: Duration = Duration::from_secs(3);
/// How often pending work is polled.
const POLL: Duration = Duration::from_millis(2);

/// What the parent asks the worker to do.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Plan {
    pub phase: Phase,
    /// The 128-byte handle, hex.
    pub handle: String,
    pub node_rank: u64,
    pub nodes: u64,
    /// This pod's fingerprint record, hex (consistency phase).
    pub fingerprint: String,
    /// All-reduce sizes, bytes (bandwidth phase).
    pub sizes: Vec<u64>,
    pub iterations: u32,
    /// Bytes each end of a pair sends per exchange (bandwidth phase).
    pub p2p_bytes: u64,
    /// Everything (init and every collective) must end within this, from the start.
    pub timeout_ms: u64,
    pub cuda_lib: String,
    pub nccl_candidates: Vec<String>,
}

/// What the worker brings back.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkerResult {
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
    /// One fingerprint record per node, hex (consistency phase).
    pub fingerprints: Vec<String>,
    pub allreduce: Vec<SizeRow>,
    /// Each node's pairwise round times, seconds: `[node][r]`, r indexing
    /// `verdict::schedule(N)` (0 where the node sat the round out).
    pub round_seconds: Vec<Vec<f64>>,
    pub done: bool,
}

type R = c_int;
type Comm = *mut c_void;
const SUCCESS: R = 0;
const IN_PROGRESS: R = 7;
const UINT8: c_int = 1;
const FLOAT32: c_int = 7;
const FLOAT64: c_int = 8;
const SUM: c_int = 0;
const MAX: c_int = 2;
/// CUDA_ERROR_NOT_READY: cuStreamQuery's "still running".
const CUDA_NOT_READY: c_int = 600;

/// ncclUniqueId, passed by value as the C struct.
#[repr(C)]
#[derive(Clone, Copy)]
struct UniqueId {
    internal: [u8; handle::HANDLE_BYTES],
}

/// ncclConfig_t as of NCCL 2.17 (ncclConfig_v21700 in src/nccl.h.in). NCCL copies
/// `size` bytes of it when `version` >= 2.17.0 and reads the 2.17 fields otherwise
/// (src/init.cc parseCommConfig), so this prefix works with every later NCCL.
#[repr(C)]
struct Config {
    size: usize,
    magic: c_uint,
    version: c_uint,
    blocking: c_int,
    cga_cluster_size: c_int,
    min_ctas: c_int,
    max_ctas: c_int,
    net_name: *const c_char,
    split_share: c_int,
}

/// NCCL_CONFIG_INITIALIZER with blocking = 0.
fn nonblocking_config() -> Config {
    const UNDEF: c_int = c_int::MIN;
    Config {
        size: std::mem::size_of::<Config>(),
        magic: 0xcafe_beef,
        version: 21700,
        blocking: 0,
        cga_cluster_size: UNDEF,
        min_ctas: UNDEF,
        max_ctas: UNDEF,
        net_name: std::ptr::null(),
        split_share: UNDEF,
    }
}

type Stream = *mut c_void;
type Ptr = u64;

struct Nccl {
    version: Symbol<unsafe extern "C" fn(*mut c_int) -> R>,
    unique_id: Option<Symbol<unsafe extern "C" fn(*mut UniqueId) -> R>>,
    init: Symbol<unsafe extern "C" fn(*mut Comm, c_int, UniqueId, c_int, *mut Config) -> R>,
    async_error: Symbol<unsafe extern "C" fn(Comm, *mut R) -> R>,
    abort: Symbol<unsafe extern "C" fn(Comm) -> R>,
    group_start: Symbol<unsafe extern "C" fn() -> R>,
    group_end: Symbol<unsafe extern "C" fn() -> R>,
    all_gather: Symbol<unsafe extern "C" fn(Ptr, Ptr, usize, c_int, Comm, Stream) -> R>,
    all_reduce: Symbol<unsafe extern "C" fn(Ptr, Ptr, usize, c_int, c_int, Comm, Stream) -> R>,
    send: Symbol<unsafe extern "C" fn(Ptr, usize, c_int, c_int, Comm, Stream) -> R>,
    recv: Symbol<unsafe extern "C" fn(Ptr, usize, c_int, c_int, Comm, Stream) -> R>,
    error_string: Symbol<unsafe extern "C" fn(R) -> *const c_char>,
    last_error: Option<Symbol<unsafe extern "C" fn(Comm) -> *const c_char>>,
}

/// The two driver calls the gang needs beyond bench's wrapper.
struct CudaExtra {
    stream_query: Symbol<unsafe extern "C" fn(Stream) -> c_int>,
    copy_htod: Symbol<unsafe extern "C" fn(Ptr, *const c_void, usize) -> c_int>,
}

fn text(p: *const c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: NCCL returns NUL-terminated strings it owns; read at once.
    let s = unsafe { CStr::from_ptr(p) }
        .to_string_lossy()
        .trim()
        .to_string();
    (!s.is_empty()).then_some(s)
}

/// Why a step stopped.
enum Stop {
    Error(String),
    Timeout(String),
}

struct Gang<'a> {
    nccl: &'a Nccl,
    cuda: &'a CudaExtra,
    driver: &'a Driver<'a>,
    gpus: &'a [Gpu],
    comms: Vec<Comm>,
    deadline: Instant,
    grouped_abort: bool,
}

impl Gang<'_> {
    fn nccl_error(&self, call: &str, rc: R) -> Stop {
        // SAFETY: ncclGetErrorString returns a static string for any code.
        let what = text(unsafe { (self.nccl.error_string.get())(rc) }).unwrap_or_default();
        Stop::Error(format!("{call}: {what} ({rc})"))
    }

    fn check(&self, call: &str, rc: R) -> Result<(), Stop> {
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
                let mut state: R = IN_PROGRESS;
                // SAFETY: a communicator from ncclCommInitRankConfig; out-pointer to an int.
                let rc = unsafe { (self.nccl.async_error.get())(*comm, &mut state) };
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
                    // SAFETY: the stream was created by the driver wrapper on this GPU.
                    let rc = unsafe { (self.cuda.stream_query.get())(gpu.stream) };
                    if rc == CUDA_NOT_READY {
                        pending = true;
                    } else if rc != 0 {
                        return Err(Stop::Error(format!(
                            "{what}: cuStreamQuery(GPU {}): {}",
                            gpu.ordinal,
                            crate::gather::gpu::cuda::result_name(rc)
                        )));
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
    fn group(&self, what: &str, each: impl Fn(usize) -> R) -> Result<(), Stop> {
        // SAFETY: no arguments.
        self.check("ncclGroupStart", unsafe { (self.nccl.group_start.get())() })?;
        for g in 0..self.comms.len() {
            let rc = each(g);
            if rc != SUCCESS && rc != IN_PROGRESS {
                // SAFETY: closes the group opened above.
                unsafe { (self.nccl.group_end.get())() };
                return Err(self.nccl_error(what, rc));
            }
        }
        // SAFETY: no arguments.
        self.check(what, unsafe { (self.nccl.group_end.get())() })?;
        self.wait(what, true)
    }

    fn upload(&self, gpu: &Gpu, dst: &DeviceBuffer<'_, '_>, bytes: &[u8]) -> Result<(), Stop> {
        if bytes.len() > dst.len() {
            return Err(Stop::Error(format!(
                "cuMemcpyHtoD(GPU {}): {} bytes into a buffer of {}",
                gpu.ordinal,
                bytes.len(),
                dst.len()
            )));
        }
        self.driver
            .make_current(gpu)
            .map_err(|e| Stop::Error(e.to_string()))?;
        // SAFETY: `dst` is a live allocation on `gpu` holding at least `bytes.len()`
        // bytes (checked above).
        let rc = unsafe {
            (self.cuda.copy_htod.get())(dst.device_ptr(), bytes.as_ptr().cast(), bytes.len())
        };
        if rc != 0 {
            return Err(Stop::Error(format!(
                "cuMemcpyHtoD(GPU {}): {}",
                gpu.ordinal,
                crate::gather::gpu::cuda::result_name(rc)
            )));
        }
        Ok(())
    }

    /// Aborts every communicator (grouped where NCCL supports it).
    fn abort(&mut self) {
        if self.grouped_abort {
            // SAFETY: no arguments.
            unsafe { (self.nccl.group_start.get())() };
        }
        for comm in self.comms.drain(..) {
            if !comm.is_null() {
                // SAFETY: a communicator from init, aborted once.
                unsafe { (self.nccl.abort.get())(comm) };
            }
        }
        if self.grouped_abort {
            // SAFETY: closes the group opened above.
            unsafe { (self.nccl.group_end.get())() };
        }
    }
}

fn load_nccl(candidates: &[String]) -> Result<(Nccl, String), (bool, String)> {
    let mut missing = true;
    let mut last = String::from("no candidates");
    for name in candidates {
        match Library::open(name) {
            Ok(lib) => {
                let api = (|| {
                    Ok::<Nccl, crate::facts::FactError>(Nccl {
                        version: lib.symbol("ncclGetVersion")?,
                        unique_id: lib.symbol("ncclGetUniqueId").ok(),
                        init: lib.symbol("ncclCommInitRankConfig")?,
                        async_error: lib.symbol("ncclCommGetAsyncError")?,
                        abort: lib.symbol("ncclCommAbort")?,
                        group_start: lib.symbol("ncclGroupStart")?,
                        group_end: lib.symbol("ncclGroupEnd")?,
                        all_gather: lib.symbol("ncclAllGather")?,
                        all_reduce: lib.symbol("ncclAllReduce")?,
                        send: lib.symbol("ncclSend")?,
                        recv: lib.symbol("ncclRecv")?,
                        error_string: lib.symbol("ncclGetErrorString")?,
                        last_error: lib.symbol("ncclGetLastError").ok(),
                    })
                })();
                return match api {
                    Ok(api) => {
                        // NCCL starts threads; it stays loaded until the worker exits.
                        std::mem::forget(lib);
                        Ok((api, name.clone()))
                    }
                    Err(e) => Err((false, e.to_string())),
                };
            }
            Err(e) => {
                missing &= is_missing(name, &e.message);
                last = e.to_string();
            }
        }
    }
    Err((missing, last))
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
            let text = serde_json::to_string(&slot.0).unwrap_or_default();
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{text}");
            let _ = out.flush();
        }
        // SAFETY: _exit ends the process at once; the result was flushed above. No
        // library destructor runs against NCCL's threads.
        unsafe { libc::_exit(0) }
    }
}

/// `gang-worker`: never returns.
pub fn main() -> ! {
    let mut input = String::new();
    let plan: Result<Plan, String> = std::io::stdin()
        .take(1 << 20)
        .read_to_string(&mut input)
        .map_err(|e| e.to_string())
        .and_then(|_| serde_json::from_str(&input).map_err(|e| e.to_string()));
    let shared = Arc::new(Shared {
        result: Mutex::new((WorkerResult::default(), false)),
    });
    let plan = match plan {
        Ok(p) => p,
        Err(e) => {
            shared.update(|r| {
                r.error = Some(format!("gang-worker: bad plan on standard input: {e}"))
            });
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

fn run(plan: &Plan, deadline: Instant, shared: &Shared) {
    let stage = |s: &str| shared.update(|r| r.stage = s.to_string());
    let fail = |e: String| shared.update(|r| r.error = Some(e));
    stage("loading libnccl");
    let (nccl, library) = match load_nccl(&plan.nccl_candidates) {
        Ok(x) => x,
        Err((true, why)) => {
            return shared.update(|r| r.unavailable = Some(format!("no libnccl: {why}")));
        }
        Err((false, why)) => return fail(format!("libnccl could not be loaded: {why}")),
    };
    let mut code: c_int = 0;
    // SAFETY: out-pointer to an int.
    unsafe { (nccl.version.get())(&mut code) };
    shared.update(|r| {
        r.library = Some(library);
        r.nccl_version = Some(code);
    });
    // Before 2.16 the uniqueId is a bare sockaddr at offset 0, with no magic
    // (v2.14.3-1 src/bootstrap.cc bootstrapGetUniqueId): not the handle built here.
    if code < 21600 {
        return fail(format!(
            "NCCL {} is older than 2.16, whose uniqueId layout the gang builds; the gang needs NCCL 2.16 or later",
            super::fingerprint::version_text(code)
        ));
    }
    stage("opening the CUDA driver");
    let watch = Watch::default();
    let driver = match Driver::open(&watch, &plan.cuda_lib) {
        Opened::Ready(d) => d,
        Opened::NotFound(why) => {
            return shared.update(|r| r.unavailable = Some(format!("no CUDA driver: {why}")));
        }
        Opened::Failed(e) => return fail(format!("the CUDA driver failed: {e}")),
    };
    let extra = Library::open(&plan.cuda_lib).and_then(|lib| {
        let api = CudaExtra {
            stream_query: lib.symbol("cuStreamQuery")?,
            copy_htod: lib.symbol("cuMemcpyHtoD_v2")?,
        };
        std::mem::forget(lib);
        Ok(api)
    });
    let cuda = match extra {
        Ok(c) => c,
        Err(e) => return fail(format!("the CUDA driver lacks a call the gang needs: {e}")),
    };
    let mut gpus = match driver.gpus() {
        Ok(g) => g,
        Err(e) => return fail(format!("listing GPUs: {e}")),
    };
    if gpus.is_empty() {
        return shared.update(|r| r.unavailable = Some("no GPU visible to the CUDA driver".into()));
    }
    // The consistency phase joins one rank per pod (GPU 0), so pods with different GPU
    // counts still form a communicator and the difference is reported; the bandwidth
    // phase drives every local GPU, nranks = pods x GPUs, as the trainer's communicator.
    if plan.phase == Phase::Consistency {
        gpus.truncate(1);
    }
    let local = gpus.len() as u64;
    let nranks = plan.nodes.saturating_mul(local);
    if nranks > c_int::MAX as u64 {
        return fail(format!(
            "{} pods x {local} GPUs is more ranks than NCCL counts (an int)",
            plan.nodes
        ));
    }
    shared.update(|r| {
        r.local_gpus = local as u32;
        r.nranks = nranks;
    });
    let Some(bytes) = handle::from_hex(&plan.handle).filter(|b| b.len() == handle::HANDLE_BYTES)
    else {
        return fail("gang-worker: the handle is not 128 bytes of hex".into());
    };
    let mut id = UniqueId {
        internal: [0; handle::HANDLE_BYTES],
    };
    id.internal.copy_from_slice(&bytes);
    // Rank 0 on NCCL >= 2.22: NCCL's own id for NCCL_COMM_ID must carry the same
    // address bytes (src/bootstrap.cc bootstrapGetUniqueId) - a layout self-check.
    if plan.node_rank == 0
        && code >= 22200
        && let Some(get) = &nccl.unique_id
    {
        stage("checking ncclGetUniqueId's layout");
        let mut own = UniqueId {
            internal: [0; handle::HANDLE_BYTES],
        };
        // SAFETY: out-pointer to a 128-byte id.
        let rc = unsafe { (get.get())(&mut own) };
        if rc == SUCCESS
            && handle::address_bytes(&own.internal) != handle::address_bytes(&id.internal)
        {
            return fail(format!(
                "unknown NCCL uniqueId layout: ncclGetUniqueId for NCCL_COMM_ID gave address bytes {} where the gang built {}",
                handle::to_hex(handle::address_bytes(&own.internal)),
                handle::to_hex(handle::address_bytes(&id.internal))
            ));
        }
    }
    let mut gang = Gang {
        nccl: &nccl,
        cuda: &cuda,
        driver: &driver,
        gpus: &gpus,
        comms: Vec::new(),
        deadline,
        grouped_abort: code >= 22200,
    };
    stage("joining (ncclCommInitRankConfig)");
    let started = Instant::now();
    let outcome = join_and_measure(&mut gang, plan, id, shared, started);
    if let Err(stop) = outcome {
        let last = nccl
            .last_error
            .as_ref()
            // SAFETY: ncclGetLastError accepts NULL (the process-wide last error).
            .and_then(|f| text(unsafe { (f.get())(std::ptr::null_mut()) }));
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

fn join_and_measure(
    gang: &mut Gang<'_>,
    plan: &Plan,
    id: UniqueId,
    shared: &Shared,
    started: Instant,
) -> Result<(), Stop> {
    let local = gang.gpus.len() as u64;
    let nranks = plan.nodes * local;
    let mut config = nonblocking_config();
    gang.comms = vec![std::ptr::null_mut(); gang.gpus.len()];
    // SAFETY: no arguments.
    gang.check("ncclGroupStart", unsafe { (gang.nccl.group_start.get())() })?;
    for (g, gpu) in gang.gpus.iter().enumerate() {
        // NCCL takes the device from the calling thread's current context (src/init.cc).
        gang.driver
            .make_current(gpu)
            .map_err(|e| Stop::Error(e.to_string()))?;
        let rank = plan.node_rank * local + g as u64;
        // SAFETY: `comms[g]` is an out-pointer; the id is passed by value; the config
        // outlives the call (NCCL copies it).
        let rc = unsafe {
            (gang.nccl.init.get())(
                &mut gang.comms[g],
                nranks as c_int,
                id,
                rank as c_int,
                &mut config,
            )
        };
        if rc != SUCCESS && rc != IN_PROGRESS {
            // SAFETY: closes the group opened above.
            unsafe { (gang.nccl.group_end.get())() };
            return Err(gang.nccl_error(
                &format!("ncclCommInitRankConfig(rank {rank} of {nranks})"),
                rc,
            ));
        }
    }
    // SAFETY: no arguments.
    gang.check("ncclCommInitRankConfig", unsafe {
        (gang.nccl.group_end.get())()
    })?;
    gang.wait("joining", false)?;
    shared.update(|r| {
        r.joined = true;
        r.join_seconds = Some(started.elapsed().as_secs_f64());
    });
    match plan.phase {
        Phase::Consistency => exchange(gang, plan, shared)?,
        Phase::Bandwidth => measure(gang, plan, shared)?,
    }
    // A last tiny all-reduce as a barrier: no rank leaves while a peer still needs it.
    shared.update(|r| r.stage = "final barrier".into());
    barrier(gang)?;
    shared.update(|r| {
        r.done = true;
        r.stage = "done".into();
    });
    Ok(())
}

fn alloc<'d>(
    gang: &Gang<'d>,
    gpu: &Gpu,
    bytes: usize,
) -> Result<crate::bench::driver::DeviceBuffer<'d, 'd>, Stop> {
    gang.driver
        .alloc(gpu, bytes.max(8))
        .map_err(|e| Stop::Error(e.to_string()))
}

fn read(gang: &Gang<'_>, src: &DeviceBuffer<'_, '_>, out: &mut [u8]) -> Result<(), Stop> {
    gang.driver
        .read_back(src.all(), out)
        .map_err(|e| Stop::Error(e.to_string()))
}

fn barrier(gang: &Gang<'_>) -> Result<(), Stop> {
    let bufs = gang
        .gpus
        .iter()
        .map(|gpu| alloc(gang, gpu, 8))
        .collect::<Result<Vec<_>, _>>()?;
    gang.group("the final barrier all-reduce", |g| {
        // SAFETY: an 8-byte device buffer on GPU g; its communicator and stream.
        unsafe {
            (gang.nccl.all_reduce.get())(
                bufs[g].device_ptr(),
                bufs[g].device_ptr(),
                1,
                FLOAT64,
                MAX,
                gang.comms[g],
                gang.gpus[g].stream,
            )
        }
    })
}

/// The fingerprint all-gather: every rank sends its pod's record.
fn exchange(gang: &Gang<'_>, plan: &Plan, shared: &Shared) -> Result<(), Stop> {
    shared.update(|r| r.stage = "fingerprint all-gather".into());
    let record = handle::from_hex(&plan.fingerprint)
        .ok_or_else(|| Stop::Error("gang-worker: the fingerprint is not hex".into()))?;
    let n = plan.nodes as usize;
    let local = gang.gpus.len();
    let mut bufs = Vec::new();
    for gpu in gang.gpus {
        let send = alloc(gang, gpu, record.len())?;
        let recv = alloc(gang, gpu, record.len() * n * local)?;
        gang.upload(gpu, &send, &record)?;
        bufs.push((send, recv));
    }
    gang.group("the fingerprint all-gather", |g| {
        // SAFETY: send holds one record, recv one per rank, both on GPU g.
        unsafe {
            (gang.nccl.all_gather.get())(
                bufs[g].0.device_ptr(),
                bufs[g].1.device_ptr(),
                record.len(),
                UINT8,
                gang.comms[g],
                gang.gpus[g].stream,
            )
        }
    })?;
    let mut all = vec![0u8; record.len() * n * local];
    read(gang, &bufs[0].1, &mut all)?;
    // Ranks of one pod carry the same record: node i's is rank i x local's.
    let records: Vec<String> = (0..n)
        .map(|i| {
            let at = i * local * record.len();
            handle::to_hex(&all[at..at + record.len()])
        })
        .collect();
    shared.update(|r| r.fingerprints = records);
    Ok(())
}

/// Element-wise max over every rank of `values` (f64).
fn max_over_ranks(gang: &Gang<'_>, values: &[f64], what: &str) -> Result<Vec<f64>, Stop> {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_ne_bytes()).collect();
    let bufs = gang
        .gpus
        .iter()
        .map(|gpu| {
            let b = alloc(gang, gpu, bytes.len())?;
            gang.upload(gpu, &b, &bytes)?;
            Ok(b)
        })
        .collect::<Result<Vec<_>, Stop>>()?;
    gang.group(what, |g| {
        // SAFETY: `values.len()` doubles on GPU g, reduced in place.
        unsafe {
            (gang.nccl.all_reduce.get())(
                bufs[g].device_ptr(),
                bufs[g].device_ptr(),
                values.len(),
                FLOAT64,
                MAX,
                gang.comms[g],
                gang.gpus[g].stream,
            )
        }
    })?;
    let mut out = vec![0u8; bytes.len()];
    read(gang, &bufs[0], &mut out)?;
    Ok(out
        .chunks(8)
        .map(|c| f64::from_ne_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
        .collect())
}

/// All-reduce busbw at each size, then the pairwise rounds.
fn measure(gang: &Gang<'_>, plan: &Plan, shared: &Shared) -> Result<(), Stop> {
    let local = gang.gpus.len();
    let n = plan.nodes as usize;
    let nranks = (n * local) as u64;
    let largest = plan
        .sizes
        .iter()
        .copied()
        .max()
        .unwrap_or(4)
        .max(plan.p2p_bytes) as usize;
    let mut bufs = Vec::new();
    for gpu in gang.gpus {
        bufs.push((alloc(gang, gpu, largest)?, alloc(gang, gpu, largest)?));
    }
    let iterations = plan.iterations.max(1);
    let mut times = Vec::new();
    for &bytes in &plan.sizes {
        shared.update(|r| r.stage = format!("all-reduce of {bytes} bytes"));
        let count = bytes as usize / 4;
        let op = |g: usize| {
            // SAFETY: both buffers hold `largest` >= count x 4 bytes on GPU g.
            unsafe {
                (gang.nccl.all_reduce.get())(
                    bufs[g].0.device_ptr(),
                    bufs[g].1.device_ptr(),
                    count,
                    FLOAT32,
                    SUM,
                    gang.comms[g],
                    gang.gpus[g].stream,
                )
            }
        };
        gang.group("a warm-up all-reduce", op)?;
        let t0 = Instant::now();
        for _ in 0..iterations {
            gang.group("an all-reduce", op)?;
        }
        times.push(t0.elapsed().as_secs_f64() / f64::from(iterations));
    }
    // The slowest rank's time (nccl-tests averages; a straggler's view is the max).
    let slowest = max_over_ranks(gang, &times, "the all-reduce time exchange")?;
    let rows: Vec<SizeRow> = plan
        .sizes
        .iter()
        .zip(&slowest)
        .map(|(&b, &t)| super::verdict::size_row(b, t, nranks))
        .collect();
    shared.update(|r| r.allreduce = rows);
    // Pairwise rounds (`verdict::schedule`): in each round the nodes meet in
    // disjoint pairs and both ends of a pair send to and receive from each other in
    // one group, GPU g to GPU g (rail-aligned), so a round's time is that link's
    // alone. One untimed warm-up per round: NCCL connects p2p peers lazily (since
    // v2.22.3-1), and the warm-up cannot end before the partner has finished its
    // previous round, which lines the pair up before the timed exchanges. A node
    // that sits the round out (odd N) records 0.
    let schedule = super::verdict::schedule(n);
    let mut rounds = vec![0f64; schedule.len().max(1)];
    let node = plan.node_rank as usize;
    let p2p = plan.p2p_bytes as usize;
    for (r, slot) in rounds.iter_mut().enumerate().take(schedule.len()) {
        let Some(peer) = super::verdict::partner(n, r, node) else {
            continue;
        };
        shared.update(|res| res.stage = format!("pairwise round {} with node {peer}", r + 1));
        let op = |g: usize| {
            let peer = (peer * local + g) as c_int;
            // SAFETY: both buffers hold `largest` >= p2p bytes on GPU g; send and receive
            // sit in one group, so the two ends of the pair do not deadlock.
            unsafe {
                let rc = (gang.nccl.send.get())(
                    bufs[g].0.device_ptr(),
                    p2p,
                    UINT8,
                    peer,
                    gang.comms[g],
                    gang.gpus[g].stream,
                );
                if rc != SUCCESS && rc != IN_PROGRESS {
                    return rc;
                }
                (gang.nccl.recv.get())(
                    bufs[g].1.device_ptr(),
                    p2p,
                    UINT8,
                    peer,
                    gang.comms[g],
                    gang.gpus[g].stream,
                )
            }
        };
        gang.group("a warm-up pairwise exchange", op)?;
        let t0 = Instant::now();
        for _ in 0..iterations {
            gang.group("a pairwise exchange", op)?;
        }
        *slot = t0.elapsed().as_secs_f64() / f64::from(iterations);
    }
    // Every node's round times to every rank: an all-gather of R doubles per rank.
    let bytes: Vec<u8> = rounds.iter().flat_map(|v| v.to_ne_bytes()).collect();
    let mut gathered = Vec::new();
    for gpu in gang.gpus {
        let send = alloc(gang, gpu, bytes.len())?;
        let recv = alloc(gang, gpu, bytes.len() * n * local)?;
        gang.upload(gpu, &send, &bytes)?;
        gathered.push((send, recv));
    }
    gang.group("the round-time all-gather", |g| {
        // SAFETY: send holds R doubles, recv R per rank, on GPU g.
        unsafe {
            (gang.nccl.all_gather.get())(
                gathered[g].0.device_ptr(),
                gathered[g].1.device_ptr(),
                bytes.len(),
                UINT8,
                gang.comms[g],
                gang.gpus[g].stream,
            )
        }
    })?;
    let mut all = vec![0u8; bytes.len() * n * local];
    read(gang, &gathered[0].1, &mut all)?;
    let per_node: Vec<Vec<f64>> = (0..n)
        .map(|i| {
            let at = i * local * bytes.len();
            all[at..at + bytes.len()]
                .chunks(8)
                .map(|c| f64::from_ne_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                .collect()
        })
        .collect();
    shared.update(|r| r.round_seconds = per_node);
    Ok(())
}
