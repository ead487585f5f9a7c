//! What each subcommand does: gather (or load facts), judge, tune, render, write.
//! Returns the process exit code; errors that stop the tool become exit 2 in main.

use crate::cli::{
    CheckArgs, ExecArgs, ExplainArgs, FactsArgs, Format, InitArgs, ProbeArgs, ReportArgs, Switch,
};
use crate::finding::Status;
use crate::gather::gpu::{CudaProbe, HungCall};
use crate::output::{self, Output};
use crate::render;
use crate::report::Report;
use crate::run::{
    EXIT_FAILED, EXIT_NODE_FAULT, EXIT_OK, Evaluation, Exit, build_policy, emit, emit_err,
    evaluate, use_color,
};
use crate::run::{describing, exec_environment, exit_code, gather_facts, print};
use crate::tune;
use anyhow::{Context, Result, bail};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// Where the kubelet mounts the container's termination message file.
const DEFAULT_TERMINATION_LOG: &str = "/dev/termination-log";

pub fn check(args: &ReportArgs, env: &[(OsString, OsString)]) -> Result<Exit> {
    let how = Evaluation::default().cuda(&args.cuda).tune(&args.tune);
    let (report, hung) = evaluate(&args.check, env, how)?;
    print(&report, args.output.format, env)?;
    Ok(Exit::new(exit_code(&report), hung))
}

/// `probe`: the checks without CUDA (cuInit alone takes ~0.5 s, more than a kubelet
/// exec probe's default 1 s timeout leaves), answered with the exit code and one line:
/// `ok: ...`, or `fail: ID: summary; ID: summary` naming every failed check. With
/// `--npd`, node-problem-detector's plugin contract instead (render::npd).
pub fn probe(probe: &ProbeArgs, env: &[(OsString, OsString)]) -> Result<Exit> {
    let args = &probe.check;
    let how = || Evaluation {
        cuda: CudaProbe::Off,
        ..Evaluation::default()
    };
    if probe.npd {
        let max = probe
            .max_output
            .map_or(render::npd::DEFAULT_MAX_OUTPUT, usize::from);
        let (code, line, hung) = match evaluate(args, env, how()) {
            Ok((report, hung)) => {
                let (code, line) = render::npd::answer(&report, max);
                (code, line, hung)
            }
            Err(e) => {
                let (code, line) = render::npd::unknown(&e, max);
                (code, line, HungCall::default())
            }
        };
        emit(&format!("{line}\n"))?;
        return Ok(Exit::new(code, hung));
    }
    let (report, hung) = evaluate(args, env, how())?;
    emit(&format!("{}\n", render::npd::probe_line(&report)))?;
    Ok(Exit::new(exit_code(&report), hung))
}

pub fn doctor(args: &ReportArgs, env: &[(OsString, OsString)]) -> Result<Exit> {
    let check = &CheckArgs {
        gather: describing(&args.check.gather),
        ..args.check.clone()
    };
    let how = Evaluation {
        probe_all: true,
        ..Evaluation::default()
    };
    let (report, hung) = evaluate(check, env, how.cuda(&args.cuda).tune(&args.tune))?;
    match args.output.format {
        Format::Human => emit(&render::doctor::render(&report, use_color(env)))?,
        Format::Json => {
            let mut text = serde_json::to_string_pretty(&render::doctor::doctor(&report))
                .context("serializing the report")?;
            text.push('\n');
            emit(&text)?;
        }
    }
    Ok(Exit::new(exit_code(&report), hung))
}

/// `init --bench`: the checks, with the peer-copy bench started before them in a
/// child that also reads the checks' CUDA facts (`bench::child`); with `--bench-nccl`,
/// the checks as `check` runs them, then one child measuring peer copies and NCCL's
/// all-reduce with the tuned settings. The bench's findings are judged under the same
/// --ignore.
fn init_bench(
    args: &InitArgs,
    env: &[(OsString, OsString)],
    policy: &crate::policy::Policy,
) -> Result<(Report, HungCall)> {
    crate::diagnostic::progress(
        args.check.gather.libs.trace,
        format_args!(
            "nccl-preflight: init: running the bench for up to {:.0} s (--bench-seconds)",
            args.bench_limits.bench_seconds.as_secs_f64()
        ),
    );
    let (mut report, hung, measured) = if args.bench_nccl {
        let how = Evaluation::under(policy).cuda(&args.cuda).tune(&args.tune);
        let (report, hung) = evaluate(&args.check, env, how)?;
        // Measured with the settings the trainer will get.
        let bench = crate::bench::child::start_all(args, exec_environment(env, &report.settings));
        (report, hung, crate::bench::child::finish(bench))
    } else {
        let cuda_facts = args.cuda.cuda == Switch::On;
        let (links, cuda) = crate::bench::child::start_links(args, env.to_vec(), cuda_facts);
        let how = match cuda {
            Some(source) => Evaluation {
                cuda: CudaProbe::Elsewhere(source),
                ..Evaluation::under(policy)
            },
            None => Evaluation::under(policy).cuda(&args.cuda),
        };
        let (report, hung) = evaluate(&args.check, env, how.tune(&args.tune))?;
        // Judged against this process's NVML link figures: the child reads none.
        let measured = crate::bench::child::finish_links(
            links,
            report.facts.gpus.nvml.loaded(),
            args.bench_limits.min_bandwidth_fraction,
        );
        (report, hung, measured)
    };
    report
        .checks
        .extend(measured.into_iter().map(|f| policy.settle(f)));
    report.rejudge();
    Ok((report, hung))
}

pub fn init(args: &InitArgs, env: &[(OsString, OsString)]) -> Result<Exit> {
    if args.bench && args.check.facts.is_some() {
        bail!("--bench cannot be used with --facts: a bench measures this host, not saved facts");
    }
    let policy = build_policy(&args.check)?;
    // A bad gang identity is refused before anything is gathered.
    let gang = if args.gang {
        Some(crate::gang::command::prepare(
            &args.check,
            &args.gang_opts,
            env,
        )?)
    } else {
        None
    };
    let (mut report, hung) = if args.bench {
        init_bench(args, env, &policy)?
    } else {
        evaluate(
            &args.check,
            env,
            Evaluation::under(&policy).cuda(&args.cuda).tune(&args.tune),
        )?
    };
    if let Some(gang) = gang {
        if hung.0 {
            // The driver is the node's, as for `gang`; nothing is written.
            crate::diagnostic::line(format_args!(
                "nccl-preflight: init --gang: a GPU driver call did not return within --timeout; the gang cannot run NCCL here"
            ));
            return Ok(Exit::new(EXIT_NODE_FAULT, hung));
        }
        let run = gang.run(&mut report, &policy, env)?;
        if args.output.format == Format::Human {
            emit_err(&crate::gang::render::job(
                &run,
                report.verdict,
                report.fault,
            ))?;
        }
    }
    let outputs = init_outputs(args, &mut report, &policy);
    let termination = match &args.termination_log {
        Some(path) => Some(path.clone()),
        None => Some(PathBuf::from(DEFAULT_TERMINATION_LOG)).filter(|p| p.exists()),
    };
    // No two outputs may name one file (`--env-file X --report X`), the termination
    // log included where its directory exists; refused before anything is written.
    let mut named: Vec<(&str, &Path)> =
        outputs.iter().map(|o| (o.flag, o.path.as_path())).collect();
    if let Some(path) = termination.as_deref().filter(|p| output_dir_exists(p)) {
        named.push(("--termination-log", path));
    }
    output::distinct(&named)?;
    output::write_atomically(&outputs)?;
    if let Some(path) = termination {
        // Best effort: the kubelet only shows this message. Failing here would turn
        // a verdict (a failed check's exit 1 or 3) into exit 2 after the other outputs
        // were already replaced, and hide the report.
        if let Err(e) = output::write_in_place(
            "--termination-log",
            &path,
            &render::termination::render(&report),
        ) {
            crate::diagnostic::line(format_args!(
                "nccl-preflight: warning: termination message not written: {e:#}"
            ));
        }
    }
    print(&report, args.output.format, env)?;
    Ok(Exit::new(exit_code(&report), hung))
}

/// init's files, each where its flag says (an nccl.conf only for an NCCL that reads it).
fn init_outputs(
    args: &InitArgs,
    report: &mut Report,
    policy: &crate::policy::Policy,
) -> Vec<Output> {
    let nccl_conf = nccl_conf_output(report, policy, args);
    let mut outputs = Vec::new();
    let mut add = |flag, path: &Option<PathBuf>, contents: String| {
        if let Some(path) = path {
            outputs.push(Output::text(flag, path.clone(), contents));
        }
    };
    add(
        "--env-file",
        &args.env_file,
        render::env_file::render(report),
    );
    add("--nccl-conf", &nccl_conf, render::nccl_conf::render(report));
    add("--report", &args.report, render::json::render(report));
    outputs
}

/// Where `--nccl-conf` is written: nowhere when the image's NCCL would not read it (older
/// than 2.23), which is then a warning in the report (and the verdict's counts).
fn nccl_conf_output(
    report: &mut Report,
    policy: &crate::policy::Policy,
    args: &InitArgs,
) -> Option<PathBuf> {
    let path = args.nccl_conf.as_ref()?;
    let unread = crate::nccl::conf_file::unread(
        crate::nccl::version(&report.facts),
        args.env_file.is_some(),
    );
    match unread {
        Some(warning) => {
            report.checks.push(policy.settle(warning));
            report.rejudge();
            None
        }
        None => Some(path.clone()),
    }
}

/// Whether the directory an output path names exists (the path's own file need not).
fn output_dir_exists(path: &Path) -> bool {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.is_dir(),
        _ => true,
    }
}

pub fn facts(args: &FactsArgs, env: &[(OsString, OsString)]) -> Result<Exit> {
    // The same probes as `check`, so `check --facts` judges what `check` would have.
    let how = Evaluation::default().cuda(&args.cuda);
    let (facts, hung) = gather_facts(&describing(&args.gather), env, how)?;
    let mut text = serde_json::to_string_pretty(&facts).context("serializing facts")?;
    text.push('\n');
    emit(&text)?;
    Ok(Exit::new(EXIT_OK, hung))
}

/// `facts-child`: `facts` for serve's probe (`serve::probe`), asked and answered in the
/// child protocol (`crate::child`): its request carries the server's gather flags and
/// what an earlier run found of the image's libraries; it replies the facts, and exits
/// with `EXIT_NODE_FAULT` where a vendor call hung.
pub fn facts_child(env: &[(OsString, OsString)]) -> Result<Exit> {
    let request: crate::serve::probe::Request =
        crate::child::request().map_err(|e| anyhow::anyhow!("facts-child: {e}"))?;
    // serve never loads the CUDA driver (NVML shows a stopped fabric manager).
    let how = Evaluation {
        probe_all: request.probe_all,
        probed: request.probed.as_ref(),
        cuda: CudaProbe::Off,
        ..Evaluation::default()
    };
    let (facts, hung) = gather_facts(&describing(&request.gather), env, how)?;
    let text = serde_json::to_vec(&facts).context("serializing facts")?;
    crate::child::reply(&text);
    let code = if hung.0 { EXIT_NODE_FAULT } else { EXIT_OK };
    Ok(Exit::new(code, hung))
}

/// `nccl-params-child`: asks the libnccl named on standard input for its parameters
/// (`crate::vendor::nccl::params`) and replies them as JSON: `{"Ok": [...]}`, `{"Ok":
/// null}` where the library has no parameter API, or `{"Err": "..."}`.
pub fn nccl_params_child() -> Result<Exit> {
    let library: String = crate::child::request().map_err(anyhow::Error::msg)?;
    let watch = crate::vendor::deadline::Watch::default();
    let answer: std::result::Result<Option<Vec<crate::facts::NcclParam>>, String> =
        match crate::vendor::nccl::params(&watch, &library) {
            Ok(Some(a)) => {
                let values = a.values.into_iter().map(|(k, v)| (k, v.ok())).collect();
                Ok(Some(crate::nccl::params::merge(values, &a.dump)))
            }
            Ok(None) => Ok(None),
            Err(e) => Err(e.to_string()),
        };
    let text = serde_json::to_vec(&answer).context("serializing the parameters")?;
    crate::child::reply(&text);
    Ok(Exit::new(EXIT_OK, HungCall(false)))
}

pub fn explain_log(args: &ExplainArgs, env: &[(OsString, OsString)]) -> Result<Exit> {
    let name = args.input.display().to_string();
    let explanation = if name == "-" {
        crate::explain::explain(std::io::stdin().lock(), "-")
    } else {
        let file =
            crate::run::open_input(&args.input).with_context(|| format!("explain-log {name}"))?;
        crate::explain::explain(file, &name)
    }
    .with_context(|| format!("explain-log {name}: reading"))?;
    // No NCCL line is nothing to judge, not a clean log: exit 2 saying what the input held.
    if let Some(why) = explanation.nothing_to_judge() {
        anyhow::bail!(
            "explain-log {}: nothing to judge, no NCCL lines: {why}",
            render::visible(&name)
        );
    }
    match args.output.format {
        Format::Human => emit(&render::explain::render(&explanation, use_color(env)))?,
        Format::Json => {
            let mut text = serde_json::to_string_pretty(&explanation)
                .context("serializing the explanation")?;
            text.push('\n');
            emit(&text)?;
        }
    }
    let code = if explanation.verdict == Status::Fail {
        EXIT_FAILED
    } else {
        EXIT_OK
    };
    Ok(Exit::new(code, HungCall(false)))
}

/// Exit codes for a command that cannot be started, as shells use them.
const EXIT_NOT_FOUND: u8 = 127;
const EXIT_NOT_EXECUTABLE: u8 = 126;

pub fn exec(args: &ExecArgs, env: &[(OsString, OsString)]) -> Result<Exit> {
    crate::gang::command::stop_on_signals();
    let policy = build_policy(&args.check)?;
    // A bad gang identity is refused before anything is gathered.
    let gang = if args.gang {
        Some(crate::gang::command::prepare(
            &args.check,
            &args.gang_opts,
            env,
        )?)
    } else {
        None
    };
    let how = Evaluation::under(&policy).cuda(&args.cuda).tune(&args.tune);
    let (mut report, hung) = evaluate(&args.check, env, how)?;
    if let Some(gang) = &gang
        && let Some(exit) = exec_gang(args, env, &policy, gang, &mut report, hung)?
    {
        return Ok(exit);
    }
    let failed = report.verdict == Status::Fail;
    let tuned: Vec<&tune::Setting> = report
        .settings
        .iter()
        .filter(|s| s.source == tune::Source::Tuned)
        .collect();
    // With --gang the report was shown with the gang's rendering above.
    // The command's standard output is its own: the report goes to standard error.
    if (args.dry_run || failed || hung.0) && !args.gang {
        match args.output.format {
            Format::Human => emit_err(&render::human::render(&report, false))?,
            Format::Json => emit_err(&render::json::render(&report))?,
        }
    }
    if failed {
        crate::diagnostic::line(format_args!(
            "nccl-preflight: not starting {}: a check failed (--ignore ID lets it start)",
            args.command[0].to_string_lossy()
        ));
        return Ok(Exit::new(exit_code(&report), hung));
    }
    if args.dry_run {
        dry_run(args, env, &tuned)?;
        return Ok(Exit::new(EXIT_OK, hung));
    }
    if hung.0 {
        // Issue 16: this used to print "starting ..." and exit 1 with no reason. A
        // driver call is still stuck in a thread of this process (its check was
        // ignored, so the verdict passed). execve(2) must first end every other
        // thread, and one blocked inside the driver may never end, so exec could
        // hang the container for good; and the command would meet the same driver.
        crate::diagnostic::line(format_args!(
            "nccl-preflight: not starting {}: a GPU driver call did not return within --timeout {:.1} s \
             (see the gpu checks above) and is still stuck in this process; exec would wait on it. \
             --ignore lets a failed check pass, not a hung driver: drain the node or fix the driver",
            args.command[0].to_string_lossy(),
            args.check.gather.libs.timeout.as_secs_f64()
        ));
        // The driver is the node's: another node can run the command.
        return Ok(Exit::new(EXIT_NODE_FAULT, hung));
    }
    crate::diagnostic::line(format_args!(
        "nccl-preflight: {} ({}); starting {} with {} tuned variable(s)",
        report.verdict.label(),
        report.count_text(),
        args.command[0].to_string_lossy(),
        tuned.len()
    ));
    Ok(exec_command(
        args,
        exec_environment(env, &report.settings),
        hung,
    ))
}

/// `exec --gang`: the gang runs (in a child, so nothing of NCCL's survives into
/// CMD) and its report is shown; Some(exit) when CMD must not start because a
/// driver call hung.
fn exec_gang(
    args: &ExecArgs,
    env: &[(OsString, OsString)],
    policy: &crate::policy::Policy,
    gang: &crate::gang::command::Prepared<'_>,
    report: &mut Report,
    hung: HungCall,
) -> Result<Option<Exit>> {
    if hung.0 {
        eprintln!(
            "nccl-preflight: not starting {}: a GPU driver call did not return within --timeout; the gang cannot run NCCL here",
            args.command[0].to_string_lossy()
        );
        // The driver is the node's, as for `gang`.
        return Ok(Some(Exit::new(EXIT_NODE_FAULT, hung)));
    }
    let run = gang.run(report, policy, env)?;
    match args.output.format {
        Format::Human => emit_err(&crate::gang::command::human(report, &run, false))?,
        Format::Json => emit_err(&crate::gang::render::json(report, &run))?,
    }
    Ok(None)
}

/// `exec --dry-run`: the tuned variables the environment lacks and the exec line,
/// as sh would take them.
fn dry_run(args: &ExecArgs, env: &[(OsString, OsString)], tuned: &[&tune::Setting]) -> Result<()> {
    for s in tuned {
        if env.iter().any(|(k, _)| k.as_os_str() == s.name.as_str()) {
            continue;
        }
        emit(&format!(
            "{}={}\n",
            s.name,
            render::env_file::shell_quote(&s.value)
        ))?;
    }
    emit(&format!(
        "exec {}\n",
        args.command
            .iter()
            .map(|a| render::env_file::shell_quote(&a.to_string_lossy()))
            .collect::<Vec<_>>()
            .join(" ")
    ))
}

/// Replaces this process with CMD (as PID 1, runs it as a child: `init`); returns only
/// when CMD could not be started, or, as PID 1, with CMD's exit.
fn exec_command(args: &ExecArgs, environment: Vec<(OsString, OsString)>, hung: HungCall) -> Exit {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    let mut command = std::process::Command::new(&args.command[0]);
    command
        .args(&args.command[1..])
        .env_clear()
        .envs(environment);
    if std::process::id() == 1 {
        return match init::run(&mut command) {
            Ok(code) => Exit::new(code, hung),
            Err(err) => not_started(args, &err, hung),
        };
    }
    // exec replaces this process: CMD's exit status and signals are the container's.
    let err = std::os::unix::process::CommandExt::exec(&mut command);
    not_started(args, &err, hung)
}

/// The exit for a command that could not be started, as shells give it.
fn not_started(args: &ExecArgs, err: &std::io::Error, hung: HungCall) -> Exit {
    crate::diagnostic::line(format_args!(
        "nccl-preflight: exec {}: {err}",
        args.command[0].to_string_lossy()
    ));
    Exit::new(
        match err.kind() {
            std::io::ErrorKind::NotFound => EXIT_NOT_FOUND,
            _ => EXIT_NOT_EXECUTABLE,
        },
        hung,
    )
}

/// `exec` as PID 1 of a PID namespace (a container's first process). The kernel gives
/// PID 1 only the signals it has a handler for (pid_namespaces(7): "the only signals
/// that can be sent to the init process are those for which the init process has
/// established a signal handler"): a command exec'd there that installs none (`sleep`,
/// a plain Python script) ignored the kubelet's SIGTERM until SIGKILL, and reaped no
/// orphan, which stayed a zombie. So as PID 1 exec stays, as tini does: CMD runs as its
/// child, SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 are passed on to it,
/// every child is reaped, and the exit code is CMD's, or 128 + the signal that killed it.
mod init {
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};
    use nix::sys::wait::{WaitStatus, waitpid};
    use std::sync::atomic::{AtomicI32, Ordering};

    /// CMD's pid, for the signal handler (0 until it runs).
    static CHILD: AtomicI32 = AtomicI32::new(0);
    /// A signal that came before CMD ran, passed on once it runs.
    static PENDING: AtomicI32 = AtomicI32::new(0);

    const FORWARDED: [Signal; 6] = [
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
        Signal::SIGQUIT,
        Signal::SIGUSR1,
        Signal::SIGUSR2,
    ];

    /// Sends the pending signal, if any, to CMD: exactly once, by whoever swaps it out.
    fn send_pending(child: i32) {
        let signal = PENDING.swap(0, Ordering::SeqCst);
        if signal != 0 {
            // SAFETY: kill(2) is async-signal-safe; `child` is CMD's pid, not yet reaped.
            unsafe { libc::kill(child, signal) };
        }
    }

    extern "C" fn forward(signal: libc::c_int) {
        let child = CHILD.load(Ordering::SeqCst);
        if child > 0 {
            // SAFETY: kill(2) is async-signal-safe; CMD is reaped only after it exited.
            unsafe { libc::kill(child, signal) };
            return;
        }
        PENDING.store(signal, Ordering::SeqCst);
        // CMD may have started meanwhile, after its starter looked for this one.
        let child = CHILD.load(Ordering::SeqCst);
        if child > 0 {
            send_pending(child);
        }
    }

    /// Runs `command` as this process's child until it exits; its exit code.
    pub(super) fn run(command: &mut std::process::Command) -> std::io::Result<u8> {
        // From here a signal is CMD's: one that comes before CMD runs waits for it
        // (the checks' handler would end this process and, with PID 1, the namespace).
        let action = SigAction::new(
            SigHandler::Handler(forward),
            SaFlags::SA_RESTART,
            SigSet::empty(),
        );
        for signal in FORWARDED {
            // SAFETY: the handler calls only kill(2) and atomic loads and stores.
            let _ = unsafe { sigaction(signal, &action) };
        }
        // std resets the signal mask and SIGPIPE in the child before execve, and
        // execve resets the handlers: CMD starts with the default dispositions.
        let child = command.spawn()?;
        let pid = i32::try_from(child.id()).unwrap_or(i32::MAX);
        CHILD.store(pid, Ordering::SeqCst);
        send_pending(pid);
        loop {
            // Any child: orphans reparented to PID 1 are reaped as they end.
            match waitpid(None, None) {
                Ok(WaitStatus::Exited(p, code)) if p.as_raw() == pid => {
                    return Ok(u8::try_from(code).unwrap_or(u8::MAX));
                }
                Ok(WaitStatus::Signaled(p, signal, _)) if p.as_raw() == pid => {
                    return Ok(128u8.saturating_add(u8::try_from(signal as i32).unwrap_or(0)));
                }
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// `install DIR`: this very binary, copied whole into DIR under a temp name and
/// renamed, so a container starting from DIR never runs a half-written file.
pub fn install(args: &crate::cli::InstallArgs) -> Result<Exit> {
    let name = &args.name;
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        bail!("install --name {name:?}: must be a plain file name");
    }
    let dir = &args.dir;
    let meta = std::fs::metadata(dir).with_context(|| format!("install {}", dir.display()))?;
    if !meta.is_dir() {
        bail!("install {}: not a directory", dir.display());
    }
    // /proc/self/exe still reads the running binary if its file was replaced meanwhile.
    let bytes = std::fs::read("/proc/self/exe")
        .or_else(|_| std::fs::read(std::env::current_exe()?))
        .context("install: reading this binary")?;
    let target = dir.join(name);
    output::write_atomically(&[Output {
        flag: "install",
        path: target.clone(),
        contents: bytes,
        mode: 0o755,
        keep_mode: false,
    }])?;
    emit(&format!("nccl-preflight: installed {}\n", target.display()))?;
    Ok(Exit::new(EXIT_OK, HungCall(false)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::GatherArgs;
    use serde_json::Value;

    /// Every gathering flag travels in the requests of the children that gather
    /// (`crate::child`): the flags clap defines and the keys serde writes both come from
    /// the derives, so a flag added and left out of the encoding fails here, whatever
    /// its name. Each request reads back as it was written.
    #[test]
    fn every_gather_flag_travels_in_the_child_requests() {
        use clap::{Args, FromArgMatches};
        /// The flags of `T` and `T` as clap gives it from its defaults.
        fn parsed<T: Args + FromArgMatches>() -> (std::collections::BTreeSet<String>, T) {
            let command = T::augment_args(clap::Command::new("gather"));
            let flags = command
                .get_arguments()
                .map(|a| a.get_id().to_string())
                .collect();
            (
                flags,
                T::from_arg_matches(&command.get_matches_from(["gather"])).unwrap(),
            )
        }
        /// Every key of a JSON object, nested objects' keys included.
        fn keys(v: &Value, out: &mut std::collections::BTreeSet<String>) {
            for (k, v) in v.as_object().into_iter().flatten() {
                out.insert(k.clone());
                keys(v, out);
            }
        }
        let (gather_flags, gather) = parsed::<GatherArgs>();
        let (library_flags, libraries) = parsed::<crate::cli::LibraryArgs>();
        assert!(gather_flags.len() > 10, "{gather_flags:?}");
        let facts = crate::serve::probe::Request {
            gather,
            probe_all: true,
            probed: None,
        };
        let bench = crate::bench::child::Request {
            part: crate::bench::child::Part::Links { cuda_facts: true },
            libraries,
            limits: crate::cli::BenchLimits {
                bench_seconds: std::time::Duration::from_millis(1500),
                min_bandwidth_fraction: 0.25,
            },
        };
        let facts_sent = crate::child::encode(&facts).unwrap();
        let bench_sent = crate::child::encode(&bench).unwrap();
        for (sent, flags, field) in [
            (&facts_sent, &gather_flags, "gather"),
            (&bench_sent, &library_flags, "libraries"),
        ] {
            let doc: Value = serde_json::from_slice(sent).unwrap();
            let mut sent_keys = std::collections::BTreeSet::new();
            keys(&doc[field], &mut sent_keys);
            let missing: Vec<_> = flags.difference(&sent_keys).collect();
            assert!(missing.is_empty(), "not in the request: {missing:?}");
        }
        let facts_read: crate::serve::probe::Request = crate::child::decode(&facts_sent).unwrap();
        let bench_read: crate::bench::child::Request = crate::child::decode(&bench_sent).unwrap();
        assert_eq!(crate::child::encode(&facts_read).unwrap(), facts_sent);
        assert_eq!(crate::child::encode(&bench_read).unwrap(), bench_sent);
    }

    /// fastrand, seeded: a fixed seed gives the same mutations on every run and machine.
    struct Rng(fastrand::Rng);
    impl Rng {
        fn new(seed: u64) -> Rng {
            Rng(fastrand::Rng::with_seed(seed))
        }
        /// A number in 0..n (0 when n is 0).
        fn below(&mut self, n: usize) -> usize {
            self.0.usize(..n.max(1))
        }
    }

    const HOSTILE_TEXT: &[&str] = &[
        "",
        "\u{1b}[2J\u{1b}]0;x\u{7}",
        "a\"b\\c\nd",
        "é",
        "999999999999999999999",
        "-1",
        "NaN",
    ];

    /// Replaces one value somewhere in `v` with a hostile one of any type.
    fn mutate(v: &mut Value, rng: &mut Rng) {
        let children = match v {
            Value::Object(m) => m.len(),
            Value::Array(a) => a.len(),
            _ => 0,
        };
        if children > 0 && rng.below(4) != 0 {
            let i = rng.below(children);
            match v {
                Value::Object(m) => {
                    if let Some((_, child)) = m.iter_mut().nth(i) {
                        return mutate(child, rng);
                    }
                }
                Value::Array(a) => {
                    if rng.below(8) == 0 {
                        // Many copies of one element: big inputs, duplicate names.
                        let copy = a[i].clone();
                        a.extend(std::iter::repeat_n(copy, 50));
                        return;
                    }
                    return mutate(&mut a[i], rng);
                }
                _ => {}
            }
        }
        // Mostly a hostile value of the same type (the loader then takes it and
        // the judges and renderers meet it); now and then any type at all.
        *v = match (&*v, rng.below(10)) {
            (_, 0) => Value::Null,
            (_, 1) => Value::Array(Vec::new()),
            (Value::String(_), n) if n % 2 == 0 => Value::from("x".repeat(70_000)),
            (Value::String(_), _) => Value::from(HOSTILE_TEXT[rng.below(HOSTILE_TEXT.len())]),
            (Value::Number(_), n) if n % 2 == 0 => Value::from(u64::MAX),
            (Value::Number(_), _) => Value::from(0),
            (Value::Bool(b), _) => Value::Bool(!b),
            (Value::Array(_), _) => Value::Array(Vec::new()),
            _ => Value::from(HOSTILE_TEXT[rng.below(HOSTILE_TEXT.len())]),
        };
    }

    /// A fixture's golden part of its facts laid over whole facts. Its sections are
    /// whole, or some whole fields of one (tests/integration/fixtures.rs,
    /// FACTS_UNDER_TEST): a section whose keys are a strict subset of the base's is laid
    /// field by field, any other replaces the base's (an enum's tag, `{"value": ..}`
    /// against `{"error": ..}`, must never be mixed).
    fn overlay(base: &mut Value, part: &Value) {
        for (key, section) in part.as_object().into_iter().flatten() {
            let at = &mut base[key];
            match (at.as_object_mut(), section.as_object()) {
                (Some(at), Some(fields))
                    if fields.len() < at.len() && fields.keys().all(|k| at.contains_key(k)) =>
                {
                    for (field, value) in fields {
                        at.insert(field.clone(), value.clone());
                    }
                }
                _ => *at = section.clone(),
            }
        }
    }

    /// A bounded, seeded fuzz of the facts loader and everything downstream of it
    /// (judges, tuning, the human, doctor, JSON, env-file, nccl.conf and termination
    /// renderers): mutated golden facts, in a report, must load or be refused with an error,
    /// and never panic. The seeds: healthy-pod's whole facts, and each fixture's golden
    /// part of its facts (tests/golden/NAME/facts.json) laid over them.
    #[test]
    fn fuzz_facts_loader_judges_and_renderers_with_seeded_mutations() {
        let goldens = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
        let read = |path: &std::path::Path| -> Value {
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
        };
        let whole = read(&goldens.join("healthy-pod/facts.json"));
        let mut seeds: Vec<Value> = Vec::new();
        let mut dirs: Vec<_> = std::fs::read_dir(&goldens)
            .unwrap()
            .map(|e| e.unwrap().path().join("facts.json"))
            .filter(|p| p.exists())
            .collect();
        dirs.sort();
        for path in dirs {
            let mut facts = whole.clone();
            overlay(&mut facts, &read(&path));
            seeds.push(
                serde_json::json!({ "schema": crate::report::REPORT_SCHEMA, "facts": facts }),
            );
        }
        assert!(seeds.len() > 10, "the golden facts are the seeds");
        let tmp = tempfile::Builder::new()
            .prefix("fuzz-facts-")
            .tempdir()
            .unwrap();
        let dir = tmp.path().to_path_buf();
        let path = dir.join("facts.json");
        let policy = crate::policy::build(&[], &[], None, None).unwrap();
        let mut rng = Rng::new(crate::test_facts::fuzz_seed(0x9e37_79b9_7f4a_7c15));
        let (mut loaded, mut refused) = (0, 0);
        for _ in 0..crate::test_facts::fuzz_iterations(400) {
            let mut doc = seeds[rng.below(seeds.len())].clone();
            for _ in 0..=rng.below(2) {
                mutate(&mut doc["facts"], &mut rng);
            }
            let mut text = doc.to_string();
            if rng.below(10) == 0 {
                // Raw byte damage too: truncation.
                let cut = rng.below(text.len());
                text = String::from_utf8_lossy(&text.as_bytes()[..cut]).into_owned();
            }
            std::fs::write(&path, &text).unwrap();
            let Ok(facts) = crate::run::load_facts(&path) else {
                refused += 1;
                continue;
            };
            loaded += 1;
            let report = Report::judge(facts, &policy);
            assert!(!render::human::render(&report, false).is_empty());
            assert!(!render::doctor::render(&report, false).is_empty());
            assert!(!render::json::render(&report).is_empty());
            let _ = render::env_file::render(&report);
            let _ = render::nccl_conf::render(&report);
            assert!(render::termination::render(&report).len() <= render::termination::MAX_BYTES);
        }
        // Both sides of the loader were exercised.
        assert!(
            loaded > 50 && refused > 20,
            "loaded {loaded}, refused {refused}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A bounded, seeded fuzz of the NCCL_SOCKET_IFNAME and NCCL_IB_HCA parsers and
    /// everything that reads their result (nccl-env, tuning, the renderers), on a
    /// node with interfaces and IB devices: random values over the characters those
    /// grammars use (`^`, `=`, `:`, `,`), hostile ones among them, must not panic.
    #[test]
    fn fuzz_socket_ifname_and_ib_hca_values_with_seeded_mutations() {
        use crate::test_facts;
        const ALPHABET: &[&str] = &[
            "^", "=", ":", ",", "eth", "0", "1", "ib", "mlx5_", "lo", "docker", " ", "", "\u{1b}",
            "é", "\n", "-", "*",
        ];
        let policy = crate::policy::build(&[], &[], None, None).unwrap();
        let base = test_facts::with_ib(test_facts::healthy());
        let mut rng = Rng::new(test_facts::fuzz_seed(0x0123_4567_89ab_cdef));
        for _ in 0..test_facts::fuzz_iterations(1500) {
            let mut value = String::new();
            for _ in 0..rng.below(12) {
                value.push_str(ALPHABET[rng.below(ALPHABET.len())]);
            }
            let name = ["NCCL_SOCKET_IFNAME", "NCCL_IB_HCA", "NCCL_SOCKET_FAMILY"][rng.below(3)];
            let facts = test_facts::with_env(base.clone(), &[(name, value.as_str())]);
            let report = Report::judge(facts, &policy);
            assert!(
                report.checks.iter().any(|f| f.id == "nccl-env"),
                "{name}={value:?}"
            );
            assert!(render::human::render(&report, false).contains("Verdict: "));
            let _ = render::env_file::render(&report);
            let _ = render::nccl_conf::render(&report);
        }
    }
}
