//! How NCCL itself reads things, reimplemented from its source so checks and
//! tuning predict what NCCL will do rather than guess.

pub mod bootstrap;
pub mod catalog;
pub(crate) mod conf_file;
pub(crate) mod ib_hca;
pub(crate) mod interface;
pub mod net_plugin;
pub(crate) mod ras_diagnostics;
pub(crate) mod socket_ifname;
pub(crate) mod version;

pub use version::Version;

/// The version of the libnccl the trainer will load.
pub(crate) fn version(facts: &crate::facts::Facts) -> Option<Version> {
    Version::parse(facts.rdma.nccl.library.loaded()?.version.value()?)
}
