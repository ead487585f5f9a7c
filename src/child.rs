//! The children of this binary, and how they are asked and answered (the one place
//! that says so). `serve` gathers in `facts-child` (`serve::probe`), `init --bench`
//! measures in `bench-child` (`bench::child`), `gang` runs NCCL in `gang-worker`
//! (`gang::spawn`): work that must not happen, or stay mapped, in the asking process.
//!
//! The mode is the child's only argument; the request is ONE JSON document on its
//! standard input (`start`/`call` encode it, the child's `request` decodes it), whose
//! types derive their encoding: `GatherArgs` travels whole, so a new flag needs no
//! builder, and no child reads flags or `NCCL_PREFLIGHT_*` for what its request says.
//! The child answers with one framed reply on its standard output (a line
//! `nccl-preflight-child <length>`, then exactly that many bytes), so whatever a vendor
//! library prints around it cannot be mistaken for the reply; earlier frames may precede
//! it (`Started::frames`), and a child that replied may hang up (`hang_up`): the parent
//! then takes the reply without waiting for its exit. The parent bounds everything: the
//! child runs in its own process group, is killed with it past the deadline, and dies
//! with its parent (PR_SET_PDEATHSIG), so a parent ended by SIGKILL or SIGTERM leaves
//! nothing behind; output past a cap is drained and dropped.
//!
//! One child speaks otherwise: `gather::reader` reads host files in a bare clone(2) of
//! the gathering process, without exec (so not this binary in a mode), and allocates
//! nothing after the clone, so it trades fixed binary messages on two pipes; its header
//! says why.

use serde::Serialize;
use serde::de::DeserializeOwned;
use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The reply's header word.
const FRAME: &str = "nccl-preflight-child";
/// Standard output and error kept from a child, bytes each.
const OUTPUT_CAP: u64 = 4 << 20;
/// The largest request a child reads.
const REQUEST_CAP: u64 = 1 << 20;

/// How a child ended.
#[derive(Debug)]
pub enum Ended {
    /// It replied; the tail of its standard error beside (`--trace` lines a parent may
    /// pass on), and its exit status (None when it hung up and was not waited for).
    Replied {
        reply: Vec<u8>,
        stderr: String,
        status: Option<ExitStatus>,
    },
    /// It exited without a reply; the tail of its standard error.
    Silent { status: ExitStatus, stderr: String },
    /// It ran past the deadline and was killed with its process group.
    Killed { after: Duration },
    /// It could not be started or waited for.
    Failed(String),
}

/// A child started and not yet sent its request. Dropped unfinished, it is killed
/// with its process group.
pub struct Started {
    child: Option<std::process::Child>,
    exe: std::path::PathBuf,
    out: Option<std::thread::JoinHandle<Vec<u8>>>,
    /// Each whole frame of standard output, as it arrives.
    frames: Option<Frames>,
    err: Option<std::thread::JoinHandle<Vec<u8>>>,
    at: Instant,
}

/// Runs `exe mode` with exactly `env` and `request`, waits at most `limit`.
pub fn call(
    exe: &Path,
    mode: &str,
    request: &impl Serialize,
    env: Vec<(OsString, OsString)>,
    limit: Duration,
) -> Ended {
    match start(exe, mode, request, env) {
        Ok(started) => started.finish(limit),
        Err(e) => Ended::Failed(e),
    }
}

/// Starts `exe mode` with exactly `env`, in its own process group, to die with this
/// process, and sends it `request`; its output is drained from now on.
pub fn start(
    exe: &Path,
    mode: &str,
    request: &impl Serialize,
    env: Vec<(OsString, OsString)>,
) -> Result<Started, String> {
    let body = encode(request).map_err(|e| format!("{mode}: {e}"))?;
    spawn(exe, &[mode], env, body)
}

/// A request as it travels: one JSON document.
pub(crate) fn encode(request: &impl Serialize) -> Result<Vec<u8>, String> {
    serde_json::to_vec(request).map_err(|e| format!("encoding the request: {e}"))
}

/// A request as the child reads it back.
pub(crate) fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, String> {
    serde_json::from_slice(body).map_err(|e| format!("the request on standard input: {e}"))
}

/// Starts `exe args` as `start` does and writes `body` on its standard input, then
/// closes it. The write runs on a thread of its own: a child that never reads cannot
/// hold the parent past its deadline.
fn spawn(
    exe: &Path,
    args: &[impl AsRef<std::ffi::OsStr>],
    env: Vec<(OsString, OsString)>,
    body: Vec<u8>,
) -> Result<Started, String> {
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
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("starting {}: {e}", exe.display()))?;
    if let Some(mut stdin) = child.stdin.take() {
        // Not started: the pipe closes with the closure, and the child reads no request.
        let _ = std::thread::Builder::new()
            .name("child-request".into())
            .spawn(move || {
                let _ = stdin.write_all(&body);
            });
    }
    let (sent, frames) = std::sync::mpsc::channel();
    let out = drain_frames(child.stdout.take(), sent);
    let err = drain(child.stderr.take());
    Ok(Started {
        child: Some(child),
        exe: exe.to_path_buf(),
        out: Some(out),
        frames: Some(Frames(frames)),
        err: Some(err),
        at: Instant::now(),
    })
}

/// The frames a child sends, in order, while it runs.
pub struct Frames(std::sync::mpsc::Receiver<Vec<u8>>);

/// Why no frame came.
#[derive(Debug, PartialEq, Eq)]
pub enum NoFrame {
    TimedOut,
    /// The child's standard output closed (it ended, or hung up) with no further frame.
    Closed,
}

impl Frames {
    /// The next frame, waiting at most `limit`.
    pub fn next(&self, limit: Duration) -> Result<Vec<u8>, NoFrame> {
        self.0.recv_timeout(limit).map_err(|e| match e {
            std::sync::mpsc::RecvTimeoutError::Timeout => NoFrame::TimedOut,
            std::sync::mpsc::RecvTimeoutError::Disconnected => NoFrame::Closed,
        })
    }
}

impl Started {
    /// The frames as they arrive, for a parent that acts on one before the reply
    /// (`init --bench`'s CUDA facts); `finish` still returns the last. Once only.
    pub fn frames(&mut self) -> Option<Frames> {
        self.frames.take()
    }

    /// Waits until `limit` after the child's start. A child that replied and hung up
    /// (`hang_up`) is not waited for: it is killed with its group and reaped in the
    /// background, since a GPU process's exit (its contexts torn down) can take hundreds
    /// of milliseconds.
    pub fn finish(mut self, limit: Duration) -> Ended {
        let Some(mut child) = self.child.take() else {
            return Ended::Failed(String::from("the child was already waited for"));
        };
        let hung_up = |s: &Started| {
            [&s.out, &s.err]
                .iter()
                .all(|h| h.as_ref().is_none_or(|h| h.is_finished()))
        };
        let mut early: Option<(Vec<u8>, String)> = None;
        let status = loop {
            match child.try_wait() {
                Ok(Some(s)) => break Some(s),
                Ok(None) if early.is_none() && hung_up(&self) => {
                    let (stdout, stderr) = self.output();
                    if let Some(reply) = reply_in(&stdout) {
                        kill_group_in_background(child);
                        return Ended::Replied {
                            reply,
                            stderr,
                            status: None,
                        };
                    }
                    early = Some((stdout, stderr));
                }
                Ok(None) if self.at.elapsed() > limit => break None,
                Ok(None) => std::thread::sleep(Duration::from_millis(5)),
                Err(e) => {
                    kill_group(&mut child);
                    return Ended::Failed(format!("waiting for {}: {e}", self.exe.display()));
                }
            }
        };
        let Some(status) = status else {
            kill_group(&mut child);
            return Ended::Killed {
                after: self.at.elapsed(),
            };
        };
        // Whatever the child started and left behind holds no pipe of ours past here.
        // SAFETY: kill(2) on the child's own process group (created by process_group(0)).
        unsafe { libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL) };
        let (stdout, stderr) = early.unwrap_or_else(|| self.output());
        match reply_in(&stdout) {
            Some(reply) => Ended::Replied {
                reply,
                stderr,
                status: Some(status),
            },
            None => Ended::Silent {
                status,
                stderr: stderr.chars().take(2000).collect(),
            },
        }
    }

    /// The child's standard output and error so far (all of it once both are closed).
    fn output(&mut self) -> (Vec<u8>, String) {
        let joined = |h: Option<std::thread::JoinHandle<Vec<u8>>>| {
            h.and_then(|h| h.join().ok()).unwrap_or_default()
        };
        let stdout = joined(self.out.take());
        let stderr: String = String::from_utf8_lossy(&joined(self.err.take()))
            .chars()
            .take(OUTPUT_CAP as usize)
            .collect();
        (stdout, stderr)
    }
}

/// Kills the child's group and reaps it on a thread of its own.
fn kill_group_in_background(mut child: std::process::Child) {
    // SAFETY: kill(2) on the child's own process group (created by process_group(0)).
    unsafe { libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL) };
    let _ = std::thread::Builder::new()
        .name("child-reaper".into())
        .spawn(move || {
            let _ = child.wait();
        });
}

impl Drop for Started {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            kill_group(child);
        }
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

/// Reads standard output to its end like `drain`, and sends each whole frame on
/// `sent` as soon as it is complete (the receiver may be gone: nobody listens). Each
/// read scans only what no earlier scan settled.
fn drain_frames(
    pipe: Option<impl Read + Send + 'static>,
    sent: std::sync::mpsc::Sender<Vec<u8>>,
) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut kept = Vec::new();
        let Some(mut pipe) = pipe else {
            return kept;
        };
        let mut chunk = [0u8; 64 * 1024];
        let (mut settled, mut line_start) = (0, true);
        loop {
            let n = match pipe.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            };
            let room = (OUTPUT_CAP as usize).saturating_sub(kept.len());
            kept.extend_from_slice(&chunk[..n.min(room)]);
            let scan = frames_in(&kept[settled..], line_start);
            for frame in scan.frames {
                let _ = sent.send(frame);
            }
            settled += scan.resume;
            line_start &= scan.resume == 0;
        }
        kept
    })
}

/// The last complete reply frame in `out`.
fn reply_in(out: &[u8]) -> Option<Vec<u8>> {
    frames_in(out, true).frames.pop()
}

/// What one scan of the output found.
struct Scan {
    /// Every complete frame, in order.
    frames: Vec<Vec<u8>>,
    /// Where a later scan of more output must start: at the line break before a header
    /// whose frame is not complete yet, else far enough before the end that a header
    /// cut across reads is found whole (with the line break before it).
    resume: usize,
}

/// Scans `out` for frames: a header line `nccl-preflight-child <length>` at the start
/// of a line (`at_line_start`: also at the start of `out`), then that many bytes. A
/// frame's body is not searched for further frames.
fn frames_in(out: &[u8], at_line_start: bool) -> Scan {
    let head = format!("{FRAME} ");
    let marker = format!("\n{head}");
    let after =
        |from: usize| memchr::memmem::find(&out[from..], marker.as_bytes()).map(|at| from + at + 1);
    let mut next = if at_line_start && out.starts_with(head.as_bytes()) {
        Some(0)
    } else {
        after(0)
    };
    let mut frames = Vec::new();
    let mut resume = out.len().saturating_sub(marker.len());
    let mut settled = 0;
    while let Some(at) = next {
        let start = at + head.len();
        let line_end = memchr::memchr(b'\n', &out[start..]).map(|e| start + e);
        let Some(end) = line_end else {
            resume = at.saturating_sub(1);
            break;
        };
        let len = std::str::from_utf8(&out[start..end])
            .ok()
            .and_then(|n| n.trim().parse::<usize>().ok());
        match len {
            Some(len) if out.len() >= end + 1 + len => {
                frames.push(out[end + 1..end + 1 + len].to_vec());
                settled = end + 1 + len;
                next = after(settled);
            }
            // The body is still coming: wait for it here.
            Some(_) => {
                resume = at.saturating_sub(1);
                break;
            }
            // Not a header after all.
            None => next = after(start),
        }
    }
    Scan {
        frames,
        resume: resume.max(settled),
    }
}

/// The child's side: its request, the JSON document on standard input (at most
/// REQUEST_CAP bytes), decoded.
pub fn request<T: DeserializeOwned>() -> Result<T, String> {
    let mut input = Vec::new();
    std::io::stdin()
        .take(REQUEST_CAP)
        .read_to_end(&mut input)
        .map_err(|e| format!("reading the request: {e}"))?;
    decode(&input)
}

/// The child's side: writes `message` as the reply frame and flushes.
pub fn reply(message: &[u8]) {
    let mut out = std::io::stdout().lock();
    let _ = write!(out, "\n{FRAME} {}\n", message.len());
    let _ = out.write_all(message);
    let _ = out.write_all(b"\n");
    let _ = out.flush();
}

/// The child's side, after `reply`: points standard output and error at /dev/null,
/// so the parent sees both pipes close and takes the reply without waiting for this
/// process's exit. Whatever is printed after this is lost.
pub fn hang_up() {
    let _ = std::io::stderr().lock().flush();
    let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") else {
        return;
    };
    use std::os::fd::AsRawFd;
    for fd in [libc::STDOUT_FILENO, libc::STDERR_FILENO] {
        // SAFETY: dup2(2) onto the standard descriptors, from a descriptor this
        // function owns; Rust's stdout is flushed by `reply` and unbuffered stderr
        // holds nothing, so no buffered byte is written to the wrong file later.
        unsafe { libc::dup2(null.as_raw_fd(), fd) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `sh -c script` as a child, sent `body`, waited for at most `limit`.
    fn sh(script: &str, body: &[u8], limit: Duration) -> Ended {
        let path = vec![("PATH".into(), "/bin:/usr/bin".into())];
        match spawn(Path::new("/bin/sh"), &["-c", script], path, body.to_vec()) {
            Ok(started) => started.finish(limit),
            Err(e) => Ended::Failed(e),
        }
    }

    /// Output fed a few bytes at a time, scanning only what is not settled as the drain
    /// does, finds the same frames as one scan of the whole: headers and bodies cut
    /// anywhere, noise between frames, a header at the very start.
    #[test]
    fn scanning_in_pieces_finds_what_one_scan_finds() {
        let out: &[u8] = b"nccl-preflight-child 3\nabc\nnoise nccl-preflight-child 9\n\nnccl-preflight-child 5\nhello\nmore noise\n\nnccl-preflight-child 2\n{}\n";
        let whole = frames_in(out, true).frames;
        assert_eq!(whole, [b"abc".to_vec(), b"hello".to_vec(), b"{}".to_vec()]);
        for step in 1..out.len() {
            let (mut kept, mut found) = (Vec::new(), Vec::new());
            let (mut settled, mut line_start) = (0, true);
            for piece in out.chunks(step) {
                kept.extend_from_slice(piece);
                let scan = frames_in(&kept[settled..], line_start);
                found.extend(scan.frames);
                settled += scan.resume;
                line_start &= scan.resume == 0;
            }
            assert_eq!(found, whole, "pieces of {step} bytes");
        }
    }

    #[test]
    fn the_last_whole_frame_wins_over_noise() {
        let out = b"noise nccl-preflight-child 3\nabc\nnccl-preflight-child 2\n{}\nnccl-preflight-child 99\nshort";
        assert_eq!(reply_in(out), Some(b"{}".to_vec()));
        assert_eq!(reply_in(b"nccl-preflight-child 1\nx"), Some(b"x".to_vec()));
        assert_eq!(reply_in(b"nothing"), None);
    }

    /// A child that replied and hung up is not waited for (its exit, a GPU process's
    /// teardown, can be slow); one dropped unfinished is killed with its group.
    #[test]
    fn a_reply_is_taken_at_hang_up_and_an_unfinished_child_dies_when_dropped() {
        let path = vec![("PATH".into(), "/bin:/usr/bin".into())];
        let started = Instant::now();
        let said = sh(
            "read x; printf '\\nnccl-preflight-child 2\\nok\\n'; echo done >&2; exec >/dev/null 2>&1; sleep 30",
            b"go\n",
            Duration::from_secs(60),
        );
        assert!(
            matches!(said, Ended::Replied { ref reply, ref stderr, status: None } if reply == b"ok" && stderr.contains("done")),
            "{said:?}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "waited for the exit"
        );
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("pid");
        let script = format!("echo $$ > {}; sleep 30", pid_file.display());
        let child = spawn(
            Path::new("/bin/sh"),
            &["-c", script.as_str()],
            path,
            Vec::new(),
        )
        .unwrap();
        let pid = loop {
            if let Some(pid) = std::fs::read_to_string(&pid_file)
                .ok()
                .filter(|p| p.ends_with('\n'))
            {
                break pid.trim().to_string();
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "no pid written"
            );
            std::thread::sleep(Duration::from_millis(10));
        };
        drop(child);
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "the child outlived its Started"
        );
    }

    /// A frame sent before the reply reaches the parent while the child still runs
    /// (here: waits for its request); the reply is the last frame.
    #[test]
    fn an_early_frame_arrives_before_the_child_ends_and_the_last_is_the_reply() {
        let mut started = spawn(
            Path::new("/bin/sh"),
            &[
                "-c",
                "printf '\\nnccl-preflight-child 5\\nfirst\\n'; read x; printf '\\nnccl-preflight-child 4\\nlast\\n'",
            ],
            vec![("PATH".into(), "/bin:/usr/bin".into())],
            b"go\n".to_vec(),
        )
        .unwrap();
        let frames = started.frames().unwrap();
        assert_eq!(frames.next(Duration::from_secs(60)), Ok(b"first".to_vec()));
        assert!(started.frames().is_none(), "frames are handed out once");
        let ended = started.finish(Duration::from_secs(60));
        assert!(
            matches!(ended, Ended::Replied { ref reply, .. } if reply == b"last"),
            "{ended:?}"
        );
        assert_eq!(frames.next(Duration::from_secs(60)), Ok(b"last".to_vec()));
        assert_eq!(frames.next(Duration::from_secs(60)), Err(NoFrame::Closed));
    }

    #[test]
    fn a_child_that_hangs_is_killed_with_its_group_in_the_limit() {
        let started = Instant::now();
        let ended = sh("sleep 30 & sleep 30", b"", Duration::from_millis(300));
        assert!(matches!(ended, Ended::Killed { .. }), "{ended:?}");
        assert!(started.elapsed() < Duration::from_secs(5));
        let said = sh(
            "read x; printf 'junk\\nnccl-preflight-child 5\\n%s\\n' \"$x\"; exit 3",
            b"hello\n",
            Duration::from_secs(10),
        );
        assert!(
            matches!(said, Ended::Replied { ref reply, status: Some(s), .. } if reply == b"hello" && s.code() == Some(3)),
            "{said:?}"
        );
        let silent = sh("echo oops >&2; exit 4", b"", Duration::from_secs(10));
        assert!(
            matches!(silent, Ended::Silent { ref stderr, .. } if stderr.contains("oops")),
            "{silent:?}"
        );
    }
}
