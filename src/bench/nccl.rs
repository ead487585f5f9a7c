//! `bench nccl`: one process drives every visible GPU through NCCL
//! (ncclCommInitAll), all-reduces a range of sizes and reports algbw and busbw
//! as nccl-tests computes them, with the transports NCCL's own log names.

use super::{Budget, gbps};
use crate::facts::FactError;
use crate::vendor::cuda::{DeviceBuffer, Driver, Gpu};
use crate::vendor::deadline::Watch;
use crate::vendor::nccl::{
    self as libnccl, Code, Comm, DataType, LoadFailure, Nccl, RedOp, SingleProcess,
};
use serde::Serialize;
use std::ffi::c_int;

type Api<'w> = Nccl<'w, SingleProcess>;
const WARMUP: u32 = 3;

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

/// Makes one NCCL call under `watch`; a failing code becomes an error naming the call.
fn call(
    api: &Api<'_>,
    watch: &Watch,
    call: impl Into<String>,
    f: impl FnOnce() -> Code,
) -> Result<(), FactError> {
    let call = call.into();
    let rc = watch.call(call.clone(), f);
    if rc == libnccl::SUCCESS {
        return Ok(());
    }
    let text = api
        .error_text(rc)
        .unwrap_or_else(|| String::from("unknown error"));
    Err(FactError::new(call, format!("{text} ({rc})")))
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
    /// Leave the communicators to the end of the process (`init`'s child, killed
    /// once it replied): ncclCommDestroy took 369 ms at 4 H100s.
    pub leave_comms: bool,
}

/// Runs the NCCL bench; `Ok(None)` when no NCCL library is installed.
pub fn run(
    driver: &Driver<'_>,
    watch: &Watch,
    gpus: &[Gpu],
    plan: &Plan<'_>,
    budget: &Budget,
) -> Option<NcclResult> {
    let api: Api<'_> = match libnccl::load(watch, plan.candidates) {
        Ok(api) => api,
        Err(LoadFailure::Missing(_)) => return None,
        Err(LoadFailure::Failed(e)) => {
            return Some(NcclResult {
                library: plan.candidates.first().cloned().unwrap_or_default(),
                error: Some(e),
                ..NcclResult::default()
            });
        }
    };
    let mut result = NcclResult {
        library: api.library().to_string(),
        gpus: gpus.len() as u32,
        ..NcclResult::default()
    };
    let mut code: c_int = 0;
    if call(&api, watch, "ncclGetVersion", || api.version(&mut code)).is_ok() {
        result.version = Some(crate::nccl::Version::code_text(code.into()));
    }
    if let Err(e) = all_reduces(driver, watch, &api, gpus, plan, budget, &mut result.sizes) {
        result.error = Some(e);
    }
    Some(result)
}

fn all_reduces(
    driver: &Driver<'_>,
    watch: &Watch,
    api: &Api<'_>,
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
    let mut comms = Vec::new();
    call(
        api,
        watch,
        format!("ncclCommInitAll({} GPUs)", gpus.len()),
        || {
            let (rc, made) = api.init_all(gpus.len());
            comms = made;
            rc
        },
    )?;
    let outcome = sizes(
        driver, watch, api, gpus, &comms, &buffers, plan, budget, out,
    );
    if plan.leave_comms {
        return outcome;
    }
    for (rank, comm) in comms.into_iter().enumerate() {
        let _ = call(api, watch, format!("ncclCommDestroy({rank})"), || {
            api.destroy(comm)
        });
    }
    outcome
}

type Buffers<'d, 'w> = [(DeviceBuffer<'d, 'w>, DeviceBuffer<'d, 'w>)];

/// Queues one all-reduce of `count` floats on every GPU, as one NCCL group.
fn group(
    watch: &Watch,
    api: &Api<'_>,
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
    call(api, watch, "ncclGroupStart", || api.group_start())?;
    for (rank, ((gpu, (send, recv)), comm)) in gpus.iter().zip(buffers).zip(comms).enumerate() {
        call(
            api,
            watch,
            format!("ncclAllReduce({rank}, {bytes} bytes)"),
            || api.all_reduce(send, recv, count, DataType::F32, RedOp::Sum, comm, gpu),
        )?;
    }
    call(api, watch, "ncclGroupEnd", || api.group_end())
}

#[allow(clippy::too_many_arguments)]
fn sizes(
    driver: &Driver<'_>,
    watch: &Watch,
    api: &Api<'_>,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contributions_sum_exactly_in_float32_for_every_gpu_count_up_to_a_rack() {
        // The result check compares with ==: the float32 sum must be exact, in the
        // order a ring adds it (rank by rank) as in any other.
        for n in 1..=72usize {
            let forward: f32 = (0..n).map(contribution).sum();
            let backward: f32 = (0..n).rev().map(contribution).sum();
            let want = (n * (n + 1) / 2) as f32;
            assert_eq!((forward, backward), (want, want), "{n} GPUs");
        }
    }
}
