//! The transport for each GPU pair of this node, from src/graph/paths.cc
//! ncclTopoCheckP2p (v2.18-v2.28) and src/transport/p2p.cc / shm.cc: P2P when the
//! pair's path is within NCCL_P2P_LEVEL (default PXB) and NVML reports P2P read and
//! write; P2P read only between Ampere (sm_80) GPUs over NVLink, unless
//! NCCL_P2P_READ_ENABLE says otherwise; else SHM, unless NCCL_SHM_DISABLE=1, then NET.
//! All GPUs of this pod share one host hash and /dev/shm, so NCCL pairs them locally.

use super::gdr::{rank, user_level};
use super::{env, int_param};
use crate::facts::Facts;
use crate::facts::gpu::{NvmlFacts, P2pStatus};
use crate::nccl::Version;
use crate::nccl::version::{CUMEM, since};
use crate::topology::matrix;
use serde::{Deserialize, Serialize};

/// GPUs whose pairs are predicted (8128 pairs at most).
const MAX_GPUS: usize = 128;

/// One GPU pair (NVML indexes) and NCCL's transport between them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PairTransport {
    pub a: u32,
    pub b: u32,
    /// As NCCL's log prints it: `P2P/CUMEM/read`, `P2P/CUMEM`, `P2P/IPC`, `SHM`, `NET`;
    /// `init fails` where NCCL refuses to start.
    pub transport: String,
    /// The pair's path in NCCL's terms (NVL, PIX, PXB, PHB, SYS).
    pub path: String,
    pub why: String,
}

/// The pair's path: NVL over NVLink, else NVML's common ancestor in NCCL's names.
fn path(nvml: &NvmlFacts, a: u32, b: u32) -> String {
    let label = matrix::link_label(nvml, a, b);
    if label.starts_with("NV") {
        return "NVL".into();
    }
    match label.as_str() {
        "NODE" => "PHB".into(),
        other => other.to_string(),
    }
}

fn p2p_ok(nvml: &NvmlFacts, a: u32, b: u32) -> bool {
    matrix::pair(nvml, a, b)
        .or_else(|| matrix::pair(nvml, b, a))
        .is_some_and(|p| {
            p.p2p_read.value() == Some(&P2pStatus::Ok)
                && p.p2p_write.value() == Some(&P2pStatus::Ok)
        })
}

fn ampere(nvml: &NvmlFacts, i: u32) -> bool {
    matrix::gpu(nvml, i)
        .and_then(|g| g.compute_capability.value())
        .is_some_and(|c| c == "8.0")
}

/// The P2P level in force and where it came from (ncclGetUserP2pLevel).
fn p2p_level(facts: &Facts) -> (&'static str, String) {
    if int_param(facts, "NCCL_P2P_DISABLE").is_some_and(|v| v != 0) {
        return ("LOC", "NCCL_P2P_DISABLE=1".into());
    }
    match env(facts, "NCCL_P2P_LEVEL").and_then(user_level) {
        Some(l) => (l, format!("NCCL_P2P_LEVEL={l}")),
        None => ("PXB", "the default level PXB".into()),
    }
}

fn one(facts: &Facts, nvml: &NvmlFacts, version: Option<Version>, a: u32, b: u32) -> PairTransport {
    let (level, level_why) = p2p_level(facts);
    let path = path(nvml, a, b);
    let within = rank(&path) <= rank(level);
    let ok = p2p_ok(nvml, a, b);
    let (transport, why) = if within && ok {
        let read = match int_param(facts, "NCCL_P2P_READ_ENABLE") {
            Some(v) => v != 0,
            None => path == "NVL" && ampere(nvml, a) && ampere(nvml, b),
        };
        // src/misc/cudawrap.cc ncclCuMemEnable (v2.19.3-1 to v2.28.9-1): a set
        // NCCL_CUMEM_ENABLE wins over the default, so 0 means legacy CUDA IPC.
        let cumem_off = int_param(facts, "NCCL_CUMEM_ENABLE") == Some(0);
        let kind = if since(version, CUMEM) && !cumem_off {
            "P2P/CUMEM"
        } else {
            "P2P/IPC"
        };
        let t = if read {
            format!("{kind}/read")
        } else {
            kind.to_string()
        };
        (
            t,
            format!("path {path} within {level_why}, NVML reports P2P read and write"),
        )
    } else if within && path == "NVL" && int_param(facts, "NCCL_IGNORE_DISABLED_P2P") != Some(1) {
        // src/graph/paths.cc ncclTopoCheckP2p (v2.13.4-1 to v2.30.7-1): NVML's P2P status
        // not OK on a path of type <= PATH_NVB returns ncclUnhandledCudaError with
        // "P2P is disabled between NVLINK connected GPUs ... probably due to a hardware
        // issue", unless NCCL_IGNORE_DISABLED_P2P=1 (then p2p = 0: SHM).
        (
            "init fails".to_string(),
            "NVLink-connected pair without P2P in NVML: ncclTopoCheckP2p returns an error"
                .to_string(),
        )
    } else {
        let reason = if within {
            "NVML reports no P2P".to_string()
        } else {
            format!("path {path} beyond {level_why}")
        };
        if int_param(facts, "NCCL_SHM_DISABLE").is_some_and(|v| v != 0) {
            (
                "NET".to_string(),
                format!("{reason}, and NCCL_SHM_DISABLE=1"),
            )
        } else {
            ("SHM".to_string(), reason)
        }
    };
    PairTransport {
        a,
        b,
        transport,
        path,
        why,
    }
}

pub(super) fn predict(facts: &Facts, version: Option<Version>) -> Vec<PairTransport> {
    let Some(nvml) = facts.gpus.nvml.loaded() else {
        return Vec::new();
    };
    // A node has at most 72 GPUs in one NVLink domain; facts with more (a fuzzed or
    // corrupt capture) are predicted for the first MAX_GPUS, as doctor's matrices are.
    let indexes: Vec<u32> = nvml.gpus.iter().map(|g| g.index).take(MAX_GPUS).collect();
    let mut out = Vec::new();
    for (i, a) in indexes.iter().enumerate() {
        for b in &indexes[i + 1..] {
            out.push(one(facts, nvml, version, *a, *b));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_facts;

    #[test]
    fn h200_pairs_use_p2p_write_and_the_levels_move_them() {
        let f = test_facts::healthy();
        let p = predict(&f, Some(Version::new(2, 28, 9)));
        assert_eq!(p[0].transport, "P2P/CUMEM", "{p:?}");
        assert_eq!(p[0].path, "NVL");
        let off = test_facts::with_env(f.clone(), &[("NCCL_P2P_DISABLE", "1")]);
        assert_eq!(predict(&off, None)[0].transport, "SHM");
        let net = test_facts::with_env(off, &[("NCCL_SHM_DISABLE", "1")]);
        assert_eq!(predict(&net, None)[0].transport, "NET");
        let ipc = test_facts::with_env(f.clone(), &[("NCCL_CUMEM_ENABLE", "0")]);
        assert_eq!(
            predict(&ipc, Some(Version::new(2, 28, 9)))[0].transport,
            "P2P/IPC"
        );
        let pix = test_facts::with_env(f.clone(), &[("NCCL_P2P_LEVEL", "PIX")]);
        assert_eq!(predict(&pix, None)[0].transport, "P2P/CUMEM");
        let read = test_facts::with_env(f.clone(), &[("NCCL_P2P_READ_ENABLE", "1")]);
        assert_eq!(
            predict(&read, Some(Version::new(2, 18, 5)))[0].transport,
            "P2P/IPC/read"
        );
    }
}
