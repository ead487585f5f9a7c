//! The bench report for people: the GPUs, one line per peer direction, one per
//! all-reduce size, the findings and the verdict.

use super::BenchReport;
use super::P2pSection;
use super::nccl::NcclResult;
use crate::units::format_bytes;
use std::fmt::Write;

fn pct(f: Option<f64>) -> String {
    f.map(|f| format!("{:>4.0}%", f * 100.0))
        .unwrap_or_else(|| String::from("    -"))
}

fn gb(v: Option<f64>) -> String {
    v.map(|v| format!("{v:>7.1}"))
        .unwrap_or_else(|| format!("{:>7}", "-"))
}

pub fn human(report: &BenchReport, color: bool) -> String {
    let mut out = String::new();
    let gpus: Vec<String> = report
        .gpus
        .iter()
        .map(|g| format!("GPU{} {}", g.ordinal, g.pci_bus_id))
        .collect();
    let _ = writeln!(
        out,
        "nccl-preflight bench: {} GPU(s){}{}\n",
        gpus.len(),
        if gpus.is_empty() { "" } else { ": " },
        gpus.join(", ")
    );
    if let Some(p2p) = report.p2p.as_ref().filter(|p| !p.pairs.is_empty()) {
        peer_copies(&mut out, p2p);
    }
    if let Some(n) = &report.nccl {
        all_reduce(&mut out, n);
    }
    crate::render::human::findings(&mut out, &report.findings, color);
    if report.verdict == crate::finding::Status::Skip {
        let _ = writeln!(
            out,
            "\nNOTHING MEASURED: {}",
            report
                .findings
                .iter()
                .map(|f| format!("{}: {}", f.id, f.summary))
                .collect::<Vec<_>>()
                .join("; ")
        );
        return out;
    }
    let _ = writeln!(
        out,
        "\n{} in {:.2} s (budget {} s, threshold {:.0}% of the link)",
        crate::render::human::verdict_text(report.verdict, report.fault, color),
        report.wall_seconds,
        report.budget_seconds,
        report.min_bandwidth_fraction * 100.0
    );
    out
}

/// One line per peer direction: one-way and both-ways GB/s against the link.
fn peer_copies(out: &mut String, p2p: &P2pSection) {
    let _ = writeln!(
        out,
        "peer copies ({} x {} per measurement, GB/s = 10^9 B/s):",
        p2p.iterations,
        format_bytes(p2p.buffer_bytes)
    );
    let _ = writeln!(
        out,
        "  {:<14} {:>7} {:>5}  {:>7} {:>5}  {:<9} link",
        "pair", "one-way", "", "both", "", "data"
    );
    for row in &p2p.pairs {
        let m = &row.measured;
        let data = match (m.verified, &m.error, m.peer_access) {
            (_, Some(_), _) => "error",
            (_, None, false) => "no peer",
            (Some(true), ..) => "verified",
            (Some(false), ..) => "CORRUPT",
            (None, ..) => "-",
        };
        let link = match (&row.expected_basis, row.expected_gbps) {
            (Some(b), Some(g)) => format!("{b} = {g:.1} GB/s"),
            _ => String::from("unknown"),
        };
        let _ = writeln!(
            out,
            "  {:<14} {} {}  {} {}  {:<9} {link}",
            format!("GPU{} -> GPU{}", m.src, m.dst),
            gb(m.unidirectional_gbps),
            pct(row.unidirectional_fraction),
            gb(m.bidirectional_gbps),
            pct(row.bidirectional_fraction),
            data
        );
    }
    out.push('\n');
}

/// One line per all-reduce size, then the transports NCCL logged.
fn all_reduce(out: &mut String, n: &NcclResult) {
    let _ = writeln!(
        out,
        "NCCL all-reduce ({}, {}, {} GPUs, float32 sum, {} iterations):",
        n.library,
        n.version.as_deref().unwrap_or("version unknown"),
        n.gpus,
        n.sizes.first().map(|s| s.iterations).unwrap_or(0)
    );
    let _ = writeln!(
        out,
        "  {:>10} {:>11} {:>9} {:>9}  result",
        "size", "time (us)", "algbw", "busbw"
    );
    for s in &n.sizes {
        let _ = writeln!(
            out,
            "  {:>10} {:>11.1} {:>9.1} {:>9.1}  {}",
            format_bytes(s.bytes),
            s.time_us,
            s.algbw_gbps,
            s.busbw_gbps,
            if s.verified { "verified" } else { "WRONG" }
        );
    }
    if !n.transports.is_empty() {
        let list: Vec<String> = n
            .transports
            .iter()
            .map(|(t, c)| format!("{t} x{c}"))
            .collect();
        let _ = writeln!(out, "  transports (NCCL's log): {}", list.join(", "));
    }
    out.push('\n');
}
