//! A RAS STATUS reply, parsed: the JSON of NCCL 2.28.7+ (`SET FORMAT json`) and the text
//! of every version since 2.24, into one model. The formats are those written by
//! NVIDIA/nccl src/ras/client_support.cc (jsonWriteRankData, jsonWriteMissingRank,
//! rasClientRunComms' `rasOutAppend` lines) at v2.24.3-1 through v2.30.7-1. Parsing is
//! pure: the replies in tests/data/ras are fed to it as literals.

use super::version::Version;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt;

/// One rank or process as RAS names it; what a reply leaves out is `None`.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Member {
    pub rank: Option<u32>,
    pub host: Option<String>,
    pub pid: Option<i64>,
    /// NVML's device index (unique on a node; `cuda_dev` repeats under CUDA_VISIBLE_DEVICES).
    pub gpu: Option<i64>,
    /// The pod whose address `host` is, where the pod's /etc/hosts says (pods.rs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
}

impl fmt::Display for Member {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut what = String::new();
        if let Some(p) = self.pid {
            what.push_str(&format!("pid {p}"));
        }
        if let Some(h) = &self.host {
            what.push_str(if what.is_empty() { "on " } else { " on " });
            if let Some(pod) = &self.pod {
                what.push_str(&format!("pod {pod} at "));
            }
            what.push_str(h);
        }
        if let Some(g) = self.gpu {
            what.push_str(if what.is_empty() { "" } else { ", " });
            what.push_str(&format!("GPU {g}"));
        }
        match (self.rank, what.is_empty()) {
            (Some(r), true) => write!(f, "rank {r}"),
            (Some(r), false) => write!(f, "rank {r} ({what})"),
            (None, _) => write!(f, "process {what}"),
        }
    }
}

/// A rank that answered, with its status and per-operation launch counts (JSON only).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RankState {
    pub member: Member,
    /// 0 initialised, 7 (ncclInProgress) initialising, anything else an init error.
    init_state: i64,
    /// What ncclCommGetAsyncError would return (ncclResult_t).
    pub async_error: i64,
    abort_flag: bool,
    finalize_called: bool,
    destroy_flag: bool,
    /// Collectives launched, by operation (`AllReduce`): launches, not completions (nccl#1730).
    pub counts: BTreeMap<String, u64>,
}

/// A rank RAS could not get the communicator's data from.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Missing {
    pub member: Member,
    /// RAS could not reach its process while collecting.
    pub unresponsive: bool,
    /// RAS gave up on its process (60 s without an answer, ras.rst "DEAD").
    pub dead: bool,
}

/// Ranks of one communicator that launched the same number of one operation.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CountGroup {
    /// `AllReduce`; `collective` on 2.24/2.25, which count all operations together.
    pub op: String,
    pub count: u64,
    /// How many ranks launched `count`.
    pub ranks: u32,
    /// The ranks RAS named (all of them in JSON; the outliers in text).
    pub members: Vec<Member>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Comm {
    /// The communicator hash as NCCL logs it, `0x74e4f22091e41071`.
    pub hash: String,
    pub size: Option<u32>,
    pub ranks: Vec<RankState>,
    pub missing: Vec<Missing>,
    /// For each operation whose counts disagree between ranks, its groups, highest first.
    pub mismatch: Vec<CountGroup>,
    /// A rank is still in ncclCommInit (init_state 7, or text status INIT).
    pub initializing: bool,
    /// Asynchronous, init and abort errors, one line each.
    pub errors: Vec<String>,
}

/// One STATUS reply.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct JobStatus {
    pub version: Option<String>,
    /// `json` or `text`.
    pub format: &'static str,
    pub comms: Vec<Comm>,
    /// Processes RAS considers dead (text `DEAD` section; JSON has it per missing rank).
    pub dead: Vec<Member>,
    /// Processes RAS could not get data from (text job-level `INCOMPLETE`).
    pub unreachable: Vec<Member>,
    /// Some communicator is initialising somewhere (text summary table `INIT`).
    pub initializing: bool,
    /// Communicators and ranks in the job: the JSON's list, or the text summary table's
    /// `Comms in group` (summed) and `Ranks in group` (the largest group's); the text
    /// lists a communicator only when something is wrong with it.
    pub communicators: u64,
    pub ranks_in_table: u64,
    /// RAS's own timeouts while collecting the reply.
    pub timeouts: u64,
    /// The JSON needed NCCL 2.28.7-2.28.9's missing comma put back.
    pub repaired: bool,
}

impl JobStatus {
    pub fn version(&self) -> Option<Version> {
        self.version.as_deref().and_then(Version::parse)
    }
}

#[derive(Debug, PartialEq, Eq)]
pub struct Malformed(pub String);

/// ncclResult_t names (src/nccl.h.in), for the async errors RAS reports.
fn nccl_result(code: i64) -> &'static str {
    match code {
        0 => "success",
        1 => "unhandled CUDA error",
        2 => "system error",
        3 => "internal error",
        4 => "invalid argument",
        5 => "invalid usage",
        6 => "remote error",
        7 => "in progress",
        _ => "unknown error",
    }
}

/// Text from the trainer's processes made safe for a terminal and a log line, at the
/// one place it enters (host names, versions, operation names).
pub fn safe(text: &str) -> String {
    crate::render::visible(text).into_owned()
}

/// `0x74e4f22091e41071` from the JSON's `"0x..."` or the text's zero-padded `%016lx`.
pub fn comm_hash_of(text: &str) -> String {
    let digits = text.trim().trim_start_matches("0x");
    match u64::from_str_radix(digits, 16) {
        Ok(v) => format!("0x{v:x}"),
        Err(_) => safe(text.trim()),
    }
}

/// Puts back a comma missing between a value that ends one line and a key that opens the
/// next: the shape of NCCL 2.28.7-2.28.9's `missing_ranks` bug (`"nvml_dev": 1` then
/// `"status": {`; client_support.cc jsonWriteMissingRank at v2.28.9-1, fixed at v2.29.2-1;
/// ray-project/ray#64928 repairs it the same way). Only used when the reply does not parse
/// as it is.
fn repair_missing_commas(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 16);
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        out.push_str(line);
        let ends_value = line.trim_end().ends_with(|c: char| {
            c.is_ascii_digit() || c == '"' || c == 'e' || c == 'l' || c == '}' || c == ']'
        });
        let next_is_key = lines
            .peek()
            .is_some_and(|n| n.trim_start().starts_with('"'));
        if ends_value && next_is_key {
            out.push(',');
        }
        out.push('\n');
    }
    out
}

/// A JSON reply (`SET FORMAT json`, then `STATUS`).
pub fn parse_json(text: &str) -> Result<JobStatus, Malformed> {
    let (value, repaired) = match serde_json::from_str::<serde_json::Value>(text) {
        Ok(v) => (v, false),
        Err(first) => match serde_json::from_str(&repair_missing_commas(text)) {
            Ok(v) => (v, true),
            Err(_) => return Err(Malformed(format!("RAS JSON reply: {first}"))),
        },
    };
    let comms = value
        .get("communicators")
        .and_then(|c| c.as_array())
        .ok_or_else(|| Malformed("RAS JSON reply: no \"communicators\" array".into()))?;
    let mut status = JobStatus {
        version: value.get("nccl_version").and_then(|v| v.as_str()).map(safe),
        format: "json",
        comms: comms.iter().map(json_comm).collect(),
        timeouts: value
            .pointer("/ras/timeouts_count")
            .and_then(|v| v.as_u64())
            .unwrap_or(0),
        repaired,
        ..JobStatus::default()
    };
    status.initializing = status.comms.iter().any(|c| c.initializing);
    status.communicators = status.comms.len() as u64;
    Ok(status)
}

fn json_member(v: &serde_json::Value) -> Member {
    let int = |k: &str| v.get(k).and_then(|x| x.as_i64());
    Member {
        rank: int("rank").and_then(|r| u32::try_from(r).ok()),
        host: v.get("host").and_then(|h| h.as_str()).map(safe),
        pid: int("pid").filter(|p| *p >= 0),
        gpu: int("nvml_dev").or(int("cuda_dev")).filter(|g| *g >= 0),
        pod: None,
    }
}

fn json_rank(v: &serde_json::Value) -> RankState {
    let status = |k: &str| v.get("status").and_then(|s| s.get(k));
    let flag = |k: &str| status(k).and_then(|x| x.as_bool()).unwrap_or(false);
    RankState {
        member: json_member(v),
        init_state: status("init_state").and_then(|x| x.as_i64()).unwrap_or(0),
        async_error: status("async_error").and_then(|x| x.as_i64()).unwrap_or(0),
        abort_flag: flag("abort_flag"),
        finalize_called: flag("finalize_called"),
        destroy_flag: flag("destroy_flag"),
        counts: v
            .get("collective_counts")
            .and_then(|c| c.as_object())
            .map(|o| {
                o.iter()
                    .filter_map(|(k, n)| Some((safe(k), n.as_u64()?)))
                    .collect()
            })
            .unwrap_or_default(),
    }
}

fn json_comm(v: &serde_json::Value) -> Comm {
    let list = |k: &str| {
        v.get(k)
            .and_then(|x| x.as_array())
            .cloned()
            .unwrap_or_default()
    };
    let ranks: Vec<RankState> = list("ranks").iter().map(json_rank).collect();
    let missing = list("missing_ranks")
        .iter()
        .map(|m| {
            let s = |k: &str| {
                m.get("status")
                    .and_then(|s| s.get(k))
                    .and_then(|x| x.as_bool())
                    .unwrap_or(false)
            };
            Missing {
                member: json_member(m),
                unresponsive: s("unresponsive"),
                dead: s("considered_dead"),
            }
        })
        .collect();
    let errors = ranks.iter().filter_map(rank_error).collect();
    Comm {
        hash: comm_hash_of(v.get("hash").and_then(|h| h.as_str()).unwrap_or("")),
        size: v
            .get("size")
            .and_then(|s| s.as_u64())
            .and_then(|s| u32::try_from(s).ok()),
        initializing: ranks.iter().any(|r| r.init_state == 7),
        mismatch: mismatch_of(&ranks),
        ranks,
        missing,
        errors,
    }
}

/// What is wrong with a rank that answered, if anything.
fn rank_error(r: &RankState) -> Option<String> {
    let mut why = Vec::new();
    if r.async_error != 0 && r.async_error != 7 {
        why.push(format!(
            "asynchronous error {} ({})",
            r.async_error,
            nccl_result(r.async_error)
        ));
    }
    if r.init_state != 0 && r.init_state != 7 {
        why.push(format!(
            "initialisation failed with {} ({})",
            r.init_state,
            nccl_result(r.init_state)
        ));
    }
    if r.abort_flag {
        why.push("communicator aborted (abort flag set)".into());
    }
    (!why.is_empty()).then(|| format!("{}: {}", r.member, why.join(", ")))
}

/// For each operation whose counts differ between ranks, the ranks grouped by count,
/// highest count first.
fn mismatch_of(ranks: &[RankState]) -> Vec<CountGroup> {
    let ops: std::collections::BTreeSet<&String> =
        ranks.iter().flat_map(|r| r.counts.keys()).collect();
    let mut out = Vec::new();
    for op in ops {
        let mut by_count: BTreeMap<u64, Vec<Member>> = BTreeMap::new();
        for r in ranks {
            let n = r.counts.get(op).copied().unwrap_or(0);
            by_count.entry(n).or_default().push(r.member.clone());
        }
        if by_count.len() < 2 {
            continue;
        }
        for (count, members) in by_count.into_iter().rev() {
            out.push(CountGroup {
                op: op.clone(),
                count,
                ranks: u32::try_from(members.len()).unwrap_or(u32::MAX),
                members,
            });
        }
    }
    out
}

pub use super::reply_text::parse_text;

#[cfg(test)]
mod tests {
    use super::*;

    const HEALTHY: &str = include_str!("../../../tests/data/ras/2.28.9/healthy.json");
    const STOPPED: &str = include_str!("../../../tests/data/ras/2.28.9/stopped-dead.json");

    #[test]
    fn a_healthy_reply_has_every_rank_and_no_mismatch() {
        let s = parse_json(HEALTHY).unwrap();
        assert_eq!(s.version.as_deref(), Some("2.28.9"));
        assert!(!s.repaired);
        assert_eq!(s.comms.len(), 1);
        let c = &s.comms[0];
        assert_eq!((c.hash.as_str(), c.size), ("0x74e4f22091e41071", Some(2)));
        assert_eq!(c.ranks.len(), 2);
        assert_eq!(c.ranks[1].counts["AllReduce"], 235);
        assert_eq!(
            c.ranks[1].member.to_string(),
            "rank 1 (pid 637 on 192.0.2.2, GPU 1)"
        );
        assert!(c.mismatch.is_empty() && c.missing.is_empty() && c.errors.is_empty());
    }

    /// NCCL 2.28.9's reply with a missing rank is not JSON (no comma after nvml_dev).
    #[test]
    fn the_2_28_9_missing_ranks_reply_is_repaired_and_names_the_dead_rank() {
        assert!(serde_json::from_str::<serde_json::Value>(STOPPED).is_err());
        let s = parse_json(STOPPED).unwrap();
        assert!(s.repaired);
        let m = &s.comms[0].missing;
        assert_eq!(m.len(), 1);
        assert_eq!((m[0].unresponsive, m[0].dead), (true, true));
        assert_eq!(m[0].member.pid, Some(637));
    }

    #[test]
    fn counts_that_disagree_group_the_ranks_and_errors_are_named() {
        let text = HEALTHY
            .replacen("\"AllReduce\": 235", "\"AllReduce\": 240", 1)
            .replacen("\"async_error\": 0", "\"async_error\": 6", 1)
            .replacen("\"abort_flag\": false", "\"abort_flag\": true", 1);
        let c = &parse_json(&text).unwrap().comms[0];
        assert_eq!(c.mismatch.len(), 2);
        assert_eq!((c.mismatch[0].count, c.mismatch[1].count), (240, 235));
        assert_eq!(c.mismatch[1].members[0].rank, Some(1));
        assert_eq!(
            c.errors,
            vec![
                "rank 0 (pid 636 on 192.0.2.2, GPU 0): asynchronous error 6 (remote error), communicator aborted (abort flag set)"
            ]
        );
    }

    #[test]
    fn malformed_and_cut_replies_are_errors_not_panics() {
        for bad in [
            "",
            "{",
            "[]",
            "{\"communicators\": 3}",
            &HEALTHY[..HEALTHY.len() / 2],
        ] {
            assert!(parse_json(bad).is_err(), "{bad:?}");
        }
        // A seeded fuzz: byte flips and cuts never panic.
        let mut state = crate::test_facts::fuzz_seed(0x7a5);
        for _ in 0..crate::test_facts::fuzz_iterations(500) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let mut bytes = STOPPED.as_bytes().to_vec();
            let at = (state as usize) % bytes.len();
            bytes[at] = (state >> 32) as u8;
            bytes.truncate(bytes.len() - (state as usize >> 8) % 64);
            let text = String::from_utf8_lossy(&bytes);
            let _ = parse_json(&text);
            let _ = parse_text(&text);
        }
    }
}
