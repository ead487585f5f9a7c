//! serve's gathering, in a child process on every run. `serve` lives as long as the
//! pod, so what it maps and touches stays resident: loading libnccl (with libstdc++),
//! the CUDA runtime, libibverbs, libfabric and the net plugin in the server itself cost
//! 3.3 MB of resident memory for good on the 1x H200 (driver 580, NCCL 2.28.3), and ran
//! their constructors in it; on an RDMA node its memory registration would pin
//! `--memreg-size` in the server too; and the gathering's own code and NVML's (NVLink,
//! field values, P2P status) kept 1.1 MB more of the server resident on 4x H100
//! (tests/data/h100x4/serve-rss-run5).
//! So each run executes this same binary as `nccl-preflight facts-child` (`facts`,
//! replying in the child protocol of `crate::child`) with the server's gather flags and
//! environment, and the server judges the facts it replies. Its request carries what an
//! earlier run found of the image's libraries (`gather::Probed`), so they are loaded
//! once, not on every run: an image's files do not change while the pod lives. A child
//! whose vendor call hung exits with `EXIT_NODE_FAULT` after its reply, and the server
//! stops its checks as when the call hung in it. A child that fails leaves the server
//! to gather itself for that run.

use crate::child::Ended;
use crate::cli::{GatherArgs, ImageArg, Switch};
use crate::facts::Facts;
use crate::gather::Probed;
use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use std::ffi::OsString;
use std::time::Duration;

/// The `facts` command line that gathers as `args` does. Every gather flag is written
/// out, so the child's environment twins (`NCCL_PREFLIGHT_*`) cannot make it differ.
fn facts_argv(args: &GatherArgs) -> Vec<OsString> {
    let mut argv: Vec<OsString> = vec!["facts-child".into()];
    let mut flag = |name: &str, value: OsString| {
        argv.push(name.into());
        argv.push(value);
    };
    flag("--host-root", args.host_root.clone().into_os_string());
    flag("--nvml-lib", args.nvml_lib.clone().into());
    flag("--cuda-lib", args.cuda_lib.clone().into());
    flag(
        "--timeout",
        format!("{}s", args.timeout.as_secs_f64()).into(),
    );
    flag("--verbs-lib", args.verbs_lib.clone().into());
    if let Some(lib) = &args.fabric_lib {
        flag("--fabric-lib", lib.clone().into());
    }
    if let Some(lib) = &args.nccl_lib {
        flag("--nccl-lib", lib.clone().into());
    }
    if let Some(lib) = &args.cudart_lib {
        flag("--cudart-lib", lib.clone().into());
    }
    flag("--memreg-size", args.memreg_size.to_string().into());
    let cuda = match args.cuda {
        Switch::On => "on",
        Switch::Off => "off",
    };
    flag("--cuda", cuda.into());
    let image = match args.image {
        ImageArg::Trainer => "trainer",
        ImageArg::Own => "own",
    };
    flag("--image", image.into());
    // No --nodes: `facts` does not read it (the judge applies it), and refuses it.
    if let Some(path) = &args.replay_kernel {
        flag("--replay-kernel", path.clone().into_os_string());
    }
    if args.trace {
        argv.push("--trace".into());
    }
    argv
}

/// How long the child may take: its gather bounds every vendor call and file read by
/// `--timeout`, on a GPU thread and an RDMA thread side by side, each a chain of calls.
fn limit(args: &GatherArgs) -> Duration {
    args.timeout.saturating_mul(4) + Duration::from_secs(30)
}

/// What the gathering child is asked besides its command line.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Request {
    /// Load every vendor library even where no device needs it (`--require rdma|efa`).
    pub probe_all: bool,
    /// The image's library facts of an earlier run, used instead of loading them again.
    pub probed: Option<Probed>,
}

impl Request {
    /// The child's side: an empty request asks for the defaults.
    pub fn parse(bytes: &[u8]) -> Result<Request> {
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(Request::default());
        }
        serde_json::from_slice(bytes).context("facts-child: the request is not readable")
    }
}

/// What the gathering child replied.
pub struct Gathered {
    pub facts: Facts,
    /// A vendor call hung in the child (it exited with `EXIT_NODE_FAULT`).
    pub hung: bool,
}

/// Runs `nccl-preflight facts-child` (`facts`, replying in the child protocol of
/// `crate::child`) with `args`, `env` and `request`, and returns the facts it
/// gathered. `--trace` lines of the child go to this process's standard error.
pub fn in_child(
    args: &GatherArgs,
    env: &[(OsString, OsString)],
    request: &Request,
) -> Result<Gathered> {
    let exe = std::env::current_exe().context("finding this executable to run `facts`")?;
    let limit = limit(args);
    let asked = serde_json::to_vec(request).context("serializing the request")?;
    let ended = crate::child::call(&exe, &facts_argv(args), env.to_vec(), &asked, limit);
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::FromArgMatches;

    /// As the binary parses it, a flag `facts` does not read refused.
    fn gather_of(argv: &[OsString]) -> GatherArgs {
        let matches = crate::cli::command()
            .try_get_matches_from(
                std::iter::once(OsString::from("nccl-preflight")).chain(argv.iter().cloned()),
            )
            .unwrap();
        crate::cli::unread::refuse(&matches).unwrap();
        let cli = crate::cli::Cli::from_arg_matches(&matches).unwrap();
        match cli.command {
            crate::cli::Command::FactsChild(g) => g,
            other => panic!("not facts-child: {other:?}"),
        }
    }

    /// The child gathers exactly as the server would: every flag survives the trip
    /// through the command line, the defaults and every optional one set, except
    /// `--nodes`, which only the judge reads (in the server).
    #[test]
    fn the_facts_command_line_reproduces_the_gather_flags() {
        let defaults = gather_of(&["facts-child".into()]);
        let mut set = defaults.clone();
        set.host_root = "/host root/with space".into();
        set.nvml_lib = "/opt/nvml/libnvidia-ml.so.1".into();
        set.cuda_lib = "/opt/cuda/libcuda.so.1".into();
        set.timeout = Duration::from_micros(2500);
        set.verbs_lib = "/opt/libibverbs.so.1".into();
        set.fabric_lib = Some("/opt/amazon/efa/lib/libfabric.so.1".into());
        set.nccl_lib = Some("/x/libnccl.so.2".into());
        set.cudart_lib = Some("/x/libcudart.so.12".into());
        set.memreg_size = 3 << 20;
        set.cuda = Switch::Off;
        set.trace = true;
        set.image = ImageArg::Own;
        set.nodes = Some(4);
        set.replay_kernel = Some("/k.json".into());
        for args in [defaults, set] {
            let back = gather_of(&facts_argv(&args));
            let gathered = GatherArgs {
                nodes: None,
                ..args
            };
            assert_eq!(format!("{back:?}"), format!("{gathered:?}"));
        }
    }
}
