//! A child process that reads host files for `Host`, so that a read stuck in the
//! kernel strands that child, not this process. The other children of this binary
//! speak the protocol of `crate::child`; this one cannot (below).
//!
//! A read of a sysfs attribute of a hung driver, or of a FUSE file whose server never
//! answers, can block uninterruptibly: once the request has reached the driver or the
//! FUSE server, not even SIGKILL ends it (Linux fs/fuse/dev.c `request_wait_answer`
//! waits with `wait_event` once the request is sent). A thread of ours stuck like that
//! keeps the whole process from exiting: exit_group(2) waits for every thread, so an
//! initContainer that wrote its verdict still never completed (issue 31 row 3). So
//! the reads run in a child process: the parent waits for each answer with a
//! deadline, and when one overruns it sends the child SIGKILL, does not wait for it,
//! and starts a fresh one for the next read. A stuck child does not hold its parent:
//! the parent exits with its verdict, and the child ends when the kernel lets it go.
//!
//! The child is made with a bare clone(2) (fork without the atfork handlers, which
//! vendor libraries register and which could block on a lock a hung vendor thread
//! holds), from memory prepared before it: it makes only system calls (read, write,
//! open, fstat, close, _exit) on buffers allocated beforehand, never the allocator
//! or a lock, which a multithreaded parent may have left held. It closes every
//! descriptor but its two pipes first, so it holds no other pipe or socket open
//! (a stuck child holding the parent's stdout would keep a log reader waiting).
//! One child serves every read of a run (hundreds): a process each would cost more
//! than the reads.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

/// Upper bound on one file read (as `host::MAX_FILE_BYTES`): the child stops there.
const MAX_FILE_BYTES: usize = 16 << 20;
/// The child sends a file in pieces of at most this.
const CHUNK: usize = 64 << 10;
/// The longest path the child takes (PATH_MAX).
const MAX_PATH: usize = 4096;

/// What the child answers for one file, before any data.
const DATA: u32 = 1;
const END: u32 = 2;
const ERRNO: u32 = 3;
const NOT_REGULAR: u32 = 4;
const TOO_LARGE: u32 = 5;

/// How one read ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Answer {
    Bytes(Vec<u8>),
    /// open, fstat or read failed with this errno.
    Errno(i32),
    /// Not a regular file; its `st_mode`.
    NotRegular(u32),
    TooLarge,
}

/// Why no answer came.
#[derive(Debug, PartialEq, Eq)]
pub enum Lost {
    /// The deadline passed: the child is stuck in a read (it was sent SIGKILL).
    Overran,
    /// The child went away or spoke out of turn.
    Broken(String),
}

/// The reading child: its pid and the two pipe ends the parent holds.
#[derive(Debug)]
pub struct Reader {
    pid: libc::pid_t,
    /// `None` once closed (the child then ends).
    requests: Option<OwnedFd>,
    replies: OwnedFd,
    /// Left stuck in a read: not waited for when dropped.
    abandoned: bool,
}

impl Reader {
    /// Starts a reading child.
    pub fn start() -> std::io::Result<Reader> {
        let (req_read, req_write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        let (rep_read, rep_write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        // Everything the child touches is allocated here, before the clone.
        let mut path = vec![0u8; MAX_PATH + 1];
        let mut chunk = vec![0u8; CHUNK];
        let (input, output) = (req_read.as_raw_fd(), rep_write.as_raw_fd());
        // SAFETY: clone(2) with only SIGCHLD is fork(2) without glibc's atfork handlers.
        // The child runs `child_main`, which makes only system calls on the buffers
        // above and never returns (it ends in _exit); the parent continues normally.
        let pid = unsafe {
            libc::syscall(
                libc::SYS_clone,
                libc::SIGCHLD as libc::c_ulong,
                0usize,
                0usize,
                0usize,
                0usize,
            )
        };
        match pid {
            -1 => Err(std::io::Error::last_os_error()),
            0 => child_main(input, output, &mut path, &mut chunk),
            pid => Ok(Reader {
                pid: pid as libc::pid_t,
                requests: Some(req_write),
                replies: rep_read,
                abandoned: false,
            }),
        }
    }

    /// Reads `path` in the child; gives up at `deadline`.
    pub fn read(&mut self, path: &[u8], deadline: Instant) -> Result<Answer, Lost> {
        if path.len() > MAX_PATH || path.contains(&0) {
            return Ok(Answer::Errno(libc::ENAMETOOLONG));
        }
        let mut request = (path.len() as u32).to_ne_bytes().to_vec();
        request.extend_from_slice(path);
        let requests = self.requests.as_ref().map_or(-1, |fd| fd.as_raw_fd());
        write_all(requests, &request)
            .map_err(|e| Lost::Broken(format!("the reading process is gone (errno {e})")))?;
        let mut bytes = Vec::new();
        loop {
            let mut frame = [0u8; 8];
            self.receive(&mut frame, deadline)?;
            let tag = u32::from_ne_bytes([frame[0], frame[1], frame[2], frame[3]]);
            let value = u32::from_ne_bytes([frame[4], frame[5], frame[6], frame[7]]);
            let size = value as usize;
            match tag {
                DATA if size <= CHUNK && bytes.len() + size <= MAX_FILE_BYTES => {
                    let at = bytes.len();
                    bytes.resize(at + size, 0);
                    self.receive(&mut bytes[at..], deadline)?;
                }
                END => return Ok(Answer::Bytes(bytes)),
                ERRNO => return Ok(Answer::Errno(value as i32)),
                NOT_REGULAR => return Ok(Answer::NotRegular(value)),
                TOO_LARGE => return Ok(Answer::TooLarge),
                _ => return Err(Lost::Broken(format!("unexpected answer {tag}/{value}"))),
            }
        }
    }

    /// Fills `buf` from the child by `deadline`.
    fn receive(&mut self, buf: &mut [u8], deadline: Instant) -> Result<(), Lost> {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        use std::os::fd::AsFd;
        let mut at = 0;
        while at < buf.len() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Lost::Overran);
            }
            let millis = left.as_millis().clamp(1, i32::MAX as u128) as i32;
            let mut fds = [PollFd::new(self.replies.as_fd(), PollFlags::POLLIN)];
            match poll(
                &mut fds,
                PollTimeout::try_from(millis).unwrap_or(PollTimeout::MAX),
            ) {
                Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
                Ok(_) => {}
                Err(e) => return Err(Lost::Broken(e.to_string())),
            }
            match nix::unistd::read(&self.replies, &mut buf[at..]) {
                Ok(0) => return Err(Lost::Broken("the reading process ended".into())),
                Ok(n) => at += n,
                Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(Lost::Broken(e.to_string())),
            }
        }
        Ok(())
    }

    /// Leaves a stuck child: SIGKILL (it dies when the kernel releases its read) and
    /// no wait. Returns its pid, to be reaped later with `reap`.
    pub fn abandon(mut self) -> libc::pid_t {
        // SAFETY: kill(2) of our own child, not yet reaped, so the pid is still its.
        unsafe { libc::kill(self.pid, libc::SIGKILL) };
        self.abandoned = true;
        self.pid
    }
}

/// Reaps `pid` if it has ended; true when it has (or is no child of ours).
pub fn reap(pid: libc::pid_t) -> bool {
    !matches!(
        nix::sys::wait::waitpid(
            nix::unistd::Pid::from_raw(pid),
            Some(nix::sys::wait::WaitPidFlag::WNOHANG)
        ),
        Ok(nix::sys::wait::WaitStatus::StillAlive)
    )
}

impl Drop for Reader {
    /// A child that is not stuck ends when its request pipe closes; it is reaped
    /// here, after a bounded wait for it to close its end.
    fn drop(&mut self) {
        self.requests = None;
        if self.abandoned {
            return;
        }
        let mut byte = [0u8; 1];
        let ended = matches!(
            self.receive(&mut byte, Instant::now() + Duration::from_millis(100)),
            Err(Lost::Broken(_))
        );
        if ended {
            // Its descriptors are closed: it is past anything that can block.
            let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(self.pid), None);
        } else {
            reap(self.pid);
        }
    }
}

/// errno of the last failed call.
fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn write_all(fd: RawFd, mut bytes: &[u8]) -> Result<(), i32> {
    while !bytes.is_empty() {
        // SAFETY: writes from a live slice of `bytes.len()` bytes.
        let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
        if n < 0 {
            let e = errno();
            if e == libc::EINTR {
                continue;
            }
            return Err(e);
        }
        bytes = &bytes[n as usize..];
    }
    Ok(())
}

fn read_exact(fd: RawFd, buf: &mut [u8]) -> Result<(), i32> {
    let mut at = 0;
    while at < buf.len() {
        // SAFETY: reads into the live slice `buf[at..]`.
        let n = unsafe { libc::read(fd, buf[at..].as_mut_ptr().cast(), buf.len() - at) };
        match n {
            0 => return Err(0),
            n if n < 0 && errno() == libc::EINTR => {}
            n if n < 0 => return Err(errno()),
            n => at += n as usize,
        }
    }
    Ok(())
}

/// The child: answers read requests until its request pipe closes. System calls on
/// `path` and `chunk` only (see the module doc).
fn child_main(input: RawFd, output: RawFd, path: &mut [u8], chunk: &mut [u8]) -> ! {
    // SAFETY: dup and close descriptors of this child only; `_exit` on failure.
    unsafe {
        let a = libc::fcntl(input, libc::F_DUPFD, 3);
        let b = libc::fcntl(output, libc::F_DUPFD, 3);
        if a < 0 || b < 0 || libc::dup2(a, 0) < 0 || libc::dup2(b, 1) < 0 {
            libc::_exit(1)
        }
    }
    close_from(2);
    loop {
        let mut len = [0u8; 4];
        if read_exact(0, &mut len).is_err() {
            break;
        }
        let n = u32::from_ne_bytes(len) as usize;
        if n >= path.len() || read_exact(0, &mut path[..n]).is_err() {
            break;
        }
        path[n] = 0;
        if send_file(path, chunk).is_err() {
            break;
        }
    }
    // SAFETY: ends this child at once, running nothing of the parent's.
    unsafe { libc::_exit(0) }
}

/// Closes every descriptor from `first` up.
fn close_from(first: u32) {
    // SAFETY: close_range(2) (Linux 5.9) takes plain integers.
    let rc = unsafe { libc::syscall(libc::SYS_close_range, first, u32::MAX, 0u32) };
    if rc == 0 {
        return;
    }
    // Older kernels: each descriptor up to the limit.
    // SAFETY: a zeroed rlimit is a valid value; getrlimit(2) writes into it.
    let mut limit: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: writes into `limit` only.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    let last = limit.rlim_cur.clamp(u64::from(first), 1 << 16) as i32;
    for fd in first as i32..last {
        // SAFETY: closes a descriptor of this child; EBADF for unused ones is harmless.
        unsafe { libc::close(fd) };
    }
}

/// Sends one header: what follows, and a number (a size, an errno, a mode).
fn frame(tag: u32, value: u32) -> Result<(), i32> {
    let mut header = [0u8; 8];
    header[..4].copy_from_slice(&tag.to_ne_bytes());
    header[4..].copy_from_slice(&value.to_ne_bytes());
    write_all(1, &header)
}

/// Opens the NUL-terminated `path` without blocking, refuses anything but a regular
/// file, and sends at most `MAX_FILE_BYTES` of it.
fn send_file(path: &[u8], chunk: &mut [u8]) -> Result<(), i32> {
    let flags = libc::O_RDONLY | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY;
    // SAFETY: `path` is NUL-terminated (the caller wrote the NUL).
    let fd = unsafe { libc::open(path.as_ptr().cast(), flags) };
    if fd < 0 {
        return frame(ERRNO, errno() as u32);
    }
    // SAFETY: a zeroed stat is a valid value; fstat(2) writes into it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is open; writes into `st` only.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        let e = errno();
        // SAFETY: closes the descriptor opened above.
        unsafe { libc::close(fd) };
        return frame(ERRNO, e as u32);
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        // SAFETY: closes the descriptor opened above.
        unsafe { libc::close(fd) };
        return frame(NOT_REGULAR, st.st_mode);
    }
    let mut total = 0;
    let sent = loop {
        // SAFETY: reads into the live buffer `chunk`.
        let n = unsafe { libc::read(fd, chunk.as_mut_ptr().cast(), chunk.len()) };
        if n < 0 && errno() == libc::EINTR {
            continue;
        }
        if n < 0 {
            break frame(ERRNO, errno() as u32);
        }
        if n == 0 {
            break frame(END, 0);
        }
        let n = n as usize;
        total += n;
        if total > MAX_FILE_BYTES {
            break frame(TOO_LARGE, 0);
        }
        if let Err(e) = frame(DATA, n as u32).and_then(|()| write_all(1, &chunk[..n])) {
            break Err(e);
        }
    };
    // SAFETY: closes the descriptor opened above.
    unsafe { libc::close(fd) };
    sent
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_files_refuses_others_and_ends_with_its_pipe() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, "x".repeat(200_000)).unwrap();
        let deadline = || Instant::now() + Duration::from_secs(30);
        let mut reader = Reader::start().unwrap();
        let path = |p: &std::path::Path| p.as_os_str().as_encoded_bytes().to_vec();
        assert_eq!(
            reader.read(&path(&file), deadline()),
            Ok(Answer::Bytes("x".repeat(200_000).into_bytes()))
        );
        let missing = dir.path().join("missing");
        assert_eq!(
            reader.read(&path(&missing), deadline()),
            Ok(Answer::Errno(libc::ENOENT))
        );
        assert!(matches!(
            reader.read(&path(dir.path()), deadline()),
            Ok(Answer::NotRegular(m)) if m & libc::S_IFMT == libc::S_IFDIR
        ));
        let pid = reader.pid;
        drop(reader);
        // Reaped by the drop: no such child any more.
        assert!(nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None).is_err());
    }
}
