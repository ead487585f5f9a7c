//! `LogSummary`: everything explain-log keeps from a log, built one line at a
//! time. Memory is bounded whatever the input: sets and maps are capped (what
//! did not fit is counted in `dropped`), examples are kept only for the first
//! few lines of each kind, and a communicator keeps a sample of `MAX_RANKS`
//! ranks with a count of every rank it saw (a bitmap up to `MAX_RANK_BITS`).

use super::framework::JobLines;
use super::line::{Level, NcclLine};
use super::transport;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// Caps on what one summary keeps.
const MAX_SET: usize = 256;
const MAX_COMMS: usize = 1024;
/// Ranks per communicator kept with host, pid and bus id.
pub const MAX_RANKS: usize = 64;
/// Ranks per communicator counted exactly (one bit each, 8 KiB at most).
const MAX_RANK_BITS: u32 = 65_536;
const MAX_EXAMPLES: usize = 3;
/// Longest message text kept in a set or example.
const MAX_TEXT: usize = 512;
/// Longest host name kept: Linux allows 64 bytes (HOST_NAME_MAX), Kubernetes
/// pod names 253; longer is not a host name NCCL printed.
const MAX_HOST: usize = 255;
/// Bytes of text one summary keeps in all (issue 31: caps that counted
/// entries let 60 KB host names take 1.17 GB for a 1 GB log). What does not
/// fit is counted in `dropped`.
const MAX_KEPT_BYTES: usize = 8 << 20;

fn clip(text: &str) -> String {
    clip_to(text, MAX_TEXT)
}

fn clip_to(text: &str, max: usize) -> String {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

/// Charges `bytes` to the summary's text budget; false when it is spent.
fn charge(kept: &mut usize, bytes: usize) -> bool {
    if *kept + bytes > MAX_KEPT_BYTES {
        return false;
    }
    *kept += bytes;
    true
}

/// One rank of a communicator.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RankInfo {
    pub host: Option<String>,
    pub pid: Option<u32>,
    /// PCI bus id of its GPU as NCCL printed it (hex, e.g. `70` or `1b000`).
    pub bus_id: Option<String>,
}

/// One communicator, keyed by commId (or by its pointer on NCCL versions without commId).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Communicator {
    pub ranks_total: Option<u32>,
    /// nNodes as NCCL counted them (hosts by hostname + boot_id).
    pub nodes: Option<u32>,
    /// Distinct ranks the log showed (exact up to 65,536 rank numbers; higher
    /// rank numbers are not counted).
    pub ranks_seen: u64,
    /// The first `MAX_RANKS` ranks seen, with where they ran.
    pub ranks: BTreeMap<u32, RankInfo>,
    #[serde(skip)]
    seen_bits: Vec<u64>,
}

impl Communicator {
    /// Marks a rank seen; true the first time.
    fn see(&mut self, rank: u32) -> bool {
        if rank >= MAX_RANK_BITS {
            return false;
        }
        let (word, bit) = ((rank / 64) as usize, rank % 64);
        if self.seen_bits.len() <= word {
            self.seen_bits.resize(word + 1, 0);
        }
        let fresh = self.seen_bits[word] & (1 << bit) == 0;
        self.seen_bits[word] |= 1 << bit;
        self.ranks_seen += u64::from(fresh);
        fresh
    }

    /// Takes in another entry for the same communicator (seen under its pointer
    /// before the line naming its commId).
    fn absorb(&mut self, other: Communicator) {
        self.ranks_total = self.ranks_total.or(other.ranks_total);
        self.nodes = self.nodes.or(other.nodes);
        for (word, bits) in other.seen_bits.iter().enumerate() {
            for bit in 0..64 {
                if bits & (1 << bit) != 0 {
                    self.see(word as u32 * 64 + bit);
                }
            }
        }
        for (rank, info) in other.ranks {
            if self.ranks.len() < MAX_RANKS || self.ranks.contains_key(&rank) {
                let mine = self.ranks.entry(rank).or_default();
                mine.host = mine.host.take().or(info.host);
                mine.pid = mine.pid.or(info.pid);
                mine.bus_id = mine.bus_id.take().or(info.bus_id);
            }
        }
    }
}

/// The last WARN's host, pid, message and entry (when it has one).
type LastWarn = (Option<String>, Option<u32>, String, Option<usize>);

/// A WARN message and how often it was seen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WarnEntry {
    pub message: String,
    pub location: Option<String>,
    pub count: u64,
    /// 1-based line number of the first occurrence.
    pub first_line: u64,
    /// The WARN the same process printed just before the first occurrence: NCCL
    /// prints the specific error first and its generic wrappers after it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
    /// The first error-return trace the same process printed after it
    /// (`transport/net_ib.cc:395`): the caller that failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace: Option<String>,
    /// Printed at NCCL 2.32's ATTN level (NCCL goes on after it).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub attn: bool,
}

impl WarnEntry {
    /// The WARN as one evidence line: `line 12 transport/shm.cc:590: message (3 lines)`.
    pub fn evidence_line(&self) -> String {
        format!(
            "line {}{}: {}{}",
            self.first_line,
            self.location
                .as_deref()
                .map(|l| format!(" {l}"))
                .unwrap_or_default(),
            self.message,
            if self.count > 1 {
                format!(" ({} lines)", self.count)
            } else {
                String::new()
            }
        )
    }
}

/// Lines of the log that back a conclusion.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Examples(pub Vec<String>);

impl Examples {
    fn keep(&mut self, line_no: u64, text: &str) {
        if self.0.len() < MAX_EXAMPLES {
            self.0.push(format!("line {line_no}: {}", clip(text)));
        }
    }
}

fn insert_capped(set: &mut BTreeSet<String>, value: &str, dropped: &mut u64, kept: &mut usize) {
    if set.contains(value) {
        return;
    }
    let value = clip(value);
    if set.len() < MAX_SET && charge(kept, value.len()) {
        set.insert(value);
    } else {
        *dropped += 1;
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Plugins {
    /// Net plugin libraries NCCL looked for and did not find.
    pub not_found: BTreeSet<String>,
    /// `NET/Plugin` lines that report a loaded plugin.
    pub loaded: BTreeSet<String>,
    /// Networks NCCL failed to initialise (`Failed to initialize NET plugin X`).
    pub failed: BTreeSet<String>,
    /// Networks NCCL initialised.
    pub initialized: BTreeSet<String>,
    /// Where NCCL loaded an external plugin from (`Plugin Path : X`, printed by
    /// Mellanox/HPC-X nccl-rdma-sharp-plugins).
    pub paths: BTreeSet<String>,
}

/// What the aws-ofi-nccl plugin (`NET/OFI` lines) said about itself.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct OfiPlugin {
    /// `aws-ofi-nccl 1.7.4-aws`, from `Initializing aws-ofi-nccl X` (1.7 on) or `Using aws-ofi-nccl X` (1.6).
    pub versions: BTreeSet<String>,
    /// Libfabric providers (`Selected Provider is efa`).
    pub providers: BTreeSet<String>,
    /// EC2 platforms (`Running on p4d.24xlarge platform`).
    pub platforms: BTreeSet<String>,
    /// The plugin set NCCL_PROTO=simple itself (`Setting NCCL_PROTO to "simple"`,
    /// 1.6-1.14; `Need to force simple protocol: ... not supported`, 1.16 on).
    pub forced_proto_simple: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct LogSummary {
    pub lines: u64,
    pub nccl_lines: u64,
    /// Lines longer than the reader's limit, read only in part.
    pub truncated_lines: u64,
    /// Lines that were not valid UTF-8 (read with replacement characters).
    pub non_utf8_lines: u64,
    /// The text encoding when it was not UTF-8 (`UTF-16LE`, `UTF-16BE`): decoded before reading.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub encoding: Option<String>,
    pub nccl_versions: BTreeSet<String>,
    pub cuda_driver_versions: BTreeSet<String>,
    pub plugins: Plugins,
    /// Networks communicators used (`Using network X`).
    pub networks: BTreeSet<String>,
    /// What NCCL's IB transport listed (`NET/IB : Using [0]mlx5_0:1/IB ...`); empty when no device.
    pub ib_devices: BTreeSet<String>,
    /// What the libfabric plugin reported (`NET/OFI ...`).
    pub ofi_lines: BTreeSet<String>,
    pub ofi: OfiPlugin,
    /// Interfaces the socket transport used.
    pub socket_interfaces: BTreeSet<String>,
    /// Variables NCCL reported `set by environment`, with every value seen.
    pub settings: BTreeMap<String, BTreeSet<String>>,
    pub communicators: BTreeMap<String, Communicator>,
    /// Connection lines per normalized transport.
    pub transport_counts: BTreeMap<String, u64>,
    /// Text a build appended after NCCL's transport names (dropped from the keys).
    pub transport_appended: BTreeSet<String>,
    /// Connections through a proxy rank (PXN).
    pub proxied_connections: u64,
    /// Intra-node path types from `Pattern ..., type X/Y` lines (e.g. `NVL/PIX`).
    pub path_types: BTreeSet<String>,
    /// The topology dump showed NVLink (`NVL` paths or links).
    pub nvlink_in_topology: bool,
    pub warnings: Vec<WarnEntry>,
    /// INFO lines that may carry a finding (GPUDirect RDMA or P2P disabled, NCCL's
    /// HINT lines), counted like WARNs; the catalog decides which do.
    pub notable_info: Vec<WarnEntry>,
    /// NCCL's error-return trace lines (`transport/net.cc:1302 -> 6`): a call failed.
    pub error_returns: u64,
    /// INFO lines: the log was written with NCCL_DEBUG=INFO (or TRACE).
    pub info_lines: u64,
    /// PyTorch, torchrun and NCCL RAS lines around NCCL's own.
    pub job: JobLines,
    /// Example lines per transport, for findings' evidence.
    #[serde(skip)]
    pub transport_examples: BTreeMap<String, Examples>,
    #[serde(skip)]
    pub setting_examples: BTreeMap<String, Examples>,
    /// Values that did not fit a capped set or map, or the text budget.
    pub dropped: u64,
    /// Bytes of text kept, against `MAX_KEPT_BYTES`.
    #[serde(skip)]
    kept: usize,
    #[serde(skip)]
    comm_by_pointer: BTreeMap<(Option<String>, Option<u32>, String), String>,
    #[serde(skip)]
    warn_index: BTreeMap<String, usize>,
    /// The last WARN: its host, pid, message and entry (when it has one).
    #[serde(skip)]
    last_warn: Option<LastWarn>,
    #[serde(skip)]
    scratch: String,
}

/// INFO lines worth matching against the catalog's INFO classes (GPUDirect RDMA
/// or P2P disabled, cuMem host memory failing, NCCL's HINT lines). Prefix tests:
/// this runs on most INFO lines of a log, and a substring search per line per
/// word cost explain-log half its speed.
fn is_notable(m: &str) -> bool {
    match m.as_bytes().first() {
        Some(b'G') => m.starts_with("GPU Direct RDMA Disabled"),
        Some(b'N') => m.starts_with("NET/") && m.contains(" : GPU Direct RDMA Disabled"),
        Some(b'P') => m.starts_with("P2P is disabled") || m.starts_with("P2P not supported"),
        Some(b'c') => m.starts_with("cuMem host allocations do not appear"),
        Some(b'H') => m.starts_with("HINT"),
        // Retries NCCL reports before giving up (`Call to connect returned
        // Connection timed out, retrying`, src/misc/socket.cc; `Call to
        // ibv_modify_qp failed with ..., retrying`, src/misc/ibvwrap.cc 2.24 on).
        Some(b'C') => m.starts_with("Call to ") && m.ends_with("retrying"),
        _ => false,
    }
}
const MAX_NOTABLE: usize = 64;

/// NCCL's error-return trace (`NCCLCHECK` in src/include/checks.h prints
/// `%s:%d -> %d`): `transport/net.cc:1302 -> 6`, `group.cc:65 -> 3 [Async thread]`.
fn is_error_return(m: &str) -> bool {
    // One byte search and two prefix tests: this runs on most INFO lines.
    let Some((at, rest)) = m.split_once(' ') else {
        return false;
    };
    let Some(rest) = rest.strip_prefix("-> ") else {
        return false;
    };
    let code = rest.split(' ').next().unwrap_or("");
    at.rsplit_once(':').is_some_and(|(f, l)| {
        f.contains('.') && !l.is_empty() && l.bytes().all(|b| b.is_ascii_digit())
    }) && code.parse::<u32>().is_ok_and(|c| c != 0)
}

/// The value after `key` in a space-separated `key value key value` message.
fn field<'a>(message: &'a str, key: &str) -> Option<&'a str> {
    let mut tokens = message.split_whitespace();
    while let Some(t) = tokens.next() {
        if t == key {
            return tokens.next();
        }
    }
    None
}

impl LogSummary {
    /// Counts a line of the log, whatever it holds.
    pub fn line(&mut self) {
        self.lines += 1;
    }

    /// Takes a bare `NCCL version X` line (no `NCCL INFO` prefix).
    pub fn bare_version(&mut self, version: &str) {
        self.nccl_lines += 1;
        if let Some(v) = version.split_whitespace().next() {
            insert_capped(
                &mut self.nccl_versions,
                v,
                &mut self.dropped,
                &mut self.kept,
            );
        }
    }

    /// Takes one NCCL line (`line_no` is 1-based).
    pub fn nccl_line(&mut self, line_no: u64, line: &NcclLine<'_>) {
        self.nccl_lines += 1;
        let m = line.message;
        if line.level != Level::Info {
            self.warn(line_no, line);
            return;
        }
        let mut scratch = std::mem::take(&mut self.scratch);
        if let Some(proxied) = transport::normalize_into(m, &mut scratch) {
            if scratch.len() > MAX_TEXT {
                scratch = clip(&scratch);
            }
            if let Some(extra) = transport::appended(m, &scratch) {
                insert_capped(
                    &mut self.transport_appended,
                    extra,
                    &mut self.dropped,
                    &mut self.kept,
                );
            }
            let fresh = !self.transport_counts.contains_key(scratch.as_str());
            // A new name costs its bytes twice (counts and examples) and three examples.
            let room = self.transport_counts.len() < MAX_SET
                && (!fresh || charge(&mut self.kept, 2 * scratch.len() + 3 * MAX_TEXT));
            match self.transport_counts.get_mut(scratch.as_str()) {
                Some(n) => *n += 1,
                None if room => {
                    self.transport_counts.insert(scratch.clone(), 1);
                }
                None => self.dropped += 1,
            }
            match self.transport_examples.get_mut(scratch.as_str()) {
                Some(examples) => examples.keep(line_no, m),
                None if room => {
                    let mut examples = Examples::default();
                    examples.keep(line_no, m);
                    self.transport_examples.insert(scratch.clone(), examples);
                }
                None => {}
            }
            self.proxied_connections += u64::from(proxied);
            self.scratch = scratch;
            return;
        }
        self.scratch = scratch;
        self.info(line_no, line);
    }

    /// Takes a line (or a record of one) that NCCL did not print.
    pub fn job_line(&mut self, line_no: u64, text: &str) {
        self.job.line(line_no, text);
        self.job.ras_row(text);
    }

    fn info(&mut self, line_no: u64, line: &NcclLine<'_>) {
        let m = line.message;
        self.info_lines += 1;
        if let Some(v) = m.strip_prefix("NCCL version ") {
            insert_capped(
                &mut self.nccl_versions,
                v.trim(),
                &mut self.dropped,
                &mut self.kept,
            );
        } else if let Some(v) = m.strip_prefix("cudaDriverVersion ") {
            insert_capped(
                &mut self.cuda_driver_versions,
                v.trim(),
                &mut self.dropped,
                &mut self.kept,
            );
        } else if let Some(rest) = m.strip_prefix("NET/Plugin") {
            self.plugin_line(rest);
        } else if let Some(path) = m.strip_prefix("Plugin Path : ") {
            insert_capped(
                &mut self.plugins.paths,
                path.trim(),
                &mut self.dropped,
                &mut self.kept,
            );
        } else if let Some(name) = m.strip_prefix("P2P plugin ") {
            // HPC-X / nccl-rdma-sharp-plugins announce their net plugin as
            // `P2P plugin IBext` (or `IBext_v8`) after `Plugin Path : ...`.
            insert_capped(
                &mut self.plugins.loaded,
                name.trim(),
                &mut self.dropped,
                &mut self.kept,
            );
        } else if let Some(net) = m.strip_prefix("Failed to initialize NET plugin ") {
            insert_capped(
                &mut self.plugins.failed,
                net.trim(),
                &mut self.dropped,
                &mut self.kept,
            );
        } else if let Some(net) = m.strip_prefix("Initialized NET plugin ") {
            insert_capped(
                &mut self.plugins.initialized,
                net.trim(),
                &mut self.dropped,
                &mut self.kept,
            );
        } else if let Some(net) = m.strip_prefix("Using network ") {
            insert_capped(
                &mut self.networks,
                net.trim(),
                &mut self.dropped,
                &mut self.kept,
            );
        } else if let Some(rest) = m
            .strip_prefix("NET/IB : Using ")
            .or_else(|| m.strip_prefix("NET/IBext : Using "))
            .or_else(|| m.strip_prefix("NET/IBext_v8 : Using "))
        {
            // The device list: `[0]mlx5_0:1/IB [1]...`; `[RO]` alone is only the relaxed-ordering flag.
            if rest.contains(":1/") || rest.contains("/IB") || rest.contains("/RoCE") {
                insert_capped(
                    &mut self.ib_devices,
                    rest.split(';').next().unwrap_or(rest).trim(),
                    &mut self.dropped,
                    &mut self.kept,
                );
            }
        } else {
            self.info_more(line_no, line);
        }
    }

    /// Settings, topology, communicators, error traces and notable lines.
    fn info_more(&mut self, line_no: u64, line: &NcclLine<'_>) {
        let m = line.message;
        if let Some(rest) = m.strip_prefix("NET/Socket : Using ") {
            insert_capped(
                &mut self.socket_interfaces,
                rest.trim(),
                &mut self.dropped,
                &mut self.kept,
            );
        } else if let Some(ofi) = m.strip_prefix("NET/OFI") {
            self.ofi_line(ofi.trim_start());
            insert_capped(&mut self.ofi_lines, m, &mut self.dropped, &mut self.kept);
        } else if let Some(at) = m
            .starts_with("NCCL_")
            .then(|| m.find(" set by environment to "))
            .flatten()
        {
            self.setting_line(line_no, m, at);
        } else if m.starts_with("Pattern ") {
            if let Some(t) = field(m, "type") {
                insert_capped(
                    &mut self.path_types,
                    t.trim_end_matches(','),
                    &mut self.dropped,
                    &mut self.kept,
                );
            }
        } else if !self.nvlink_in_topology
            && m.contains("NVL")
            && (m.contains("/NVL)") || m.contains("+ NVL["))
        {
            self.nvlink_in_topology = true;
        } else if m.starts_with("ncclCommInit") || m.starts_with("comm 0x") {
            self.communicator(line, m);
        } else if is_error_return(m) {
            self.error_returns += 1;
            self.trace(line, m);
        } else if is_notable(m) {
            self.notable(line_no, m);
        }
    }

    /// An error-return trace: the caller of the last WARN of the same process,
    /// kept on that WARN's entry (the first trace only).
    fn trace(&mut self, line: &NcclLine<'_>, m: &str) {
        let Some((host, pid, _, Some(index))) = &self.last_warn else {
            return;
        };
        let same = match line.host_pid() {
            Some((h, p)) => {
                host.as_deref() == Some(clip_to(h, MAX_HOST).as_str()) && *pid == Some(p)
            }
            None => host.is_none() && pid.is_none(),
        };
        if let Some(w) = self
            .warnings
            .get_mut(*index)
            .filter(|w| same && w.trace.is_none())
        {
            w.trace = m.split(' ').next().map(clip);
        }
    }

    /// An INFO line the catalog may turn into a finding, kept once per text.
    fn notable(&mut self, line_no: u64, m: &str) {
        let message = clip(m.trim());
        if let Some(n) = self.notable_info.iter_mut().find(|n| n.message == message) {
            n.count += 1;
        } else if self.notable_info.len() < MAX_NOTABLE && charge(&mut self.kept, message.len()) {
            self.notable_info.push(WarnEntry {
                message,
                location: None,
                count: 1,
                first_line: line_no,
                after: None,
                trace: None,
                attn: false,
            });
        } else {
            self.dropped += 1;
        }
    }

    /// `NET/Plugin...` lines: the net plugins NCCL could not find or loaded.
    fn plugin_line(&mut self, rest: &str) {
        let rest = rest.trim_start_matches([' ', ':']);
        if let Some(libs) = rest.strip_prefix("Could not find:") {
            // 2.19 on: `Could not find: libA libB. Using internal net plugin.`
            // (src/plugin/plugin_open.cc:107 at v2.28.9-1: names, then ". " and the fallback).
            let libs = libs.split(". ").next().unwrap_or(libs);
            for lib in libs.split_whitespace() {
                insert_capped(
                    &mut self.plugins.not_found,
                    lib,
                    &mut self.dropped,
                    &mut self.kept,
                );
            }
        } else if let Some(lib) = rest.strip_prefix("No plugin found (") {
            // 2.4 to 2.16: `No plugin found (libnccl-net.so), using internal
            // implementation` (src/init.cc:63 at v2.5.6-1, src/net.cc:125 at v2.12.12-1).
            let lib = lib.split(')').next().unwrap_or(lib);
            insert_capped(
                &mut self.plugins.not_found,
                lib,
                &mut self.dropped,
                &mut self.kept,
            );
        } else if rest.starts_with("No plugin found") {
            // 2.17-2.18 print no name (src/net.cc:180 at v2.18.1-1).
            insert_capped(
                &mut self.plugins.not_found,
                "(name not printed)",
                &mut self.dropped,
                &mut self.kept,
            );
        } else if let Some(name) = rest.strip_prefix("Loaded net plugin ") {
            insert_capped(
                &mut self.plugins.loaded,
                name.trim(),
                &mut self.dropped,
                &mut self.kept,
            );
        } else if rest.contains("oaded") {
            insert_capped(
                &mut self.plugins.loaded,
                rest,
                &mut self.dropped,
                &mut self.kept,
            );
        }
    }

    /// `NCCL_X set by environment to V`: a setting that reached NCCL (`at` is
    /// where " set by environment to " starts).
    fn setting_line(&mut self, line_no: u64, m: &str, at: usize) {
        let name = &m[..at];
        if !name.contains(' ') && name.len() <= MAX_TEXT {
            let value = m[at + 23..].trim_end();
            // NCCL_PARAM prints "to %s." with a period; plain getenv reports do not.
            let value = value.strip_suffix('.').unwrap_or(value);
            if self.settings.contains_key(name)
                || self.settings.len() < MAX_SET
                    && charge(&mut self.kept, 2 * name.len() + 3 * MAX_TEXT)
            {
                let values = self.settings.entry(name.to_string()).or_default();
                insert_capped(values, value, &mut self.dropped, &mut self.kept);
                self.setting_examples
                    .entry(name.to_string())
                    .or_default()
                    .keep(line_no, m);
            } else {
                self.dropped += 1;
            }
        }
    }

    /// aws-ofi-nccl's own INFO lines (src/nccl_ofi_net.cpp and src/platform-aws.cpp at v1.21.1;
    /// src/nccl_ofi_net.c and src/platform-aws.c at v1.6.0 and v1.7.4-aws).
    fn ofi_line(&mut self, m: &str) {
        let ofi = &mut self.ofi;
        if let Some(v) = m
            .strip_prefix("Initializing ")
            .or_else(|| m.strip_prefix("Using "))
            .filter(|v| v.starts_with("aws-ofi-nccl") || v.starts_with("nccl-net-ofi"))
        {
            insert_capped(
                &mut ofi.versions,
                v.trim(),
                &mut self.dropped,
                &mut self.kept,
            );
        } else if let Some(p) = m
            .strip_prefix("Selected Provider is ")
            .or_else(|| m.strip_prefix("Selected provider is "))
        {
            let p = p.split([' ', ',']).next().unwrap_or(p);
            insert_capped(&mut ofi.providers, p, &mut self.dropped, &mut self.kept);
        } else if let Some(p) = m.strip_prefix("Running on ") {
            let p = p.split(' ').next().unwrap_or(p);
            insert_capped(&mut ofi.platforms, p, &mut self.dropped, &mut self.kept);
        } else if m.starts_with("Setting NCCL_PROTO to \"simple\"")
            || m.starts_with("Need to force simple protocol")
        {
            ofi.forced_proto_simple = true;
        }
    }

    fn communicator(&mut self, line: &NcclLine<'_>, m: &str) {
        let (Some(pointer), Some(rank)) = (
            field(m, "comm"),
            field(m, "rank").and_then(|r| r.parse::<u32>().ok()),
        ) else {
            return;
        };
        let (pointer, id) = (clip(pointer), field(m, "commId").map(clip));
        let (host, pid) = match line.host_pid() {
            Some((h, p)) => (Some(clip_to(h, MAX_HOST)), Some(p)),
            None => (None, None),
        };
        let host = host.as_deref();
        let source = (host.map(String::from), pid, pointer.clone());
        // Versions without commId, and lines before the one naming it: the
        // pointer is unique within one process.
        let provisional = format!("{pointer}@{}:{}", host.unwrap_or("?"), pid.unwrap_or(0));
        let key = match id {
            Some(id) => {
                let cost = pointer.len() + id.len() + host.map_or(0, str::len);
                if self.comm_by_pointer.contains_key(&source)
                    || self.comm_by_pointer.len() < MAX_COMMS && charge(&mut self.kept, cost)
                {
                    self.comm_by_pointer.insert(source, id.clone());
                }
                // A `comm 0x... nNodes` line came first: fold what it said into the commId entry.
                if let Some(early) = self.communicators.remove(&provisional) {
                    self.communicators
                        .entry(id.to_string())
                        .or_default()
                        .absorb(early);
                }
                id.to_string()
            }
            None => match self.comm_by_pointer.get(&source) {
                Some(id) => id.clone(),
                None => provisional,
            },
        };
        if !self.communicators.contains_key(&key)
            && (self.communicators.len() >= MAX_COMMS || !charge(&mut self.kept, key.len() + 64))
        {
            self.dropped += 1;
            return;
        }
        let comm = self.communicators.entry(key).or_default();
        if let Some(n) = field(m, "nranks")
            .or_else(|| field(m, "nRanks"))
            .and_then(|n| n.parse().ok())
        {
            comm.ranks_total = Some(n);
        }
        if let Some(n) = field(m, "nNodes").and_then(|n| n.parse().ok()) {
            comm.nodes = Some(n);
        }
        comm.see(rank);
        if !comm.ranks.contains_key(&rank) && comm.ranks.len() >= MAX_RANKS {
            // Counted in ranks_seen; only the sample keeps where ranks ran.
            return;
        }
        let bus = field(m, "busId").map(clip);
        let fresh = !comm.ranks.contains_key(&rank);
        let cost = host.map_or(0, str::len) + bus.as_ref().map_or(0, String::len) + 32;
        if fresh && !charge(&mut self.kept, cost) {
            // Counted in ranks_seen; the text budget is spent.
            self.dropped += 1;
            return;
        }
        let info = comm.ranks.entry(rank).or_default();
        if info.host.is_none() && host.is_some() && (fresh || charge(&mut self.kept, cost)) {
            info.host = host.map(String::from);
        }
        info.pid = info.pid.or(pid);
        if bus.is_some() && (fresh || info.bus_id.is_none() && charge(&mut self.kept, cost)) {
            info.bus_id = bus;
        }
    }

    fn warn(&mut self, line_no: u64, line: &NcclLine<'_>) {
        let message = clip(line.message.trim());
        let (host, pid) = match line.host_pid() {
            Some((h, p)) => (Some(clip_to(h, MAX_HOST)), Some(p)),
            None => (None, None),
        };
        let after = match self.last_warn.take() {
            Some((h, p, previous, _)) if h == host && p == pid => Some(previous),
            _ => None,
        };
        // aws-ofi-nccl's own failure line (src/nccl_ofi_net.cpp:418 at v1.21.1), the
        // only evidence of a failed plugin before NCCL 2.28 printed `Failed to initialize NET plugin`.
        if message.starts_with("NET/OFI") && message.ends_with("initialization failed") {
            insert_capped(
                &mut self.plugins.failed,
                "aws-ofi-nccl (NET/OFI)",
                &mut self.dropped,
                &mut self.kept,
            );
        }
        let index = if let Some(&i) = self.warn_index.get(&message) {
            self.warnings[i].count += 1;
            Some(i)
        } else if self.warnings.len() < MAX_SET
            && charge(&mut self.kept, 4 * message.len() + 3 * MAX_TEXT)
        {
            self.warn_index.insert(message.clone(), self.warnings.len());
            self.warnings.push(WarnEntry {
                message: message.clone(),
                location: line.location().map(clip),
                count: 1,
                first_line: line_no,
                after,
                trace: None,
                attn: line.level == Level::Attn,
            });
            Some(self.warnings.len() - 1)
        } else {
            self.dropped += 1;
            None
        };
        self.last_warn = Some((host, pid, message, index));
    }

    /// Connection lines whose transport family is `family` (`NET`, `SHM`, `P2P`).
    pub fn connections(&self, family: &str) -> u64 {
        self.transport_counts
            .iter()
            .filter(|(t, _)| transport::family(t) == family)
            .map(|(_, n)| n)
            .sum()
    }

    /// The value(s) NCCL reported for a variable.
    pub fn setting(&self, name: &str) -> Option<&BTreeSet<String>> {
        self.settings.get(name)
    }

    /// True when the topology says GPUs of a node are joined by NVLink.
    pub fn nvlink(&self) -> bool {
        self.nvlink_in_topology || self.path_types.iter().any(|t| t.starts_with("NVL"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str) -> LogSummary {
        crate::explain::summarize(text.as_bytes()).unwrap()
    }

    /// Issue 15: the net plugin lines of every NCCL version.
    #[test]
    fn a_warn_is_one_evidence_line_with_its_place_and_repeats() {
        let mut w = WarnEntry {
            message: "Error: failed to extend /dev/shm/nccl-x to 9 bytes".into(),
            location: Some("transport/shm.cc:590".into()),
            count: 2,
            first_line: 12,
            after: None,
            trace: None,
            attn: false,
        };
        assert_eq!(
            w.evidence_line(),
            "line 12 transport/shm.cc:590: Error: failed to extend /dev/shm/nccl-x to 9 bytes (2 lines)"
        );
        (w.location, w.count) = (None, 1);
        assert_eq!(
            w.evidence_line(),
            "line 12: Error: failed to extend /dev/shm/nccl-x to 9 bytes"
        );
    }

    #[test]
    fn net_plugin_lines_of_every_version() {
        // src/init.cc:63 at v2.5.6-1; src/net.cc:125 at v2.12.12-1.
        let s = read(
            "h:1:1 [0] NCCL INFO NET/Plugin : No plugin found (libnccl-net.so), using internal implementation\n",
        );
        assert_eq!(
            s.plugins.not_found,
            BTreeSet::from(["libnccl-net.so".to_string()])
        );
        // src/net.cc:180 at v2.18.1-1: no name.
        let s = read(
            "h:1:1 [0] NCCL INFO NET/Plugin : No plugin found, using internal implementation\n",
        );
        assert_eq!(
            s.plugins.not_found,
            BTreeSet::from(["(name not printed)".to_string()])
        );
        // src/plugin/plugin_open.cc:107 at v2.28.9-1.
        let s = read(
            "h:1:1 [0] NCCL INFO NET/Plugin: Could not find: libnccl-net-ofi.so libnccl-net.so. Using internal net plugin.\n",
        );
        assert_eq!(
            s.plugins.not_found,
            BTreeSet::from([
                "libnccl-net-ofi.so".to_string(),
                "libnccl-net.so".to_string()
            ])
        );
        // HPC-X nccl-rdma-sharp-plugins.
        let s = read(
            "h:1:2 [0] NCCL INFO Plugin Path : /opt/hpcx/nccl_rdma_sharp_plugin/lib/libnccl-net.so\n\
             h:1:2 [0] NCCL INFO P2P plugin IBext_v8\n\
             h:1:2 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [RO]; OOB ib0:10.0.0.1<0>\n",
        );
        assert_eq!(s.plugins.loaded, BTreeSet::from(["IBext_v8".to_string()]));
        assert_eq!(s.plugins.paths.len(), 1);
        assert_eq!(s.ib_devices.len(), 1);
        // aws-ofi-nccl's own failure (src/nccl_ofi_net.cpp:418 at v1.21.1), NCCL 2.18.
        let s = read(
            "h:1:2 [0] nccl_net_ofi_init:418 NCCL WARN NET/OFI aws-ofi-nccl initialization failed\n",
        );
        assert_eq!(
            s.plugins.failed,
            BTreeSet::from(["aws-ofi-nccl (NET/OFI)".to_string()])
        );
    }

    #[test]
    fn aws_ofi_nccl_version_platform_and_forced_protocol() {
        let s = read(
            "h:1:1 [0] NCCL INFO NET/OFI Initializing aws-ofi-nccl 1.7.4-aws\n\
             h:1:1 [0] NCCL INFO NET/OFI Running on p4d.24xlarge platform, Setting NCCL_TOPO_FILE environment variable to /opt/x.xml\n\
             h:1:1 [0] NCCL INFO NET/OFI Setting NCCL_PROTO to \"simple\"\n\
             h:1:1 [0] NCCL INFO NET/OFI Selected Provider is efa (found 4 nics)\n",
        );
        assert_eq!(
            s.ofi.versions,
            BTreeSet::from(["aws-ofi-nccl 1.7.4-aws".to_string()])
        );
        assert_eq!(
            s.ofi.platforms,
            BTreeSet::from(["p4d.24xlarge".to_string()])
        );
        assert_eq!(s.ofi.providers, BTreeSet::from(["efa".to_string()]));
        assert!(s.ofi.forced_proto_simple);
    }

    /// Issue 15: one communicator was listed twice when its `comm 0x... nNodes`
    /// line came before the line tying the pointer to its commId.
    #[test]
    fn communicator_listed_twice_when_nnodes_came_first() {
        let s = read(
            "a:5:5 [0] NCCL INFO comm 0x55d0 rank 0 nRanks 2 nNodes 2 localRanks 1 localRank 0 MNNVL 0\n\
             a:5:5 [0] NCCL INFO ncclCommInitRank comm 0x55d0 rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 1b000 commId 0xfeed - Init COMPLETE\n\
             b:6:6 [0] NCCL INFO ncclCommInitRank comm 0x77e0 rank 1 nranks 2 cudaDev 0 nvmlDev 0 busId 1b000 commId 0xfeed - Init COMPLETE\n",
        );
        assert_eq!(s.communicators.len(), 1, "{:?}", s.communicators.keys());
        let c = &s.communicators["0xfeed"];
        assert_eq!(
            (c.nodes, c.ranks_total, c.ranks_seen),
            (Some(2), Some(2), 2)
        );
        assert_eq!(c.ranks[&0].host.as_deref(), Some("a"));
    }

    /// Issue 15: two processes' output on one line lost the connections on it.
    #[test]
    fn two_processes_on_one_line_keep_both_connections() {
        let s = read(
            "a:5:5 [0] NCCL INFO Channel 00 : 0[0] -> 1[1] via P2P/IPCa:6:6 [1] NCCL INFO Channel 00 : 1[1] -> 0[0] via P2P/IPC\n",
        );
        assert_eq!((s.lines, s.nccl_lines), (1, 2));
        assert_eq!(
            s.transport_counts.get("P2P/IPC"),
            Some(&2),
            "{:?}",
            s.transport_counts
        );
        let s = read(
            "a:5:5 [0] NCCL INFO Channel 00 : 0[0] -> 1[1] via P2P/IPC a:6:6 [1] NCCL INFO Channel 00 : 1[1] -> 0[0] via P2P/IPC\n",
        );
        assert_eq!(s.transport_counts.get("P2P/IPC"), Some(&2));
    }

    #[test]
    fn ranks_are_sampled_and_counted() {
        let mut text = String::new();
        for rank in 0..300u32 {
            text.push_str(&format!(
                "h{rank}:1:1 [0] NCCL INFO ncclCommInitRank comm 0x1 rank {rank} nranks 300 cudaDev 0 busId 1000 commId 0xabc - Init START\n"
            ));
        }
        // Rank 5 again, and one beyond the counted range.
        text.push_str("h5:1:1 [0] NCCL INFO ncclCommInitRank comm 0x1 rank 5 nranks 300 cudaDev 0 busId 1000 commId 0xabc - Init START\n");
        let s = read(&text);
        let c = &s.communicators["0xabc"];
        assert_eq!((c.ranks_seen, c.ranks.len()), (300, MAX_RANKS));
    }
}
