//! The gang's human rendering: rank 0 prints the whole job (the consistency rows
//! that differ and a count of the rest, all-reduce busbw, the node x node matrix
//! up to 16 nodes, the straggler); other ranks print their own line and the job
//! verdict. JSON is the report (schema v1) with a `gang` object.

use super::GangRun;
use super::verdict::node_name;
use crate::finding::Status;
use crate::report::Report;
use std::fmt::Write;

/// The matrix is printed whole up to this many nodes; beyond, a summary.
const MATRIX_NODES: usize = 16;

/// Rank 0's gang section (after the local report).
pub fn job(run: &GangRun, verdict: Status, fault: crate::finding::Fault) -> String {
    let mut s = String::new();
    let id = &run.identity;
    let names = run.names();
    let gpus = run.bandwidth.as_ref().map(|b| b.local_gpus).unwrap_or(0);
    let _ = writeln!(
        s,
        "\nGang: {} node(s){}, root {} ({}), this is node {}",
        id.nodes,
        if gpus > 0 {
            format!(" x {gpus} GPU(s)")
        } else {
            String::new()
        },
        run.root_address.as_deref().unwrap_or(&id.root),
        id.launcher,
        id.node_rank
    );
    for f in &run.findings {
        let _ = writeln!(s, "  [{}] {}: {}", f.status().label(), f.id, f.summary);
    }
    consistency(&mut s, run, &names);
    if let Some(b) = &run.bandwidth {
        for row in &b.allreduce {
            let _ = writeln!(
                s,
                "All-reduce {}: busbw {:.2} GB/s, algbw {:.2} GB/s (slowest rank, {:.3} ms)",
                crate::units::format_bytes(row.bytes),
                row.busbw_gbps,
                row.algbw_gbps,
                row.seconds * 1e3
            );
        }
    }
    if !run.transports.is_empty() {
        let t: Vec<String> = run
            .transports
            .iter()
            .map(|(k, v)| format!("{k} x{v}"))
            .collect();
        let _ = writeln!(s, "Transports (this pod): {}", t.join(", "));
    }
    matrix(&mut s, run);
    if let Some(st) = &run.straggler {
        let _ = writeln!(
            s,
            "Straggler: {} (its links at {:.2} GB/s against the other links' median of {:.2} GB/s)",
            node_name(st.node, &names),
            st.mean_gbps,
            st.median_gbps
        );
    }
    let _ = writeln!(
        s,
        "Job verdict: {}",
        crate::render::human::verdict_text(verdict, fault, false)
    );
    s
}

/// The consistency rows that differ, with a count of those that agree.
fn consistency(s: &mut String, run: &GangRun, names: &[String]) {
    if run.rows.is_empty() {
        return;
    }
    // The same count as gang-consistency's: the records that came, the fields compared.
    let compared = run.rows.iter().filter(|r| r.note.is_none()).count();
    let differing: Vec<_> = run.rows.iter().filter(|r| r.differs()).collect();
    let _ = writeln!(
        s,
        "Consistency: {} node(s) agree on {} of {} fields",
        run.fingerprints.iter().filter(|f| f.is_some()).count(),
        compared - differing.iter().filter(|r| r.note.is_none()).count(),
        compared
    );
    for r in &differing {
        let values: Vec<String> = r
            .values
            .iter()
            .enumerate()
            .map(|(i, v)| format!("{}={}", node_name(i, names), crate::render::visible(v)))
            .collect();
        let note = r
            .note
            .as_deref()
            .map_or(String::new(), |n| format!(" (not compared: {n})"));
        let _ = writeln!(s, "  {}: {}{note}", r.field, values.join(", "));
    }
}

/// The node x node matrix, whole up to MATRIX_NODES nodes, summarised beyond.
fn matrix(s: &mut String, run: &GangRun) {
    let n = run.matrix.len();
    if n < 2 {
        return;
    }
    let _ = writeln!(
        s,
        "Node x node send/recv, GB/s ({} each way per pairwise exchange):",
        crate::units::format_bytes(run.p2p_bytes)
    );
    if n <= MATRIX_NODES {
        let _ = write!(s, "     ");
        for j in 0..n {
            let _ = write!(s, "{j:>8}");
        }
        let _ = writeln!(s);
        for (i, row) in run.matrix.iter().enumerate() {
            let _ = write!(s, "{i:>5}");
            for v in row {
                match v {
                    Some(v) => {
                        let _ = write!(s, "{v:>8.2}");
                    }
                    None => {
                        let _ = write!(s, "{:>8}", "-");
                    }
                }
            }
            let _ = writeln!(s);
        }
    } else {
        let all = super::verdict::matrix::links(&run.matrix);
        let min = all.iter().copied().fold(f64::INFINITY, f64::min);
        let max = all.iter().copied().fold(0.0, f64::max);
        let _ = writeln!(
            s,
            "  {n} nodes, {} links: min {min:.2}, median {:.2}, max {max:.2} (--format json has every link)",
            all.len(),
            super::verdict::matrix::median(&run.matrix).unwrap_or(0.0)
        );
    }
}

/// A non-root rank's line.
pub fn own_line(run: &GangRun, report: &Report) -> String {
    let names = run.names();
    let failed: Vec<String> = report
        .checks
        .iter()
        .filter(|c| c.status() == Status::Fail)
        .map(|c| format!("{}: {}", c.id, crate::render::visible(&c.summary)))
        .collect();
    format!(
        "gang: {} of {}: {}{}\n",
        node_name(run.identity.node_rank as usize, &names),
        run.identity.nodes,
        format_args!(
            "job verdict {}",
            crate::render::human::verdict_text(report.verdict, report.fault, false)
        ),
        if failed.is_empty() {
            String::new()
        } else {
            format!(" ({})", failed.join("; "))
        }
    )
}

/// The JSON report with the gang object.
pub fn json(report: &Report, run: &GangRun) -> String {
    let mut value = serde_json::to_value(report).unwrap_or(serde_json::Value::Null);
    if let serde_json::Value::Object(map) = &mut value {
        map.insert(
            "gang".to_string(),
            serde_json::to_value(run).unwrap_or(serde_json::Value::Null),
        );
    }
    let mut text = serde_json::to_string_pretty(&value).unwrap_or_default();
    text.push('\n');
    text
}
