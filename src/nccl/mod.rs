//! How NCCL itself reads things, reimplemented from its source so checks and
//! tuning predict what NCCL will do rather than guess.

pub mod catalog;
pub mod ib_hca;
pub mod net_plugin;
pub mod socket_ifname;
