//! `LogSummary`: everything explain-log keeps from a log, built one line at a
//! time. Memory is bounded whatever the input: sets and maps are capped (what
//! did not fit is counted in `dropped`), examples are kept only for the first
//! few lines of each kind.

use super::line::{Level, NcclLine};
use super::transport;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// Caps on what one summary keeps.
const MAX_SET: usize = 256;
const MAX_COMMS: usize = 4096;
const MAX_RANKS: usize = 65_536;
const MAX_EXAMPLES: usize = 3;
/// Longest message text kept in a set or example.
const MAX_TEXT: usize = 512;

fn clip(text: &str) -> String {
    let mut end = text.len().min(MAX_TEXT);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
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
    pub ranks: BTreeMap<u32, RankInfo>,
}

/// A WARN message and how often it was seen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WarnEntry {
    pub message: String,
    pub location: Option<String>,
    pub count: u64,
    /// 1-based line number of the first occurrence.
    pub first_line: u64,
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

fn insert_capped(set: &mut BTreeSet<String>, value: &str, dropped: &mut u64) {
    if set.contains(value) {
        return;
    }
    if set.len() < MAX_SET {
        set.insert(clip(value));
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
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct LogSummary {
    pub lines: u64,
    pub nccl_lines: u64,
    /// Lines longer than the reader's limit, read only in part.
    pub truncated_lines: u64,
    /// Lines that were not valid UTF-8 (read with replacement characters).
    pub non_utf8_lines: u64,
    pub nccl_versions: BTreeSet<String>,
    pub cuda_driver_versions: BTreeSet<String>,
    pub plugins: Plugins,
    /// Networks communicators used (`Using network X`).
    pub networks: BTreeSet<String>,
    /// What NCCL's IB transport listed (`NET/IB : Using [0]mlx5_0:1/IB ...`); empty when no device.
    pub ib_devices: BTreeSet<String>,
    /// What the libfabric plugin reported (`NET/OFI ...`).
    pub ofi_lines: BTreeSet<String>,
    /// Interfaces the socket transport used.
    pub socket_interfaces: BTreeSet<String>,
    /// Variables NCCL reported `set by environment`, with every value seen.
    pub settings: BTreeMap<String, BTreeSet<String>>,
    pub communicators: BTreeMap<String, Communicator>,
    /// Connection lines per normalized transport.
    pub transport_counts: BTreeMap<String, u64>,
    /// Connections through a proxy rank (PXN).
    pub proxied_connections: u64,
    /// Intra-node path types from `Pattern ..., type X/Y` lines (e.g. `NVL/PIX`).
    pub path_types: BTreeSet<String>,
    /// The topology dump showed NVLink (`NVL` paths or links).
    pub nvlink_in_topology: bool,
    pub warnings: Vec<WarnEntry>,
    /// Example lines per transport, for findings' evidence.
    #[serde(skip)]
    pub transport_examples: BTreeMap<String, Examples>,
    #[serde(skip)]
    pub setting_examples: BTreeMap<String, Examples>,
    /// Values that did not fit a capped set or map.
    pub dropped: u64,
    #[serde(skip)]
    comm_by_pointer: BTreeMap<(Option<String>, Option<u32>, String), String>,
    #[serde(skip)]
    warn_index: BTreeMap<String, usize>,
    #[serde(skip)]
    scratch: String,
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
    /// Counts a line that is not NCCL's.
    pub fn other_line(&mut self) {
        self.lines += 1;
    }

    /// Takes a bare `NCCL version X` line (no `NCCL INFO` prefix).
    pub fn bare_version(&mut self, version: &str) {
        self.lines += 1;
        self.nccl_lines += 1;
        if let Some(v) = version.split_whitespace().next() {
            insert_capped(&mut self.nccl_versions, v, &mut self.dropped);
        }
    }

    /// Takes one NCCL line (`line_no` is 1-based).
    pub fn nccl_line(&mut self, line_no: u64, line: &NcclLine<'_>) {
        self.lines += 1;
        self.nccl_lines += 1;
        let m = line.message;
        if line.level == Level::Warn {
            self.warn(line_no, line);
            return;
        }
        let mut scratch = std::mem::take(&mut self.scratch);
        if let Some(proxied) = transport::normalize_into(m, &mut scratch) {
            let room = self.transport_counts.len() < MAX_SET;
            match self.transport_counts.get_mut(scratch.as_str()) {
                Some(n) => *n += 1,
                None if room => {
                    self.transport_counts.insert(scratch.clone(), 1);
                }
                None => self.dropped += 1,
            }
            let room = self.transport_examples.len() < MAX_SET;
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

    fn info(&mut self, line_no: u64, line: &NcclLine<'_>) {
        let m = line.message;
        if let Some(v) = m.strip_prefix("NCCL version ") {
            insert_capped(&mut self.nccl_versions, v.trim(), &mut self.dropped);
        } else if let Some(v) = m.strip_prefix("cudaDriverVersion ") {
            insert_capped(&mut self.cuda_driver_versions, v.trim(), &mut self.dropped);
        } else if let Some(rest) = m.strip_prefix("NET/Plugin") {
            let rest = rest.trim_start_matches([' ', ':']);
            if let Some(lib) = rest.strip_prefix("Could not find: ") {
                insert_capped(&mut self.plugins.not_found, lib.trim(), &mut self.dropped);
            } else if let Some(lib) = rest.strip_prefix("No plugin found (") {
                // NCCL 2.4 to 2.11: `NET/Plugin : No plugin found (libnccl-net.so).`
                let lib = lib.trim_end_matches(['.', ')']);
                insert_capped(&mut self.plugins.not_found, lib, &mut self.dropped);
            } else if let Some(name) = rest.strip_prefix("Loaded net plugin ") {
                insert_capped(&mut self.plugins.loaded, name.trim(), &mut self.dropped);
            } else if rest.contains("oaded") {
                insert_capped(&mut self.plugins.loaded, rest, &mut self.dropped);
            }
        } else if let Some(net) = m.strip_prefix("Failed to initialize NET plugin ") {
            insert_capped(&mut self.plugins.failed, net.trim(), &mut self.dropped);
        } else if let Some(net) = m.strip_prefix("Initialized NET plugin ") {
            insert_capped(&mut self.plugins.initialized, net.trim(), &mut self.dropped);
        } else if let Some(net) = m.strip_prefix("Using network ") {
            insert_capped(&mut self.networks, net.trim(), &mut self.dropped);
        } else if let Some(rest) = m.strip_prefix("NET/IB : Using ") {
            // The device list: `[0]mlx5_0:1/IB [1]...`; `[RO]` alone is only the relaxed-ordering flag.
            if rest.contains(":1/") || rest.contains("/IB") || rest.contains("/RoCE") {
                insert_capped(
                    &mut self.ib_devices,
                    rest.split(';').next().unwrap_or(rest).trim(),
                    &mut self.dropped,
                );
            }
        } else if let Some(rest) = m.strip_prefix("NET/Socket : Using ") {
            insert_capped(&mut self.socket_interfaces, rest.trim(), &mut self.dropped);
        } else if m.starts_with("NET/OFI") {
            insert_capped(&mut self.ofi_lines, m, &mut self.dropped);
        } else if let Some(at) = m
            .starts_with("NCCL_")
            .then(|| m.find(" set by environment to "))
            .flatten()
        {
            let name = &m[..at];
            if !name.contains(' ') {
                let value = m[at + 23..].trim_end();
                // NCCL_PARAM prints "to %s." with a period; plain getenv reports do not.
                let value = value.strip_suffix('.').unwrap_or(value);
                if self.settings.contains_key(name) || self.settings.len() < MAX_SET {
                    let values = self.settings.entry(name.to_string()).or_default();
                    insert_capped(values, value, &mut self.dropped);
                    self.setting_examples
                        .entry(name.to_string())
                        .or_default()
                        .keep(line_no, m);
                } else {
                    self.dropped += 1;
                }
            }
        } else if m.starts_with("Pattern ") {
            if let Some(t) = field(m, "type") {
                insert_capped(
                    &mut self.path_types,
                    t.trim_end_matches(','),
                    &mut self.dropped,
                );
            }
        } else if !self.nvlink_in_topology
            && m.contains("NVL")
            && (m.contains("/NVL)") || m.contains("+ NVL["))
        {
            self.nvlink_in_topology = true;
        } else if m.starts_with("ncclCommInit") || m.starts_with("comm 0x") {
            self.communicator(line, m);
        }
    }

    fn communicator(&mut self, line: &NcclLine<'_>, m: &str) {
        let (Some(pointer), Some(rank)) = (
            field(m, "comm"),
            field(m, "rank").and_then(|r| r.parse::<u32>().ok()),
        ) else {
            return;
        };
        let (host, pid) = (line.host(), line.pid());
        let source = (host.map(String::from), pid, pointer.to_string());
        let key = match field(m, "commId") {
            Some(id) => {
                if self.comm_by_pointer.len() < MAX_COMMS {
                    self.comm_by_pointer.insert(source, id.to_string());
                }
                id.to_string()
            }
            None => match self.comm_by_pointer.get(&source) {
                Some(id) => id.clone(),
                // Versions without commId: the pointer is unique within one process.
                None => format!("{pointer}@{}:{}", host.unwrap_or("?"), pid.unwrap_or(0)),
            },
        };
        if !self.communicators.contains_key(&key) && self.communicators.len() >= MAX_COMMS {
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
        if !comm.ranks.contains_key(&rank) && comm.ranks.len() >= MAX_RANKS {
            self.dropped += 1;
            return;
        }
        let info = comm.ranks.entry(rank).or_default();
        info.host = info.host.take().or_else(|| host.map(String::from));
        info.pid = info.pid.or(pid);
        if let Some(bus) = field(m, "busId") {
            info.bus_id = Some(clip(bus));
        }
    }

    fn warn(&mut self, line_no: u64, line: &NcclLine<'_>) {
        let message = clip(line.message.trim());
        if let Some(&i) = self.warn_index.get(&message) {
            self.warnings[i].count += 1;
        } else if self.warnings.len() < MAX_SET {
            self.warn_index.insert(message.clone(), self.warnings.len());
            self.warnings.push(WarnEntry {
                message,
                location: line.location().map(clip),
                count: 1,
                first_line: line_no,
            });
        } else {
            self.dropped += 1;
        }
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
