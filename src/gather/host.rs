//! `Host`: every file gather reads, resolved under one root (`--host-root`).
//!
//! A missing file is `Ok(None)` (absence is data); any other failure is a
//! `FactError` naming the full path. Reads are bounded so a hostile or runaway
//! pseudo-file cannot exhaust memory, and cannot block for ever:
//! - files are opened with O_NONBLOCK and must be regular files (procfs and sysfs
//!   files are), so a FIFO planted under `--host-root` is refused, not waited on;
//! - with a deadline (`Host::with_deadline`, the `--timeout` of vendor calls), each
//!   read runs in a child process (`gather::reader`) and gives up when it overruns,
//!   naming the path: a /proc/driver/nvidia or sysfs attribute can block inside a
//!   hung driver, and a read stuck in the kernel must strand a child, not keep this
//!   process from exiting. Directory listings, links and metadata stay in this
//!   process: sysfs and procfs answer those without calling into a driver.

use crate::facts::{FactError, Observed};
use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

/// Upper bound on one file read. /proc/self/mountinfo on a busy node is a few hundred KiB.
const MAX_FILE_BYTES: u64 = 16 << 20;

/// The filesystem tree that stands for `/` on the host being checked.
#[derive(Debug, Clone)]
pub struct Host {
    root: PathBuf,
    /// How long one file read may block; `None` reads on the calling thread.
    deadline: Option<Duration>,
    /// What does the reads under a deadline: a child process (`gather::reader`),
    /// started on the first read and replaced when a read overruns and leaves it
    /// stuck; where no child can be started, a thread, as before.
    reader: Arc<Mutex<Readers>>,
}

/// The reading child, or the reading thread where no child can be started, and the
/// children left stuck in a read, reaped once they end.
#[derive(Debug, Default)]
struct Readers {
    process: Option<super::reader::Reader>,
    /// A child could not be started (this process's own limits): threads from now on.
    no_process: bool,
    thread: Option<Reader>,
    stranded: Vec<libc::pid_t>,
}

/// A request to the reading thread: one read, which sends its own outcome back.
type ReadRequest = Box<dyn FnOnce() + Send>;

#[derive(Debug)]
struct Reader {
    requests: mpsc::Sender<ReadRequest>,
}

/// How one read ended, before it is turned into a fact.
enum ReadOutcome {
    Missing,
    Bytes(Vec<u8>),
    Failed(String),
}

impl Host {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Host {
            root: root.into(),
            deadline: None,
            reader: Arc::default(),
        }
    }

    /// A host whose file reads each give up after `deadline`.
    pub fn with_deadline(root: impl Into<PathBuf>, deadline: Duration) -> Self {
        Host {
            root: root.into(),
            deadline: Some(deadline),
            reader: Arc::default(),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The real path of `abs` (an absolute path as seen on the host) under the root.
    pub fn path(&self, abs: &str) -> PathBuf {
        self.root.join(abs.trim_start_matches('/'))
    }

    fn error(&self, abs: &str, err: impl std::fmt::Display) -> FactError {
        FactError::new(self.path(abs).display().to_string(), err)
    }

    /// Reads a text file. Invalid UTF-8 is an error: every file read here is ASCII
    /// on Linux. Anything but a regular file is an error naming what it is.
    pub fn read(&self, abs: &str) -> Result<Option<String>, FactError> {
        match self.read_bytes(abs)? {
            None => Ok(None),
            Some(bytes) => String::from_utf8(bytes)
                .map(Some)
                .map_err(|_| self.error(abs, "not valid UTF-8")),
        }
    }

    /// Reads a binary file (a PCI device's `config`), with the same bounds as `read`.
    pub fn read_bytes(&self, abs: &str) -> Result<Option<Vec<u8>>, FactError> {
        let path = self.path(abs);
        let outcome = match self.deadline {
            None => read_regular(&path),
            Some(deadline) => self.read_with_deadline(path, deadline),
        };
        match outcome {
            ReadOutcome::Missing => Ok(None),
            ReadOutcome::Bytes(bytes) => Ok(Some(bytes)),
            ReadOutcome::Failed(message) => Err(self.error(abs, message)),
        }
    }

    /// Reads a file that must exist and parses it; a missing file, a read error or
    /// a parse error becomes an error fact naming the path.
    pub fn parse_required<T>(
        &self,
        abs: &str,
        parse: impl FnOnce(&str) -> Result<T, String>,
    ) -> Observed<T> {
        match self.read(abs) {
            Ok(Some(text)) => parse(&text).map_err(|e| self.error(abs, e)).into(),
            Ok(None) => Observed::Error(self.error(abs, "missing")),
            Err(e) => Observed::Error(e),
        }
    }

    /// Opens `abs` read-write and closes it again, as a process that will use the
    /// device node must: `None` when it does not exist, `Some(Err)` with the error
    /// when it exists but cannot be opened (permissions, a device cgroup).
    pub fn try_open_rw(&self, abs: &str) -> Option<Result<(), String>> {
        match fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(self.path(abs))
        {
            Ok(_) => Some(Ok(())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => Some(Err(e.to_string())),
        }
    }

    /// The canonical path of `abs` with every symlink resolved, as a host path
    /// (sysfs links through links: /sys/class/infiniband/X/device); `None` when missing.
    pub fn real_path(&self, abs: &str) -> Result<Option<String>, FactError> {
        let root = fs::canonicalize(&self.root).map_err(|e| self.error("/", e))?;
        match fs::canonicalize(self.path(abs)) {
            Ok(p) => Ok(p
                .strip_prefix(&root)
                .ok()
                .map(|rel| format!("/{}", rel.display()))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.error(abs, e)),
        }
    }

    /// Reads the target of a symbolic link (e.g. /proc/self/ns/ipc).
    pub fn read_link(&self, abs: &str) -> Result<Option<String>, FactError> {
        match fs::read_link(self.path(abs)) {
            Ok(target) => Ok(Some(target.to_string_lossy().into_owned())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.error(abs, e)),
        }
    }

    /// Lists a directory's entry names, sorted; `None` when the directory does not exist.
    pub fn list_dir(&self, abs: &str) -> Result<Option<Vec<String>>, FactError> {
        let entries = match fs::read_dir(self.path(abs)) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(self.error(abs, e)),
        };
        let mut names = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| self.error(abs, e))?;
            names.push(entry.file_name().to_string_lossy().into_owned());
        }
        names.sort();
        Ok(Some(names))
    }
}

/// Opens `path` without blocking, refuses anything but a regular file, and reads
/// at most `MAX_FILE_BYTES` of it.
fn read_regular(path: &Path) -> ReadOutcome {
    let file = match fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return ReadOutcome::Missing,
        Err(e) => return ReadOutcome::Failed(e.to_string()),
    };
    match file.metadata() {
        Ok(meta) if meta.file_type().is_file() => {}
        Ok(meta) => return ReadOutcome::Failed(format!("{}, not a regular file", kind(&meta))),
        Err(e) => return ReadOutcome::Failed(e.to_string()),
    }
    let mut bytes = Vec::new();
    if let Err(e) = file.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes) {
        return ReadOutcome::Failed(e.to_string());
    }
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return ReadOutcome::Failed(format!("larger than {MAX_FILE_BYTES} bytes"));
    }
    ReadOutcome::Bytes(bytes)
}

fn kind(meta: &fs::Metadata) -> &'static str {
    let t = meta.file_type();
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else {
        "not a regular file"
    }
}

impl Host {
    /// `read_regular` in the reading child, abandoned when it takes longer than
    /// `deadline` (a read blocked in a driver or a FUSE server cannot be cancelled;
    /// the child stays parked in the kernel, and the next read starts a fresh one).
    /// A thread does the same where no child can be started.
    fn read_with_deadline(&self, path: PathBuf, deadline: Duration) -> ReadOutcome {
        use std::os::unix::ffi::OsStrExt;
        // A poisoned lock only means another reader panicked; the slot is usable.
        let mut readers = self.reader.lock().unwrap_or_else(|p| p.into_inner());
        readers.stranded.retain(|&pid| !super::reader::reap(pid));
        if readers.process.is_none() && !readers.no_process {
            match super::reader::Reader::start() {
                Ok(r) => readers.process = Some(r),
                Err(_) => readers.no_process = true,
            }
        }
        let Some(child) = readers.process.as_mut() else {
            drop(readers);
            return self.read_on_thread(path, deadline);
        };
        let until = std::time::Instant::now() + deadline;
        match child.read(path.as_os_str().as_bytes(), until) {
            Ok(answer) => outcome_of(answer),
            Err(super::reader::Lost::Overran) => {
                if let Some(stuck) = readers.process.take() {
                    let pid = stuck.abandon();
                    readers.stranded.push(pid);
                }
                ReadOutcome::Failed(overran(deadline))
            }
            Err(super::reader::Lost::Broken(why)) => {
                readers.process = None;
                ReadOutcome::Failed(format!("the reading process failed: {why}"))
            }
        }
    }

    /// `read_regular` on the reading thread, abandoned when it takes longer than
    /// `deadline` (a thread stuck in the kernel keeps the process from exiting: used
    /// only where no reading child can be started).
    fn read_on_thread(&self, path: PathBuf, deadline: Duration) -> ReadOutcome {
        let (reply, outcome) = mpsc::channel();
        let sent = {
            let mut readers = self.reader.lock().unwrap_or_else(|p| p.into_inner());
            if readers.thread.is_none() {
                match start_reader() {
                    Ok(r) => readers.thread = Some(r),
                    Err(e) => {
                        return ReadOutcome::Failed(format!(
                            "cannot start the reading thread ({e})"
                        ));
                    }
                }
            }
            readers.thread.as_ref().is_some_and(|r| {
                let read = move || {
                    let _ = reply.send(read_regular(&path));
                };
                r.requests.send(Box::new(read)).is_ok()
            })
        };
        if !sent {
            return ReadOutcome::Failed("the reading thread is gone".into());
        }
        match outcome.recv_timeout(deadline) {
            Ok(outcome) => outcome,
            Err(e) => {
                // Stuck (or gone): later reads get a thread of their own.
                self.reader.lock().unwrap_or_else(|p| p.into_inner()).thread = None;
                match e {
                    mpsc::RecvTimeoutError::Timeout => ReadOutcome::Failed(overran(deadline)),
                    mpsc::RecvTimeoutError::Disconnected => {
                        ReadOutcome::Failed("the reading thread ended without a result".into())
                    }
                }
            }
        }
    }
}

fn overran(deadline: Duration) -> String {
    format!(
        "read did not return within {:.1} s (--timeout): a stuck driver file?",
        deadline.as_secs_f64()
    )
}

/// The reading child's answer as `read_regular`'s outcome, in the same words.
fn outcome_of(answer: super::reader::Answer) -> ReadOutcome {
    use super::reader::Answer;
    match answer {
        Answer::Bytes(bytes) => ReadOutcome::Bytes(bytes),
        Answer::Errno(libc::ENOENT) => ReadOutcome::Missing,
        Answer::Errno(e) => ReadOutcome::Failed(io::Error::from_raw_os_error(e).to_string()),
        Answer::NotRegular(mode) => {
            ReadOutcome::Failed(format!("{}, not a regular file", kind_of_mode(mode)))
        }
        Answer::TooLarge => ReadOutcome::Failed(format!("larger than {MAX_FILE_BYTES} bytes")),
    }
}

/// `kind` from a raw `st_mode`.
fn kind_of_mode(mode: u32) -> &'static str {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => "a directory",
        libc::S_IFIFO => "a FIFO",
        libc::S_IFSOCK => "a socket",
        libc::S_IFCHR => "a character device",
        libc::S_IFBLK => "a block device",
        _ => "not a regular file",
    }
}

/// Starts a thread that reads the files it is sent until its sender is dropped.
fn start_reader() -> io::Result<Reader> {
    let (requests, incoming) = mpsc::channel::<ReadRequest>();
    std::thread::Builder::new()
        .name("host-read".into())
        .spawn(move || {
            for read in incoming {
                read();
            }
        })?;
    Ok(Reader { requests })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_file_is_none_and_unreadable_names_the_path() {
        let tmp = tempfile::Builder::new()
            .prefix("host-test-")
            .tempdir()
            .unwrap();
        let dir = tmp.path().to_path_buf();
        fs::create_dir_all(dir.join("proc")).unwrap();
        fs::write(dir.join("proc/x"), "hello\n").unwrap();
        fs::create_dir_all(dir.join("proc/adir")).unwrap();
        let host = Host::new(&dir);
        assert_eq!(host.read("/proc/x").unwrap().as_deref(), Some("hello\n"));
        assert_eq!(host.read("/proc/missing").unwrap(), None);
        let err = host.read("/proc/adir").unwrap_err();
        assert!(err.source.ends_with("proc/adir"), "{err}");
        assert_eq!(host.list_dir("/nothing").unwrap(), None);
        fs::write(dir.join("proc/bin"), [0xff, 0xfe]).unwrap();
        assert!(
            host.read("/proc/bin")
                .unwrap_err()
                .message
                .contains("UTF-8")
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn fifo_under_the_host_root_is_refused_without_waiting() {
        // Issue 13: a FIFO in place of a file under --host-root hung `check` for ever.
        let tmp = tempfile::Builder::new()
            .prefix("host-fifo-")
            .tempdir()
            .unwrap();
        let dir = tmp.path().to_path_buf();
        fs::create_dir_all(dir.join("proc/self")).unwrap();
        nix::unistd::mkfifo(&dir.join("proc/self/limits"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        for host in [
            Host::new(&dir),
            Host::with_deadline(&dir, Duration::from_secs(30)),
        ] {
            let err = host.read("/proc/self/limits").unwrap_err();
            assert!(err.source.ends_with("proc/self/limits"), "{err}");
            assert!(err.message.contains("a FIFO, not a regular file"), "{err}");
        }
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn stuck_read_gives_up_at_the_deadline_and_later_reads_still_work() {
        // A driver file can block in read(2) for ever; nothing on a test machine
        // does, so the reading thread is made to hang by a request that sleeps.
        // This is the thread used where no reading child can be started.
        let host = Host::with_deadline("/", Duration::from_millis(50));
        let reader = start_reader().unwrap();
        let hang: ReadRequest = Box::new(|| std::thread::sleep(Duration::from_secs(5)));
        reader.requests.send(hang).unwrap();
        {
            let mut readers = host.reader.lock().unwrap();
            readers.no_process = true;
            readers.thread = Some(reader);
        }
        let err = host.read("/proc/self/status").unwrap_err();
        assert!(err.message.contains("did not return within 0.1 s"), "{err}");
        assert!(err.source.ends_with("proc/self/status"), "{err}");
        // The stuck thread was replaced: the next read answers.
        assert!(host.read("/proc/self/status").unwrap().is_some());
    }
}
