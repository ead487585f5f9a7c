//! explain-log's human view: versions, plugins and networks, communicators,
//! transports with counts, settings that reached NCCL, then the findings.

use super::human::{findings, paint};
use crate::explain::Explanation;
use std::fmt::Write;

fn list<'a>(items: impl IntoIterator<Item = &'a String>) -> String {
    let v: Vec<&str> = items.into_iter().map(String::as_str).collect();
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

pub fn render(e: &Explanation, color: bool) -> String {
    let s = &e.summary;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "nccl-preflight explain-log {}: {} lines, {} from NCCL{}{}\n",
        e.input,
        s.lines,
        s.nccl_lines,
        if s.truncated_lines > 0 {
            format!(", {} too long (read in part)", s.truncated_lines)
        } else {
            String::new()
        },
        if s.non_utf8_lines > 0 {
            format!(", {} not UTF-8", s.non_utf8_lines)
        } else {
            String::new()
        },
    );
    let _ = writeln!(out, "NCCL:          {}", list(&s.nccl_versions));
    let _ = writeln!(out, "CUDA driver:   {}", list(&s.cuda_driver_versions));
    let _ = writeln!(out, "Network:       {}", list(&s.networks));
    let _ = writeln!(
        out,
        "Net plugins:   not found: {}; failed: {}; initialized: {}{}",
        list(&s.plugins.not_found),
        list(&s.plugins.failed),
        list(&s.plugins.initialized),
        if s.plugins.loaded.is_empty() {
            String::new()
        } else {
            format!("; loaded: {}", list(&s.plugins.loaded))
        }
    );
    if !s.ib_devices.is_empty() {
        let _ = writeln!(out, "IB devices:    {}", list(&s.ib_devices));
    }
    if !s.socket_interfaces.is_empty() {
        let _ = writeln!(out, "Socket:        {}", list(&s.socket_interfaces));
    }
    for (id, c) in &s.communicators {
        let hosts: std::collections::BTreeSet<&str> =
            c.ranks.values().filter_map(|r| r.host.as_deref()).collect();
        let _ = writeln!(
            out,
            "Communicator {id}: {} ranks ({} seen), {} node(s) per NCCL, hosts {}",
            c.ranks_total.map_or("?".into(), |n| n.to_string()),
            c.ranks.len(),
            c.nodes.map_or("?".into(), |n| n.to_string()),
            if hosts.is_empty() {
                "?".to_string()
            } else {
                hosts.into_iter().collect::<Vec<_>>().join(", ")
            }
        );
    }
    if !s.settings.is_empty() {
        out.push_str("Settings that reached NCCL:\n");
        for (k, v) in &s.settings {
            let _ = writeln!(
                out,
                "  {k}={}",
                v.iter().cloned().collect::<Vec<_>>().join(" | ")
            );
        }
    }
    if s.transport_counts.is_empty() {
        out.push_str("Transports: no connection lines (NCCL_DEBUG=INFO with the INIT subsystem prints them)\n");
    } else {
        out.push_str("Transports (connection lines):\n");
        let width = s
            .transport_counts
            .keys()
            .map(String::len)
            .max()
            .unwrap_or(0);
        for (t, n) in &s.transport_counts {
            let _ = writeln!(out, "  {t:width$}  {n}");
        }
        if s.proxied_connections > 0 {
            let _ = writeln!(
                out,
                "  ({} through a proxy rank, PXN)",
                s.proxied_connections
            );
        }
    }
    out.push('\n');
    if e.findings.is_empty() {
        out.push_str("No problems found.\n");
    } else {
        findings(&mut out, &e.findings, color);
    }
    let _ = writeln!(
        out,
        "\nVerdict: {}",
        paint(e.verdict.label(), e.verdict, color)
    );
    out
}
