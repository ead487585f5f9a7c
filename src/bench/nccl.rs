//! `bench nccl`: one process drives every visible GPU through NCCL
//! (ncclCommInitAll), all-reduces a range of sizes and reports algbw and busbw
//! as nccl-tests computes them, with the transports NCCL's own log names.

use super::driver::{Driver, Gpu};
use super::{Budget, gbps};
use crate::facts::FactError;
use crate::gather::deadline::Watch;
use crate::gather::dl::{Library, Symbol, is_missing};
use serde::Serialize;
use std::ffi::{CStr, c_char, c_int, c_void};

type Comm = *mut c_void;
type R = c_int;
const NCCL_FLOAT32: c_int = 7;
const NCCL_SUM: c_int = 0;
const WARMUP: u32 = 3;

struct Api {
    version: Symbol<unsafe extern "C" fn(*mut c_int) -> R>,
    init_all: Symbol<unsafe extern "C" fn(*mut Comm, c_int, *const c_int) -> R>,
    all_reduce: Symbol<
        unsafe extern "C" fn(
            *const c_void,
            *mut c_void,
            usize,
            c_int,
            c_int,
            Comm,
            *mut c_void,
        ) -> R,
    >,
    group_start: Symbol<unsafe extern "C" fn() -> R>,
    group_end: Symbol<unsafe extern "C" fn() -> R>,
    destroy: Symbol<unsafe extern "C" fn(Comm) -> R>,
    error_string: Symbol<unsafe extern "C" fn(R) -> *const c_char>,
}

/// One all-reduce size.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SizeResult {
    pub bytes: u64,
    pub iterations: u32,
    /// Mean time per all-reduce, microseconds (the slowest GPU's).
    pub time_us: f64,
    /// bytes / time, GB/s.
    pub algbw_gbps: f64,
    /// algbw x 2(n-1)/n, as nccl-tests reports it.
    pub busbw_gbps: f64,
    /// The first and last elements of every GPU's result held the expected sum.
    pub verified: bool,
}

#[derive(Debug, Clone, Serialize, PartialEq, Default)]
pub struct NcclResult {
    pub library: String,
    pub version: Option<String>,
    pub gpus: u32,
    pub sizes: Vec<SizeResult>,
    /// Connections NCCL logged, by transport (from its NCCL_DEBUG=INFO output).
    pub transports: std::collections::BTreeMap<String, u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<FactError>,
}

fn load(watch: &Watch, candidates: &[String]) -> Result<Option<(Api, String)>, FactError> {
    let mut missing = true;
    let mut last = None;
    for name in candidates {
        match watch.call(format!("dlopen({name})"), || Library::open(name)) {
            Ok(lib) => {
                let api = Api {
                    version: lib.symbol("ncclGetVersion")?,
                    init_all: lib.symbol("ncclCommInitAll")?,
                    all_reduce: lib.symbol("ncclAllReduce")?,
                    group_start: lib.symbol("ncclGroupStart")?,
                    group_end: lib.symbol("ncclGroupEnd")?,
                    destroy: lib.symbol("ncclCommDestroy")?,
                    error_string: lib.symbol("ncclGetErrorString")?,
                };
                // NCCL starts threads; it stays loaded.
                std::mem::forget(lib);
                return Ok(Some((api, name.clone())));
            }
            Err(e) => {
                missing &= is_missing(name, &e.message);
                last = Some(e);
            }
        }
    }
    match last {
        Some(e) if !missing => Err(e),
        _ => Ok(None),
    }
}

impl Api {
    fn run(
        &self,
        watch: &Watch,
        call: impl Into<String>,
        f: impl FnOnce() -> R,
    ) -> Result<(), FactError> {
        let call = call.into();
        let rc = watch.call(call.clone(), f);
        if rc == 0 {
            return Ok(());
        }
        // SAFETY: ncclGetErrorString returns a static string for any code.
        let text = unsafe { (self.error_string.get())(rc) };
        let text = if text.is_null() {
            String::from("unknown error")
        } else {
            // SAFETY: a NUL-terminated static string.
            unsafe { CStr::from_ptr(text) }
                .to_string_lossy()
                .into_owned()
        };
        Err(FactError::new(call, format!("{text} ({rc})")))
    }
}

/// The value every element of GPU `rank`'s send buffer holds; the sum over n
/// ranks is n(n+1)/2, exact in float32 for any GPU count.
fn contribution(rank: usize) -> f32 {
    (rank + 1) as f32
}

/// What the bench loop needs besides the driver.
pub struct Plan<'a> {
    pub candidates: &'a [String],
    pub sizes: &'a [u64],
    pub iterations: u32,
}

/// Runs the NCCL bench; `Ok(None)` when no NCCL library is installed.
pub fn run(
    driver: &Driver<'_>,
    watch: &Watch,
    gpus: &[Gpu],
    plan: &Plan<'_>,
    budget: &Budget,
) -> Option<NcclResult> {
    let (api, library) = match load(watch, plan.candidates) {
        Ok(Some(found)) => found,
        Ok(None) => return None,
        Err(e) => {
            return Some(NcclResult {
                library: plan.candidates.first().cloned().unwrap_or_default(),
                error: Some(e),
                ..NcclResult::default()
            });
        }
    };
    let mut result = NcclResult {
        library,
        gpus: gpus.len() as u32,
        ..NcclResult::default()
    };
    let mut code: c_int = 0;
    // SAFETY: out-pointer to an int.
    if api
        .run(watch, "ncclGetVersion", || unsafe {
            (api.version.get())(&mut code)
        })
        .is_ok()
    {
        result.version = Some(crate::gather::rdma::nccl::version_text(code));
    }
    if let Err(e) = all_reduces(driver, watch, &api, gpus, plan, budget, &mut result.sizes) {
        result.error = Some(e);
    }
    Some(result)
}

fn all_reduces(
    driver: &Driver<'_>,
    watch: &Watch,
    api: &Api,
    gpus: &[Gpu],
    plan: &Plan<'_>,
    budget: &Budget,
    out: &mut Vec<SizeResult>,
) -> Result<(), FactError> {
    let largest = plan.sizes.iter().copied().max().unwrap_or(0) as usize;
    let mut buffers = Vec::new();
    for (rank, gpu) in gpus.iter().enumerate() {
        let send = driver.alloc(gpu, largest)?;
        let recv = driver.alloc(gpu, largest)?;
        driver.fill(gpu, send.words(), contribution(rank).to_bits())?;
        driver.sync(gpu)?;
        buffers.push((send, recv));
    }
    let mut comms: Vec<Comm> = vec![std::ptr::null_mut(); gpus.len()];
    // SAFETY: `comms` has room for one communicator per GPU; a null device list means 0..n-1.
    api.run(
        watch,
        format!("ncclCommInitAll({} GPUs)", gpus.len()),
        || unsafe {
            (api.init_all.get())(comms.as_mut_ptr(), gpus.len() as c_int, std::ptr::null())
        },
    )?;
    let outcome = sizes(
        driver, watch, api, gpus, &comms, &buffers, plan, budget, out,
    );
    for (rank, comm) in comms.iter().enumerate() {
        // SAFETY: a communicator from ncclCommInitAll, destroyed once.
        let _ = api.run(watch, format!("ncclCommDestroy({rank})"), || unsafe {
            (api.destroy.get())(*comm)
        });
    }
    outcome
}

type Buffers<'d, 'w> = [(
    super::driver::DeviceBuffer<'d, 'w>,
    super::driver::DeviceBuffer<'d, 'w>,
)];

/// Queues one all-reduce of `count` floats on every GPU, as one NCCL group.
fn group(
    watch: &Watch,
    api: &Api,
    gpus: &[Gpu],
    comms: &[Comm],
    buffers: &Buffers<'_, '_>,
    count: usize,
) -> Result<(), FactError> {
    // Checked before the group opens, so an error never leaves one half-queued.
    let bytes = count.saturating_mul(4);
    for (rank, (send, recv)) in buffers.iter().enumerate() {
        let held = send.len().min(recv.len());
        if bytes > held {
            return Err(FactError::new(
                format!("ncclAllReduce({rank}, {bytes} bytes)"),
                format!("the buffers hold {held} bytes"),
            ));
        }
    }
    // SAFETY: no arguments.
    api.run(watch, "ncclGroupStart", || unsafe {
        (api.group_start.get())()
    })?;
    for (rank, gpu) in gpus.iter().enumerate() {
        let (send, recv) = &buffers[rank];
        // SAFETY: both buffers hold at least `count` floats on this GPU (checked above); the
        // stream is this GPU's.
        api.run(
            watch,
            format!("ncclAllReduce({rank}, {bytes} bytes)"),
            || unsafe {
                (api.all_reduce.get())(
                    send.device_ptr() as *const c_void,
                    recv.device_ptr() as *mut c_void,
                    count,
                    NCCL_FLOAT32,
                    NCCL_SUM,
                    comms[rank],
                    gpu.stream,
                )
            },
        )?;
    }
    // SAFETY: no arguments.
    api.run(watch, "ncclGroupEnd", || unsafe { (api.group_end.get())() })
}

#[allow(clippy::too_many_arguments)]
fn sizes(
    driver: &Driver<'_>,
    watch: &Watch,
    api: &Api,
    gpus: &[Gpu],
    comms: &[Comm],
    buffers: &Buffers<'_, '_>,
    plan: &Plan<'_>,
    budget: &Budget,
    out: &mut Vec<SizeResult>,
) -> Result<(), FactError> {
    let n = gpus.len();
    let want = (n * (n + 1) / 2) as f32;
    for &bytes in plan.sizes {
        budget.check()?;
        let count = bytes as usize / 4;
        for _ in 0..WARMUP {
            group(watch, api, gpus, comms, buffers, count)?;
        }
        let mut events = Vec::new();
        for gpu in gpus {
            let (start, end) = (driver.event(gpu)?, driver.event(gpu)?);
            driver.record(start, gpu)?;
            events.push((start, end));
        }
        for _ in 0..plan.iterations {
            group(watch, api, gpus, comms, buffers, count)?;
        }
        let mut slowest_ms = 0f64;
        for (gpu, (_, end)) in gpus.iter().zip(&events) {
            driver.make_current(gpu)?;
            driver.record(*end, gpu)?;
        }
        for (gpu, (start, end)) in gpus.iter().zip(&events) {
            slowest_ms = slowest_ms.max(driver.elapsed_ms(gpu, *start, *end)?);
        }
        let mut verified = true;
        for (_, recv) in buffers {
            let mut word = [0u8; 4];
            for at in [0, count.saturating_sub(1)] {
                driver.read_back(recv.slice(at * 4, 4)?, &mut word)?;
                verified &= f32::from_ne_bytes(word) == want;
            }
        }
        let per_op_ms = slowest_ms / f64::from(plan.iterations.max(1));
        let algbw = gbps(bytes as f64, per_op_ms);
        out.push(SizeResult {
            bytes,
            iterations: plan.iterations,
            time_us: per_op_ms * 1e3,
            algbw_gbps: algbw,
            busbw_gbps: algbw * 2.0 * (n as f64 - 1.0) / n as f64,
            verified,
        });
    }
    Ok(())
}
