//! A bounded, seeded fuzz of the NCCL log line parser on mutations of real logs: the
//! H200 logs in `../shared/data/h200x2` (NCCL 2.28 on the lent machine), the public
//! excerpts in `tests/logs/corpus` and the per-rule logs in `tests/logs`. Lines are cut,
//! spliced between logs, repeated, stretched past the line limit, given CRLF ends, NUL,
//! invalid UTF-8, escape sequences, huge numbers and the tokens the parser keys on
//! (`via`, `[`, `->`, `/`, `comm 0x`...), then read in random chunk sizes.
//!
//! Properties: `explain` never panics and never fails on in-memory input; the result
//! does not depend on where the reads split the input (chunked and whole reads give the
//! same JSON); the per-line counts stay within the line count; the JSON answer serializes.
//! `NCCL_PREFLIGHT_FUZZ_ITERATIONS` and `NCCL_PREFLIGHT_FUZZ_SEED` lengthen and vary it.

use std::io::Read;
use std::path::{Path, PathBuf};

/// Tokens the line parser and summary look for, and hostile bytes.
const TOKENS: &[&[u8]] = &[
    b"via ",
    b" : ",
    b"[",
    b"]",
    b"->",
    b"/",
    b"%",
    b"\r",
    b"\0",
    b"\xff",
    b"\xc3",
    b"\xe2\x82",
    b"18446744073709551616",
    b"-1",
    b"0x",
    b"NCCL INFO ",
    b"NCCL WARN ",
    b"NCCL version ",
    b"Channel ",
    b"comm 0x",
    b" nRanks ",
    b" nNodes ",
    b" rank ",
    b" busId ",
    b"[default0]:",
    b"\x1b[2J",
    b"\xc3\xa9",
    b"P2P/CUMEM",
    b"NET/IB/0/GDRDMA",
    b"P2P/IPC/read",
    b"NET/OFI",
    b"Using network ",
    b"NCCL_",
    b"=",
    b"\t",
];

/// Files of the seed corpus: every `.log` directly under each directory.
fn seed_logs() -> Vec<Vec<u8>> {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let shared = repo.join("../shared/data/h200x2");
    if !shared.is_dir() {
        // As the integration tests do: a skip outside CI, a failure under strict mode.
        assert!(
            std::env::var_os("NCCL_PREFLIGHT_TEST_STRICT").is_none(),
            "{} is missing and NCCL_PREFLIGHT_TEST_STRICT is set",
            shared.display()
        );
        eprintln!(
            "{} is missing: fuzzing the repository's logs only",
            shared.display()
        );
    }
    let mut paths: Vec<PathBuf> = Vec::new();
    for dir in [
        shared,
        repo.join("tests/logs"),
        repo.join("tests/logs/corpus"),
    ] {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        paths.extend(
            entries
                .map(|e| e.unwrap().path())
                .filter(|p| p.extension().is_some_and(|x| x == "log")),
        );
    }
    paths.sort();
    paths.iter().map(|p| std::fs::read(p).unwrap()).collect()
}

/// A reader that hands out its bytes in the chunk sizes it is given, in turn.
struct Chunks<'a> {
    data: &'a [u8],
    at: usize,
    sizes: Vec<usize>,
    turn: usize,
}

impl Read for Chunks<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let size = self.sizes[self.turn % self.sizes.len()];
        self.turn += 1;
        let n = size.min(buf.len()).min(self.data.len() - self.at);
        buf[..n].copy_from_slice(&self.data[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

fn split_lines(log: &[u8]) -> Vec<Vec<u8>> {
    log.split_inclusive(|b| *b == b'\n')
        .map(<[u8]>::to_vec)
        .collect()
}

#[test]
fn fuzz_nccl_log_lines_with_seeded_mutations_of_real_logs() {
    let seeds = seed_logs();
    assert!(seeds.len() >= 20, "only {} seed logs", seeds.len());
    let mut state = crate::test_facts::fuzz_seed(0x10c5_eed5_0f0a_11ce);
    let mut next = move |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n.max(1) as u64) as usize
    };
    let (mut judged, mut nothing) = (0, 0);
    for _ in 0..crate::test_facts::fuzz_iterations(300) {
        let mut lines = split_lines(&seeds[next(seeds.len())]);
        for _ in 0..=next(8) {
            if lines.is_empty() {
                lines.push(b"\n".to_vec());
            }
            let i = next(lines.len());
            match next(10) {
                0 if !lines[i].is_empty() => {
                    let at = next(lines[i].len());
                    lines[i][at] = next(256) as u8;
                }
                1 => {
                    let at = next(lines[i].len() + 1);
                    let token = TOKENS[next(TOKENS.len())];
                    lines[i].splice(at..at, token.iter().copied());
                }
                2 => {
                    let keep = next(lines[i].len() + 1);
                    lines[i].truncate(keep);
                }
                3 => {
                    let copies = vec![lines[i].clone(); 1 + next(300)];
                    lines.splice(i..i, copies);
                }
                4 => {
                    let other = split_lines(&seeds[next(seeds.len())]);
                    if !other.is_empty() {
                        let line = other[next(other.len())].clone();
                        let at = next(lines[i].len() + 1);
                        // Mid-line: two processes' output interleaved on one line.
                        lines[i].splice(at..at, line);
                    }
                }
                5 => {
                    lines.remove(i);
                }
                6 => {
                    // Every number on the line becomes a huge one.
                    let text = String::from_utf8_lossy(&lines[i]).into_owned();
                    let huge: String = text
                        .split(|c: char| c.is_ascii_digit())
                        .collect::<Vec<_>>()
                        .join("99999999999999999999");
                    lines[i] = huge.into_bytes();
                }
                7 => {
                    for line in &mut lines {
                        if line.ends_with(b"\n") && !line.ends_with(b"\r\n") {
                            line.insert(line.len() - 1, b'\r');
                        }
                    }
                }
                8 => {
                    // Past the line limit, where the rest of the line is skipped.
                    let body = lines[i].clone();
                    let times = 1 + super::MAX_LINE / body.len().max(1);
                    lines[i] = body.repeat(times.min(1 << 17));
                }
                _ => {
                    let j = next(lines.len());
                    lines.swap(i, j);
                }
            }
        }
        let log: Vec<u8> = lines.concat();
        let whole = super::explain(&log[..], "fuzz").unwrap();
        let sizes = (0..32).map(|_| 1 + next(4096)).collect();
        let chunked = super::explain(
            Chunks {
                data: &log,
                at: 0,
                sizes,
                turn: 0,
            },
            "fuzz",
        )
        .unwrap();
        let (a, b) = (
            serde_json::to_value(&whole).unwrap(),
            serde_json::to_value(&chunked).unwrap(),
        );
        assert!(
            a == b,
            "the result depends on read boundaries for {:?}",
            String::from_utf8_lossy(&log[..log.len().min(2000)])
        );
        let s = &whole.summary;
        // nccl_lines counts records, and two processes' output on one line is two
        // (see line::for_each_record): only the per-line counts are bounded by lines.
        assert!(
            s.lines >= s.truncated_lines && s.lines >= s.non_utf8_lines,
            "lines {} truncated {} non-UTF-8 {}",
            s.lines,
            s.truncated_lines,
            s.non_utf8_lines
        );
        match whole.nothing_to_judge() {
            Some(why) => {
                nothing += 1;
                assert!(!why.is_empty());
            }
            None => judged += 1,
        }
    }
    // Most mutants still hold NCCL lines: the parser was exercised, not only refused.
    assert!(
        judged > nothing,
        "judged {judged}, nothing to judge {nothing}"
    );
}
