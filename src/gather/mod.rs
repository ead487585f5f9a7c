//! gather: the only stage that touches the host. Reads files under `Host`,
//! makes syscalls through `Kernel`, takes the environment as an argument, and
//! returns `Facts`.

pub mod deadline;
pub mod environment;
pub mod gpu;
pub mod host;
pub mod kernel;
pub mod memlock;
pub mod namespaces;
pub mod netlink;
pub mod network;
pub mod platform;
pub mod replay;
pub mod shm;

use crate::facts::{FACTS_SCHEMA, Facts};
use host::Host;
use kernel::{Kernel, LimitKind};
use std::ffi::OsString;

/// Gathers every fact. Never fails: what could not be read is recorded as such.
/// The second value says whether a vendor call hung (see `deadline`).
pub fn gather(
    host: &Host,
    kernel: &dyn Kernel,
    env: &[(OsString, OsString)],
    gpu_options: &gpu::GpuOptions,
) -> (Facts, gpu::HungCall) {
    let (gpus, hung) = gpu::gather(host, gpu_options);
    let namespaces = namespaces::gather(host);
    let network = network::gather(
        host,
        kernel,
        namespaces.hostname.value().map(String::as_str),
    );
    let (launcher, nccl_env) = environment::split(env);
    let facts = Facts {
        schema: FACTS_SCHEMA.to_string(),
        tool_version: env!("CARGO_PKG_VERSION").to_string(),
        host_root: host.root().display().to_string(),
        memlock: memlock::gather(host, kernel),
        stack_limit: kernel.rlimit(LimitKind::Stack).into(),
        dev_shm: shm::gather(host, kernel),
        namespaces,
        network,
        platform: platform::gather(host),
        rdma: platform::gather_rdma(host),
        gpus,
        launcher,
        nccl_env,
    };
    (facts, hung)
}
