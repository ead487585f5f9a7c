//! The lines around NCCL's own: what PyTorch's ProcessGroupNCCL and c10d,
//! torchrun's elastic agent and NCCL's RAS client print when a job fails.
//! Formats from pytorch/pytorch torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp
//! (`Watchdog caught collective operation timeout: WorkNCCL(SeqNum=.., OpType=..`,
//! `Exception (either an error or timeout) detected by watchdog at work: N`,
//! `... due to ProcessGroupNCCL watchdog hang`, `watchdog got stuck for N seconds`,
//! `Exception (either an error or timeout) detected by watchdog at work: N, last
//! enqueued NCCL work: A, last completed NCCL work: B`, `Received a dump signal
//! due to a collective timeout from rank N`: getNCCLWatchdogTimeoutErrorMsg at
//! v2.5.0-v2.11.0), NCCLUtils (`NCCL error in:
//! FILE:LINE, REASON, NCCL version X` then `ncclXError: ...` and `Last error:`),
//! XLA's `NCCL operation X failed: REASON. Last NCCL warning(error) log entry
//! (may be unrelated) 'TEXT'` (xla/service/gpu/nccl_utils.cc), Ray's worker
//! failure summary (`A worker died or was killed while executing a task by an
//! unexpected system error ... Worker IP address: X ... Worker PID: N ... Worker
//! exit type: T`, python/ray/_private/worker.py and the raylet),
//! torch/distributed/elastic/multiprocessing/api.py (`failed (exitcode: N)
//! local_rank: N (pid: N) of binary`) and errors/__init__.py (ChildFailedError's
//! `Root Cause (first observed failure)` block); NCCL's RAS (docs
//! troubleshooting/ras.rst): the `STATUS` text reply and 2.31's `NCCL DIAG` lines.
//! Kept within fixed bounds, like the rest of the summary.

use serde::Serialize;

const MAX_ENTRIES: usize = 32;
const MAX_RANKS: usize = 64;
const MAX_TEXT: usize = 512;

fn clip(text: &str) -> String {
    let mut end = text.len().min(MAX_TEXT);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

/// A collective PyTorch's watchdog gave up on.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CollectiveTimeout {
    pub seq: Option<u64>,
    /// `ALLREDUCE`, `_ALLGATHER_BASE`, ... (absent when the line was cut).
    pub op: Option<String>,
    pub timeout_ms: Option<u64>,
    /// The ranks that reported it (the ones that waited), first `MAX_RANKS`.
    pub ranks: Vec<u32>,
    pub first_line: u64,
    pub count: u64,
}

/// A c10d `NCCL error in: ...` (DistBackendError), with NCCL's last error.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct FrameworkError {
    /// NCCL's own wording of the result (`remote process exited or there was a network error`).
    pub reason: String,
    /// The line of NCCL's `Last error:` text (or the line after `ncclXError: ...`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    pub first_line: u64,
    pub count: u64,
}

/// A process the launcher saw fail.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct LauncherFailure {
    /// `torchrun`, `DeepSpeed` or `ray`.
    pub launcher: &'static str,
    pub rank: Option<String>,
    pub host: Option<String>,
    pub exitcode: Option<String>,
    pub line: u64,
}

/// Where one rank's process group stood when its watchdog fired: the last
/// collective it enqueued and the last that completed (PyTorch's pgStatus).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct WorkState {
    pub rank: u32,
    pub enqueued: i64,
    pub completed: i64,
}

/// What the framework and launcher lines said.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct JobLines {
    pub collective_timeouts: Vec<CollectiveTimeout>,
    /// `... due to ProcessGroupNCCL watchdog hang` or `watchdog got stuck` (the
    /// heartbeat monitor found the watchdog thread itself stuck).
    pub watchdog_hangs: u64,
    /// Per rank, the work numbers its watchdog printed (first `MAX_RANKS` ranks).
    pub work: Vec<WorkState>,
    /// `Received a dump signal due to a collective timeout from rank N`: the rank
    /// whose watchdog fired first, as the others heard it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dump_signal_from: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub watchdog_hang_line: Option<u64>,
    pub nccl_errors: Vec<FrameworkError>,
    pub launcher_failures: Vec<LauncherFailure>,
    /// NCCL RAS `STATUS` rows whose status or errors are not `RUNNING`/`OK`, and `NCCL DIAG` lines that are not OK.
    ras_problems: Vec<String>,
    #[serde(skip)]
    pending_last_error: bool,
    #[serde(skip)]
    in_root_cause: bool,
    /// Lines left in which a Ray failure's fields (wrapped by the terminal) may follow.
    #[serde(skip)]
    ray_fields: u8,
}

/// The text after `key` up to the next `,` or `)`.
fn value_after<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    let at = text.find(key)? + key.len();
    // A value is short (a number, a host, an op name): search for its end in
    // the first MAX_TEXT bytes only (issue 39: a 60 KB host name as a value made
    // every such line a char-by-char scan of it).
    let mut window = (text.len() - at).min(MAX_TEXT);
    while !text.is_char_boundary(at + window) {
        window -= 1;
    }
    let rest = &text[at..at + window];
    let end = memchr::memchr3(b',', b')', b' ', rest.as_bytes()).unwrap_or(rest.len());
    Some(&rest[..end])
}

/// The rank a watchdog line is about: `[Rank 3]`, `[PG 1 Rank 3]`, `[PG ID 0 PG
/// GUID 0(default_pg) Rank 3]`, or torchrun's `[rank3]:` prefix.
fn rank_of(text: &str) -> Option<u32> {
    let digits = |s: &str| -> Option<u32> {
        let n: String = s.chars().take_while(char::is_ascii_digit).collect();
        n.parse().ok()
    };
    text.split(" Rank ")
        .nth(1)
        .or_else(|| text.split("[Rank ").nth(1))
        .and_then(digits)
        .or_else(|| text.split("[rank").nth(1).and_then(digits))
}

/// The line without launcher prefixes (`[rank3]: `, `(RayWorkerWrapper pid=1) `, `> `).
fn unprefixed(line: &str) -> &str {
    let mut rest = line.trim();
    loop {
        let before = rest.len();
        rest = rest.trim_start_matches('>').trim_start();
        if rest.starts_with('(') || rest.starts_with('[') {
            let close = if rest.starts_with('(') { ") " } else { "]: " };
            if let Some(end) = rest.find(close).filter(|&e| e < 64) {
                rest = rest[end + close.len()..].trim_start();
            }
        }
        if rest.len() == before {
            return rest;
        }
    }
}

impl JobLines {
    /// Takes one line that is not NCCL's own (`line_no` is 1-based).
    pub fn line(&mut self, line_no: u64, text: &str) {
        if self.pending_last_error {
            return self.awaited_last_error(text);
        }
        if self.ray_fields > 0 {
            self.ray_fields -= 1;
            self.ray_field(text);
        }
        if let Some(at) = text
            .find("watchdog thread terminated with exception: ")
            .filter(|_| !text.contains("Watchdog caught collective operation timeout"))
        {
            // The watchdog died on an error of its own (`CUDA error: an illegal
            // memory access was encountered`): that error is the failure.
            let reason = &text[at + "watchdog thread terminated with exception: ".len()..];
            self.nccl_error(line_no, &format!("NCCL error: {reason}"));
            // The error is on this line: no `Last error:` block follows.
            self.pending_last_error = false;
        } else if text.contains("Watchdog caught collective operation timeout") {
            // Also in its `watchdog thread terminated with exception: ...` form,
            // the only one some ranks print: a rank counts once per SeqNum.
            self.timeout(line_no, text);
        } else if text.contains("watchdog hang") || text.contains("watchdog got stuck") {
            self.watchdog_hangs += 1;
            self.watchdog_hang_line.get_or_insert(line_no);
        } else if text.contains("last enqueued NCCL work: ")
            || text.contains("Last enqueued NCCL work: ")
        {
            self.work_state(text);
        } else if let Some(at) = text
            .find("NCCL error in: ")
            .or_else(|| text.find("NCCL error: "))
            .or_else(|| text.find("NCCL operation "))
        {
            self.nccl_error(line_no, &text[at..]);
        } else if text.contains("failed (exitcode: ") && text.contains("local_rank: ") {
            self.launcher(LauncherFailure {
                launcher: "torchrun",
                rank: value_after(text, "local_rank: ").map(|r| format!("local rank {r}")),
                host: None,
                exitcode: value_after(text, "exitcode: ").map(clip),
                line: line_no,
            });
        } else if let Some(code) = value_after(text, "] exits with return code = ") {
            self.deepspeed(line_no, text, code);
        } else if text.contains("Root Cause (first observed failure)") {
            self.in_root_cause = true;
            self.launcher(LauncherFailure {
                launcher: "torchrun",
                line: line_no,
                ..LauncherFailure::default()
            });
        } else if text.contains("worker process has died")
            || text.contains("A worker died or was killed")
        {
            self.ray_failure(line_no, text);
        } else if self.in_root_cause {
            self.root_cause_field(text);
        } else if text.contains("NCCL DIAG ") && !text.contains("NCCL DIAG [OK]") {
            self.ras_problem(text);
        }
    }

    /// The line after c10d's `NCCL error in: ...`: NCCL's last error, alone or
    /// after `Last error:`.
    fn awaited_last_error(&mut self, text: &str) {
        let t = unprefixed(text);
        if let Some(rest) = t.strip_prefix("Last error:") {
            let rest = rest.trim();
            if !rest.is_empty() {
                self.last_error(rest);
            }
        } else if !(t.is_empty() || t.starts_with("nccl") && t.contains("Error: ")) {
            self.last_error(t);
        }
    }

    /// DeepSpeed's launcher (deepspeed/launcher/launch.py sigkill_handler:
    /// `{cmd} exits with return code = {code}`, after killing the other ranks):
    /// the command names the rank (`--local_rank=N`), a negative code is the
    /// signal that ended it (Popen.returncode).
    fn deepspeed(&mut self, line_no: u64, text: &str, code: &str) {
        self.launcher(LauncherFailure {
            launcher: "DeepSpeed",
            rank: text
                .split("'--local_rank=")
                .nth(1)
                .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
                .and_then(|r| r.parse::<u32>().ok())
                .map(|r| format!("local rank {r}")),
            host: None,
            exitcode: Some(clip(code)),
            line: line_no,
        });
    }

    fn timeout(&mut self, line_no: u64, text: &str) {
        let seq = value_after(text, "SeqNum=").and_then(|s| s.parse().ok());
        let op = value_after(text, "OpType=").map(clip);
        let rank = rank_of(text);
        let i = match self.collective_timeouts.iter().position(|t| t.seq == seq) {
            Some(i) => i,
            None if self.collective_timeouts.len() < MAX_ENTRIES => {
                self.collective_timeouts.push(CollectiveTimeout {
                    seq,
                    op,
                    timeout_ms: value_after(text, "Timeout(ms)=").and_then(|s| s.parse().ok()),
                    first_line: line_no,
                    ..CollectiveTimeout::default()
                });
                self.collective_timeouts.len() - 1
            }
            None => return,
        };
        let t = &mut self.collective_timeouts[i];
        t.count += 1;
        if let Some(r) = rank.filter(|r| !t.ranks.contains(r) && t.ranks.len() < MAX_RANKS) {
            t.ranks.push(r);
            t.ranks.sort_unstable();
        }
    }

    /// `Exception (either an error or timeout) detected by watchdog at work: N,
    /// last enqueued NCCL work: A, last completed NCCL work: B.` and `Received a
    /// dump signal due to a collective timeout from rank R ... Last enqueued NCCL
    /// work: A, last completed NCCL work: B.`
    fn work_state(&mut self, text: &str) {
        if let Some(from) = text
            .split("collective timeout from ")
            .nth(1)
            .and_then(|r| r.split(" and we will").next())
        {
            self.dump_signal_from
                .get_or_insert_with(|| clip(from.trim()));
        }
        let number = |key: &str| -> Option<i64> {
            let rest = text.split(key).nth(1)?;
            let n: String = rest
                .trim_start()
                .chars()
                .take_while(|c| c.is_ascii_digit() || *c == '-')
                .collect();
            n.parse().ok()
        };
        let enqueued = number("ast enqueued NCCL work: ");
        let completed = number("ast completed NCCL work: ");
        let (Some(rank), Some(enqueued), Some(completed)) = (rank_of(text), enqueued, completed)
        else {
            return;
        };
        if self.work.len() < MAX_RANKS && !self.work.iter().any(|w| w.rank == rank) {
            self.work.push(WorkState {
                rank,
                enqueued,
                completed,
            });
            self.work.sort_by_key(|w| w.rank);
        }
    }

    /// Ray's summary of a dead worker: its address, pid and exit type follow on
    /// the same line or the next few (a terminal wraps them).
    fn ray_failure(&mut self, line_no: u64, text: &str) {
        if self.launcher_failures.iter().any(|f| f.launcher == "ray") {
            self.ray_fields = 3;
            self.ray_field(text);
            return;
        }
        self.launcher(LauncherFailure {
            launcher: "ray",
            line: line_no,
            ..LauncherFailure::default()
        });
        self.ray_fields = 3;
        self.ray_field(text);
    }

    fn ray_field(&mut self, text: &str) {
        let Some(f) = self
            .launcher_failures
            .iter_mut()
            .rfind(|f| f.launcher == "ray")
        else {
            return;
        };
        if let Some(ip) = value_after(text, "Worker IP address: ") {
            f.host.get_or_insert_with(|| clip(ip));
        }
        if let Some(pid) = value_after(text, "Worker PID: ") {
            f.rank
                .get_or_insert_with(|| format!("worker pid {}", clip(pid)));
        }
        if let Some(kind) = value_after(text, "Worker exit type: ") {
            f.exitcode.get_or_insert_with(|| clip(kind));
        }
    }

    /// `NCCL error in: FILE:LINE, REASON, NCCL version X` (or `NCCL error: REASON,
    /// NCCL version X`), and XLA's `NCCL operation CALL failed: REASON. Last NCCL
    /// warning(error) log entry (may be unrelated) 'TEXT'.`
    fn nccl_error(&mut self, line_no: u64, text: &str) {
        let body = text
            .strip_prefix("NCCL error in: ")
            .map(|t| t.split_once(", ").map_or("", |(_, r)| r))
            .or_else(|| text.strip_prefix("NCCL error: "))
            .or_else(|| {
                text.strip_prefix("NCCL operation ")
                    .and_then(|t| t.split_once(" failed: "))
                    .map(|(_, r)| r)
            })
            .unwrap_or("");
        if body.is_empty() {
            return;
        }
        let reason = body
            .split(", NCCL version")
            .next()
            .and_then(|r| r.split(". Last NCCL warning").next())
            .and_then(|r| r.split("; current tracing scope").next())
            .unwrap_or(body)
            .trim();
        // Older PyTorch prints it all on one line: `... ncclRemoteError: ... Last error: TEXT`;
        // XLA quotes NCCL's last WARN.
        let inline = text
            .find("Last error:")
            .map(|at| text[at + 11..].trim())
            .or_else(|| {
                text.split("log entry (may be unrelated) '")
                    .nth(1)
                    .and_then(|r| r.rsplit_once('\''))
                    .map(|(quoted, _)| quoted)
            });
        let room = self.nccl_errors.len() < MAX_ENTRIES;
        match self.nccl_errors.iter_mut().find(|e| e.reason == reason) {
            Some(e) => e.count += 1,
            None if room => self.nccl_errors.push(FrameworkError {
                reason: clip(reason),
                last_error: inline.filter(|t| !t.is_empty()).map(clip),
                first_line: line_no,
                count: 1,
            }),
            None => return,
        }
        // XLA prints no `Last error:` block of its own.
        self.pending_last_error = inline.is_none() && !text.starts_with("NCCL operation ");
    }

    fn last_error(&mut self, text: &str) {
        self.pending_last_error = false;
        if let Some(e) = self.nccl_errors.last_mut() {
            e.last_error.get_or_insert_with(|| clip(text));
        }
    }

    fn launcher(&mut self, failure: LauncherFailure) {
        if self.launcher_failures.len() < MAX_ENTRIES {
            self.launcher_failures.push(failure);
        }
    }

    /// The fields of ChildFailedError's root-cause block, one per line.
    fn root_cause_field(&mut self, text: &str) {
        let t = text.trim();
        if t.starts_with("=====") {
            self.in_root_cause = false;
            return;
        }
        let Some((key, value)) = t.split_once(':') else {
            return;
        };
        let key = key.trim();
        if !["host", "rank", "exitcode"].contains(&key) {
            return;
        }
        let value = clip(value.trim());
        if let Some(f) = self.launcher_failures.last_mut() {
            match key {
                "host" => f.host = Some(value),
                "rank" => f.rank = Some(format!("rank {value}")),
                _ => f.exitcode = Some(value),
            }
        }
    }

    fn ras_problem(&mut self, text: &str) {
        if self.ras_problems.len() < MAX_ENTRIES {
            self.ras_problems.push(clip(unprefixed(text)));
        }
    }

    /// Takes a row of the RAS `STATUS` communicators table (`Group Comms Nodes
    /// Ranks Ranks Ranks Status Errors`): kept when it is not `RUNNING OK`.
    pub fn ras_row(&mut self, text: &str) {
        if !text.trim_start().starts_with(|c: char| c.is_ascii_digit()) {
            return;
        }
        let cols: Vec<&str> = text.split_whitespace().collect();
        if cols.len() == 8
            && cols[..6]
                .iter()
                .all(|c| c.bytes().all(|b| b.is_ascii_digit()))
            && (cols[6] != "RUNNING" || cols[7] != "OK")
        {
            self.ras_problem(text);
        }
    }

    /// True when any line of the job's framework or launcher was read.
    pub fn any(&self) -> bool {
        !self.collective_timeouts.is_empty()
            || self.watchdog_hangs > 0
            || !self.nccl_errors.is_empty()
            || !self.launcher_failures.is_empty()
            || !self.ras_problems.is_empty()
            || !self.work.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str) -> JobLines {
        let mut j = JobLines::default();
        for (i, l) in text.lines().enumerate() {
            j.line(i as u64 + 1, l);
            j.ras_row(l);
        }
        j
    }

    #[test]
    fn watchdog_timeouts_group_by_sequence_number() {
        let j = read(
            "[rank1]:[E626 06:24:44.9 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=808, OpType=ALLREDUCE, NumelIn=9, NumelOut=9, Timeout(ms)=600000) ran for 600020 milliseconds before timing out.\n\
             (RayWorkerWrapper pid=4009) [rank0]:[E ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=808, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 1 milliseconds before timing out.\n\
             [rank0]:[E ProcessGroupNCCL.cpp:1414] [PG 1 Rank 0] Process group watchdog thread terminated with exception: [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=808, OpType=ALLREDUCE)\n",
        );
        assert_eq!(j.collective_timeouts.len(), 1);
        let t = &j.collective_timeouts[0];
        assert_eq!(
            (t.seq, t.op.as_deref(), t.timeout_ms, &t.ranks[..], t.count),
            (Some(808), Some("ALLREDUCE"), Some(600000), &[0, 1][..], 3)
        );
    }

    #[test]
    fn nccl_errors_take_the_last_error_line() {
        let j = read(
            "[rank3]: torch.distributed.DistBackendError: NCCL error in: /x/ProcessGroupNCCL.cpp:3763, remote process exited or there was a network error, NCCL version 2.28.8\n\
             [rank3]: ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.\n\
             [rank3]: Last error:\n\
             [rank3]: NET/OFI Request 0x7f completed with error. RC: 113.\n",
        );
        let e = &j.nccl_errors[0];
        assert_eq!(
            e.reason,
            "remote process exited or there was a network error"
        );
        assert_eq!(
            e.last_error.as_deref(),
            Some("NET/OFI Request 0x7f completed with error. RC: 113.")
        );
        // 2.29 on: the detail follows the result's description directly.
        let j = read(
            "torch.distributed.DistBackendError: NCCL error in: a.cpp:93, unhandled cuda error, NCCL version 2.29.7\n\
             ncclUnhandledCudaError: Call to CUDA function failed.\n\
             Failed to bind NVLink SHARP (NVLS) Multicast memory of size 2097152 : CUDA error 2 'out of memory'.\n",
        );
        assert!(
            j.nccl_errors[0]
                .last_error
                .as_deref()
                .unwrap()
                .starts_with("Failed to bind NVLink SHARP")
        );
        let j = read(
            "what(): NCCL error: remote process exited or there was a network error, NCCL version 2.14.3 ncclRemoteError: A call failed. Last error: NET/IB : Got completion from peer x with error 12\n",
        );
        assert_eq!(
            j.nccl_errors[0].last_error.as_deref(),
            Some("NET/IB : Got completion from peer x with error 12")
        );
    }

    /// Issue 38: the lines that say which rank: each rank's work numbers, the
    /// rank whose watchdog fired first; XLA's NCCL error with NCCL's last WARN;
    /// Ray's dead worker (wrapped by a terminal); a watchdog killed by a CUDA error.
    #[test]
    fn work_numbers_dump_signal_xla_ray_and_watchdog_errors() {
        let j = read(
            "[rank0]:[E1206 18:44:12.7 ProcessGroupNCCL.cpp:1664] [PG 1 Rank 0] Exception (either an error or timeout) detected by watchdog at work: 7753, last enqueued NCCL work: 7755, last completed NCCL work: 7752.\n\
             [rank6]:[E703 21:51:54.1 ProcessGroupNCCL.cpp:1987] [PG ID 0 PG GUID 0(default_pg) Rank 6] Received a dump signal due to a collective timeout from  rank 7 and we will try our best to dump the debug info. Last enqueued NCCL work: 56115, last completed NCCL work: 56115.This is most likely caused by incorrect usages of collectives\n\
             INTERNAL: external/xla/xla/service/gpu/nccl_utils.cc:305: NCCL operation ncclCommInitRank(&comm, nranks, id, rank) failed: unhandled system error (run with NCCL_DEBUG=INFO for details). Last NCCL warning(error) log entry (may be unrelated) 'socketTryAccept: Accept failed: Bad file descriptor'.\n\
             (raylet) A worker died or was killed while executing a task by an unexpected system error. Worker IP address: 10.0.1.75 Worker port: 10230 Worker PID: 207258 Worker exit type: SYSTEM_ERRO\n\
             R Worker exit detail: Worker unexpectedly exits with a connection error code 2.\n\
             [E ProcessGroupNCCL.cpp:916] [Rank 0] NCCL watchdog thread terminated with exception: CUDA error: an illegal memory access was encountered\n",
        );
        assert_eq!(
            j.work,
            [
                WorkState {
                    rank: 0,
                    enqueued: 7755,
                    completed: 7752
                },
                WorkState {
                    rank: 6,
                    enqueued: 56115,
                    completed: 56115
                }
            ]
        );
        assert_eq!(j.dump_signal_from.as_deref(), Some("rank 7"));
        assert_eq!(
            j.nccl_errors[0].reason,
            "unhandled system error (run with NCCL_DEBUG=INFO for details)"
        );
        assert_eq!(
            j.nccl_errors[0].last_error.as_deref(),
            Some("socketTryAccept: Accept failed: Bad file descriptor")
        );
        assert_eq!(
            j.nccl_errors[1].reason,
            "CUDA error: an illegal memory access was encountered"
        );
        let ray = &j.launcher_failures[0];
        assert_eq!(
            (
                ray.launcher,
                ray.host.as_deref(),
                ray.rank.as_deref(),
                ray.exitcode.as_deref()
            ),
            (
                "ray",
                Some("10.0.1.75"),
                Some("worker pid 207258"),
                Some("SYSTEM_ERRO")
            )
        );
    }

    #[test]
    fn launcher_failures_and_ras_rows() {
        let j = read(
            "E1106 04:43:02.651000 26021 api.py:869] failed (exitcode: -6) local_rank: 3 (pid: 26026) of binary: /bin/python\n\
             Root Cause (first observed failure):\n[0]:\n  time      : 2024-02-27_12:42:13\n  host      : gpt-dev-ppt\n  rank      : 0 (local_rank: 0)\n  exitcode  : -6 (pid: 65957)\n======\n\
                 0         1         1         2         2         2   RUNNING      OK\n\
                 0         1         2         2         4         3   INCOMPLETE   MISMATCH\n",
        );
        assert_eq!(j.launcher_failures.len(), 2);
        assert_eq!(j.launcher_failures[0].rank.as_deref(), Some("local rank 3"));
        assert_eq!(j.launcher_failures[1].host.as_deref(), Some("gpt-dev-ppt"));
        assert_eq!(
            j.launcher_failures[1].exitcode.as_deref(),
            Some("-6 (pid: 65957)")
        );
        assert_eq!(j.ras_problems.len(), 1);
        assert!(j.ras_problems[0].contains("INCOMPLETE"));
    }
}
