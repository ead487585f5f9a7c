//! serve's gathering, in a child process on every run. `serve` lives as long as the
//! pod, so what it maps and touches stays resident: loading libnccl (with libstdc++),
//! the CUDA runtime, libibverbs, libfabric and the net plugin in the server itself cost
//! 3.3 MB of resident memory for good on the 1x H200 (driver 580, NCCL 2.28.3), and ran
//! their constructors in it; on an RDMA node its memory registration would pin
//! `--memreg-size` in the server too; and the gathering's own code and NVML's (NVLink,
//! field values, P2P status) kept 1.1 MB more of the server resident on 4x H100
//! (tests/data/h100x4/serve-rss-run5).
//! So each run executes this same binary as `nccl-preflight facts-child` (`facts`, in
//! the child protocol of `crate::child`) with the server's environment, and the server
//! judges the facts it replies. Its request carries the server's gather flags and what an
//! earlier run found of the image's libraries (`gather::Probed`), so they are loaded
//! once, not on every run: an image's files do not change while the pod lives. A child
//! whose vendor call hung exits with `EXIT_NODE_FAULT` after its reply, and the server
//! stops its checks as when the call hung in it. A child that fails leaves the server
//! to gather itself for that run.

use crate::child::Ended;
use crate::cli::GatherArgs;
use crate::facts::Facts;
use crate::gather::Probed;
use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use std::ffi::OsString;
use std::time::Duration;

/// How long the child may take: its gather bounds every vendor call and file read by
/// `--timeout`, on a GPU thread and an RDMA thread side by side, each a chain of calls.
fn limit(args: &GatherArgs) -> Duration {
    args.timeout.saturating_mul(4) + Duration::from_secs(30)
}

/// What the gathering child is asked (the child protocol's request, `crate::child`).
#[derive(Debug, Serialize, Deserialize)]
pub struct Request {
    /// The server's gather flags, whole: the child gathers as the server would.
    pub gather: GatherArgs,
    /// Load every vendor library even where no device needs it (`--require rdma|efa`).
    pub probe_all: bool,
    /// The image's library facts of an earlier run, used instead of loading them again.
    pub probed: Option<Probed>,
}

/// What the gathering child replied.
pub struct Gathered {
    pub facts: Facts,
    /// A vendor call hung in the child (it exited with `EXIT_NODE_FAULT`).
    pub hung: bool,
}

/// Runs `nccl-preflight facts-child` (`facts`, in the child protocol of `crate::child`)
/// with `env` and `request`, and returns the facts it gathered. `--trace` lines of the
/// child go to this process's standard error.
pub fn in_child(env: &[(OsString, OsString)], request: &Request) -> Result<Gathered> {
    let args = &request.gather;
    let exe = std::env::current_exe().context("finding this executable to run `facts`")?;
    let limit = limit(args);
    let ended = crate::child::call(&exe, "facts-child", request, env.to_vec(), limit);
    let (reply, status) = match ended {
        Ended::Replied {
            reply,
            stderr,
            status,
        } => {
            if args.trace {
                for line in stderr.trim_end().lines() {
                    crate::diagnostic::line(format_args!("{}", crate::render::visible(line)));
                }
            }
            (reply, status)
        }
        Ended::Killed { .. } => bail!(
            "`facts` did not finish within {:.0} s and was killed",
            limit.as_secs_f64()
        ),
        Ended::Silent { status, stderr } => {
            bail!("`facts` exited with {status}: {}", stderr.trim_end())
        }
        Ended::Failed(e) => bail!("{e}"),
    };
    // Through the one deserializer `--facts` uses too (`run::parse_json`): a second
    // one of the whole facts tree would add ~450 KB to the binary.
    let facts: Facts = crate::run::parse_json(&mut reply.as_slice())
        .map_err(anyhow::Error::msg)
        .context("`facts` replied with no facts document")?;
    let hung = status.and_then(|s| s.code()) == Some(i32::from(crate::run::EXIT_NODE_FAULT));
    Ok(Gathered { facts, hung })
}
