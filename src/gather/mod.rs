//! gather: the only stage that touches the host. Reads files under `Host`,
//! makes syscalls through `Kernel`, takes the environment as an argument, and
//! returns `Facts`.

pub mod environment;
pub mod gpu;
pub mod host;
pub mod kernel;
pub mod memlock;
pub mod namespaces;
pub mod nccl_files;
pub mod netlink;
pub mod network;
pub mod platform;
pub mod rdma;
pub mod reader;
pub mod replay;
pub mod shm;
pub mod trainer_path;

use crate::facts::{FACTS_SCHEMA, FactError, Facts};
use host::Host;
use kernel::{Kernel, LimitKind};
use std::ffi::OsString;

/// How loading and initialising one vendor library ended: not there (dlerror's
/// message), there but failing (the call and its error), or loaded with what it saw.
/// One type for NVML, libcuda, libibverbs and libfabric.
pub enum Outcome<T> {
    NotFound(String),
    Failed(FactError),
    Loaded(T),
}

/// What an earlier run found in the image's libraries, used instead of loading them
/// again: libibverbs, libfabric, libnccl and its net plugin (`rdma::Probed`), and
/// the CUDA runtime. `serve` probes them once (in a child process, see
/// `serve::probe`) and reuses the answer on every later interval: an image's files do
/// not change while the pod lives.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Probed {
    pub rdma: rdma::Probed,
    /// `None`: the runtime was not looked for, or its probe did not finish; it is
    /// looked for again on the next run.
    pub cuda_runtime: Option<crate::facts::gpu::CudaRuntimeFacts>,
}

impl Probed {
    /// The library facts of a run, when every RDMA and NCCL library answered (see
    /// `rdma::Probed::settled`).
    pub fn settled(facts: &Facts) -> Option<Probed> {
        Some(Probed {
            rdma: rdma::Probed::settled(&facts.rdma)?,
            cuda_runtime: facts
                .gpus
                .cuda_runtime
                .skipped
                .is_none()
                .then(|| facts.gpus.cuda_runtime.clone()),
        })
    }
}

/// How to reach the vendor libraries.
#[derive(Debug, Clone)]
pub struct VendorOptions {
    pub gpu: gpu::GpuOptions,
    pub rdma: rdma::RdmaOptions,
    /// The image this runs in (`--image`), recorded in the facts.
    pub image: crate::facts::ImageRole,
}

/// Gathers every fact. Never fails: what could not be read is recorded as such.
/// The second value says whether a vendor call hung (see `deadline`). The GPU
/// and RDMA libraries are probed side by side.
pub fn gather(
    host: &Host,
    kernel: &dyn Kernel,
    env: &[(OsString, OsString)],
    vendor: &VendorOptions,
) -> (Facts, gpu::HungCall) {
    let ((gpus, gpu_hung), (rdma, rdma_hung)) = std::thread::scope(|scope| {
        // A process that cannot start a thread (its own RLIMIT_AS or RLIMIT_NPROC exhausted)
        // probes one after the other instead of panicking: that is this process's limit, not
        // the node's fault.
        let rdma = std::thread::Builder::new()
            .name("rdma-wait".into())
            .spawn_scoped(scope, || rdma::gather(host, &vendor.rdma));
        let gpus = gpu::gather(host, &vendor.gpu);
        let rdma = match rdma {
            // rdma::gather returns on its own deadline; a panic inside it is a bug reported as a hang.
            Ok(handle) => handle.join().unwrap_or_else(|_| {
                let e = crate::facts::FactError::new("rdma", "the RDMA probe panicked");
                (rdma::failed_facts(host, e), true)
            }),
            Err(_) => rdma::gather(host, &vendor.rdma),
        };
        (gpus, rdma)
    });
    let hung = gpu::HungCall(gpu_hung.0 || rdma_hung);
    let namespaces = namespaces::gather(host);
    let network = network::gather(
        host,
        kernel,
        namespaces.hostname.value().map(String::as_str),
    );
    let (launcher, nccl_env) = environment::split(env);
    let mut facts = Facts {
        schema: FACTS_SCHEMA.to_string(),
        tool_version: env!("CARGO_PKG_VERSION").to_string(),
        host_root: host.root().display().to_string(),
        memlock: memlock::gather(host, kernel),
        stack_limit: kernel.rlimit(LimitKind::Stack).into(),
        dev_shm: shm::gather(host, kernel),
        namespaces,
        network,
        platform: platform::gather(host),
        rdma,
        gpus,
        launcher,
        nccl_env,
        image: vendor.image,
        nccl_files: Default::default(),
        nodes: None,
    };
    // A relative file name is relative to the working directory, as NCCL's fopen sees it.
    let working_dir = std::env::current_dir().unwrap_or_else(|_| "/".into());
    let home = env
        .iter()
        .find(|(k, _)| k == "HOME")
        .and_then(|(_, v)| v.to_str());
    nccl_files::gather(host, &mut facts, home, &working_dir);
    (facts, hung)
}
