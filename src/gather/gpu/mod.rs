//! GPU gathering: NVML and the CUDA driver, each on its own thread under the
//! per-call deadline (they run side by side: cuInit alone can take a second),
//! plus the GPUs sysfs lists.

pub mod cuda;
pub mod cudart;
pub mod nvml;
pub mod pci;

use crate::facts::FactError;
use crate::facts::gpu::{GpuFacts, Library, LibraryState};
use crate::gather::host::Host;
use crate::vendor::deadline::{self, Hung};
use std::time::Duration;

/// Where IMEX channel device nodes live: the NVIDIA driver creates them (nvidia-caps-imex-channels
/// in /proc/devices), and a container gets the ones its runtime or the DRA driver's ComputeDomain
/// passes in (NVIDIA IMEX guide, "IMEX channels").
const IMEX_CHANNELS: &str = "/dev/nvidia-caps-imex-channels";

/// Where to load the vendor libraries from, and the per-call deadline.
#[derive(Debug, Clone)]
pub struct GpuOptions {
    pub nvml_library: String,
    pub cuda_library: String,
    pub call_timeout: Duration,
    /// Print each vendor call's duration to standard error.
    pub trace: bool,
    /// Probe the CUDA driver (cuInit costs ~0.5 s even on a warm node), here or in
    /// another process.
    pub cuda: CudaProbe,
    /// Also read what is shown but judged by no check and costs per-call NVML reads:
    /// every NVLink's CRC data counter (no field gives it: ~1 ms a link on the H200,
    /// 37 ms for 2 GPUs) and the NUMA affinity doctor prints (~8 ms a GPU). `doctor`,
    /// `facts` and `serve` read them; the gates and `bench` leave them out.
    pub unjudged: bool,
    /// Where to look for the image's CUDA runtime (`cudart::locations`), or why not
    /// (nccl-preflight's own image holds no trainer's runtime).
    pub cudart: Result<Vec<cudart::Candidate>, String>,
    /// What an earlier run found of the CUDA runtime (`serve`'s later runs): used
    /// instead of looking again.
    pub cudart_probed: Option<crate::facts::gpu::CudaRuntimeFacts>,
}

/// Where the CUDA driver's facts come from.
#[derive(Debug, Clone, Default)]
pub enum CudaProbe {
    /// Not asked (`--cuda off`).
    Off,
    /// This process loads libcuda and calls cuInit.
    #[default]
    Here,
    /// Another process that will use CUDA anyway reads them (`init --bench`'s bench,
    /// so that one cuInit serves both: two at once cost twice, `bench::child`).
    Elsewhere(Elsewhere),
}

/// The CUDA facts' source in another process: called once, on the CUDA thread, it
/// waits for them within its own bound and says what happened as the probe here
/// would (`Err` when the driver call did not return in time).
#[derive(Clone)]
pub struct Elsewhere(std::sync::Arc<std::sync::Mutex<Option<ElsewhereFn>>>);

type ElsewhereFn = Box<dyn FnOnce() -> Result<cuda::Outcome, Hung> + Send>;

impl Elsewhere {
    pub fn new(source: impl FnOnce() -> Result<cuda::Outcome, Hung> + Send + 'static) -> Self {
        Elsewhere(std::sync::Arc::new(std::sync::Mutex::new(Some(Box::new(
            source,
        )))))
    }

    fn take(&self) -> Result<cuda::Outcome, Hung> {
        let source = self.0.lock().unwrap_or_else(|p| p.into_inner()).take();
        match source {
            Some(f) => f(),
            None => Ok(cuda::Outcome::Failed(FactError::new(
                "the CUDA facts of another process",
                "already taken by an earlier gather",
            ))),
        }
    }
}

impl std::fmt::Debug for Elsewhere {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Elsewhere")
    }
}

/// True when a vendor call hung: the process must then leave with `_exit`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct HungCall(pub bool);

fn hung_fact(h: &Hung) -> FactError {
    if h.not_started {
        return own_resources(&h.call);
    }
    FactError::new(
        h.call.clone(),
        format!(
            "did not return within {:.1} s: the driver or a GPU is hung (check dmesg for Xid errors)",
            h.deadline.as_secs_f64()
        ),
    )
    .with_kind(crate::facts::FailureKind::Timeout)
}

/// A library that could not be mapped for lack of memory (dlopen's "Cannot allocate memory"
/// under a small `ulimit -v`) failed for this process's limits, not because the driver
/// libraries are wrong.
fn mark_own_resources(e: FactError) -> FactError {
    if e.source.starts_with("dlopen") && e.message.contains("Cannot allocate memory") {
        e.with_kind(crate::facts::FailureKind::OwnResources)
    } else {
        e
    }
}

/// This process could not start a thread: its own limits, not the node's fault.
pub fn own_resources(call: &str) -> FactError {
    FactError::new(
        call,
        "this process ran out of its own resources (its address-space or thread limit: ulimit -v / -u, \
         or the container's pids limit); nothing is known about the GPUs",
    )
    .with_kind(crate::facts::FailureKind::OwnResources)
}

fn nvml_state(
    r: Result<nvml::Outcome, Hung>,
    hung: &mut bool,
) -> LibraryState<crate::facts::gpu::NvmlFacts> {
    match r {
        Ok(nvml::Outcome::NotFound(message)) => LibraryState::NotFound { message },
        Ok(nvml::Outcome::Failed(e)) => LibraryState::Failed(mark_own_resources(e)),
        Ok(nvml::Outcome::Loaded(f)) => LibraryState::Loaded(f),
        Err(h) => {
            *hung |= !h.not_started;
            LibraryState::Failed(hung_fact(&h))
        }
    }
}

fn cuda_state(
    r: Result<cuda::Outcome, Hung>,
    hung: &mut bool,
) -> LibraryState<crate::facts::gpu::CudaFacts> {
    match r {
        Ok(cuda::Outcome::NotFound(message)) => LibraryState::NotFound { message },
        Ok(cuda::Outcome::Failed(e)) => LibraryState::Failed(mark_own_resources(e)),
        Ok(cuda::Outcome::Loaded(f)) => LibraryState::Loaded(f),
        Err(h) => {
            *hung |= !h.not_started;
            LibraryState::Failed(hung_fact(&h))
        }
    }
}

/// The image's CUDA runtimes: those an earlier run found (`cudart_probed`), else probed
/// under the deadline (`hung` set when the probe hung).
fn cuda_runtime(options: &GpuOptions, hung: &mut bool) -> crate::facts::gpu::CudaRuntimeFacts {
    let (timeout, trace) = (options.call_timeout, options.trace);
    match (&options.cudart_probed, &options.cudart) {
        (Some(known), _) => known.clone(),
        (None, Err(reason)) => crate::facts::gpu::CudaRuntimeFacts::skipped(reason.clone()),
        (None, Ok(candidates)) => {
            let candidates = candidates.clone();
            match deadline::run("cudart", timeout, trace, move |w| {
                cudart::gather(w, &candidates)
            }) {
                Ok(facts) => facts,
                Err(h) => {
                    *hung |= !h.not_started;
                    let mut facts = crate::facts::gpu::CudaRuntimeFacts::skipped(
                        "the CUDA runtime probe did not finish",
                    );
                    facts.attempts.push(hung_fact(&h).to_string());
                    facts
                }
            }
        }
    }
}

/// The IMEX channel device nodes in this container (`IMEX_CHANNELS`).
fn imex_channels(host: &Host) -> crate::facts::Observed<Option<Vec<String>>> {
    host.list_dir(IMEX_CHANNELS)
        .map(|dir| {
            dir.map(|names| {
                names
                    .into_iter()
                    .filter(|n| n.starts_with("channel"))
                    .collect()
            })
        })
        .into()
}

pub fn gather(host: &Host, options: &GpuOptions) -> (GpuFacts, HungCall) {
    let timeout = options.call_timeout;
    let trace = options.trace;
    let cuda_library = options.cuda_library.clone();
    let probe = options.cuda.clone();
    // The CUDA waiter returns on its own deadline (or the other process's bound), so
    // joining it cannot hang.
    let cuda_waiter = (!matches!(probe, CudaProbe::Off)).then(|| {
        std::thread::Builder::new()
            .name("cuda-wait".into())
            .spawn(move || match probe {
                CudaProbe::Elsewhere(source) => source.take(),
                _ => deadline::run("cuda", timeout, trace, move |w| {
                    cuda::gather(w, &cuda_library)
                }),
            })
    });
    let (nvml_library, unjudged) = (options.nvml_library.clone(), options.unjudged);
    let nvml_result = deadline::run("nvml", timeout, trace, move |w| {
        nvml::gather(w, &nvml_library, unjudged)
    });
    let mut hung = false;
    let cuda_state = match cuda_waiter {
        None => LibraryState::Skipped {
            reason: "--cuda off".into(),
        },
        Some(Ok(handle)) => {
            let result = handle.join().unwrap_or_else(|_| {
                Err(Hung {
                    call: "the CUDA thread (it panicked)".into(),
                    deadline: Duration::ZERO,
                    not_started: false,
                })
            });
            cuda_state(result, &mut hung)
        }
        Some(Err(e)) => cuda_state(
            Err(Hung {
                call: format!("starting the CUDA thread ({e})"),
                deadline: Duration::ZERO,
                not_started: true,
            }),
            &mut hung,
        ),
    };
    let cuda_runtime = cuda_runtime(options, &mut hung);
    let facts = GpuFacts {
        nvml: Library {
            library: options.nvml_library.clone(),
            state: nvml_state(nvml_result, &mut hung),
        },
        cuda: Library {
            library: options.cuda_library.clone(),
            state: cuda_state,
        },
        pci_gpus: pci::gather(host),
        pci_nvswitches: pci::nvswitches(host),
        call_timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
        imex_channels: imex_channels(host),
        cuda_runtime,
    };
    (facts, HungCall(hung))
}
