//! `exec`: check, tune, then replace this process with the command: its exit
//! status and signals are the container's, the user's variables win over tuned
//! ones, arguments pass through untouched, a missing command is 127, and a
//! failed check starts nothing.

use super::support::*;
use std::os::unix::process::ExitStatusExt;

fn exec_in(fixture: &str, cmd: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut args = vec!["--"];
    args.extend(cmd);
    fixture_command(fixture, "exec", &args, env)
        .output()
        .unwrap()
}

#[test]
fn exit_status_signals_and_the_same_process() {
    let out = exec_in("healthy-pod", &["sh", "-c", "exit 7"], &[]);
    assert_eq!(out.status.code(), Some(7), "{}", stderr(&out));
    let out = exec_in("healthy-pod", &["sh", "-c", "kill -TERM $$"], &[]);
    assert_eq!(out.status.signal(), Some(libc::SIGTERM));
    // exec, not spawn: the command runs under the wrapper's own pid.
    let child = fixture_command("healthy-pod", "exec", &["--", "sh", "-c", "echo $$"], &[])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    assert_eq!(stdout(&out).trim(), pid.to_string());
}

#[test]
fn user_values_win_and_arguments_pass_through() {
    let script = r#"printf '%s|' "$NCCL_SOCKET_IFNAME" "$NCCL_BUFFSIZE" "$1" "$2""#;
    let out = exec_in(
        "rdma-p4d-efa",
        &["sh", "-c", script, "sh", "a b 'c'", "$(id) \"q\""],
        &[("NCCL_SOCKET_IFNAME", "eth")],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // The user's interface wins; the tuned EFA buffer size is added; arguments arrive as given.
    assert_eq!(stdout(&out), "eth|8388608|a b 'c'|$(id) \"q\"|");
    let out = exec_in(
        "rdma-p4d-efa",
        &["sh", "-c", "printf %s \"$NCCL_BUFFSIZE\""],
        &[("NCCL_BUFFSIZE", "4194304")],
    );
    assert_eq!(stdout(&out), "4194304");
}

#[test]
fn missing_command_and_failed_checks() {
    let out = exec_in("healthy-pod", &["no-such-command-here"], &[]);
    assert_eq!(out.status.code(), Some(127));
    assert!(
        stderr(&out).contains("exec no-such-command-here: No such file or directory"),
        "{}",
        stderr(&out)
    );
    let dir = scratch("exec-failed");
    let marker = dir.join("started");
    // --min-shm 1GiB: the 64 MiB /dev/shm fails a requirement given (issue 36).
    let out = exec_in(
        "runtime-defaults",
        &["touch", marker.to_str().unwrap()],
        &[("NCCL_PREFLIGHT_MIN_SHM", "1GiB")],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(!marker.exists(), "the command ran although dev-shm failed");
    assert!(
        stderr(&out).contains("FAIL  dev-shm"),
        "the report goes to stderr"
    );
    let out = exec_in(
        "runtime-defaults",
        &["touch", marker.to_str().unwrap()],
        &[
            ("NCCL_PREFLIGHT_MIN_SHM", "1GiB"),
            ("NCCL_PREFLIGHT_IGNORE", "dev-shm"),
        ],
    );
    assert_eq!(out.status.code(), Some(0));
    assert!(marker.exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn dry_run_prints_and_runs_nothing() {
    let out = fixture_command(
        "rdma-p4d-efa",
        "exec",
        &["--dry-run", "--", "touch", "/nonexistent/never"],
        // A user value that differs from the tuned one (1 byte would now fail
        // nccl-env: NCCL dies of SIGFPE with buffers of 512 bytes or less).
        &[("NCCL_BUFFSIZE", "16777216")],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("NCCL_P2P_NET_CHUNKSIZE='524288'\n"), "{text}");
    assert!(
        !text.contains("NCCL_BUFFSIZE"),
        "the user's value is not shown as set: {text}"
    );
    assert!(
        text.ends_with("exec 'touch' '/nonexistent/never'\n"),
        "{text}"
    );
}

#[test]
fn hung_driver_call_that_was_ignored_refuses_exec_and_says_why() {
    // Issue 16: after a hung driver call the user ignored (--ignore gpu-devices), exec
    // printed "starting ..." and exited 1 without a reason.
    let out = exec_in(
        "gpu-hung-p2p-query",
        &["/bin/echo", "started"],
        &[("NCCL_PREFLIGHT_IGNORE", "gpu-devices")],
    );
    // The driver is the node's: exit 3, retry elsewhere.
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert_eq!(stdout(&out), "", "the command did not run");
    let err = stderr(&out);
    assert!(!err.contains("; starting"), "{err}");
    assert!(
        err.contains(
            "not starting /bin/echo: a GPU driver call did not return within --timeout 1.0 s"
        ),
        "{err}"
    );
    assert!(
        err.contains("Verdict: WARN"),
        "the report says which call: {err}"
    );
}

/// `exec` in `fixture` as PID 1 of a new PID namespace (`unshare --pid --fork
/// --mount-proc`, as a container's first process), with `env` over the fixture's.
/// Sends `signal` to PID 1 once `ready(pid1)` holds, then waits up to the hang guard:
/// (exit code, stdout, stderr).
fn as_pid_1(
    fixture: &str,
    cmd: &[&str],
    env: &[(&str, &str)],
    ready: &dyn Fn(u32) -> bool,
    signal: i32,
) -> (Option<i32>, String, String) {
    use std::time::Instant;
    let mut args = vec!["--"];
    args.extend(cmd);
    let inner = fixture_command(fixture, "exec", &args, env);
    let mut outer = std::process::Command::new("unshare");
    outer
        .args(["--pid", "--fork", "--mount-proc"])
        .arg(inner.get_program())
        .args(inner.get_args())
        .env_clear()
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    for (k, v) in inner.get_envs() {
        if let Some(v) = v {
            outer.env(k, v);
        }
    }
    if let Some(dir) = inner.get_current_dir() {
        outer.current_dir(dir);
    }
    let mut unshare = outer.spawn().unwrap();
    let started = Instant::now();
    let pid1 = loop {
        if let Some(&p) = children(unshare.id()).first()
            && ready(p)
        {
            break p;
        }
        assert!(started.elapsed() < WAIT, "PID 1 never got ready");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    // SAFETY: kill(2) on a process this test started.
    unsafe { libc::kill(pid1 as i32, signal) };
    let sent = Instant::now();
    while unshare.try_wait().unwrap().is_none() && sent.elapsed() < WAIT {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let _ = unshare.kill();
    let out = unshare.wait_with_output().unwrap();
    (out.status.code(), stdout(&out), stderr(&out))
}

fn children(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// True once `pid` has a child whose command is `name`.
fn runs(pid: u32, name: &str) -> bool {
    children(pid).iter().any(|c| {
        std::fs::read_to_string(format!("/proc/{c}/comm")).is_ok_and(|comm| comm.trim() == name)
    })
}

/// How long a PID-1 run may take to get ready, or to end after its signal: a hang
/// guard, not a speed.
const WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Issue 39, re-run of the PID-1 signal cases. As PID 1 (a container's first
/// process) `exec` replaced itself with CMD, and the kernel gives PID 1 only the
/// signals it handles (pid_namespaces(7)): `sleep` (or a plain Python script) ignored
/// the kubelet's SIGTERM until SIGKILL, and orphans stayed zombies. Expected, as tini
/// and docker --init behave: each of SIGTERM, SIGINT and SIGHUP reaches CMD; CMD killed
/// by it makes the exit code 128 + the signal; CMD's own exit code passes through; an
/// orphan reparented to PID 1 is reaped, not left a zombie.
#[test]
fn as_pid_1_exec_passes_signals_on_and_reaps_orphans() {
    let test = "exec_as_pid_1";
    if !require_root(test) || !require_tools(test, &["unshare"]) {
        return;
    }
    let dir = scratch("exec-pid1");
    for signal in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
        let sleeping = |p: u32| runs(p, "sleep");
        let (code, _, err) = as_pid_1("healthy-pod", &["sleep", "60"], &[], &sleeping, signal);
        assert_eq!(code, Some(128 + signal), "signal {signal}: {err}");
        // Signalled once its trap is set (it says so in a file).
        let mark = dir.join(format!("trapped-{signal}"));
        let trap = format!(
            "trap 'echo caught; exit 9' TERM INT HUP; : > {}; while :; do sleep 0.05; done",
            mark.display()
        );
        let trapped = |_| mark.exists();
        let (code, out, err) = as_pid_1("healthy-pod", &["sh", "-c", &trap], &[], &trapped, signal);
        assert_eq!(
            (code, out.as_str()),
            (Some(9), "caught\n"),
            "signal {signal}: {err}"
        );
    }
    // The inner shell exits at once, leaving its `sleep` to PID 1; a second later the
    // outer shell looks for it in /proc (the namespace's, --mount-proc) and says so.
    let (orphan, said) = (dir.join("orphan"), dir.join("said"));
    let script = format!(
        "sh -c 'sleep 0.2 & echo $! > {0}'; sleep 1.5; p=$(cat {0}); \
         if [ -e /proc/$p ]; then echo \"left: $(cut -d' ' -f3 /proc/$p/stat)\" > {1}.new; \
         else echo reaped > {1}.new; fi; mv {1}.new {1}; sleep 60",
        orphan.display(),
        said.display()
    );
    let done = |_| said.exists();
    let (code, _, err) = as_pid_1(
        "healthy-pod",
        &["sh", "-c", &script],
        &[],
        &done,
        libc::SIGTERM,
    );
    let said = std::fs::read_to_string(&said).unwrap();
    assert_eq!(said, "reaped\n", "{err}");
    assert_eq!(code, Some(128 + libc::SIGTERM), "{err}");
    // While the checks still run (a P2P query that hangs, up to --timeout 20s), SIGHUP
    // ends PID 1 at once, saying so, and starts nothing: it was dropped, and the checks
    // went on.
    // Ready once its "nvml" thread (the NVML calls under their deadline) is running.
    let checking = |p: u32| {
        std::fs::read_dir(format!("/proc/{p}/task")).is_ok_and(|tasks| {
            tasks.flatten().any(|t| {
                std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == "nvml")
            })
        })
    };
    let (code, out, err) = as_pid_1(
        "gpu-hung-p2p-query",
        &["/bin/echo", "started"],
        &[("NCCL_PREFLIGHT_TIMEOUT", "20s")],
        &checking,
        libc::SIGHUP,
    );
    assert_eq!(code, Some(128 + libc::SIGHUP), "{err}");
    assert!(
        err.contains("stopped by a signal") && out.is_empty(),
        "{out}\n{err}"
    );
}
