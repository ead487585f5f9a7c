//! nccl-preflight: checks a GPU node or pod for what breaks or slows NCCL and
//! writes tuned NCCL settings.
//!
//! The pipeline is gather -> predict -> judge -> tune -> render: `gather` is the only
//! module that touches the host; the others are pure functions over `Facts`.

pub mod bench;
pub mod child;
pub mod cli;
pub mod commands;
pub mod diagnostic;
pub mod explain;
pub mod facts;
pub mod finding;
pub mod gang;
pub mod gather;
pub mod judge;
pub mod layout;
pub mod nccl;
pub mod output;
pub mod platform;
pub mod policy;
pub mod predict;
pub mod remediation;
pub mod render;
pub mod report;
pub mod run;
pub mod serve;
pub mod topology;
pub mod tune;
pub mod units;

/// Facts for unit tests: the lent 2x H200 node and variations, shared by every stage's tests.
#[cfg(test)]
pub(crate) mod test_facts;
