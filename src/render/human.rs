//! The human report: one aligned line per check, evidence and the fix under
//! every check that did not pass, the settings, and the verdict. Colour only
//! when asked (the caller decides: a terminal, and NO_COLOR unset).
//!
//! Every string that comes from the host or the user (names, values, hostnames,
//! evidence) goes through `visible`, and columns are padded by `pad`, never by a
//! `{:width$}` format: since Rust 1.87 the formatter panics on a width above
//! u16::MAX (release notes: "limit width and precision in format strings to 16
//! bits"), and an NCCL_* name or value, or a GPU name, can be that long.

use super::visible;
use crate::finding::{Fault, Finding, Status};
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

/// Appends `text` and then spaces up to `width` characters. Any width works:
/// this is the padding `{:width$}` does, without its u16 limit.
pub fn pad(out: &mut String, text: &str, width: usize) {
    out.push_str(text);
    let used = text.chars().count();
    out.extend(std::iter::repeat_n(' ', width.saturating_sub(used)));
}

/// The width in characters that `pad` measures.
pub fn width(text: &str) -> usize {
    text.chars().count()
}

/// Indents every line of `text` by `by` spaces.
fn indent(out: &mut String, text: &str, by: usize) {
    for line in text.lines() {
        pad(out, "", by);
        out.push_str(&visible(line));
        out.push('\n');
    }
}

/// One aligned line per finding; evidence and the fix under each that did not pass.
pub fn findings(out: &mut String, list: &[Finding], color: bool) {
    let id_width = list
        .iter()
        .map(|c| width(&visible(&c.id)))
        .max()
        .unwrap_or(0);
    let detail_pad = 6 + id_width + 2;
    for c in list {
        let label = paint(c.status().label(), c.status(), color);
        let ignored = if c.is_ignored() {
            " (failure ignored by --ignore)"
        } else {
            ""
        };
        out.push_str(&label);
        out.push_str("  ");
        pad(out, &visible(&c.id), id_width);
        let _ = writeln!(out, "  {}{ignored}", visible(&c.summary));
        if c.status() == Status::Pass || c.status() == Status::Skip {
            continue;
        }
        for e in &c.evidence {
            pad(out, "", detail_pad);
            let _ = writeln!(out, "- {}", visible(e));
        }
        if let Some(outcome) = c.outcome() {
            pad(out, "", detail_pad);
            let _ = writeln!(out, "NCCL: {}", visible(&outcome.describe()));
        }
        if let Some(fix) = &c.remediation() {
            pad(out, "", detail_pad);
            match c.blame() {
                Some(blame) => {
                    let _ = writeln!(out, "fix (blame: {}):", blame.label());
                }
                None => out.push_str("fix:\n"),
            }
            indent(out, fix, detail_pad + 2);
        }
    }
}

pub fn render(report: &Report, color: bool) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "nccl-preflight {} on {} (host root {})\n",
        report.tool_version,
        visible(report.hostname()),
        visible(&report.facts.host_root)
    );
    findings(&mut out, &report.checks, color);
    if !report.settings.is_empty() {
        out.push_str("\nNCCL settings (user values are kept, never overridden):\n");
        let rows: Vec<(String, String)> = report
            .settings
            .iter()
            .map(|s| {
                (
                    visible(&s.name).into_owned(),
                    format!("'{}'", s.value.escape_debug()),
                )
            })
            .collect();
        let name_w = rows.iter().map(|(n, _)| width(n)).max().unwrap_or(0);
        let value_w = rows.iter().map(|(_, v)| width(v)).max().unwrap_or(0);
        for (s, (name, value)) in report.settings.iter().zip(&rows) {
            let source = match s.source {
                Source::User => "user ",
                Source::Tuned => "tuned",
            };
            out.push_str("  ");
            pad(&mut out, name, name_w);
            out.push_str("  ");
            pad(&mut out, value, value_w);
            let _ = writeln!(out, "  {source}  {}", visible(&s.reason));
        }
    }
    let _ = writeln!(
        out,
        "\nVerdict: {} ({})",
        verdict_text(report.verdict, report.fault, color),
        report.count_text()
    );
    out
}

/// "FAIL, job fault: fix the job" or "PASS": the verdict with where its failures lie.
pub fn verdict_text(verdict: Status, fault: Fault, color: bool) -> String {
    let label = paint(verdict.label(), verdict, color);
    match fault.advice() {
        Some(advice) if verdict == Status::Fail => format!("{label}, {advice}"),
        _ => label,
    }
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
        assert!(
            text.contains("                fix (blame: job):\n"),
            "{text}"
        );
        assert!(
            text.ends_with(
                "Verdict: FAIL, job fault: fix the job (1 failed, 1 warning, 1 passed)\n"
            )
        );
        assert!(!text.contains('\x1b'));
    }

    #[test]
    fn colour_only_when_asked() {
        assert!(render(&report(), true).contains("\x1b[31;1mFAIL\x1b[0m"));
    }

    #[test]
    fn nccl_names_and_values_of_65534_bytes_do_not_panic() {
        // Issue 18: a 65,534-byte NCCL_* name or value panicked the report.
        for len in [65_534, 65_535, 70_000] {
            let mut r = report();
            r.settings[0].name = format!("NCCL_{}", "X".repeat(len));
            r.settings[1].value = "v".repeat(len);
            r.checks[0].id = "i".repeat(len);
            let text = render(&r, false);
            assert!(text.contains(&"v".repeat(len)), "value kept whole");
            let setting = text
                .lines()
                .find(|l| l.contains("NCCL_SOCKET_IFNAME"))
                .unwrap();
            // The short name is padded to the long one, so the columns still line up.
            assert!(setting.starts_with(&format!("  NCCL_SOCKET_IFNAME{}", " ".repeat(100))));
        }
    }

    #[test]
    fn control_characters_from_the_host_are_shown_not_sent() {
        let mut r = report();
        r.settings[1].value = "eth0\x1b[2J".into();
        r.settings[0].name = "NCCL_\x1b]0;pwned\x07".into();
        r.checks[0]
            .evidence
            .push("ifname \x1b[31mred\r\nPASS  forged".into());
        let text = render(&r, false);
        assert!(!text.contains('\x1b') && !text.contains('\x07') && !text.contains('\r'));
        assert!(
            text.contains("\\x1b[31mred\\x0d\\x0aPASS  forged"),
            "{text}"
        );
    }
}
