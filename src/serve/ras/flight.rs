//! PyTorch's flight recorder, read by the sidecar: on a hang, serve asks each rank of
//! this pod for a dump and reads what it wrote, so the report can say which collective
//! each rank was in, its sequence number, and the line of Python that issued it.
//!
//! How PyTorch does it (torch/csrc/distributed/c10d: ProcessGroupNCCL's heartbeat
//! monitor, DumpPipe, FlightRecorder*.{hpp,cpp}, DebugInfoWriter): with a trace buffer
//! (`TORCH_FR_BUFFER_SIZE`, older `TORCH_NCCL_TRACE_BUFFER_SIZE`, above 0; the pipe is
//! gated on the old name up to 2.8) and `TORCH_NCCL_DEBUG_INFO_PIPE_FILE=DIR/pipe_`, the
//! rank with process group uid 0 makes a FIFO `DIR/pipe_<global rank>.pipe`, opens it
//! O_RDONLY|O_NONBLOCK and, every TORCH_NCCL_COORD_CHECK_MILSEC (1 s), reads it; any byte
//! read makes it write a dump to `<TORCH_FR_DUMP_TEMP_FILE or
//! TORCH_NCCL_DEBUG_INFO_TEMP_FILE><global rank>` (`DIR/dump_<rank>`): a pickle of plain
//! dicts and lists (pickle_str: the TorchScript pickler with tag_aggregates off), format
//! `version` 2.x with `pg_config`, `pg_status` (last enqueued/started/completed
//! collective per process group) and `entries` (record_id, process_group (name, desc),
//! collective_seq_id, p2p_seq_id, profiling_name, state scheduled/started/completed,
//! input_sizes, frames of name/filename/line, innermost first, ...).
//!
//! Bounded for serve: the FIFO is opened O_WRONLY|O_NONBLOCK (ENXIO when no process has
//! it open, EAGAIN when the rank never drained it: both said, neither waited on), a
//! dump is read only when it is a regular file (O_NOFOLLOW, fstat) of at most
//! `MAX_DUMP`, and the wait for dumps is `WAIT`. What a rank cannot do: dump while it is
//! stopped (SIGSTOP) or dead, or while another thread holds the GIL it needs to
//! symbolize the Python frames.

use super::pickle::{self, Pickle, Value};
use crate::tune::flight_recorder::{DUMP_PREFIX, PIPE_PREFIX};
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The largest dump read: 2,000 entries with their stacks are a few hundred KB.
const MAX_DUMP: u64 = 8 << 20;
/// How long the ranks get to write their dumps (their monitor reads the pipe every
/// second, and a dump of 2,000 entries takes well under a second to symbolize).
pub const WAIT: Duration = Duration::from_secs(10);
/// The most local ranks asked (a pod has at most a node's GPUs).
const MAX_RANKS: usize = 64;
/// Frames kept per entry, after PyTorch's own.
const MAX_FRAMES: usize = 4;

/// One line of Python.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Frame {
    pub name: String,
    filename: String,
    pub line: i64,
}

/// One collective as the flight recorder kept it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Entry {
    /// The process group's name and description (`0`, `default_pg`).
    pg: (String, String),
    pub collective_seq_id: i64,
    p2p_seq_id: i64,
    is_p2p: bool,
    /// `nccl:all_reduce`.
    pub profiling_name: String,
    /// `scheduled` (enqueued, not started on the GPU), `started`, `completed`.
    pub state: String,
    input_sizes: Vec<Vec<i64>>,
    /// The caller's frames: PyTorch's own (torch/distributed/...) left out.
    pub frames: Vec<Frame>,
}

/// What a rank's dump says.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Dump {
    pub version: Option<String>,
    /// The oldest collective not completed: where the rank waits.
    pub waiting: Option<Entry>,
    /// The last collective it recorded.
    pub last: Option<Entry>,
    pub entries: usize,
}

fn text(p: &Pickle, v: &Value, key: &str) -> String {
    p.get(v, key)
        .and_then(Value::as_str)
        .map(super::reply::safe)
        .unwrap_or_default()
}

fn int(p: &Pickle, v: &Value, key: &str) -> i64 {
    p.get(v, key).and_then(Value::as_int).unwrap_or(-1)
}

/// PyTorch's own frames (distributed_c10d.py, c10d_logger.py, ...): not the caller's.
fn is_torch(filename: &str) -> bool {
    filename.contains("/torch/") || filename.starts_with("torch/")
}

fn entry(p: &Pickle, e: &Value) -> Entry {
    let pg = p.items(p.get(e, "process_group").unwrap_or(&Value::None));
    let pg_part = |i: usize| {
        pg.get(i)
            .and_then(Value::as_str)
            .map(super::reply::safe)
            .unwrap_or_default()
    };
    let frames = p
        .items(p.get(e, "frames").unwrap_or(&Value::None))
        .iter()
        .map(|f| Frame {
            name: text(p, f, "name"),
            filename: text(p, f, "filename"),
            line: int(p, f, "line"),
        })
        .filter(|f| !is_torch(&f.filename))
        .take(MAX_FRAMES)
        .collect();
    let input_sizes = p
        .items(p.get(e, "input_sizes").unwrap_or(&Value::None))
        .iter()
        .take(4)
        .map(|s| {
            p.items(s)
                .iter()
                .take(8)
                .filter_map(Value::as_int)
                .collect()
        })
        .collect();
    Entry {
        pg: (pg_part(0), pg_part(1)),
        collective_seq_id: int(p, e, "collective_seq_id"),
        p2p_seq_id: int(p, e, "p2p_seq_id"),
        is_p2p: p.get(e, "is_p2p").and_then(Value::as_int) == Some(1),
        profiling_name: text(p, e, "profiling_name"),
        state: text(p, e, "state"),
        input_sizes,
        frames,
    }
}

impl Dump {
    /// The dump's root dict (`version`, `entries`, ...).
    pub fn from_pickle(p: &Pickle) -> Result<Dump, String> {
        if p.pairs(&p.root).is_empty() {
            return Err("not a flight recorder dump: the pickle is not a dict".into());
        }
        let entries = p.items(p.get(&p.root, "entries").unwrap_or(&Value::None));
        // Entries are in the order they were recorded (FlightRecorder::dump_entries).
        let waiting = entries
            .iter()
            .find(|e| p.get(e, "state").and_then(Value::as_str) != Some("completed"))
            .map(|e| entry(p, e));
        Ok(Dump {
            version: p
                .get(&p.root, "version")
                .and_then(Value::as_str)
                .map(super::reply::safe),
            last: entries.last().map(|e| entry(p, e)),
            waiting,
            entries: entries.len(),
        })
    }

    /// `in nccl:all_reduce #352 of process group 0 (default_pg), scheduled (...)`, or
    /// where it is when every collective completed.
    pub fn line(&self) -> String {
        match (&self.waiting, &self.last) {
            (Some(e), _) => format!(
                "in {}, {}, issued at {}",
                described(e),
                match e.state.as_str() {
                    "scheduled" => "enqueued but not started on the GPU",
                    "started" => "started on the GPU, not completed",
                    other => other,
                },
                stack(&e.frames)
            ),
            (None, Some(e)) => format!(
                "not in a collective: every one it issued completed, the last {} issued at {}: it runs outside NCCL (user code)",
                described(e),
                stack(&e.frames)
            ),
            (None, None) => "no collective recorded (a buffer of 0, or none issued yet)".into(),
        }
    }
}

fn described(e: &Entry) -> String {
    let seq = if e.is_p2p {
        format!("p2p #{}", e.p2p_seq_id)
    } else {
        format!("#{}", e.collective_seq_id)
    };
    let sizes = e
        .input_sizes
        .first()
        .map(|s| format!(" {s:?}"))
        .unwrap_or_default();
    format!(
        "{} {seq}{sizes} of process group {} ({})",
        e.profiling_name, e.pg.0, e.pg.1
    )
}

/// `train.py:10 in step < train.py:25 in <module>`.
fn stack(frames: &[Frame]) -> String {
    if frames.is_empty() {
        return "an unknown line (no stack recorded)".into();
    }
    frames
        .iter()
        .take(2)
        .map(|f| format!("{}:{} in {}", f.filename, f.line, f.name))
        .collect::<Vec<_>>()
        .join(" < ")
}

/// What became of one rank's dump request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "outcome", content = "detail")]
pub enum Answer {
    /// Asked; no dump yet.
    Waiting,
    Dumped(Box<Dump>),
    /// The request or the dump failed: why.
    Failed(String),
}

/// The global ranks whose pipes are in `dir` (`pipe_<N>.pipe`), at most `MAX_RANKS`.
fn local_ranks(dir: &Path) -> Result<Vec<u32>, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut ranks: Vec<u32> = entries
        .take(4096)
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name();
            let name = name.to_str()?;
            let digits = name.strip_prefix(PIPE_PREFIX)?.strip_suffix(".pipe")?;
            digits.parse().ok()
        })
        .collect();
    ranks.sort_unstable();
    ranks.truncate(MAX_RANKS);
    Ok(ranks)
}

/// Inode, modification time (s, ns) and size: a new dump changes them.
type Identity = (u64, i64, i64, u64);

/// What identifies a version of a file.
fn identity(path: &Path) -> Option<Identity> {
    let m = std::fs::symlink_metadata(path).ok()?;
    Some((m.ino(), m.mtime(), m.mtime_nsec(), m.size()))
}

/// Writes a line to the rank's FIFO without ever blocking.
fn poke(pipe: &Path) -> Result<(), String> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(pipe);
    let mut file = match file {
        Ok(f) => f,
        Err(e) if e.raw_os_error() == Some(libc::ENXIO) => {
            return Err("no process has its pipe open (the rank exited)".into());
        }
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            return Err(format!(
                "{}: permission denied: the pipe is the trainer's user's (mkfifo 0666 less its umask); run the sidecar as that user",
                pipe.display()
            ));
        }
        Err(e) => return Err(format!("{}: {e}", pipe.display())),
    };
    let is_fifo = file.metadata().map(|m| m.file_type().is_fifo());
    if is_fifo.ok() != Some(true) {
        return Err(format!("{} is not a FIFO: not written", pipe.display()));
    }
    match file.write(b"dump\n") {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Err(
            "its pipe is full: the rank has not read it (stopped, or its monitor is off)".into(),
        ),
        Err(e) => Err(format!("{}: {e}", pipe.display())),
    }
}

/// The dump at `path` when it is a whole regular file of at most `MAX_DUMP`.
fn read_dump(path: &Path) -> Result<Dump, String> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let meta = file
        .metadata()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if !meta.file_type().is_file() {
        return Err(format!("{} is not a regular file", path.display()));
    }
    if meta.len() > MAX_DUMP {
        return Err(format!(
            "{} is {} bytes, over {} MiB: lower TORCH_FR_BUFFER_SIZE",
            path.display(),
            meta.len(),
            MAX_DUMP >> 20
        ));
    }
    let mut data = Vec::new();
    file.take(MAX_DUMP)
        .read_to_end(&mut data)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let parsed = pickle::parse(&data).map_err(|e| format!("{}: {}", path.display(), e.0))?;
    Dump::from_pickle(&parsed)
}

/// Asks every rank of this pod for a dump and waits for them (up to `WAIT`), calling
/// `update` with each rank's answer as it comes. Runs on a thread of its own.
pub fn collect(
    dir: &Path,
    stop: &dyn Fn() -> bool,
    update: &mut dyn FnMut(u32, Answer),
) -> Result<(), String> {
    let ranks = local_ranks(dir)?;
    if ranks.is_empty() {
        return Err(format!(
            "no {PIPE_PREFIX}<rank>.pipe in {}: is TORCH_NCCL_DEBUG_INFO_PIPE_FILE={}/{PIPE_PREFIX} set in the trainer, with a trace buffer (TORCH_FR_BUFFER_SIZE and TORCH_NCCL_TRACE_BUFFER_SIZE above 0)?",
            dir.display(),
            dir.display()
        ));
    }
    let mut pending: BTreeMap<u32, (PathBuf, Option<Identity>)> = BTreeMap::new();
    for rank in ranks {
        let dump = dir.join(format!("{DUMP_PREFIX}{rank}"));
        let before = identity(&dump);
        match poke(&dir.join(format!("{PIPE_PREFIX}{rank}.pipe"))) {
            Ok(()) => {
                update(rank, Answer::Waiting);
                pending.insert(rank, (dump, before));
            }
            Err(why) => update(rank, Answer::Failed(why)),
        }
    }
    let deadline = Instant::now() + WAIT;
    while !pending.is_empty() && Instant::now() < deadline && !stop() {
        std::thread::sleep(Duration::from_millis(200));
        pending.retain(|&rank, (path, before)| {
            if identity(path) == *before {
                return true;
            }
            // A dump being written does not parse yet: try again next time.
            match read_dump(path) {
                Ok(d) => {
                    update(rank, Answer::Dumped(Box::new(d)));
                    false
                }
                Err(_) => true,
            }
        });
    }
    for (rank, (path, _)) in pending {
        let why = match read_dump(&path) {
            Ok(_) | Err(_) if identity(&path).is_none() => format!(
                "no dump at {} within {} s: the rank is stopped or stuck, or does not read its pipe",
                path.display(),
                WAIT.as_secs()
            ),
            Err(e) => e,
            Ok(_) => format!(
                "no new dump within {} s (the one there is older)",
                WAIT.as_secs()
            ),
        };
        update(rank, Answer::Failed(why));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const DUMP: &[u8] = include_bytes!("../../../tests/data/flight-recorder/dump-2.10.pickle");

    /// The fixture (scripts/fr_dump.py, the format of FlightRecorder dump_dict at
    /// version 2.10): rank 1 of the divergent job, in `_all_gather_base` #352.
    #[test]
    fn a_dump_names_the_collective_it_waits_in_and_its_line_of_python() {
        let d = Dump::from_pickle(&pickle::parse(DUMP).unwrap()).unwrap();
        assert_eq!(d.version.as_deref(), Some("2.10"));
        let w = d.waiting.as_ref().unwrap();
        assert_eq!(
            (
                w.profiling_name.as_str(),
                w.collective_seq_id,
                w.state.as_str()
            ),
            ("nccl:_all_gather_base", 352, "scheduled")
        );
        assert_eq!(
            w.frames[0],
            Frame {
                name: "step".into(),
                filename: "/job/train3.py".into(),
                line: 10
            }
        );
        assert_eq!(
            d.line(),
            "in nccl:_all_gather_base #352 [1048576] of process group 0 (default_pg), enqueued but not started on the GPU, issued at /job/train3.py:10 in step < /job/train3.py:25 in <module>"
        );
    }

    #[test]
    fn pipes_are_poked_without_blocking_and_dumps_read_only_when_new() {
        let dir = tempfile::tempdir().unwrap();
        let pipe = dir.path().join("pipe_3.pipe");
        // No FIFO reader: ENXIO, said at once.
        nix::unistd::mkfifo(&pipe, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        assert!(poke(&pipe).unwrap_err().contains("exited"));
        // A reader that never reads: the pipe fills, and serve is told, never blocked.
        let reader = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&pipe)
            .unwrap();
        let started = Instant::now();
        let mut full = None;
        for _ in 0..100_000 {
            if let Err(e) = poke(&pipe) {
                full = Some(e);
                break;
            }
        }
        assert!(full.unwrap().contains("full"), "a never-read pipe fills");
        assert!(started.elapsed() < Duration::from_secs(10));
        drop(reader);
        // A regular file named like a pipe is not written.
        let fake = dir.path().join("pipe_4.pipe");
        std::fs::write(&fake, b"").unwrap();
        assert!(poke(&fake).unwrap_err().contains("not a FIFO"));
        assert_eq!(local_ranks(dir.path()).unwrap(), [3, 4]);
        // A dump behind a symlink is refused (O_NOFOLLOW).
        let link = dir.path().join("dump_3");
        std::os::unix::fs::symlink("/etc/passwd", &link).unwrap();
        assert!(read_dump(&link).is_err());
    }
}
