//! The `nccl-preflight` binary: parse flags, run the command, exit with its code.
//! Exit codes: 0 no check failed, 1 a check failed, 2 the tool could not do its job.

use clap::Parser;
use nccl_preflight::cli::{Cli, Command};
use nccl_preflight::commands;
use std::process::ExitCode;

const EXIT_TOOL_ERROR: u8 = 2;

fn main() -> ExitCode {
    // clap exits 2 on bad flags and 0 on --help/--version, matching the contract.
    let cli = Cli::parse();
    let env: Vec<_> = std::env::vars_os().collect();
    // A panic is a bug, but it still means "the tool could not do its job": exit 2,
    // not Rust's 101, so the contract holds even then.
    let result = std::panic::catch_unwind(|| match &cli.command {
        Command::Check(args) => commands::check(args, &env),
        Command::Init(args) => commands::init(args, &env),
        Command::Facts(args) => commands::facts(args, &env),
        Command::ExplainLog(args) => commands::explain_log(args, &env),
    });
    match result {
        Ok(Ok(code)) => ExitCode::from(code),
        Ok(Err(e)) => {
            eprintln!("nccl-preflight: error: {e:#}");
            ExitCode::from(EXIT_TOOL_ERROR)
        }
        Err(_) => {
            eprintln!(
                "nccl-preflight: internal error (a bug; please report it with the message above)"
            );
            ExitCode::from(EXIT_TOOL_ERROR)
        }
    }
}
