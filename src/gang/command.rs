//! The `gang` subcommand, and the gang step of `exec --gang` and `init --gang`:
//! the local checks as `check` runs them, then the gang, whose three findings
//! join the report under the same `--ignore`.

use super::GangRun;
use crate::cli::{CheckArgs, Format, GangArgs, GangOpts};
use crate::layout::{GangFlags, GangIdentity};
use crate::policy::Policy;
use crate::report::Report;
use crate::run::{Evaluation, Exit, build_policy, emit, evaluate, exit_code, use_color};
use anyhow::{Result, anyhow, bail};
use std::ffi::OsString;

/// The libnccl the gang's NCCL child loads: the one the checks judged (the trainer's,
/// `facts.rdma.nccl.library`), else the trainer's search order.
fn trainer_nccl(
    report: &Report,
    explicit: Option<&str>,
    env: &[(OsString, OsString)],
) -> Vec<String> {
    use crate::gather::rdma::nccl;
    match report
        .facts
        .rdma
        .nccl
        .library
        .loaded()
        .and_then(|l| l.path.clone())
    {
        Some(path) => vec![path],
        None => nccl::names(&nccl::locations(explicit, env)),
    }
}

/// The gang identity from the flags and the launcher's variables; exit 2 when none.
fn identity(
    check: &CheckArgs,
    opts: &GangOpts,
    env: &[(OsString, OsString)],
) -> Result<GangIdentity> {
    let nodes = match (opts.gang_nodes, check.nodes) {
        (Some(a), Some(b)) if a != b => {
            bail!("gang: --gang-nodes {a} and --nodes {b} disagree (one is an alias of the other)")
        }
        (a, b) => a.or(b),
    };
    let flags = GangFlags {
        rank: opts.gang_rank,
        nodes,
        root: opts.gang_root.clone(),
        port: opts.gang_port,
        peers: opts
            .gang_peers
            .iter()
            .map(|p| p.trim().to_string())
            .filter(|p| !p.is_empty())
            .collect(),
        attempt: opts.gang_attempt.clone(),
    };
    let var = |name: &str| {
        env.iter()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| v.to_str())
            .map(String::from)
    };
    let mut flags = flags;
    // An MPI rank with no root named: the hostfile's first host, where this pod has
    // the hostfile (the launcher; kubeflow/mpi-operator mounts it there only, so
    // workers get the root with mpirun -x NCCL_PREFLIGHT_GANG_ROOT).
    let mpi = var("OMPI_COMM_WORLD_RANK").is_some() || var("PMI_RANK").is_some();
    if mpi && flags.root.is_none() && var("MASTER_ADDR").is_none() {
        let path = var("OMPI_MCA_orte_default_hostfile")
            .or_else(|| var("HYDRA_HOST_FILE"))
            .unwrap_or_else(|| "/etc/mpi/hostfile".to_string());
        flags.root = read_hostfile(&path)?
            .as_deref()
            .and_then(crate::layout::hostfile_root);
    }
    let from_hostfile = flags.root.is_some() && opts.gang_root.is_none();
    let mut identity =
        crate::layout::gang_identity(&flags, &var).map_err(|e| anyhow!("gang: {e}"))?;
    if from_hostfile {
        for s in identity.sources.iter_mut() {
            if s == "root from --gang-root" {
                *s = "root from the MPI hostfile's first host".to_string();
            }
        }
    }
    Ok(identity)
}

/// Largest MPI hostfile read: one line per worker, so 64 KiB holds thousands of hosts.
const MAX_HOSTFILE_BYTES: u64 = 64 << 10;

/// The MPI hostfile's text; `None` when it does not exist (a worker pod has none). Only
/// a regular file of at most `MAX_HOSTFILE_BYTES` is read, opened without blocking: a
/// FIFO nobody writes blocked for ever, and /dev/zero gave a 1 MiB "host name" (issue 31
/// row 7).
fn read_hostfile(path: &str) -> Result<Option<String>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let shown = crate::render::visible(path);
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => bail!("gang: cannot read the MPI hostfile {shown}: {e}"),
    };
    let meta = file
        .metadata()
        .map_err(|e| anyhow!("gang: cannot read the MPI hostfile {shown}: {e}"))?;
    if !meta.file_type().is_file() {
        bail!("gang: the MPI hostfile {shown} is not a regular file (a FIFO or a device?)");
    }
    let mut bytes = Vec::new();
    file.take(MAX_HOSTFILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| anyhow!("gang: cannot read the MPI hostfile {shown}: {e}"))?;
    if bytes.len() as u64 > MAX_HOSTFILE_BYTES {
        bail!("gang: the MPI hostfile {shown} is larger than {MAX_HOSTFILE_BYTES} bytes");
    }
    String::from_utf8(bytes)
        .map(Some)
        .map_err(|_| anyhow!("gang: the MPI hostfile {shown} is not UTF-8 text"))
}

/// Why the gang could not run here at all (exit 2).
pub(crate) fn unavailable(report: &Report) -> Option<String> {
    use crate::facts::gpu::LibraryState;
    let facts = &report.facts;
    if let LibraryState::NotFound { message } = &facts.rdma.nccl.library.state {
        return Some(format!("no libnccl: {message}"));
    }
    match &facts.gpus.cuda.state {
        LibraryState::NotFound { message } => {
            Some(format!("no GPU: the CUDA driver is not here ({message})"))
        }
        LibraryState::Failed(e) => Some(format!("no GPU: the CUDA driver failed ({e})")),
        LibraryState::Loaded(c) if c.devices.is_empty() => {
            Some("no GPU: the CUDA driver sees no device".to_string())
        }
        _ => None,
    }
}

/// The gang as the command line asks for it, resolved before anything is gathered
/// (a bad identity or option costs nothing): `gang`, `exec --gang` and `init --gang`
/// prepare it, run the pod's checks, then run it once.
pub(crate) struct Prepared<'a> {
    pub identity: GangIdentity,
    check: &'a CheckArgs,
    opts: &'a GangOpts,
}

/// The gang's identity and options, checked; an error: exit 2.
pub(crate) fn prepare<'a>(
    check: &'a CheckArgs,
    opts: &'a GangOpts,
    env: &[(OsString, OsString)],
) -> Result<Prepared<'a>> {
    if check.facts.is_some() {
        bail!("gang: not with --facts: the gang runs NCCL on this pod, not on saved facts");
    }
    if opts.gang_sizes.is_empty()
        || opts
            .gang_sizes
            .iter()
            .any(|s| *s < 4 || !s.is_multiple_of(4))
    {
        bail!("--gang-sizes: every size must be a multiple of 4 bytes (float32 elements)");
    }
    Ok(Prepared {
        identity: identity(check, opts, env)?,
        check,
        opts,
    })
}

impl Prepared<'_> {
    /// Runs the gang after the local checks in `report`, adds its findings (settled
    /// under `--ignore`) and recomputes the verdict. An error: the gang cannot run here.
    pub(crate) fn run(
        &self,
        report: &mut Report,
        policy: &Policy,
        env: &[(OsString, OsString)],
    ) -> Result<GangRun> {
        if let Some(why) = unavailable(report) {
            bail!("gang: cannot run here: {why}");
        }
        let (check, opts, identity) = (self.check, self.opts, &self.identity);
        let settings = super::Settings {
            opts,
            cuda_lib: check.gather.libs.cuda_lib.clone(),
            nccl_candidates: trainer_nccl(report, check.gather.libs.nccl_lib.as_deref(), env),
            host_root: check.gather.libs.host_root.clone(),
            trainer_env: crate::run::exec_environment(env, &report.settings),
            ras_diagnostics: crate::nccl::version(&report.facts)
                .is_some_and(|v| v >= crate::nccl::version::RAS_DIAGNOSTICS),
        };
        crate::diagnostic::progress(
            check.gather.libs.trace,
            format_args!(
                "nccl-preflight: gang: pod {} of {}: waiting up to {:.0} s for the pods' names, then up to {:.0} s for every pod to join at {}:{}",
                identity.node_rank,
                identity.nodes,
                opts.gang_wait.as_secs_f64(),
                opts.gang_timeout.as_secs_f64(),
                crate::render::visible(&identity.root),
                identity.port
            ),
        );
        let mut run = super::run(report, identity, &settings);
        // The gang's own list (its JSON's `gang.findings`) carries the blame the report does.
        run.findings = std::mem::take(&mut run.findings)
            .into_iter()
            .map(crate::judge::blame)
            .collect();
        report
            .checks
            .extend(run.findings.iter().cloned().map(|f| policy.settle(f)));
        report.rejudge();
        Ok(run)
    }
}

/// What this rank prints in human form: rank 0 the whole job, others their line.
pub(crate) fn human(report: &Report, run: &GangRun, color: bool) -> String {
    if run.identity.node_rank == 0 {
        let mut s = crate::render::human::render(report, color);
        s.push_str(&super::render::job(run, report.verdict, report.fault));
        s
    } else {
        super::render::own_line(run, report)
    }
}

/// What SIGTERM or SIGINT prints before the process ends.
const STOPPED: &[u8] =
    b"nccl-preflight: stopped by a signal before the checks ended; nothing was started\n";

extern "C" fn on_stop(signal: libc::c_int) {
    // SAFETY: write(2) and _exit(2) are async-signal-safe; STOPPED is a static buffer.
    unsafe {
        libc::write(2, STOPPED.as_ptr().cast(), STOPPED.len());
        libc::_exit(128 + signal);
    }
}

/// Ends the process at once on SIGTERM, SIGINT or SIGHUP with a line saying so (exit
/// 128 + the signal), also as PID 1, where the kernel drops a signal that has
/// no handler (issue 31 row 13): the gang's worker dies with it (PR_SET_PDEATHSIG,
/// `crate::child`), the rendezvous port closes with it, and `exec` never starts
/// the command. execve resets the handler, so the command gets its own signals.
pub(crate) fn stop_on_signals() {
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};
    let action = SigAction::new(
        SigHandler::Handler(on_stop),
        SaFlags::empty(),
        SigSet::empty(),
    );
    // SIGHUP too (issue 39 re-run): as PID 1 it was dropped, and the checks went on.
    for signal in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
        // SAFETY: the handler calls only async-signal-safe functions (see on_stop).
        let _ = unsafe { sigaction(signal, &action) };
    }
}

/// `nccl-preflight gang`.
pub fn gang(args: &GangArgs, env: &[(OsString, OsString)]) -> Result<Exit> {
    stop_on_signals();
    let policy = build_policy(&args.check)?;
    // A bad identity costs nothing: refused before anything is gathered.
    let gang = prepare(&args.check, &args.gang, env)?;
    let how = Evaluation::under(&policy).tune(&args.tune);
    let (mut report, hung) = evaluate(&args.check, env, how)?;
    if hung.0 {
        eprintln!(
            "nccl-preflight: gang: a GPU driver call did not return within --timeout; the gang cannot run NCCL here"
        );
        // A hung driver is the node's (exit 3), as the other pods, which name this one
        // missing from the gang, blame it.
        return Ok(Exit::new(crate::run::EXIT_NODE_FAULT, hung));
    }
    let run = gang.run(&mut report, &policy, env)?;
    match args.output.format {
        Format::Human => emit(&human(&report, &run, use_color(env)))?,
        Format::Json => emit(&super::render::json(&report, &run))?,
    }
    Ok(Exit::new(exit_code(&report), hung))
}
