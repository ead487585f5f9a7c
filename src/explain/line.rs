//! One log line: find NCCL's own prefix (`host:pid:tid [dev] NCCL INFO msg`, or
//! `host:pid:tid [dev] file.cc:123 (func) NCCL WARN msg`) behind whatever the
//! launcher put in front of it: torchrun's `[default0]:`, mpirun's
//! `[1,0]<stdout>:`, kubectl's `[pod/name/container] `, timestamps.
//! Formats from NVIDIA/nccl src/debug.cc, 2.4 to 2.30.7; 2.32 adds the `ATTN`
//! level (`[%d] %s:%d (%s) NCCL ATTN %s`, the 2.32.3 build's strings) for
//! fallbacks and plugin failures NCCL goes on after, printed like a WARN.

use memchr::memmem;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Info,
    Warn,
    /// NCCL 2.32's ATTN: something the user should know, after which NCCL goes on.
    Attn,
}

/// The parts of an NCCL line that matter. The prefix is split into host, pid and
/// WARN location only when asked: most lines never need them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NcclLine<'a> {
    pub level: Level,
    /// Everything before `NCCL INFO` / `NCCL WARN`.
    pub prefix: &'a str,
    /// The text after `NCCL INFO ` / `NCCL WARN `, without the line end.
    pub message: &'a str,
}

impl<'a> NcclLine<'a> {
    /// Host name (as NCCL printed it, up to the first `.`) and pid, when the prefix has them.
    pub fn host_pid(&self) -> Option<(&'a str, u32)> {
        // Byte searches from the end: a prefix can be 64 KiB (issue 31: 60 KB
        // host names), and char-wise reverse splitting made the whole read slow.
        let mut rest = self.prefix.trim_end_matches([' ', '\t']);
        for _ in 0..4 {
            let start = memchr::memrchr2(b' ', b'\t', rest.as_bytes()).map_or(0, |i| i + 1);
            if let Some(found) = host_pid(&rest[start..]) {
                return Some(found);
            }
            if start == 0 {
                return None;
            }
            rest = rest[..start - 1].trim_end_matches([' ', '\t']);
        }
        None
    }

    /// `file.cc:line` of a WARN (or ATTN), when printed.
    pub fn location(&self) -> Option<&'a str> {
        if self.level == Level::Info {
            return None;
        }
        self.prefix
            .split_whitespace()
            .rev()
            .take(3)
            .take_while(|t| host_pid(t).is_none())
            .find(|t| is_source_location(t))
    }
}

/// `misc/ibvwrap.cc:182`, `include/alloc.h:178`, `enqueue.cu:54`: a source file
/// and a line (headers too: NCCL's macros and inline functions WARN from them).
fn is_source_location(token: &str) -> bool {
    let Some((file, line)) = token.rsplit_once(':') else {
        return false;
    };
    let ext = file.rsplit_once('.').map_or("", |(_, e)| e);
    ["c", "cc", "cpp", "cu", "h", "hpp"].contains(&ext)
        && !line.is_empty()
        && line.bytes().all(|b| b.is_ascii_digit())
}

/// Splits `host:pid:tid`, dropping launcher prefixes glued to the host (`[default0]:vm`).
fn host_pid(token: &str) -> Option<(&str, u32)> {
    let bytes = token.as_bytes();
    let tid_at = memchr::memrchr(b':', bytes)?;
    let pid_at = memchr::memrchr(b':', &bytes[..tid_at])?;
    let tid = &bytes[tid_at + 1..];
    if tid.is_empty() || !tid.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let pid: u32 = token[pid_at + 1..tid_at].parse().ok()?;
    let host = &token[..pid_at];
    // `]` and `>` are ASCII: the byte after one is a char boundary.
    let from = memchr::memrchr2(b']', b'>', host.as_bytes()).map_or(0, |i| i + 1);
    let host = host[from..].trim_start_matches(':');
    (!host.is_empty()).then_some((host, pid))
}

/// True when `token` ends in NCCL's `host:pid:tid` (the host may be glued to
/// text before it).
fn ends_with_host_pid(token: &str) -> bool {
    let mut parts = token.rsplitn(3, ':');
    let (Some(tid), Some(pid), Some(host)) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    let digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
    digits(tid) && digits(pid) && !host.is_empty()
}

/// Last segments of NCCL's transport names (src/transport/*.cc).
const TRANSPORT_WORDS: &[&str] = &[
    "GDRDMA", "Shared", "CUMEM", "IPC", "read", "CE", "direct", "Socket", "IB",
];

/// Where a second record starts inside a line whose NCCL marker (`NCCL INFO`,
/// `NCCL WARN`) is at `marker`: at its `host:pid:tid` token, found among the
/// few tokens before the marker (`[dev]`, and for WARN `file.cc:123 (func)`).
/// The host is cut where it is glued to the previous record's text: at the last
/// character NCCL never prints in a host name.
fn record_start(line: &str, marker: usize) -> Option<usize> {
    let before = &line[..marker];
    let mut end = before.trim_end().len();
    for _ in 0..4 {
        let start = before[..end].rfind(' ').map_or(0, |i| i + 1);
        let token = &before[start..end];
        if ends_with_host_pid(token) {
            let host_end = token.rfind(':').and_then(|i| token[..i].rfind(':'))?;
            // After that character, whatever its width in bytes (a replacement
            // character from invalid UTF-8 is three).
            let mut host_from = token[..host_end]
                .char_indices()
                .rfind(|(_, c)| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '.' || *c == '_'))
                .map_or(0, |(i, c)| i + c.len_utf8());
            // Glued to a transport name (`via P2P/IPCnode-b:6:6 ...`): the host
            // starts after the transport's last segment, when it is one NCCL prints.
            if token[..host_from].ends_with('/') {
                let run = &token[host_from..host_end];
                if let Some(word) = TRANSPORT_WORDS
                    .iter()
                    .find(|w| run.len() > w.len() && run.starts_with(*w))
                {
                    host_from += word.len();
                }
            }
            return Some(start + host_from);
        }
        if start == 0 {
            return None;
        }
        end = before[..start].trim_end().len();
    }
    None
}

/// Splits a line into the records on it. Two processes writing to one stream
/// can run their lines together (`...via P2P/IPC h:2:2 [1] NCCL INFO Channel ...`):
/// each `host:pid:tid [dev] NCCL INFO|WARN` after the first starts a record of
/// its own. Calls `each` once per record, in order.
pub fn for_each_record<'a>(
    line: &'a str,
    finder: &memmem::Finder<'_>,
    mut each: impl FnMut(&'a str),
) {
    let bytes = line.as_bytes();
    let mut record_from = 0;
    let mut search_from = 0;
    let mut first = true;
    while let Some(pos) = finder.find(&bytes[search_from..]) {
        let at = search_from + pos;
        search_from = at + 5;
        let rest = &bytes[at + 5..];
        if !(rest.starts_with(b"INFO") || rest.starts_with(b"WARN") || rest.starts_with(b"ATTN")) {
            continue;
        }
        if first {
            first = false;
            continue;
        }
        if let Some(start) = record_start(line, at).filter(|&s| s > record_from) {
            each(&line[record_from..start]);
            record_from = start;
        }
    }
    each(&line[record_from..]);
}

/// Parses a line; `None` when it is not an NCCL INFO or WARN line.
pub fn parse<'a>(line: &'a str, finder: &memmem::Finder<'_>) -> Option<NcclLine<'a>> {
    let bytes = line.as_bytes();
    let mut from = 0;
    // "NCCL " may appear inside a launcher prefix; take the first occurrence followed by a level.
    while let Some(pos) = finder.find(&bytes[from..]) {
        let at = from + pos;
        let rest = &line[at + 5..];
        let level = if rest.starts_with("INFO ") || rest == "INFO" {
            Level::Info
        } else if rest.starts_with("WARN ") || rest == "WARN" {
            Level::Warn
        } else if rest.starts_with("ATTN ") || rest == "ATTN" {
            Level::Attn
        } else {
            from = at + 5;
            continue;
        };
        let message = rest.get(5..).unwrap_or("").trim_end_matches(['\r', '\n']);
        return Some(NcclLine {
            level,
            prefix: &line[..at],
            message,
        });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    impl<'a> NcclLine<'a> {
        fn host(&self) -> Option<&'a str> {
            self.host_pid().map(|(h, _)| h)
        }

        fn pid(&self) -> Option<u32> {
            self.host_pid().map(|(_, p)| p)
        }
    }

    fn p(line: &str) -> Option<NcclLine<'_>> {
        parse(line, &memmem::Finder::new(b"NCCL "))
    }

    #[test]
    fn plain_and_prefixed_info_lines() {
        let l = p("vm:675:675 [0] NCCL INFO NCCL version 2.28.9+cuda13.0").unwrap();
        assert_eq!(
            (l.host(), l.pid(), l.level, l.message),
            (
                Some("vm"),
                Some(675),
                Level::Info,
                "NCCL version 2.28.9+cuda13.0"
            )
        );
        let l = p("[default1]:node-a:42:99 [1] NCCL INFO Using network IB\r\n").unwrap();
        assert_eq!(
            (l.host(), l.pid(), l.message),
            (Some("node-a"), Some(42), "Using network IB")
        );
        let l = p(
            "[1,3]<stdout>:gpu-7:1234:1301 [3] NCCL INFO Channel 00/0 : 3[3] -> 4[4] via P2P/IPC",
        )
        .unwrap();
        assert_eq!(l.host(), Some("gpu-7"));
        let l = p("[pod/trainer-worker-0/pytorch] 2025-01-02T03:04:05.678Z trainer-worker-0:87:87 [0] NCCL INFO x").unwrap();
        assert_eq!((l.host(), l.pid()), (Some("trainer-worker-0"), Some(87)));
    }

    #[test]
    fn warn_lines_with_and_without_function() {
        let l = p("vm:1:2 [0] bootstrap.cc:114 (bootstrapInit) NCCL WARN Bootstrap : no socket interface found").unwrap();
        assert_eq!(
            (l.level, l.location(), l.message),
            (
                Level::Warn,
                Some("bootstrap.cc:114"),
                "Bootstrap : no socket interface found"
            )
        );
        let l = p("vm:1:2 [0] transport/shm.cc:590 NCCL WARN Error: failed to extend /dev/shm/nccl-x to 9 bytes").unwrap();
        assert_eq!(l.location(), Some("transport/shm.cc:590"));
        // A header's macro or inline function (src/include/alloc.h ncclCudaCalloc).
        let l = p("h:1:2 [3] include/alloc.h:178 NCCL WARN Cuda failure 'out of memory'").unwrap();
        assert_eq!(l.location(), Some("include/alloc.h:178"));
        // NCCL 2.32's ATTN level, as its build formats it.
        let l = p("vm:1:2 [0] plugin/net.cc:77 (ncclNetInit) NCCL ATTN Failed to initialize NET plugin IB").unwrap();
        assert_eq!(
            (l.level, l.location(), l.message),
            (
                Level::Attn,
                Some("plugin/net.cc:77"),
                "Failed to initialize NET plugin IB"
            )
        );
    }

    fn records(line: &str) -> Vec<&str> {
        let mut v = Vec::new();
        for_each_record(line, &memmem::Finder::new(b"NCCL "), |r| v.push(r));
        v
    }

    #[test]
    fn two_processes_on_one_line_are_two_records() {
        assert_eq!(
            records(
                "a:1:1 [0] NCCL INFO Channel 00 : 0[0] -> 1[1] via P2P/IPC b:2:2 [1] NCCL INFO Channel 00 : 1[1] -> 0[0] via P2P/IPC"
            ),
            [
                "a:1:1 [0] NCCL INFO Channel 00 : 0[0] -> 1[1] via P2P/IPC ",
                "b:2:2 [1] NCCL INFO Channel 00 : 1[1] -> 0[0] via P2P/IPC"
            ]
        );
        // Glued, and a WARN with its location.
        assert_eq!(
            records(
                "[1,0]<stdout>:a:1:1 [0] NCCL INFO Ring 00 : 0 -> 1 via P2P/IPC)b-2:2:2 [1] misc/ibvwrap.cc:212 (wrap_ibv_reg_mr) NCCL WARN Call to ibv_reg_mr failed"
            ),
            [
                "[1,0]<stdout>:a:1:1 [0] NCCL INFO Ring 00 : 0 -> 1 via P2P/IPC)",
                "b-2:2:2 [1] misc/ibvwrap.cc:212 (wrap_ibv_reg_mr) NCCL WARN Call to ibv_reg_mr failed"
            ]
        );
        // One record, and text that only mentions NCCL INFO.
        assert_eq!(records("a:1:1 [0] NCCL INFO x").len(), 1);
        assert_eq!(records("a:1:1 [0] NCCL INFO set NCCL INFO level").len(), 1);
        assert_eq!(records("plain text").len(), 1);
        // A multi-byte character glued to the second host (invalid UTF-8 read as
        // U+FFFD): the host starts after it. This cut inside the character and
        // panicked, found by the fuzz of mutated real logs.
        assert_eq!(
            records("a:1:1 [0] NCCL INFO x sy\u{fffd}z-host:721:721 [1] NCCL INFO y"),
            [
                "a:1:1 [0] NCCL INFO x sy\u{fffd}",
                "z-host:721:721 [1] NCCL INFO y"
            ]
        );
    }

    #[test]
    fn other_lines_and_odd_prefixes() {
        assert!(p("W1122 torch/distributed/run.py:851] ****").is_none());
        assert!(p("NCCL TRACE something").is_none());
        assert!(
            p("prefix NCCL notes then vm:1:1 [0] NCCL INFO real")
                .unwrap()
                .message
                == "real"
        );
        let l = p("NCCL INFO no prefix at all").unwrap();
        assert_eq!((l.host(), l.message), (None, "no prefix at all"));
        assert!(p("x:y:z [0] NCCL INFO m").unwrap().host().is_none());
        assert_eq!(p("trailing NCCL INFO").unwrap().message, "");
    }
}
