//! explain-log's human view: versions, plugins and networks, communicators,
//! transports with counts, settings that reached NCCL, then the findings.
//! Every string taken from the log goes through `visible`: a log can hold
//! terminal escape sequences, and they must not reach the reader's terminal.

use super::human::{findings, paint};
use super::visible;
use crate::explain::Explanation;
use crate::explain::summary::LogSummary;
use crate::finding::Finding;
use std::fmt::Write;

/// The items, shown visibly and joined; `empty` when there are none.
fn list_or<'a>(items: impl IntoIterator<Item = &'a String>, empty: &str) -> String {
    let v: Vec<String> = items.into_iter().map(|i| visible(i).into_owned()).collect();
    if v.is_empty() {
        empty.into()
    } else {
        v.join(", ")
    }
}

fn list<'a>(items: impl IntoIterator<Item = &'a String>) -> String {
    list_or(items, "none")
}

/// A finding with its log-derived texts made visible.
fn visible_finding(f: &Finding) -> Finding {
    let mut f = f.clone();
    f.summary = visible(&f.summary).into_owned();
    for e in &mut f.evidence {
        *e = visible(e).into_owned();
    }
    // Keep the line breaks the rule wrote; escape everything else.
    f.map_remediation(|r| {
        r.split('\n')
            .map(|l| visible(l).into_owned())
            .collect::<Vec<_>>()
            .join("\n")
    })
}

/// Context lines shown in the text view.
const CONTEXT_LINES: usize = 8;

pub fn render(e: &Explanation, color: bool) -> String {
    let s = &e.summary;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "nccl-preflight explain-log {}: {} lines, {} from NCCL{}{}{}\n",
        visible(&e.input),
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
        s.encoding
            .as_deref()
            .map(|e| format!(", decoded from {e}"))
            .unwrap_or_default(),
    );
    libraries(&mut out, s);
    communicators(&mut out, s);
    transports(&mut out, s);
    out.push('\n');
    if e.findings.is_empty() {
        out.push_str("No problems found.\n");
    } else {
        let shown: Vec<Finding> = e.findings.iter().map(visible_finding).collect();
        findings(&mut out, &shown, color);
    }
    if !e.context.is_empty() {
        // Named as context: echoes of the first failure and WARNs of healthy runs.
        let _ = writeln!(out, "\nContext (not failures):");
        for c in e.context.iter().take(CONTEXT_LINES) {
            let _ = writeln!(out, "  {}", visible(c));
        }
        if e.context.len() > CONTEXT_LINES {
            let _ = writeln!(
                out,
                "  ... {} more (--format json lists them)",
                e.context.len() - CONTEXT_LINES
            );
        }
    }
    let _ = writeln!(
        out,
        "\nVerdict: {}",
        paint(e.verdict.label(), e.verdict, color)
    );
    out
}

/// Versions, network, net plugins, aws-ofi-nccl and the devices NCCL named.
fn libraries(out: &mut String, s: &LogSummary) {
    let absent = "not in the log";
    let _ = writeln!(out, "NCCL:          {}", list_or(&s.nccl_versions, absent));
    let _ = writeln!(
        out,
        "CUDA driver:   {}",
        list_or(&s.cuda_driver_versions, absent)
    );
    let _ = writeln!(out, "Network:       {}", list_or(&s.networks, absent));
    // Only what the log said: "failed: none" beside a plugin failure misleads.
    let plugins: Vec<String> = [
        ("loaded", &s.plugins.loaded),
        ("from", &s.plugins.paths),
        ("initialized", &s.plugins.initialized),
        ("failed", &s.plugins.failed),
        ("not found", &s.plugins.not_found),
    ]
    .into_iter()
    .filter(|(_, v)| !v.is_empty())
    .map(|(k, v)| format!("{k}: {}", list(v)))
    .collect();
    let _ = writeln!(
        out,
        "Net plugins:   {}",
        if plugins.is_empty() {
            absent.to_string()
        } else {
            plugins.join("; ")
        }
    );
    if !s.ofi.versions.is_empty() || !s.ofi.platforms.is_empty() {
        let _ = writeln!(
            out,
            "aws-ofi-nccl:  {}{}",
            list_or(&s.ofi.versions, "version not in the log"),
            if s.ofi.platforms.is_empty() {
                String::new()
            } else {
                format!(" on {}", list(&s.ofi.platforms))
            }
        );
    }
    if !s.ib_devices.is_empty() {
        let _ = writeln!(out, "IB devices:    {}", list(&s.ib_devices));
    }
    if !s.socket_interfaces.is_empty() {
        let _ = writeln!(out, "Socket:        {}", list(&s.socket_interfaces));
    }
}

/// One line per communicator, then the settings that reached NCCL.
fn communicators(out: &mut String, s: &LogSummary) {
    for (id, c) in &s.communicators {
        let hosts: std::collections::BTreeSet<&str> =
            c.ranks.values().filter_map(|r| r.host.as_deref()).collect();
        let _ = writeln!(
            out,
            "Communicator {}: {} ranks ({} seen), {} node(s) per NCCL, hosts {}{}",
            visible(id),
            c.ranks_total.map_or("?".into(), |n| n.to_string()),
            c.ranks_seen,
            c.nodes.map_or("?".into(), |n| n.to_string()),
            if hosts.is_empty() {
                "?".to_string()
            } else {
                visible(&hosts.into_iter().collect::<Vec<_>>().join(", ")).into_owned()
            },
            if c.ranks_seen > c.ranks.len() as u64 {
                format!(" (of the first {} ranks)", c.ranks.len())
            } else {
                String::new()
            }
        );
    }
    if !s.settings.is_empty() {
        out.push_str("Settings that reached NCCL:\n");
        for (k, v) in &s.settings {
            let _ = writeln!(
                out,
                "  {}={}",
                visible(k),
                visible(&v.iter().cloned().collect::<Vec<_>>().join(" | "))
            );
        }
    }
}

/// The transports' connection counts, or why there are none.
fn transports(out: &mut String, s: &LogSummary) {
    if s.transport_counts.is_empty() {
        // A job that failed before connecting prints no connection lines; that
        // is no logging mistake. Only a log without any WARN hints at one.
        if s.info_lines == 0 && s.warnings.is_empty() {
            out.push_str("Transports:    not in the log (no NCCL INFO lines: run the job with NCCL_DEBUG=INFO to see them)\n");
        } else if s.warnings.is_empty() {
            out.push_str("Transports:    no connection lines (the job stopped before NCCL connected its ranks, or NCCL_DEBUG_SUBSYS left out INIT)\n");
        } else {
            out.push_str("Transports:    none: the log ends before NCCL connected its ranks (see the WARN findings)\n");
        }
    } else {
        out.push_str("Transports (connection lines):\n");
        // Padding by hand: a runtime `{:width$}` above 65,535 panics, and names come from logs.
        let shown: Vec<(std::borrow::Cow<str>, &u64)> = s
            .transport_counts
            .iter()
            .map(|(t, n)| (visible(t), n))
            .collect();
        let width = shown
            .iter()
            .map(|(t, _)| crate::render::human::width(t))
            .max()
            .unwrap_or(0);
        for (t, n) in &shown {
            out.push_str("  ");
            crate::render::human::pad(out, t, width);
            let _ = writeln!(out, "  {n}");
        }
        if !s.transport_appended.is_empty() {
            let _ = writeln!(
                out,
                "  (text a build appended after NCCL's transport names, left out above: {})",
                list(&s.transport_appended)
            );
        }
        if s.proxied_connections > 0 {
            let _ = writeln!(
                out,
                "  ({} through a proxy rank, PXN)",
                s.proxied_connections
            );
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn regression_a_transport_name_past_65535_characters_does_not_panic() {
        let mut e = crate::explain::explain(
            "h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC\n".as_bytes(),
            "log",
        )
        .unwrap();
        let long = format!("NET/{}", "x".repeat(70_000));
        e.summary.transport_counts.insert(long.clone(), 3);
        let text = super::render(&e, false);
        assert!(
            text.contains(&format!("{long}  3")),
            "the long name is printed whole"
        );
        assert!(text.contains("P2P/IPC"));
    }
}
