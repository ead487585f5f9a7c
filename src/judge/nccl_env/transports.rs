//! Transports and algorithms the user forced or turned off: P2P and SHM,
//! NCCL_PROTO and NCCL_ALGO, judged against this node's GPUs and the NCCL
//! version's own lists (src/nccl/variables.tsv: ncclAlgoStr, ncclProtoStr).
//!
//! NCCL_ALGO / NCCL_PROTO are parsed by parseList (src/graph/tuning.cc):
//! `;`-separated entries, each `[function:][^]a,b`, names compared without
//! case. Since 2.24 an unknown name is an error at init ("Unrecognized element
//! token", ncclInvalidUsage); before, it was skipped. An algorithm NCCL cannot
//! run here is dropped from the cost table (src/enqueue.cc
//! updateCollCostTable: NVLS without nvlsSupport, CollNet without
//! collNetSupport); when nothing is left the first collective fails with
//! "no algorithm/protocol available" (topoGetAlgoInfo, ncclInvalidUsage when
//! NCCL_ALGO or NCCL_PROTO is set). Checked against NCCL 2.28.9.

use super::{Problem, get};
use crate::facts::Facts;
use crate::finding::Outcome;
use crate::nccl::Version;
use crate::nccl::catalog::Catalog;
use crate::nccl::version::{ALGO_NO_FALLBACK, STRICT_LIST};

pub(super) fn lint_p2p_shm(facts: &Facts) -> Vec<Problem> {
    let nvlink = facts
        .gpus
        .nvml
        .loaded()
        .is_some_and(crate::topology::matrix::has_nvlink);
    let mut out = Vec::new();
    let p2p_off = get(facts, "NCCL_P2P_DISABLE") == Some("1");
    if nvlink && p2p_off {
        out.push(Problem::predicts(
            Outcome::degraded(
                "SHM through host memory instead of P2P over NVLink",
                "measured 27 GB/s against ~295 GB/s on 2x H200",
            ),
            "NCCL_P2P_DISABLE=1 on an NVLink node: GPUs talk through host memory (measured 27 GB/s instead of ~295 GB/s on 2x H200)".to_string(),
            "Unset NCCL_P2P_DISABLE.",
        ));
    }
    // NCCL_P2P_LEVEL against the pairs' real paths: prediction.rs lint_p2p_level.
    if get(facts, "NCCL_SHM_DISABLE") == Some("1") && (p2p_off || !nvlink) {
        out.push(Problem::predicts(
            Outcome::degraded(
                "NET (sockets, or the NIC) between the node's own ranks",
                "measured 3.7 GB/s on 2x H200",
            ),
            "NCCL_SHM_DISABLE=1 without P2P between the GPUs: ranks of one node talk over the network (measured 3.7 GB/s on 2x H200)".to_string(),
            "Unset NCCL_SHM_DISABLE.",
        ));
    }
    if let Some(proto) = get(facts, "NCCL_PROTO") {
        let forced_ll128 = !proto.starts_with('^')
            && proto
                .to_ascii_uppercase()
                .split(',')
                .any(|p| p.trim() == "LL128");
        if forced_ll128 && !nvlink {
            // src/graph/tuning.cc enables LL128 only where it is known safe.
            out.push(Problem::predicts(
                Outcome::undetermined(
                    "whether LL128 delivers correct data on this node: NCCL leaves it off without NVLink because it can corrupt data there",
                ),
                format!("NCCL_PROTO={proto:?} forces LL128 without NVLink, where NCCL does not enable it: it can corrupt data"),
                "Unset NCCL_PROTO, or exclude LL128 (NCCL_PROTO=^LL128) if a vendor asks you to.",
            ));
        }
    }
    out
}

/// One parseList entry.
struct Entry {
    function: Option<String>,
    exclude: bool,
    names: Vec<String>,
}

fn parse_list(value: &str) -> Vec<Entry> {
    value
        .split(';')
        .filter(|e| !e.is_empty())
        .map(|entry| {
            let (function, list) = match entry.split_once(':') {
                Some((f, l)) => (Some(f.to_string()), l),
                None => (None, entry),
            };
            let (exclude, list) = match list.strip_prefix('^') {
                Some(l) => (true, l),
                None => (false, list),
            };
            Entry {
                function,
                exclude,
                names: list
                    .split(',')
                    .filter(|n| !n.is_empty())
                    .map(String::from)
                    .collect(),
            }
        })
        .collect()
}

/// Names in `var`'s value that this NCCL does not know.
fn unknown_names(
    var: &str,
    value: &str,
    set: &str,
    catalog: &Catalog,
    version: Option<Version>,
) -> Option<Problem> {
    let known = catalog.values(set, version)?;
    let unknown: Vec<String> = parse_list(value)
        .into_iter()
        .flat_map(|e| e.names)
        .filter(|n| !known.iter().any(|k| k.eq_ignore_ascii_case(n)))
        .collect();
    if unknown.is_empty() {
        return None;
    }
    let which = version.map_or_else(|| "the newest NCCL".to_string(), |v| format!("NCCL {}", v));
    let (status, effect) = match version {
        Some(v) if v >= STRICT_LIST => (
            Outcome::init_fails(format!(
                "\"Unrecognized element token\" for {} (ncclInvalidUsage, src/graph/tuning.cc parseList)",
                unknown.join(", ")
            )),
            "NCCL fails at init with \"Unrecognized element token\"",
        ),
        Some(_) => (Outcome::Unaffected, "this NCCL skips the unknown names"),
        None => (
            Outcome::undetermined(
                "which NCCL the trainer loads: 2.24 and later fail at init on an unknown name, older skip it",
            ),
            "NCCL >= 2.24 fails at init on it, older versions skip it",
        ),
    };
    Some(Problem::predicts(
        status,
        format!(
            "{var}={value:?} names {} that {which} does not have (it has {}): {effect}",
            unknown.join(", "),
            known.join(", ")
        ),
        format!(
            "Use only {} in {var}, or unset it and let NCCL choose.",
            known.join(", ")
        ),
    ))
}

/// Whether these GPUs sit on an NVSwitch fabric, from NVML's fabric state
/// (nvmlDeviceGetGpuFabricInfo). `None` when NVML did not say. NVLS also needs
/// CUDA multicast (CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED), which the facts do
/// not hold yet: a registered fabric is the closest fact gathered.
fn on_nvswitch_fabric(facts: &Facts) -> Option<bool> {
    let nvml = facts.gpus.nvml.loaded()?;
    let states: Vec<&crate::facts::gpu::FabricState> = nvml
        .gpus
        .iter()
        .map(|g| g.fabric_state.value())
        .collect::<Option<_>>()?;
    if states.is_empty() {
        return None;
    }
    Some(
        !states
            .iter()
            .all(|s| **s == crate::facts::gpu::FabricState::NotSupported),
    )
}

/// Why nothing the forced algorithms allow can run here, and the fix; `None` when one can.
/// From NCCL 2.28.9's ncclTopoTuneModel (tuning.cc) and updateCollCostTable (enqueue.cc).
fn nothing_runs(facts: &Facts, forced: &[String]) -> Option<(&'static str, &'static str)> {
    let only = |allowed: &[&str]| forced.iter().all(|n| allowed.contains(&n.as_str()));
    let nvls_off = get(facts, "NCCL_NVLS_ENABLE").is_some_and(|v| v.trim() == "0");
    let collnet_on = get(facts, "NCCL_COLLNET_ENABLE").is_some_and(|v| v.trim() == "1");
    let nodes = crate::layout::nodes(facts);
    if only(&["nvls", "nvlstree"]) && nvls_off {
        // Measured with NCCL 2.28.9 on 2x H200: "Error : no algorithm/protocol
        // available for function AllReduce", invalid usage, at the first all-reduce.
        Some((
            "NVLS, which NCCL_NVLS_ENABLE=0 turns off",
            "Unset NCCL_ALGO, or unset NCCL_NVLS_ENABLE where the fabric supports NVLS.",
        ))
    } else if only(&["nvls", "nvlstree"]) && on_nvswitch_fabric(facts) == Some(false) {
        Some((
            "NVLS, which needs NVSwitch multicast, and these GPUs are not on an NVSwitch fabric",
            "Unset NCCL_ALGO (NCCL uses NVLS by itself where the fabric supports it).",
        ))
    } else if only(&["nvlstree"]) && nodes == Some(1) {
        Some((
            "NVLSTree, which NCCL disables on a single node",
            "Unset NCCL_ALGO (NCCL picks NVLSTree by itself across nodes).",
        ))
    } else if only(&["nvls"]) && nodes.is_some_and(|n| n > 1) && !collnet_on {
        Some((
            "NVLS, which NCCL disables across nodes without NCCL_COLLNET_ENABLE=1",
            "Unset NCCL_ALGO (NCCL picks NVLS by itself where it applies).",
        ))
    } else if only(&["collnet", "collnetdirect", "collnetchain"]) && !collnet_on {
        Some((
            "CollNet, which NCCL disables without NCCL_COLLNET_ENABLE=1 and a CollNet (SHARP) net plugin",
            "Unset NCCL_ALGO, or enable CollNet (NCCL_COLLNET_ENABLE=1 with the SHARP plugin) where the fabric has it.",
        ))
    } else {
        None
    }
}

pub(super) fn lint_algo(
    facts: &Facts,
    catalog: &Catalog,
    version: Option<Version>,
) -> Vec<Problem> {
    let Some(value) = get(facts, "NCCL_ALGO") else {
        return Vec::new();
    };
    if let Some(p) = unknown_names("NCCL_ALGO", value, "algo", catalog, version) {
        return vec![p];
    }
    let entries = parse_list(value);
    // The algorithms left for collectives that no function-prefixed entry covers.
    let forced: Vec<String> = entries
        .iter()
        .filter(|e| e.function.is_none() && !e.exclude)
        .flat_map(|e| e.names.iter().map(|n| n.to_ascii_lowercase()))
        .collect();
    if forced.is_empty() {
        if entries.iter().any(|e| !e.exclude) {
            return vec![forced_cost(facts, value)];
        }
        return Vec::new();
    }
    let Some((left, fix)) = nothing_runs(facts, &forced) else {
        return vec![forced_cost(facts, value)];
    };
    // NCCL <= 2.20 re-enabled Ring and Tree when a forced list left nothing
    // (tuning.cc: "ignoring NCCL_ALGO=COLLNET"); 2.24 and later fail the
    // collective; 2.21 to 2.23 were not verified, so they only warn.
    let (status, effect) = match version {
        Some(v) if v >= STRICT_LIST => (
            Outcome::init_fails(
                "\"no algorithm/protocol available\" in the first collective (ncclInvalidUsage, src/enqueue.cc topoGetAlgoInfo)",
            ),
            "every collective fails with \"no algorithm/protocol available\"".to_string(),
        ),
        Some(v) if v < ALGO_NO_FALLBACK => (
            Outcome::Unaffected,
            format!(
                "NCCL {} ignores the setting and falls back to Ring and Tree",
                v
            ),
        ),
        _ => (
            Outcome::undetermined(
                "whether this NCCL (2.21 to 2.23, or not known) fails the first collective or falls back to Ring and Tree",
            ),
            "NCCL >= 2.24 fails every collective with \"no algorithm/protocol available\"; older versions may fall back to Ring and Tree".to_string(),
        ),
    };
    vec![Problem::predicts(
        status,
        format!("NCCL_ALGO={value:?} leaves only {left}: {effect}"),
        fix,
    )]
}

fn forced_cost(facts: &Facts, value: &str) -> Problem {
    Problem::predicts(
        crate::judge::across_nodes(
            facts,
            Outcome::degraded(
                format!("NCCL_ALGO={value:?} for every collective and size"),
                "a forced Ring's latency grows with the rank count; collectives the algorithms do not implement fall back or fail",
            ),
        ),
        format!(
            "NCCL_ALGO={value:?} overrides NCCL's tuner, which picks an algorithm per collective, message size and scale: on one node the cost is small (2x H200, 256 MiB all-reduce: Ring 298 GB/s, Tree 307 GB/s, tuner 299 GB/s), but across many nodes a forced Ring's latency grows with the rank count, and collectives the forced algorithms do not implement fall back or fail (NVIDIA/nccl#317: Tree has no Broadcast)"
        ),
        "Unset NCCL_ALGO outside a benchmark; to steer one collective only, use NCCL's per-function form (e.g. NCCL_ALGO='allreduce:tree', NCCL >= 2.24).",
    )
}

pub(super) fn lint_proto_names(
    facts: &Facts,
    catalog: &Catalog,
    version: Option<Version>,
) -> Vec<Problem> {
    get(facts, "NCCL_PROTO")
        .and_then(|v| unknown_names("NCCL_PROTO", v, "proto", catalog, version))
        .into_iter()
        .collect()
}
