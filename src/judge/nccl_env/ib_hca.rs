//! NCCL_IB_HCA against the RDMA devices and ports this node has, and
//! NCCL_IB_GID_INDEX on NCCL versions that choose the GID themselves.

use super::{Problem, get};
use crate::facts::Facts;
use crate::facts::rdma::RdmaDevice;
use crate::finding::Severity;
use crate::nccl::ib_hca::HcaFilter;
use crate::predict::Prediction;

/// Entries with spaces: NCCL does not trim them (utils.cc parseStringList), so
/// " mlx5_1" names no device and NCCL uses fewer HCAs than listed.
fn spaced_entries(
    facts: &Facts,
    value: &str,
    filter: &HcaFilter,
    p: &Prediction,
) -> Option<Problem> {
    let spaced: Vec<&str> = filter
        .entries
        .iter()
        .map(|(e, _)| e.as_str())
        .filter(|e| e.trim() != *e)
        .collect();
    if spaced.is_empty() {
        return None;
    }
    let devices = facts.rdma.devices.value().map_or(&[][..], Vec::as_slice);
    // Devices the entries were meant to name that NCCL now leaves out.
    let dropped: Vec<&str> = devices
        .iter()
        .map(|d| d.name.as_str())
        .filter(|n| spaced.iter().any(|e| filter.entry_matches(e.trim(), n)))
        .filter(|n| !p.ib.value.used.iter().any(|u| u.device == *n))
        .collect();
    let status = if !dropped.is_empty() && crate::layout::is_multi_node(facts) {
        Severity::Fail
    } else {
        Severity::Warn
    };
    let fixed: String = value.chars().filter(|c| !c.is_whitespace()).collect();
    let mut problem = Problem::new(
        status,
        format!(
            "NCCL_IB_HCA={value:?} has entries with a space ({}): NCCL keeps the space, so they name no device{}",
            spaced
                .iter()
                .map(|e| format!("{e:?}"))
                .collect::<Vec<_>>()
                .join(", "),
            if dropped.is_empty() {
                String::new()
            } else {
                format!(" and NCCL leaves out {}", dropped.join(", "))
            }
        ),
        format!("Remove the spaces: NCCL_IB_HCA='{fixed}'."),
    );
    problem.evidence.push(p.ib.why.clone());
    Some(problem)
}

/// One entry: it names no device, or (as a prefix) more than the one meant.
fn entry_matches(value: &str, filter: &HcaFilter, entry: &str, names: &[&str]) -> Option<Problem> {
    let matched: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| filter.entry_matches(entry, n))
        .collect();
    if matched.is_empty() {
        Some(Problem::new(
            Severity::Warn,
            format!(
                "NCCL_IB_HCA entry {entry:?} names no RDMA device here (devices: {})",
                names.join(", ")
            ),
            "Name the devices /sys/class/infiniband lists, with '=' and ports: NCCL_IB_HCA='=mlx5_0:1,mlx5_1:1'.",
        ))
    } else if !filter.exact && matched.len() > 1 && !filter.exclude {
        Some(Problem::new(
            Severity::Warn,
            format!(
                "NCCL_IB_HCA entry {entry:?} is a prefix: it also matches {}",
                matched
                    .iter()
                    .filter(|m| *m != &entry)
                    .copied()
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            format!("Use exact names: NCCL_IB_HCA='={value}'"),
        ))
    } else {
        None
    }
}

/// The port an entry names, on every device it matches: present and ACTIVE.
fn entry_ports(filter: &HcaFilter, entry: &str, p: u32, devices: &[RdmaDevice]) -> Vec<Problem> {
    let mut out = Vec::new();
    for d in devices
        .iter()
        .filter(|d| filter.entry_matches(entry, &d.name))
    {
        match d.ports.iter().find(|x| x.port == p) {
            Some(x) if x.state.as_deref() != Some("ACTIVE") => out.push(Problem::new(
                Severity::Warn,
                format!(
                    "NCCL_IB_HCA names {}:{p}, which is {}",
                    d.name,
                    x.state.as_deref().unwrap_or("not ACTIVE")
                ),
                "Name only ACTIVE ports (rdma-devices lists them), or fix the link.",
            )),
            None => out.push(Problem::new(
                Severity::Warn,
                format!(
                    "NCCL_IB_HCA names port {p} of {}, which has no such port",
                    d.name
                ),
                "Ports count from 1; see /sys/class/infiniband/<dev>/ports.",
            )),
            _ => {}
        }
    }
    out
}

pub(super) fn lint_ib_hca(facts: &Facts, p: &Prediction) -> Vec<Problem> {
    let Some(value) = get(facts, "NCCL_IB_HCA") else {
        return Vec::new();
    };
    let filter = HcaFilter::parse(value);
    let devices = facts.rdma.devices.value().map(Vec::as_slice).unwrap_or(&[]);
    if devices.is_empty() {
        return Vec::new();
    }
    if let Some(problem) = spaced_entries(facts, value, &filter, p) {
        return vec![problem];
    }
    // A filter that leaves NCCL no port at all is the prediction's (prediction.rs).
    let leaves_nothing = p
        .inter_node
        .value
        .cause
        .as_ref()
        .and_then(|c| c.variable.as_deref())
        .is_some_and(|v| v.starts_with("NCCL_IB_HCA="));
    if leaves_nothing {
        return Vec::new();
    }
    let names: Vec<&str> = devices.iter().map(|d| d.name.as_str()).collect();
    let mut out = Vec::new();
    for (entry, port) in &filter.entries {
        out.extend(entry_matches(value, &filter, entry, &names));
        if let Some(port) = port {
            out.extend(entry_ports(&filter, entry, *port, devices));
        }
    }
    out
}

pub(super) fn lint_gid_index(facts: &Facts) -> Vec<Problem> {
    let mut out = Vec::new();
    if facts.nccl_env.contains_key("NCCL_IB_GID_INDEX")
        && crate::nccl::version(facts).is_some_and(|v| v >= crate::nccl::version::DYNAMIC_GID)
    {
        out.push(Problem::new(
            Severity::Warn,
            "NCCL_IB_GID_INDEX is set, but this NCCL (>= 2.21) picks the RoCE v2 GID itself; a fixed index breaks where the table differs".to_string(),
            "Unset NCCL_IB_GID_INDEX.",
        ));
    }
    out
}
