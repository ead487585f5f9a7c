//! A RAS STATUS reply, parsed: the JSON of NCCL 2.28.7+ (`SET FORMAT json`) and the text
//! of every version since 2.24, into one model. The formats are those written by
//! NVIDIA/nccl src/ras/client_support.cc (jsonWriteHeader, jsonStartCommunicator,
//! jsonWriteRankData, jsonWriteMissingRank, jsonWriteFooter; rasClientRunComms'
//! `rasOutAppend` lines) at v2.24.3-1 through v2.30.7-1.
//!
//! The JSON is streamed into the model as it is read, never held whole: a rank record
//! becomes a [`RankState`] of a few dozen bytes and its launch counts an index into the
//! communicator's distinct count vectors ([`Group`]), so a reply of 16,384 ranks keeps a
//! fraction of its own size (docs/job-watch.md, "Bounded at any job size"). What each
//! field means, from the source: `collective_counts` are `comm->seqNumber[op]`, bumped in
//! ncclProfilerStartTaskEvents (src/plugin/profiler.cc) when a kernel plan's collectives
//! are launched, for the five NCCL_NUM_FUNCTIONS (Broadcast, Reduce, AllGather,
//! ReduceScatter, AllReduce; not Send/Recv, not graph-captured plans): launches, not
//! completions (nccl#1730). `status` is the rank's ncclComm state (initState,
//! asyncError, finalizeCalled, destroyFlag, abortFlag); `missing_ranks` are ranks whose
//! process did not send the communicator's data (`unresponsive`: RAS could not reach the
//! process; `considered_dead`: rasPeerIsDead, 60 s without an answer).

use super::version::Version;
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::fmt;
use std::io::BufRead;

/// Members named per group and errors per communicator; the rest are counted.
pub const NAMED: usize = 16;

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

impl Member {
    /// The process behind the rank: the same in every communicator it belongs to.
    pub fn process(&self) -> (Option<&str>, Option<i64>) {
        (self.host.as_deref(), self.pid)
    }
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

/// A rank that answered (JSON only): its status and which [`Group`] its counts are.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RankState {
    pub member: Member,
    /// 0 initialised, 7 (ncclInProgress) initialising, anything else an init error.
    pub init_state: i64,
    /// What ncclCommGetAsyncError would return (ncclResult_t).
    pub async_error: i64,
    abort_flag: bool,
    /// ncclCommFinalize was called, or ncclCommDestroy/Abort began (`destroy_flag`).
    pub finalized: bool,
    /// Index into the communicator's `groups`.
    pub group: u32,
}

/// Ranks of one communicator with the same launch counts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Group {
    /// Collectives launched, per operation of the communicator's `ops` (0 past the end).
    pub counts: Vec<u64>,
    /// How many ranks have these counts.
    pub ranks: u32,
    /// The first `NAMED` of them (in text: the ranks RAS named).
    pub members: Vec<Member>,
}

impl Group {
    pub fn count(&self, op: usize) -> u64 {
        self.counts.get(op).copied().unwrap_or(0)
    }
}

/// A rank RAS could not get the communicator's data from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Missing {
    pub member: Member,
    /// RAS could not reach its process while collecting.
    pub unresponsive: bool,
    /// RAS gave up on its process (60 s without an answer, ras.rst "DEAD").
    pub dead: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Comm {
    /// The communicator hash as NCCL logs it, `0x74e4f22091e41071`.
    pub hash: String,
    pub size: Option<u32>,
    /// The operations counted (`AllReduce`, ...; `collective` on 2.24/2.25's text).
    pub ops: Vec<String>,
    /// The distinct launch counts: one group when every rank agrees.
    pub groups: Vec<Group>,
    /// Every rank that answered (JSON only).
    pub ranks: Vec<RankState>,
    pub missing: Vec<Missing>,
    /// A rank is still in ncclCommInit (init_state 7, or text status INIT).
    pub initializing: bool,
    /// Ranks that finalized or destroyed the communicator (`NAMED` at most, `finalized_more`).
    pub finalized: Vec<Member>,
    pub finalized_more: u32,
    /// Asynchronous, init and abort errors, one line each (`NAMED` at most, `errors_more`).
    pub errors: Vec<RankError>,
    pub errors_more: u32,
}

impl Comm {
    /// Ranks whose counts disagree: more than one group.
    pub fn disagrees(&self) -> bool {
        self.groups.len() > 1
    }

    /// The group of `m`'s process in this communicator, if RAS named it.
    pub fn group_of(&self, m: &Member) -> Option<&Group> {
        let key = m.process();
        if let Some(r) = self.ranks.iter().find(|r| r.member.process() == key) {
            return self.groups.get(r.group as usize);
        }
        self.groups
            .iter()
            .find(|g| g.members.iter().any(|n| n.process() == key))
    }
}

/// An error a rank reported, with its ncclResult_t.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RankError {
    pub member: Member,
    /// The ncclResult_t (0 when only the abort flag or a text line says so).
    pub code: i64,
    /// What RAS says (`asynchronous error 6 (remote error)`).
    pub what: String,
}

impl fmt::Display for RankError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.member, self.what)
    }
}

/// One STATUS reply.
#[derive(Clone, Debug, Default, PartialEq)]
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
    /// Seconds RAS took to collect the reply from its peers (JSON `collection_time_sec`).
    pub collection_secs: Option<f64>,
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
pub fn nccl_result(code: i64) -> &'static str {
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

/// The longest line the JSON reader takes: NCCL writes one short field a line.
const MAX_JSON_LINE: usize = 64 * 1024;

/// Puts back a comma missing between a value that ends one line and a key that opens
/// the next, while the reply streams through: the shape of NCCL 2.28.7-2.28.9's
/// `missing_ranks` bug (`"nvml_dev": 1` then `"status": {`; client_support.cc
/// jsonWriteMissingRank at v2.28.9-1, fixed at v2.29.2-1; ray-project/ray#64928 repairs
/// it the same way). Valid JSON never has that shape (a value followed by a key needs a
/// comma, and a string cannot hold a raw line feed), so the repair changes nothing else.
/// Reads whole lines from `inner` (buffered), one at a time, at most `MAX_JSON_LINE`.
struct CommaRepair<R> {
    inner: R,
    /// The line being handed out, and how far.
    line: Vec<u8>,
    at: usize,
    /// The next line, read ahead to see whether it opens with a key.
    next: Vec<u8>,
    eof: bool,
    repaired: bool,
}

impl<R: BufRead> CommaRepair<R> {
    fn new(inner: R) -> Self {
        CommaRepair {
            inner,
            line: Vec::new(),
            at: 0,
            next: Vec::new(),
            eof: false,
            repaired: false,
        }
    }

    fn read_line(&mut self, into: &mut Vec<u8>) -> std::io::Result<()> {
        into.clear();
        let n = std::io::Read::take(&mut self.inner, MAX_JSON_LINE as u64 + 1)
            .read_until(b'\n', into)?;
        if n == 0 {
            self.eof = true;
        } else if n > MAX_JSON_LINE {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("RAS JSON reply: a line over {} KiB", MAX_JSON_LINE >> 10),
            ));
        }
        Ok(())
    }

    /// Moves the read-ahead line into `line`, with the comma where it is missing.
    fn advance(&mut self) -> std::io::Result<()> {
        if self.next.is_empty() && !self.eof {
            let mut first = Vec::new();
            self.read_line(&mut first)?;
            self.next = first;
        }
        std::mem::swap(&mut self.line, &mut self.next);
        self.at = 0;
        let mut next = std::mem::take(&mut self.next);
        if !self.eof {
            self.read_line(&mut next)?;
        }
        self.next = next;
        let body = self.line.trim_ascii_end();
        let ends_value = body
            .last()
            .is_some_and(|c| c.is_ascii_digit() || b"\"el}]".contains(c));
        let next_is_key = self.next.trim_ascii_start().first() == Some(&b'"');
        if ends_value && next_is_key && self.line.last() == Some(&b'\n') {
            self.line.pop();
            self.line.extend_from_slice(b",\n");
            self.repaired = true;
        }
        Ok(())
    }
}

impl<R: BufRead> std::io::Read for CommaRepair<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.at >= self.line.len() {
            if self.eof && self.next.is_empty() {
                return Ok(0);
            }
            self.advance()?;
        }
        let n = buf.len().min(self.line.len() - self.at);
        buf[..n].copy_from_slice(&self.line[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// A JSON reply held in memory (tests, recorded replies).
#[cfg(test)]
pub fn parse_json(text: &str) -> Result<JobStatus, Malformed> {
    parse_json_from(text.as_bytes())
}

/// A JSON reply (`SET FORMAT json`, then `STATUS`), read and parsed as it streams: the
/// document ends at its closing brace, whether or not NCCL has closed the connection.
pub fn parse_json_from(reader: impl BufRead) -> Result<JobStatus, Malformed> {
    let mut repair = CommaRepair::new(reader);
    let parsed = {
        let mut de = serde_json::Deserializer::from_reader(std::io::BufReader::new(&mut repair));
        ReplySeed.deserialize(&mut de)
    };
    match parsed {
        Ok(mut status) => {
            status.repaired = repair.repaired;
            status.initializing = status.comms.iter().any(|c| c.initializing);
            status.communicators = status.comms.len() as u64;
            Ok(status)
        }
        Err(e) if e.is_io() => Err(Malformed(e.to_string())),
        Err(e) => Err(Malformed(format!("RAS JSON reply: {e}"))),
    }
}

/// The reply's top level: `nccl_version`, `communicators`, `ras`; the rest skipped.
struct ReplySeed;

impl<'de> DeserializeSeed<'de> for ReplySeed {
    type Value = JobStatus;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<JobStatus, D::Error> {
        d.deserialize_map(self)
    }
}

#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "snake_case")]
enum TopKey {
    NcclVersion,
    Communicators,
    Ras,
    #[serde(other)]
    Other,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RasFooter {
    collection_time_sec: Option<f64>,
    timeouts_count: u64,
}

impl<'de> Visitor<'de> for ReplySeed {
    type Value = JobStatus;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a RAS status object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<JobStatus, A::Error> {
        let mut status = JobStatus {
            format: "json",
            ..JobStatus::default()
        };
        let mut saw_comms = false;
        while let Some(key) = map.next_key::<TopKey>()? {
            match key {
                TopKey::NcclVersion => {
                    status.version = map.next_value::<Option<String>>()?.map(|v| safe(&v));
                }
                TopKey::Communicators => {
                    saw_comms = true;
                    map.next_value_seed(CommsSeed(&mut status.comms))?;
                }
                TopKey::Ras => {
                    let footer: RasFooter = map.next_value()?;
                    status.timeouts = footer.timeouts_count;
                    status.collection_secs = footer.collection_time_sec;
                }
                TopKey::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        if !saw_comms {
            return Err(serde::de::Error::custom("no \"communicators\" array"));
        }
        Ok(status)
    }
}

struct CommsSeed<'a>(&'a mut Vec<Comm>);

impl<'de> DeserializeSeed<'de> for CommsSeed<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for CommsSeed<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of communicators")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(comm) = seq.next_element_seed(CommSeed)? {
            self.0.push(comm);
        }
        Ok(())
    }
}

struct CommSeed;

#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "snake_case")]
enum CommKey {
    Hash,
    Size,
    Ranks,
    MissingRanks,
    #[serde(other)]
    Other,
}

impl<'de> DeserializeSeed<'de> for CommSeed {
    type Value = Comm;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Comm, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for CommSeed {
    type Value = Comm;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a communicator object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Comm, A::Error> {
        let mut comm = Comm::default();
        while let Some(key) = map.next_key::<CommKey>()? {
            match key {
                CommKey::Hash => {
                    let hash: Option<String> = map.next_value()?;
                    comm.hash = comm_hash_of(hash.as_deref().unwrap_or(""));
                }
                CommKey::Size => {
                    let size: Option<i64> = map.next_value()?;
                    comm.size = size.and_then(|s| u32::try_from(s).ok());
                }
                CommKey::Ranks => map.next_value_seed(RanksSeed {
                    comm: &mut comm,
                    by_counts: HashMap::new(),
                })?,
                CommKey::MissingRanks => {
                    let missing: Vec<RawMissing> = map.next_value()?;
                    comm.missing = missing.into_iter().map(RawMissing::into_missing).collect();
                }
                CommKey::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(comm)
    }
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RawIdentity {
    rank: Option<i64>,
    host: Option<String>,
    pid: Option<i64>,
    cuda_dev: Option<i64>,
    nvml_dev: Option<i64>,
}

impl RawIdentity {
    fn member(self) -> Member {
        Member {
            rank: self.rank.and_then(|r| u32::try_from(r).ok()),
            // jsonWriteRankData prints "unknown" and -1 where rasPeers has no entry.
            host: self.host.filter(|h| h != "unknown").map(|h| safe(&h)),
            pid: self.pid.filter(|p| *p >= 0),
            gpu: self.nvml_dev.or(self.cuda_dev).filter(|g| *g >= 0),
            pod: None,
        }
    }
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RawMissing {
    #[serde(flatten)]
    id: RawIdentity,
    status: RawMissingStatus,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RawMissingStatus {
    unresponsive: bool,
    considered_dead: bool,
}

impl RawMissing {
    fn into_missing(self) -> Missing {
        Missing {
            member: self.id.member(),
            unresponsive: self.status.unresponsive,
            dead: self.status.considered_dead,
        }
    }
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RawStatus {
    init_state: i64,
    async_error: i64,
    finalize_called: bool,
    destroy_flag: bool,
    abort_flag: bool,
}

/// A communicator's `ranks` list, each rank folded into the communicator as it comes.
struct RanksSeed<'a> {
    comm: &'a mut Comm,
    /// Count vector -> index into `comm.groups`.
    by_counts: HashMap<Vec<u64>, u32>,
}

impl<'de> DeserializeSeed<'de> for RanksSeed<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for RanksSeed<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of ranks")
    }
    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        while let Some((id, status, counts)) = seq.next_element_seed(RankSeed {
            ops: &mut self.comm.ops,
        })? {
            self.add(id.member(), &status, counts);
        }
        Ok(())
    }
}

impl RanksSeed<'_> {
    fn add(&mut self, member: Member, s: &RawStatus, mut counts: Vec<u64>) {
        let c = &mut *self.comm;
        while counts.last() == Some(&0) {
            counts.pop();
        }
        let next = u32::try_from(c.groups.len()).unwrap_or(u32::MAX);
        let group = *self.by_counts.entry(counts.clone()).or_insert(next);
        if group == next {
            c.groups.push(Group {
                counts,
                ..Group::default()
            });
        }
        if let Some(g) = c.groups.get_mut(group as usize) {
            g.ranks += 1;
            if g.members.len() < NAMED {
                g.members.push(member.clone());
            }
        }
        let rank = RankState {
            member,
            init_state: s.init_state,
            async_error: s.async_error,
            abort_flag: s.abort_flag,
            finalized: s.finalize_called || s.destroy_flag,
            group,
        };
        c.initializing |= rank.init_state == 7;
        if rank.finalized {
            push_capped(&mut c.finalized, &mut c.finalized_more, rank.member.clone());
        }
        if let Some(e) = rank_error(&rank) {
            push_capped(&mut c.errors, &mut c.errors_more, e);
        }
        c.ranks.push(rank);
    }
}

/// Keeps the first `NAMED` and counts the rest.
pub fn push_capped<T>(list: &mut Vec<T>, more: &mut u32, item: T) {
    if list.len() < NAMED {
        list.push(item);
    } else {
        *more = more.saturating_add(1);
    }
}

/// One rank record: identity, status, and its counts aligned with `ops`.
struct RankSeed<'a> {
    ops: &'a mut Vec<String>,
}

#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "snake_case")]
enum RankKey {
    Rank,
    Host,
    Pid,
    CudaDev,
    NvmlDev,
    Status,
    CollectiveCounts,
    #[serde(other)]
    Other,
}

impl<'de> DeserializeSeed<'de> for RankSeed<'_> {
    type Value = (RawIdentity, RawStatus, Vec<u64>);
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for RankSeed<'_> {
    type Value = (RawIdentity, RawStatus, Vec<u64>);
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a rank object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let (mut id, mut status, mut counts) = (RawIdentity::default(), None, Vec::new());
        while let Some(key) = map.next_key::<RankKey>()? {
            match key {
                RankKey::Rank => id.rank = map.next_value()?,
                RankKey::Host => id.host = map.next_value()?,
                RankKey::Pid => id.pid = map.next_value()?,
                RankKey::CudaDev => id.cuda_dev = map.next_value()?,
                RankKey::NvmlDev => id.nvml_dev = map.next_value()?,
                RankKey::Status => status = Some(map.next_value()?),
                RankKey::CollectiveCounts => {
                    counts = map.next_value_seed(CountsSeed {
                        ops: &mut *self.ops,
                    })?;
                }
                RankKey::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok((id, status.unwrap_or_default(), counts))
    }
}

/// The most operation names a communicator may carry: NCCL has five.
const MAX_OPS: usize = 32;

/// `collective_counts`: each operation's count at its index in `ops` (new names added).
struct CountsSeed<'a> {
    ops: &'a mut Vec<String>,
}

impl<'de> DeserializeSeed<'de> for CountsSeed<'_> {
    type Value = Vec<u64>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Vec<u64>, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for CountsSeed<'_> {
    type Value = Vec<u64>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("operation counts")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Vec<u64>, A::Error> {
        let mut counts = vec![0; self.ops.len()];
        while let Some(op) = map.next_key::<String>()? {
            let n: Option<u64> = map.next_value()?;
            let at = match self.ops.iter().position(|o| *o == op) {
                Some(at) => at,
                None if self.ops.len() < MAX_OPS => {
                    self.ops.push(safe(&op));
                    self.ops.len() - 1
                }
                None => continue,
            };
            if counts.len() <= at {
                counts.resize(at + 1, 0);
            }
            counts[at] = n.unwrap_or(0);
        }
        Ok(counts)
    }
}

/// What is wrong with a rank that answered, if anything.
fn rank_error(r: &RankState) -> Option<RankError> {
    let mut why = Vec::new();
    let mut code = 0;
    if r.async_error != 0 && r.async_error != 7 {
        code = r.async_error;
        why.push(format!(
            "asynchronous error {} ({})",
            r.async_error,
            nccl_result(r.async_error)
        ));
    }
    if r.init_state != 0 && r.init_state != 7 {
        code = if code == 0 { r.init_state } else { code };
        why.push(format!(
            "initialisation failed with {} ({})",
            r.init_state,
            nccl_result(r.init_state)
        ));
    }
    if r.abort_flag {
        why.push("communicator aborted (abort flag set)".into());
    }
    (!why.is_empty()).then(|| RankError {
        what: why.join(", "),
        member: r.member.clone(),
        code,
    })
}

#[cfg(test)]
pub use super::reply_text::parse_text;
pub use super::reply_text::parse_text_from;

#[cfg(test)]
mod tests {
    use super::*;

    const HEALTHY: &str = include_str!("../../../tests/data/ras/2.28.9/healthy.json");
    const STOPPED: &str = include_str!("../../../tests/data/ras/2.28.9/stopped-dead.json");

    fn allreduce(c: &Comm, g: usize) -> u64 {
        let op = c.ops.iter().position(|o| o == "AllReduce").unwrap();
        c.groups[g].count(op)
    }

    #[test]
    fn a_healthy_reply_has_every_rank_in_one_group() {
        let s = parse_json(HEALTHY).unwrap();
        assert_eq!(s.version.as_deref(), Some("2.28.9"));
        assert!(!s.repaired);
        assert_eq!(s.comms.len(), 1);
        let c = &s.comms[0];
        assert_eq!((c.hash.as_str(), c.size), ("0x74e4f22091e41071", Some(2)));
        assert_eq!(c.ranks.len(), 2);
        assert_eq!(
            c.ops,
            [
                "Broadcast",
                "Reduce",
                "AllGather",
                "ReduceScatter",
                "AllReduce"
            ]
        );
        assert_eq!((c.groups.len(), c.groups[0].ranks), (1, 2));
        assert_eq!(allreduce(c, 0), 235);
        assert_eq!(
            c.ranks[1].member.to_string(),
            "rank 1 (pid 637 on 192.0.2.2, GPU 1)"
        );
        assert!(!c.disagrees() && c.missing.is_empty() && c.errors.is_empty());
        assert_eq!((s.timeouts, s.collection_secs), (0, Some(0.0)));
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
        // Valid JSON goes through the repair untouched.
        assert!(!parse_json(HEALTHY).unwrap().repaired);
    }

    #[test]
    fn counts_that_disagree_group_the_ranks_and_errors_are_named() {
        let text = HEALTHY
            .replacen("\"AllReduce\": 235", "\"AllReduce\": 240", 1)
            .replacen("\"async_error\": 0", "\"async_error\": 6", 1)
            .replacen("\"abort_flag\": false", "\"abort_flag\": true", 1)
            .replacen("\"destroy_flag\": false", "\"destroy_flag\": true", 2);
        let c = &parse_json(&text).unwrap().comms[0];
        assert_eq!(c.groups.len(), 2);
        assert_eq!((allreduce(c, 0), allreduce(c, 1)), (240, 235));
        assert_eq!(c.groups[1].members[0].rank, Some(1));
        assert_eq!(c.group_of(&c.ranks[1].member), Some(&c.groups[1]));
        assert_eq!(c.errors.len(), 1);
        assert_eq!(
            (c.errors[0].to_string(), c.errors[0].code),
            (
                "rank 0 (pid 636 on 192.0.2.2, GPU 0): asynchronous error 6 (remote error), communicator aborted (abort flag set)".to_string(),
                6
            )
        );
        assert_eq!(c.finalized.len(), 2);
    }

    /// A rank whose process RAS cannot place: `"host": "unknown"`, `"pid": -1`
    /// (jsonWriteRankData's defaults) are absent, not an address or a pid.
    #[test]
    fn an_unknown_host_and_pid_are_absent() {
        let text = HEALTHY
            .replacen("\"host\": \"192.0.2.2\"", "\"host\": \"unknown\"", 1)
            .replacen("\"pid\": 636", "\"pid\": -1", 1);
        let c = &parse_json(&text).unwrap().comms[0];
        assert_eq!(c.ranks[0].member.to_string(), "rank 0 (GPU 0)");
    }

    #[test]
    fn malformed_and_cut_replies_are_errors_not_panics() {
        for bad in [
            "",
            "{",
            "[]",
            "{\"communicators\": 3}",
            "{\"nccl_version\": \"2.28.9\"}",
            &HEALTHY[..HEALTHY.len() / 2],
        ] {
            assert!(parse_json(bad).is_err(), "{bad:?}");
        }
        let long = format!("{{\"x\": \"{}\"}}", "a".repeat(MAX_JSON_LINE + 1));
        assert!(
            parse_json(&long)
                .unwrap_err()
                .0
                .contains("a line over 64 KiB")
        );
        // A seeded fuzz: byte flips and cuts never panic, and chunked reads agree.
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
            let whole = parse_json(&text);
            let chunked = parse_json_from(std::io::BufReader::with_capacity(
                1 + (state as usize >> 20) % 7,
                text.as_bytes(),
            ));
            assert_eq!(whole.is_ok(), chunked.is_ok());
            let _ = parse_text(&text);
        }
    }
}
