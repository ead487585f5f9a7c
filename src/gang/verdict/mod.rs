//! Judging what the gang brought back (pure): the consistency of the pods' records
//! (`consistency`), the pairwise schedule (`schedule`), the node x node matrix and
//! its straggler (`matrix`), gang-bandwidth (`bandwidth`) and the pods that left
//! while NCCL ran (`departures`).

pub(crate) mod bandwidth;
pub(crate) mod consistency;
pub(crate) mod departures;
pub(crate) mod matrix;
pub(crate) mod schedule;

/// "node 2 (job-worker-1)" for reports.
pub fn node_name(i: usize, names: &[String]) -> String {
    match names.get(i).filter(|n| !n.is_empty()) {
        Some(n) => format!("node {i} ({n})"),
        None => format!("node {i}"),
    }
}

/// Nodes by name, comma-separated.
pub(crate) fn list(nodes: &[usize], names: &[String]) -> String {
    nodes
        .iter()
        .map(|&i| node_name(i, names))
        .collect::<Vec<_>>()
        .join(", ")
}
