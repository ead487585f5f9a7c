//! NCCL_IB_HCA against the RDMA devices and ports this node has, and
//! NCCL_IB_GID_INDEX on NCCL versions that choose the GID themselves.

use super::{Problem, get};
use crate::facts::Facts;
use crate::facts::rdma::RdmaDevice;
use crate::finding::Outcome;
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
    let status = if dropped.is_empty() {
        Outcome::Unaffected
    } else {
        crate::judge::across_nodes(facts, fewer_hcas(&dropped.join(", ")))
    };
    let fixed: String = value.chars().filter(|c| !c.is_whitespace()).collect();
    let mut problem = Problem::predicts(
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

/// What NCCL leaving out HCAs the value meant does: the job's traffic on the others.
fn fewer_hcas(left_out: &str) -> Outcome {
    Outcome::degraded(
        format!("the other HCAs, without {left_out}"),
        "the left-out HCAs' share of the node's network bandwidth",
    )
}

/// One entry: it names no device, or (as a prefix) more than the one meant.
fn entry_matches(value: &str, filter: &HcaFilter, entry: &str, names: &[&str]) -> Option<Problem> {
    let matched: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| filter.entry_matches(entry, n))
        .collect();
    if matched.is_empty() {
        // ncclIbInitDevices matches devices against the list: an entry that names none
        // adds none and takes none away (a filter leaving no port is the prediction's).
        Some(Problem::predicts(
            Outcome::Unaffected,
            format!(
                "NCCL_IB_HCA entry {entry:?} names no RDMA device here (devices: {})",
                names.join(", ")
            ),
            "Name the devices /sys/class/infiniband lists, with '=' and ports: NCCL_IB_HCA='=mlx5_0:1,mlx5_1:1'.",
        ))
    } else if !filter.exact && matched.len() > 1 && !filter.exclude {
        Some(Problem::predicts(
            Outcome::undetermined(format!(
                "whether the HCAs {entry:?} also matches reach the other nodes: NCCL uses every one"
            )),
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
fn entry_ports(
    facts: &Facts,
    (filter, entry, p): (&HcaFilter, &str, u32),
    devices: &[RdmaDevice],
) -> Vec<Problem> {
    let mut out = Vec::new();
    for d in devices
        .iter()
        .filter(|d| filter.entry_matches(entry, &d.name))
    {
        match d.ports.iter().find(|x| x.port == p) {
            // ncclIbInitDevices skips a port that is not ACTIVE.
            Some(x) if x.state.as_deref() != Some("ACTIVE") => out.push(Problem::predicts(
                crate::judge::across_nodes(facts, fewer_hcas(&format!("{}:{p}", d.name))),
                format!(
                    "NCCL_IB_HCA names {}:{p}, which is {}",
                    d.name,
                    x.state.as_deref().unwrap_or("not ACTIVE")
                ),
                "Name only ACTIVE ports (rdma-devices lists them), or fix the link.",
            )),
            None => out.push(Problem::predicts(
                crate::judge::across_nodes(facts, fewer_hcas(&format!("{}:{p}", d.name))),
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
            out.extend(entry_ports(facts, (&filter, entry, *port), devices));
        }
    }
    out
}

pub(super) fn lint_gid_index(facts: &Facts) -> Vec<Problem> {
    let mut out = Vec::new();
    if facts.nccl_env.contains_key("NCCL_IB_GID_INDEX")
        && crate::nccl::version(facts).is_some_and(|v| v >= crate::nccl::version::DYNAMIC_GID)
    {
        // ncclIbGetGidIndex still takes the user's index first: a GID that does not
        // route is the prediction's lint (lint_gid); one that does changes nothing.
        out.push(Problem::predicts(
            Outcome::Unaffected,
            "NCCL_IB_GID_INDEX is set, but this NCCL (>= 2.21) picks the RoCE v2 GID itself; a fixed index breaks where the table differs".to_string(),
            "Unset NCCL_IB_GID_INDEX.",
        ));
    }
    out
}
