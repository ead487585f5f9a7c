//! explain-log: read an NCCL_DEBUG=INFO log (one rank or many interleaved,
//! behind any launcher's prefixes) and say which transports ran and what is
//! wrong. Streams: memory stays flat whatever the log's size (a fixed read
//! buffer, capped summaries); lines longer than `MAX_LINE` are read in part.

pub mod catalog;
pub(crate) mod codes;
pub(crate) mod encoding;
pub(crate) mod framework;
#[cfg(test)]
mod fuzz;
pub(crate) mod line;
pub(crate) mod meanings;
pub(crate) mod rules;
pub(crate) mod settings;
pub(crate) mod summary;
pub(crate) mod transport;
pub(crate) mod warns;

use crate::finding::{Finding, Status};
use memchr::memmem;
use serde::Serialize;
use std::io::{self, Read};
use summary::LogSummary;

pub(crate) const SCHEMA: &str = "nccl-preflight/explain-log/v1";
/// Longest line read whole; NCCL's own lines are at most 1 KiB or so.
pub(crate) const MAX_LINE: usize = 64 * 1024;
const BUFFER: usize = 1 << 20;

/// The result: what the log showed and what it means.
#[derive(Debug, Serialize)]
pub(crate) struct Explanation {
    pub schema: &'static str,
    /// The file read, or `-` for standard input.
    pub input: String,
    pub verdict: Status,
    #[serde(flatten)]
    pub summary: LogSummary,
    /// The verdict first, then the other findings.
    pub findings: Vec<Finding>,
    /// Lines that are context, not failures: echoes of the first failure
    /// (teardown, wrappers, a proxy reporting its peer) and WARNs NCCL prints on
    /// healthy runs.
    pub context: Vec<String>,
}

fn feed(summary: &mut LogSummary, finder: &memmem::Finder<'_>, line_no: u64, bytes: &[u8]) {
    let text = match std::str::from_utf8(bytes) {
        Ok(t) => std::borrow::Cow::Borrowed(t),
        Err(_) => {
            summary.non_utf8_lines += 1;
            String::from_utf8_lossy(bytes)
        }
    };
    summary.line();
    line::for_each_record(&text, finder, |record| match line::parse(record, finder) {
        Some(l) => summary.nccl_line(line_no, &l),
        // NCCL before 2.13 or so printed its version as a bare `NCCL version X` line.
        None => {
            if let Some(at) = record.find("NCCL version ") {
                summary.bare_version(&record[at + 13..]);
            }
            summary.job_line(line_no, record);
        }
    });
}

/// Reads a whole log into a summary.
pub(crate) fn summarize(mut input: impl Read) -> io::Result<LogSummary> {
    let finder = memmem::Finder::new(b"NCCL ");
    let mut summary = LogSummary::default();
    let mut buf = vec![0u8; BUFFER];
    let (mut start, mut end) = (0usize, 0usize);
    let mut line_no = 0u64;
    // Inside an over-long line whose head was already read: drop bytes to its end.
    let mut skipping = false;
    loop {
        if let Some(pos) = memchr::memchr(b'\n', &buf[start..end]) {
            if skipping {
                skipping = false;
            } else {
                line_no += 1;
                if pos > MAX_LINE {
                    summary.truncated_lines += 1;
                }
                feed(
                    &mut summary,
                    &finder,
                    line_no,
                    &buf[start..start + pos.min(MAX_LINE)],
                );
            }
            start += pos + 1;
            continue;
        }
        if end - start >= MAX_LINE {
            if !skipping {
                line_no += 1;
                summary.truncated_lines += 1;
                feed(
                    &mut summary,
                    &finder,
                    line_no,
                    &buf[start..start + MAX_LINE],
                );
                skipping = true;
            }
            start = end;
        }
        if start > 0 {
            buf.copy_within(start..end, 0);
            end -= start;
            start = 0;
        }
        let n = match input.read(&mut buf[end..]) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if n == 0 {
            if end > start && !skipping {
                line_no += 1;
                feed(&mut summary, &finder, line_no, &buf[start..end]);
            }
            return Ok(summary);
        }
        end += n;
    }
}

/// Summarizes and diagnoses a log. UTF-16 text (PowerShell's `>` writes it) is
/// decoded first and named in the summary.
pub(crate) fn explain(input: impl Read, name: &str) -> io::Result<Explanation> {
    let (found, input) = encoding::sniff(input)?;
    let summary = match found {
        Some(enc) => {
            let mut s = summarize(encoding::Utf16Reader::new(input, enc))?;
            s.encoding = Some(enc.name().to_string());
            s
        }
        None => summarize(input)?,
    };
    let (findings, context) = rules::diagnose(&summary);
    Ok(Explanation {
        schema: SCHEMA,
        input: name.to_string(),
        verdict: crate::finding::verdict(&findings),
        summary,
        findings,
        context,
    })
}

impl Explanation {
    /// Why there is nothing to judge, when the input held no NCCL line: what
    /// it held instead. An empty or binary file must not pass as a clean log.
    pub(crate) fn nothing_to_judge(&self) -> Option<String> {
        let s = &self.summary;
        if s.nccl_lines > 0 || s.job.any() {
            return None;
        }
        Some(if s.lines == 0 {
            "the input is empty".to_string()
        } else if s.non_utf8_lines * 2 > s.lines {
            format!(
                "{} line(s), {} of them not UTF-8 text (a binary file? a compressed log must be decompressed first)",
                s.lines, s.non_utf8_lines
            )
        } else {
            format!(
                "{} line(s){}, none printed by NCCL (run the job with NCCL_DEBUG=INFO, and give explain-log the job's output)",
                s.lines,
                s.encoding
                    .as_deref()
                    .map(|e| format!(" of {e} text"))
                    .unwrap_or_default()
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_lines_truncated_and_last_line_without_newline() {
        let mut log = Vec::new();
        log.extend(b"vm:1:1 [0] NCCL INFO NCCL version 2.28.9+cuda13.0\n");
        log.extend(b"vm:1:1 [0] NCCL INFO ");
        log.extend(std::iter::repeat_n(b'x', 3 * MAX_LINE));
        log.extend(b"\nvm:1:1 [0] NCCL INFO Using network IB");
        log.extend(b"\n");
        // A line longer than the whole read buffer, then a normal line.
        log.extend(std::iter::repeat_n(b'y', 2 * BUFFER + 7));
        log.extend(b"\nvm:1:1 [0] NCCL INFO Using network Socket");
        let s = summarize(&log[..]).unwrap();
        assert_eq!((s.lines, s.nccl_lines, s.truncated_lines), (5, 4, 2));
        assert!(s.networks.contains("Socket"));
        assert!(s.networks.contains("IB"));
        assert!(s.nccl_versions.contains("2.28.9+cuda13.0"));
    }

    #[test]
    fn utf16_logs_are_decoded_and_named() {
        let text = "vm:1:1 [0] NCCL INFO NCCL version 2.28.9+cuda13.0\r\nvm:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM\r\n";
        let le: Vec<u8> = [0xff, 0xfe]
            .into_iter()
            .chain(text.encode_utf16().flat_map(u16::to_le_bytes))
            .collect();
        let be: Vec<u8> = text.encode_utf16().flat_map(u16::to_be_bytes).collect();
        for (bytes, name) in [(le, "UTF-16LE"), (be, "UTF-16BE")] {
            let e = explain(&bytes[..], "x").unwrap();
            assert_eq!(e.summary.encoding.as_deref(), Some(name));
            assert_eq!(e.summary.nccl_lines, 2, "{name}");
            assert_eq!(e.summary.transport_counts.get("P2P/CUMEM"), Some(&1));
            assert!(e.nothing_to_judge().is_none());
        }
    }

    #[test]
    fn empty_binary_and_foreign_input_is_nothing_to_judge() {
        let e = explain(&b""[..], "x").unwrap();
        assert_eq!(e.nothing_to_judge().unwrap(), "the input is empty");
        let gz = [
            0x1f, 0x8b, 0x08, 0x00, 0xff, 0xfe, 0x80, 0x0a, 0x93, 0xc3, 0x28,
        ];
        assert!(
            explain(&gz[..], "x")
                .unwrap()
                .nothing_to_judge()
                .unwrap()
                .contains("not UTF-8")
        );
        let e = explain(
            &b"Traceback (most recent call last):\nRuntimeError: boom\n"[..],
            "x",
        )
        .unwrap();
        assert!(
            e.nothing_to_judge()
                .unwrap()
                .contains("2 line(s), none printed by NCCL")
        );
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        let mut seed = crate::test_facts::fuzz_seed(0x2545_f491_4f6c_dd1d);
        for round in 0..crate::test_facts::fuzz_iterations(200) {
            let len = (round * 97) % 5000;
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    // Mostly text that looks like NCCL lines, with raw bytes mixed in.
                    const ALPHABET: &[u8] =
                        b"NCCL INFO WARN via /[]:0123 Channel comm rank nNodes busId\n\xff\xc3";
                    ALPHABET[(seed % ALPHABET.len() as u64) as usize]
                })
                .collect();
            let e = explain(&bytes[..], "fuzz").unwrap();
            assert!(e.summary.lines >= e.summary.nccl_lines);
        }
    }
}
