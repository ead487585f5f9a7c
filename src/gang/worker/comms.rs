//! The worker's communicators: every local GPU's, driven in one NCCL group,
//! polled under the deadline and never synchronised (a non-blocking communicator
//! may answer ncclInProgress, src/group.cc), aborted together on a stop.

use super::Plan;
use super::budget::{from_bytes, to_bytes};
use crate::vendor::cuda::{DeviceBuffer, Driver, Gpu};
use crate::vendor::nccl::{
    Code, Comm, DataType, IN_PROGRESS, Nccl, Ranked, RedOp, SUCCESS, UniqueId,
};
use std::time::{Duration, Instant};

/// How often pending work is polled.
const POLL: Duration = Duration::from_millis(2);

/// Why a step stopped.
pub(super) enum Stop {
    Error(String),
    Timeout(String),
}

pub(super) struct Gang<'a> {
    pub nccl: &'a Nccl<'a, Ranked>,
    pub driver: &'a Driver<'a>,
    pub gpus: &'a [Gpu],
    pub comms: Vec<Comm>,
    pub deadline: Instant,
    pub grouped_abort: bool,
}

impl Gang<'_> {
    pub(super) fn nccl_error(&self, call: &str, rc: Code) -> Stop {
        let what = self.nccl.error_text(rc).unwrap_or_default();
        Stop::Error(format!("{call}: {what} ({rc})"))
    }

    pub(super) fn check(&self, call: &str, rc: Code) -> Result<(), Stop> {
        if rc == SUCCESS || rc == IN_PROGRESS {
            Ok(())
        } else {
            Err(self.nccl_error(call, rc))
        }
    }

    /// Polls every communicator's asynchronous state and every stream until all
    /// are done, one fails, or the deadline passes.
    pub(super) fn wait(&self, what: &str, streams: bool) -> Result<(), Stop> {
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
    pub(super) fn group(&self, what: &str, each: impl Fn(usize) -> Code) -> Result<(), Stop> {
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

    pub(super) fn upload(
        &self,
        gpu: &Gpu,
        dst: &DeviceBuffer<'_, '_>,
        bytes: &[u8],
    ) -> Result<(), Stop> {
        self.driver
            .upload(gpu, dst.all(), bytes)
            .map_err(|e| Stop::Error(e.to_string()))
    }

    /// Aborts every communicator (grouped where NCCL supports it).
    pub(super) fn abort(&mut self) {
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

/// Every local GPU's ncclCommInitRankConfig in one group, then polled until joined.
pub(super) fn join(gang: &mut Gang<'_>, plan: &Plan, id: UniqueId) -> Result<(), Stop> {
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

pub(super) fn alloc<'d>(
    gang: &Gang<'d>,
    gpu: &Gpu,
    bytes: usize,
) -> Result<DeviceBuffer<'d, 'd>, Stop> {
    gang.driver
        .alloc(gpu, bytes.max(8))
        .map_err(|e| Stop::Error(e.to_string()))
}

pub(super) fn read(
    gang: &Gang<'_>,
    src: &DeviceBuffer<'_, '_>,
    out: &mut [u8],
) -> Result<(), Stop> {
    gang.driver
        .read_back(src.all(), out)
        .map_err(|e| Stop::Error(e.to_string()))
}

/// One buffer per local GPU holding `bytes`.
pub(super) fn upload_all<'d>(
    gang: &Gang<'d>,
    bytes: &[u8],
) -> Result<Vec<DeviceBuffer<'d, 'd>>, Stop> {
    gang.gpus
        .iter()
        .map(|gpu| {
            let b = alloc(gang, gpu, bytes.len())?;
            gang.upload(gpu, &b, bytes)?;
            Ok(b)
        })
        .collect()
}

pub(super) fn barrier(gang: &Gang<'_>) -> Result<(), Stop> {
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
pub(super) fn gather_per_node(
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

/// Element-wise max over every rank of `values` (f64).
pub(super) fn max_over_ranks(
    gang: &Gang<'_>,
    values: &[f64],
    what: &str,
) -> Result<Vec<f64>, Stop> {
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

pub(super) type Pairs<'d> = [(DeviceBuffer<'d, 'd>, DeviceBuffer<'d, 'd>)];

/// Runs `op` once untimed, then `iterations` times; the mean time of one, seconds.
pub(super) fn timed(
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
