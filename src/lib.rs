//! nccl-preflight: checks a GPU node or pod for what breaks or slows NCCL and
//! writes tuned NCCL settings.
//!
//! The pipeline is vendor -> gather -> predict -> judge -> tune -> render. `vendor` loads
//! and calls the vendor libraries (nothing else does); `gather` reads the host into
//! `Facts`; predict, judge, tune, render, explain and the domain modules are pure
//! functions over data. The host is also touched at the edges: `output` writes files, `run`
//! opens inputs and bounds child processes, `child` runs this binary as a child that
//! answers in frames (early ones, then its reply), and the commands that act spawn
//! children, bind sockets and resolve names (`bench`, `serve`, `gang`, `commands`).
//! tests/integration/layering.rs parses the code and holds this line to what it finds:
//! Touch the host: `vendor`, `gather`, `output`, `run`, `child`, `kube`, `config`, `bench`, `serve`, `gang`, `webhook`, `commands`.
//!
//! A module is public here only when main.rs, tests/integration or a doctest names it,
//! so rustc's dead_code lint sees every other module's `pub` items
//! (tests/integration/visibility.rs holds it).

pub mod bench;
mod child;
pub mod cli;
pub mod commands;
pub mod config;
pub mod diagnostic;
pub mod explain;
pub mod facts;
pub mod finding;
pub mod gang;
mod gather;
mod judge;
mod kube;
mod layout;
pub mod nccl;
mod output;
mod platform;
mod policy;
mod predict;
mod remediation;
mod render;
mod report;
pub mod run;
pub mod serve;
mod topology;
mod tune;
mod units;
mod vendor;
pub mod webhook;

/// Facts for unit tests: the lent 2x H200 node and variations, shared by every stage's tests.
#[cfg(test)]
pub(crate) mod test_facts;
