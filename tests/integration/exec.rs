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
