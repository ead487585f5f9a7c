//! How NCCL itself reads things, reimplemented from its source so checks and
//! tuning predict what NCCL will do rather than guess.

pub mod bootstrap;
pub mod catalog;
pub(crate) mod conf_file;
pub(crate) mod ib_hca;
pub(crate) mod interface;
pub mod net_plugin;
pub(crate) mod ras_diagnostics;
pub(crate) mod roles;
pub(crate) mod socket_ifname;

/// The version of the libnccl the trainer will load, as (major, minor, patch).
pub(crate) fn version(facts: &crate::facts::Facts) -> Option<(u32, u32, u32)> {
    let v = facts.rdma.nccl.library.loaded()?.version.value()?;
    let mut parts = v.split('.').map(|p| p.parse::<u32>().ok());
    Some((parts.next()??, parts.next()??, parts.next()??))
}
