//! NCCL_IB_HCA against the RDMA devices and ports this node has, and
//! NCCL_IB_GID_INDEX on NCCL versions that choose the GID themselves.

use super::{Problem, get};
use crate::facts::Facts;
use crate::facts::rdma::RdmaDevice;
use crate::finding::Severity;
use crate::nccl::ib_hca::HcaFilter;

/// An include list none of whose entries names a device leaves NCCL's IB transport with
/// nothing ("NET/IB : No device found"): NCCL falls back to TCP sockets, which fails a
/// multi-node job's bandwidth, while one node never uses the network.
fn nothing_matches(
    facts: &Facts,
    value: &str,
    filter: &HcaFilter,
    names: &[&str],
) -> Option<Problem> {
    let nothing = !filter.exclude
        && !filter.entries.is_empty()
        && filter
            .entries
            .iter()
            .all(|(entry, _)| !names.iter().any(|n| filter.entry_matches(entry, n)));
    if !nothing {
        return None;
    }
    let multi = crate::layout::is_multi_node(&facts.launcher);
    Some(Problem::new(
        if multi {
            Severity::Fail
        } else {
            Severity::Warn
        },
        format!(
            "NCCL_IB_HCA={value:?} names no RDMA device here: NCCL finds no HCA and uses TCP sockets{}",
            if multi {
                " between the job's nodes"
            } else {
                " (this job runs on one node)"
            }
        ),
        format!(
            "Name the devices /sys/class/infiniband lists, with '=' and ports, e.g. NCCL_IB_HCA='={}:1', or unset it.",
            names.first().copied().unwrap_or("mlx5_0")
        ),
    ))
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

pub(super) fn lint_ib_hca(facts: &Facts) -> Vec<Problem> {
    let Some(value) = get(facts, "NCCL_IB_HCA") else {
        return Vec::new();
    };
    let filter = HcaFilter::parse(value);
    let devices = facts.rdma.devices.value().map(Vec::as_slice).unwrap_or(&[]);
    if devices.is_empty() {
        return Vec::new();
    }
    let names: Vec<&str> = devices.iter().map(|d| d.name.as_str()).collect();
    if let Some(p) = nothing_matches(facts, value, &filter, &names) {
        return vec![p];
    }
    let mut out = Vec::new();
    for (entry, port) in &filter.entries {
        out.extend(entry_matches(value, &filter, entry, &names));
        if let Some(p) = port {
            out.extend(entry_ports(&filter, entry, *p, devices));
        }
    }
    out
}

pub(super) fn lint_gid_index(facts: &Facts) -> Vec<Problem> {
    let mut out = Vec::new();
    if facts.nccl_env.contains_key("NCCL_IB_GID_INDEX")
        && crate::nccl::version(facts).is_some_and(|v| v >= (2, 21, 0))
    {
        out.push(Problem::new(
            Severity::Warn,
            "NCCL_IB_GID_INDEX is set, but this NCCL (>= 2.21) picks the RoCE v2 GID itself; a fixed index breaks where the table differs".to_string(),
            "Unset NCCL_IB_GID_INDEX.",
        ));
    }
    out
}
