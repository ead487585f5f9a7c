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
        Command::Probe(args) => commands::probe(args, &env),
        Command::Init(args) => commands::init(args, &env),
        Command::Doctor(args) => commands::doctor(args, &env),
        Command::Exec(args) => commands::exec(args, &env),
        Command::Facts(args) => commands::facts(args, &env),
        Command::ExplainLog(args) => commands::explain_log(args, &env),
        Command::Bench(args) => nccl_preflight::bench::command::bench(args, &env),
        Command::Install(args) => commands::install(args),
        Command::Gang(args) => nccl_preflight::gang::command::gang(args, &env),
        Command::GangWorker => nccl_preflight::gang::worker::main(),
        Command::Serve(args) => nccl_preflight::serve::serve(args, &env),
    });
    match result {
        Ok(Ok(exit)) if exit.hung => {
            // A vendor thread is stuck inside the driver: leave without running
            // library destructors, which could block on the same driver lock.
            use std::io::Write;
            let _ = std::io::stdout().flush();
            let _ = std::io::stderr().flush();
            // SAFETY: _exit ends the process immediately; output was flushed above.
            unsafe { libc::_exit(i32::from(exit.code)) }
        }
        Ok(Ok(exit)) => ExitCode::from(exit.code),
        Ok(Err(e)) => {
            nccl_preflight::diagnostic::line(format_args!("nccl-preflight: error: {e:#}"));
            ExitCode::from(EXIT_TOOL_ERROR)
        }
        Err(_) => {
            nccl_preflight::diagnostic::line(format_args!(
                "nccl-preflight: internal error (a bug; please report it with the message above)"
            ));
            ExitCode::from(EXIT_TOOL_ERROR)
        }
    }
}
