//! The `nccl-preflight` binary: parse flags, run the command, exit with its code.
//! Exit codes (docs/failure-policy.md): 0 no check failed, 1 a check failed and a failure
//! lies with the job, 2 the tool could not do its job, 3 every failure lies with the node.

use clap::FromArgMatches;
use nccl_preflight::cli::{self, Cli, Command};
use nccl_preflight::{commands, config};
use std::process::ExitCode;

use nccl_preflight::run::EXIT_TOOL_ERROR;

/// The system allocator, except that running out of memory exits 2 with a message
/// instead of Rust's abort (SIGABRT, exit 134, no report): under `prlimit --as=8388608`
/// the tool's own address-space limit, not the node, is what failed (issue 31 row 6).
struct ExitOnOom;

/// Written with one write(2) from a static buffer: nothing may allocate here.
const OOM_MESSAGE: &[u8] = b"nccl-preflight: error: out of memory: this process's address-space \
limit (ulimit -v, prlimit --as) or its container's memory limit is too small for the tool \
(it needs about 16 MiB)\n";

fn out_of_memory() -> ! {
    // SAFETY: write(2) on stderr from a static buffer and _exit(2) are async-signal-safe
    // and allocate nothing; buffered output is lost, which a process out of memory
    // cannot avoid.
    unsafe {
        libc::write(2, OOM_MESSAGE.as_ptr().cast(), OOM_MESSAGE.len());
        libc::_exit(i32::from(EXIT_TOOL_ERROR))
    }
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so
// `System`'s guarantees hold; a null result never returns (the process exits).
unsafe impl std::alloc::GlobalAlloc for ExitOnOom {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: the caller upholds `alloc`'s contract, forwarded as is.
        let p = unsafe { std::alloc::System.alloc(layout) };
        if p.is_null() {
            out_of_memory();
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: the caller upholds `alloc_zeroed`'s contract, forwarded as is.
        let p = unsafe { std::alloc::System.alloc_zeroed(layout) };
        if p.is_null() {
            out_of_memory();
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: `ptr` came from this allocator, that is from `System`, with `layout`.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from `System` with `layout`; the caller upholds the rest.
        let p = unsafe { std::alloc::System.realloc(ptr, layout, size) };
        if p.is_null() {
            out_of_memory();
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: ExitOnOom = ExitOnOom;

/// An abort from below the tool's code ends in exit 2 with a line too, not 134: glibc
/// aborts on its own when it cannot allocate for a new thread ("Fatal glibc error: failed
/// to register TLS destructor: out of memory", seen at `prlimit --as=11763712`), which
/// no allocator of ours sees. Exit 2 is the contract's "could not do its job".
extern "C" fn on_abort(_: libc::c_int) {
    const MESSAGE: &[u8] = b"nccl-preflight: error: aborted (the line above says why; under \
an address-space limit, ulimit -v or prlimit --as, raise it)\n";
    // SAFETY: write(2) from a static buffer and _exit(2) are async-signal-safe.
    unsafe {
        libc::write(2, MESSAGE.as_ptr().cast(), MESSAGE.len());
        libc::_exit(i32::from(EXIT_TOOL_ERROR))
    }
}

fn exit_2_on_abort() {
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};
    let action = SigAction::new(
        SigHandler::Handler(on_abort),
        SaFlags::empty(),
        SigSet::empty(),
    );
    // SAFETY: the handler only writes a static buffer and calls _exit, both
    // async-signal-safe; an exec'ed command gets the default action back (execve(2)).
    let _ = unsafe { sigaction(Signal::SIGABRT, &action) };
}

fn main() -> ExitCode {
    exit_2_on_abort();
    // clap exits 2 on bad flags and 0 on --help/--version, matching the contract.
    let mut matches = cli::command().get_matches();
    // The configuration file's values are defaults under the flags and their variables
    // (config.rs): read it, then parse again with them.
    let config = match matches.get_one::<std::path::PathBuf>("config") {
        Some(path) => match config::read(path).and_then(|c| {
            let command = c.apply(cli::command())?;
            Ok((c, command))
        }) {
            Ok((c, command)) => {
                matches = command.get_matches();
                Some(c)
            }
            Err(e) => {
                nccl_preflight::diagnostic::line(format_args!(
                    "nccl-preflight: error: --config: {e}"
                ));
                return ExitCode::from(EXIT_TOOL_ERROR);
            }
        },
        None => None,
    };
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    // A flag the mode does not read is a bad flag too (cli::unread).
    if let Err(e) = cli::unread::refuse(&matches) {
        nccl_preflight::diagnostic::line(format_args!("nccl-preflight: error: {e}"));
        return ExitCode::from(EXIT_TOOL_ERROR);
    }
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
        Command::FactsChild => commands::facts_child(&env),
        Command::ExplainLog(args) => commands::explain_log(args, &env),
        Command::Bench(args) => nccl_preflight::bench::command::bench(args, &env),
        Command::BenchChild => nccl_preflight::bench::command::bench_child(&env),
        Command::Install(args) => commands::install(args),
        Command::Gang(args) => nccl_preflight::gang::command::gang(args, &env),
        Command::GangWorker => nccl_preflight::gang::worker::main(),
        Command::Serve(args) => nccl_preflight::serve::serve(args, &env),
        Command::Webhook(args) => nccl_preflight::webhook::webhook(args, &env, config.as_ref()),
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
