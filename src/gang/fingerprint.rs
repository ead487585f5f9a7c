//! The fingerprint: what one pod tells every other pod at the gang's
//! rendezvous (`rendezvous`), as a bounded, versioned record.
//!
//! Record layout (at most `FINGERPRINT_BYTES` bytes): `NPGF` | version (u16 LE)
//! | length of the body (u32 LE) | the body, JSON of [`Fingerprint`]. The
//! version lets a newer tool refuse an older record by name rather than misread
//! it. A peer's record is hostile input: [`Fingerprint::decode`] bounds it and
//! [`Fingerprint::escaped`] makes every string in it printable before any of it
//! reaches a finding or a terminal.

use crate::finding::Status;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Bytes of one record: a pod's whole NCCL/FI environment and every check's verdict
/// fit with room to spare; more is refused when encoding, never cut.
pub const FINGERPRINT_BYTES: usize = 16384;
/// The record's version; bumped when a field changes meaning.
/// 2: the libnccl's path, failed and warned checks' summaries and the gang's own
/// options joined the record (it travels over the rendezvous, not NCCL).
const FINGERPRINT_VERSION: u16 = 2;
/// A check summary carried in the record is cut to this many characters.
pub(crate) const SUMMARY_CHARS: usize = 240;
const MAGIC: &[u8; 4] = b"NPGF";
const HEADER: usize = 10;

/// What one pod tells its peers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fingerprint {
    pub node_rank: u64,
    /// This pod's host name.
    pub host: String,
    /// The libnccl the trainer will load (`2.28.9`).
    pub nccl_version: Option<String>,
    /// Where that libnccl is (its path as found).
    pub nccl_library: Option<String>,
    /// The CUDA driver version (`12.8`).
    pub cuda_driver_version: Option<String>,
    /// The first GPU's model.
    pub gpu_model: Option<String>,
    /// GPUs this pod drives.
    pub gpus: u32,
    /// The NCCL net plugin NCCL will load, with its API version.
    pub net_plugin: Option<String>,
    pub libfabric_version: Option<String>,
    /// RDMA devices with an ACTIVE port.
    pub rdma_devices: u32,
    /// Their ports' sysfs rates, sorted (`400 Gb/sec (4X NDR)`).
    pub rdma_rates: Vec<String>,
    /// The interface NCCL's sockets use and its sysfs speed, Mb/s.
    pub socket_interface: Option<String>,
    pub socket_speed_mbps: Option<u64>,
    /// The effective NCCL_*, FI_*, OFI_NCCL_* environment the trainer gets (user + tuned).
    pub env: BTreeMap<String, String>,
    /// Every local check's status.
    pub checks: BTreeMap<String, Status>,
    /// The local verdict (the same `check` gives).
    pub local_verdict: Status,
    /// Every failed or warned local check's summary, by check id (cut to
    /// SUMMARY_CHARS): the text the job verdict quotes for a pod that failed its own checks.
    pub summaries: BTreeMap<String, String>,
    /// The gang's own options (`--gang-sizes`, `--gang-iterations`, `--gang-timeout`),
    /// which every pod must share: pods that measure differently never line up.
    pub gang_options: String,
    /// Where this pod's own failures lie (`none`, `job`, `node`), so every pod blames a
    /// pod that failed its own checks as that pod does; `none` from an older record.
    #[serde(default)]
    pub local_fault: crate::finding::Fault,
}

impl Default for Fingerprint {
    fn default() -> Self {
        Fingerprint {
            node_rank: 0,
            host: String::new(),
            nccl_version: None,
            nccl_library: None,
            cuda_driver_version: None,
            gpu_model: None,
            gpus: 0,
            net_plugin: None,
            libfabric_version: None,
            rdma_devices: 0,
            rdma_rates: Vec::new(),
            socket_interface: None,
            socket_speed_mbps: None,
            env: BTreeMap::new(),
            checks: BTreeMap::new(),
            local_verdict: Status::Pass,
            summaries: BTreeMap::new(),
            gang_options: String::new(),
            local_fault: crate::finding::Fault::None,
        }
    }
}

/// Why a record could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// No record at all (all zeros or foreign bytes).
    NotARecord,
    /// A record of another version.
    Version(u16),
    /// The body is damaged.
    Body(String),
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::NotARecord => f.write_str("not a gang fingerprint record"),
            DecodeError::Version(v) => write!(
                f,
                "fingerprint version {v}, this nccl-preflight reads version {FINGERPRINT_VERSION}: run the same nccl-preflight in every pod"
            ),
            DecodeError::Body(e) => write!(f, "damaged fingerprint: {e}"),
        }
    }
}

impl Fingerprint {
    /// The record: header and body, at most FINGERPRINT_BYTES.
    pub fn encode(&self) -> Result<Vec<u8>, String> {
        let body = serde_json::to_vec(self).map_err(|e| e.to_string())?;
        if body.len() > FINGERPRINT_BYTES - HEADER {
            return Err(format!(
                "the fingerprint takes {} bytes, more than the record's {}: too many NCCL/FI variables set",
                body.len(),
                FINGERPRINT_BYTES - HEADER
            ));
        }
        let mut out = Vec::with_capacity(HEADER + body.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&FINGERPRINT_VERSION.to_le_bytes());
        out.extend_from_slice(&(body.len() as u32).to_le_bytes());
        out.extend_from_slice(&body);
        Ok(out)
    }

    /// Reads a record (a peer's: bounded, and escaped before it is returned).
    pub fn decode(record: &[u8]) -> Result<Fingerprint, DecodeError> {
        if record.len() > FINGERPRINT_BYTES {
            return Err(DecodeError::Body(format!(
                "{} bytes, more than a record's {FINGERPRINT_BYTES}",
                record.len()
            )));
        }
        if record.len() < HEADER || &record[..4] != MAGIC {
            return Err(DecodeError::NotARecord);
        }
        let version = u16::from_le_bytes([record[4], record[5]]);
        if version != FINGERPRINT_VERSION {
            return Err(DecodeError::Version(version));
        }
        let len = u32::from_le_bytes([record[6], record[7], record[8], record[9]]) as usize;
        let body = record
            .get(HEADER..HEADER.saturating_add(len))
            .ok_or_else(|| DecodeError::Body(format!("length {len} past the record's end")))?;
        serde_json::from_slice(body)
            .map(Fingerprint::escaped)
            .map_err(|e| DecodeError::Body(e.to_string()))
    }

    /// The record with every string made printable (control characters shown as
    /// `\xNN`, as the rest of the report shows host text): a peer's host name, a
    /// variable or a check id could otherwise move the cursor, ring the bell or
    /// forge a line (`\n[PASS] gang-consistency`).
    fn escaped(self) -> Fingerprint {
        let v = |s: String| crate::render::visible(&s).into_owned();
        let o = |s: Option<String>| s.map(v);
        Fingerprint {
            host: v(self.host),
            nccl_version: o(self.nccl_version),
            nccl_library: o(self.nccl_library),
            cuda_driver_version: o(self.cuda_driver_version),
            gpu_model: o(self.gpu_model),
            net_plugin: o(self.net_plugin),
            libfabric_version: o(self.libfabric_version),
            rdma_rates: self.rdma_rates.into_iter().map(v).collect(),
            socket_interface: o(self.socket_interface),
            env: self.env.into_iter().map(|(k, x)| (v(k), v(x))).collect(),
            checks: self.checks.into_iter().map(|(k, s)| (v(k), s)).collect(),
            summaries: self
                .summaries
                .into_iter()
                .map(|(k, x)| (v(k), v(x)))
                .collect(),
            gang_options: v(self.gang_options),
            ..self
        }
    }

    /// The rows compared across pods: (field, value), in a stable order.
    pub fn fields(&self) -> Vec<(String, String)> {
        let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "none".to_string());
        let mut out = vec![
            ("nccl version".to_string(), opt(&self.nccl_version)),
            ("gang options".to_string(), self.gang_options.clone()),
            ("cuda driver".to_string(), opt(&self.cuda_driver_version)),
            ("gpu model".to_string(), opt(&self.gpu_model)),
            ("gpus".to_string(), self.gpus.to_string()),
            ("net plugin".to_string(), opt(&self.net_plugin)),
            ("libfabric".to_string(), opt(&self.libfabric_version)),
            ("rdma devices".to_string(), self.rdma_devices.to_string()),
            (
                "rdma rates".to_string(),
                if self.rdma_rates.is_empty() {
                    "none".to_string()
                } else {
                    self.rdma_rates.join(", ")
                },
            ),
            (
                "socket speed".to_string(),
                self.socket_speed_mbps
                    .map_or("unknown".to_string(), |s| format!("{s} Mb/s")),
            ),
            (
                "local verdict".to_string(),
                self.local_verdict.label().to_lowercase(),
            ),
        ];
        for (k, v) in &self.env {
            out.push((format!("env {k}"), v.clone()));
        }
        for (k, v) in &self.checks {
            out.push((format!("check {k}"), v.label().to_lowercase()));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Fingerprint {
        Fingerprint {
            node_rank: 1,
            host: "job-worker-0".into(),
            nccl_version: Some("2.28.9".into()),
            gpus: 8,
            rdma_devices: 4,
            rdma_rates: vec!["400 Gb/sec (4X NDR)".into(); 4],
            env: [("NCCL_ALGO".to_string(), "Ring".to_string())].into(),
            checks: [("memlock".to_string(), Status::Pass)].into(),
            local_verdict: Status::Pass,
            ..Fingerprint::default()
        }
    }

    #[test]
    fn encode_decode_round_trip_within_the_bound() {
        let f = sample();
        let rec = f.encode().unwrap();
        assert!(rec.len() <= FINGERPRINT_BYTES);
        assert_eq!(&rec[..4], b"NPGF");
        assert_eq!(u16::from_le_bytes([rec[4], rec[5]]), FINGERPRINT_VERSION);
        assert_eq!(Fingerprint::decode(&rec).unwrap(), f);
    }

    #[test]
    fn decode_refuses_other_versions_zeros_and_damage() {
        let mut rec = sample().encode().unwrap();
        assert_eq!(
            Fingerprint::decode(&[0u8; FINGERPRINT_BYTES]),
            Err(DecodeError::NotARecord)
        );
        rec[4] = 1;
        let e = Fingerprint::decode(&rec).unwrap_err();
        assert_eq!(e, DecodeError::Version(1));
        assert!(e.to_string().contains("same nccl-preflight"));
        rec[4] = 2;
        rec[6..10].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            Fingerprint::decode(&rec),
            Err(DecodeError::Body(_))
        ));
        let mut rec = sample().encode().unwrap();
        rec[HEADER] = b'!';
        assert!(matches!(
            Fingerprint::decode(&rec),
            Err(DecodeError::Body(_))
        ));
        assert_eq!(Fingerprint::decode(b"NP"), Err(DecodeError::NotARecord));
        // Longer than any record: refused before it is parsed.
        let mut long = sample().encode().unwrap();
        long.resize(FINGERPRINT_BYTES + 1, b' ');
        assert!(matches!(
            Fingerprint::decode(&long),
            Err(DecodeError::Body(_))
        ));
    }

    #[test]
    fn regression_peer_strings_reach_the_report_escaped() {
        // Issue 31 row 14: a newline in a peer's host name forged a report line.
        let mut f = sample();
        f.host = "evil\n[PASS] gang-consistency\x1b[2J\x07".into();
        f.env.insert("NCCL_\u{0}X".into(), "a\rb".into());
        f.summaries
            .insert("nccl-env".into(), "bad\x1b]0;title\x07".into());
        let back = Fingerprint::decode(&f.encode().unwrap()).unwrap();
        assert_eq!(back.host, "evil\\x0a[PASS] gang-consistency\\x1b[2J\\x07");
        assert!(back.env.contains_key("NCCL_\\x00X"), "{:?}", back.env);
        assert_eq!(back.env["NCCL_\\x00X"], "a\\x0db");
        assert!(!back.summaries["nccl-env"].chars().any(char::is_control));
    }

    #[test]
    fn an_oversized_fingerprint_is_refused_not_cut() {
        let mut f = sample();
        f.env.insert("NCCL_X".into(), "x".repeat(FINGERPRINT_BYTES));
        assert!(f.encode().unwrap_err().contains("more than the record"));
    }

    #[test]
    fn versions_and_fields() {
        let fields = sample().fields();
        assert!(fields.contains(&("env NCCL_ALGO".to_string(), "Ring".to_string())));
        assert!(fields.contains(&("check memlock".to_string(), "pass".to_string())));
        assert!(fields.contains(&("gpus".to_string(), "8".to_string())));
    }
}
