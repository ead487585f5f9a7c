//! The human report: one aligned line per check, evidence and the fix under
//! every check that did not pass, the settings, and the verdict. Colour only
//! when asked (the caller decides: a terminal, and NO_COLOR unset).

use crate::finding::{Finding, Status};
use crate::report::Report;
use crate::tune::Source;
use std::fmt::Write;

pub fn paint(text: &str, status: Status, color: bool) -> String {
    if !color {
        return text.to_string();
    }
    let code = match status {
        Status::Pass => "32",
        Status::Warn => "33",
        Status::Fail => "31;1",
        Status::Skip => "2",
    };
    format!("\x1b[{code}m{text}\x1b[0m")
}

/// Indents every line of `text` by `pad` spaces.
fn indent(text: &str, pad: usize) -> String {
    text.lines().map(|l| format!("{:pad$}{l}\n", "")).collect()
}

/// One aligned line per finding; evidence and the fix under each that did not pass.
pub fn findings(out: &mut String, list: &[Finding], color: bool) {
    let width = list.iter().map(|c| c.id.len()).max().unwrap_or(0);
    let detail_pad = 6 + width + 2;
    for c in list {
        let label = paint(c.status.label(), c.status, color);
        let ignored = if c.ignored {
            " (failure ignored by --ignore)"
        } else {
            ""
        };
        let _ = writeln!(out, "{label}  {:width$}  {}{ignored}", c.id, c.summary);
        if c.status == Status::Pass || c.status == Status::Skip {
            continue;
        }
        for e in &c.evidence {
            let _ = writeln!(out, "{:detail_pad$}- {e}", "");
        }
        if let Some(fix) = &c.remediation {
            let _ = writeln!(out, "{:detail_pad$}fix:", "");
            out.push_str(&indent(fix, detail_pad + 2));
        }
    }
}

pub fn render(report: &Report, color: bool) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "nccl-preflight {} on {} (host root {})\n",
        report.tool_version,
        report.hostname(),
        report.facts.host_root
    );
    findings(&mut out, &report.checks, color);
    if !report.settings.is_empty() {
        out.push_str("\nNCCL settings (user values are kept, never overridden):\n");
        let name_w = report
            .settings
            .iter()
            .map(|s| s.name.len())
            .max()
            .unwrap_or(0);
        let value_w = report
            .settings
            .iter()
            .map(|s| s.value.len() + 2)
            .max()
            .unwrap_or(0);
        for s in &report.settings {
            let source = match s.source {
                Source::User => "user ",
                Source::Tuned => "tuned",
            };
            let _ = writeln!(
                out,
                "  {:name_w$}  {:value_w$}  {source}  {}",
                s.name,
                format!("'{}'", s.value.escape_debug()),
                s.reason
            );
        }
    }
    let verdict = paint(report.verdict.label(), report.verdict, color);
    let _ = writeln!(out, "\nVerdict: {verdict} ({})", report.count_text());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::fixed_report::report;

    #[test]
    fn aligned_plain_text() {
        let text = render(&report(), false);
        assert!(
            text.contains("FAIL  dev-shm   /dev/shm is 64 MiB, below the 1 GiB minimum\n"),
            "{text}"
        );
        assert!(text.contains("PASS  host-ipc  host IPC namespace\n"));
        assert!(text.contains("                - size 64 MiB, free 64 MiB, required 1 GiB\n"));
        assert!(text.contains("                  emptyDir:\n"));
        assert!(text.contains("NCCL_SOCKET_IFNAME  '=eth0'  tuned  eth0 carries"));
        assert!(text.ends_with("Verdict: FAIL (1 failed, 1 warning, 1 passed)\n"));
        assert!(!text.contains('\x1b'));
    }

    #[test]
    fn colour_only_when_asked() {
        assert!(render(&report(), true).contains("\x1b[31;1mFAIL\x1b[0m"));
    }
}
