//! A child process of this binary, spoken to in one small protocol: the parent
//! writes one request on the child's standard input and closes it; the child
//! answers with one framed reply on its standard output (a line
//! `nccl-preflight-child <length>`, then exactly that many bytes), so whatever
//! a vendor library prints around it cannot be mistaken for the reply. The
//! parent bounds everything: the child runs in its own process group, is killed
//! with it past the deadline, and dies with its parent (PR_SET_PDEATHSIG), so
//! a parent ended by SIGKILL or SIGTERM leaves nothing behind; output past a
//! cap is drained and dropped. The gang's worker speaks it; bench's child and
//! serve's probe could move onto it.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The reply's header word.
const FRAME: &str = "nccl-preflight-child";
/// Standard output and error kept from a child, bytes each.
pub const OUTPUT_CAP: u64 = 4 << 20;
/// The largest request a child reads.
pub const REQUEST_CAP: u64 = 1 << 20;

/// How a child ended.
#[derive(Debug)]
pub enum Ended {
    /// It replied (whatever its exit status).
    Replied(Vec<u8>),
    /// It exited without a reply; the tail of its standard error.
    Silent { status: ExitStatus, stderr: String },
    /// It ran past the deadline and was killed with its process group.
    Killed { after: Duration },
    /// It could not be started or waited for.
    Failed(String),
}

/// Runs `exe args` with exactly `env`, sends `request`, waits at most `limit`.
pub fn call(
    exe: &Path,
    args: &[&str],
    env: Vec<(OsString, OsString)>,
    request: &[u8],
    limit: Duration,
) -> Ended {
    let parent = std::process::id() as libc::pid_t;
    let mut cmd = Command::new(exe);
    cmd.args(args)
        .env_clear()
        .envs(env)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    // SAFETY: the closure runs in the child between fork and exec and calls only
    // async-signal-safe functions (prctl, getppid, _exit); it touches no memory of
    // the parent's beyond the copied `parent` integer.
    unsafe {
        cmd.pre_exec(move || {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
            // The parent died before the prctl: nobody is left to send the signal.
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return Ended::Failed(format!("starting {}: {e}", exe.display())),
    };
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(request);
    }
    let out = drain(child.stdout.take());
    let err = drain(child.stderr.take());
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if started.elapsed() > limit => break None,
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => {
                kill_group(&mut child);
                return Ended::Failed(format!("waiting for {}: {e}", exe.display()));
            }
        }
    };
    let Some(status) = status else {
        kill_group(&mut child);
        return Ended::Killed {
            after: started.elapsed(),
        };
    };
    // Whatever the child started and left behind holds no pipe of ours past here.
    // SAFETY: kill(2) on the child's own process group (created by process_group(0)).
    unsafe { libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL) };
    let stdout = out.join().unwrap_or_default();
    let stderr = err.join().unwrap_or_default();
    match reply_in(&stdout) {
        Some(r) => Ended::Replied(r),
        None => Ended::Silent {
            status,
            stderr: String::from_utf8_lossy(&stderr)
                .chars()
                .take(2000)
                .collect(),
        },
    }
}

fn kill_group(child: &mut std::process::Child) {
    // SAFETY: kill(2) on the child's own process group (created by process_group(0)).
    unsafe { libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL) };
    let _ = child.wait();
}

/// Reads a pipe to its end, keeping OUTPUT_CAP bytes.
fn drain(pipe: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut kept = Vec::new();
        if let Some(mut p) = pipe {
            let _ = (&mut p).take(OUTPUT_CAP).read_to_end(&mut kept);
            let _ = std::io::copy(&mut p, &mut std::io::sink());
        }
        kept
    })
}

/// The last complete reply frame in `out`.
fn reply_in(out: &[u8]) -> Option<Vec<u8>> {
    let marker = format!("\n{FRAME} ");
    let mut text = b"\n".to_vec();
    text.extend_from_slice(out);
    let mut found = None;
    let mut from = 0;
    while let Some(at) = memchr::memmem::find(&text[from..], marker.as_bytes()) {
        let start = from + at + marker.len();
        let line_end = memchr::memchr(b'\n', &text[start..]).map(|e| start + e);
        if let Some(end) = line_end
            && let Some(len) = std::str::from_utf8(&text[start..end])
                .ok()
                .and_then(|n| n.trim().parse::<usize>().ok())
            && let Some(body) = text.get(end + 1..end + 1 + len)
        {
            found = Some(body.to_vec());
        }
        from = start;
    }
    found
}

/// The child's side: its request from standard input (at most REQUEST_CAP bytes).
pub fn request() -> Result<Vec<u8>, String> {
    let mut input = Vec::new();
    std::io::stdin()
        .take(REQUEST_CAP)
        .read_to_end(&mut input)
        .map_err(|e| format!("reading the request: {e}"))?;
    Ok(input)
}

/// The child's side: writes `message` as the reply frame and flushes.
pub fn reply(message: &[u8]) {
    let mut out = std::io::stdout().lock();
    let _ = write!(out, "\n{FRAME} {}\n", message.len());
    let _ = out.write_all(message);
    let _ = out.write_all(b"\n");
    let _ = out.flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_whole_frame_wins_over_noise() {
        let out = b"noise nccl-preflight-child 3\nabc\nnccl-preflight-child 2\n{}\nnccl-preflight-child 99\nshort";
        assert_eq!(reply_in(out), Some(b"{}".to_vec()));
        assert_eq!(reply_in(b"nccl-preflight-child 1\nx"), Some(b"x".to_vec()));
        assert_eq!(reply_in(b"nothing"), None);
    }

    #[test]
    fn a_child_that_hangs_is_killed_with_its_group_in_the_limit() {
        let started = Instant::now();
        let ended = call(
            Path::new("/bin/sh"),
            &["-c", "sleep 30 & sleep 30"],
            vec![("PATH".into(), "/bin:/usr/bin".into())],
            b"",
            Duration::from_millis(300),
        );
        assert!(matches!(ended, Ended::Killed { .. }), "{ended:?}");
        assert!(started.elapsed() < Duration::from_secs(5));
        let said = call(
            Path::new("/bin/sh"),
            &[
                "-c",
                "read x; printf 'junk\\nnccl-preflight-child 5\\n%s\\n' \"$x\"; exit 3",
            ],
            vec![("PATH".into(), "/bin:/usr/bin".into())],
            b"hello\n",
            Duration::from_secs(10),
        );
        assert!(
            matches!(said, Ended::Replied(ref r) if r == b"hello"),
            "{said:?}"
        );
        let silent = call(
            Path::new("/bin/sh"),
            &["-c", "echo oops >&2; exit 4"],
            vec![],
            b"",
            Duration::from_secs(10),
        );
        assert!(
            matches!(silent, Ended::Silent { ref stderr, .. } if stderr.contains("oops")),
            "{silent:?}"
        );
    }
}
