//! The env file: POSIX sh, sourceable by sh and bash. Sorted; each tuned value
//! as `export NAME='value'` after a `#` comment with its reason. Values are
//! single-quoted (a `'` inside becomes `'\''`), so no byte of a value can run as
//! shell. User-set variables are listed in comments only: they are already in
//! the environment, and writing them would override a different value the
//! training container may set.

use super::{comment_text, is_env_name};
use crate::report::Report;
use crate::tune::Source;

/// Quotes `value` for POSIX sh.
pub fn shell_quote(value: &str) -> String {
    format!("'{}'", value.replace('\'', "'\\''"))
}

pub fn render(report: &Report) -> String {
    let mut out = format!(
        "# nccl-preflight {}: tuned NCCL environment for {} (verdict: {}).\n# Source it before the launcher starts: . /path/to/this/file\n",
        report.tool_version,
        comment_text(report.hostname()),
        report.verdict.label().to_lowercase()
    );
    for s in report.settings.iter().filter(|s| s.source == Source::User) {
        out.push_str(&format!(
            "# {} is set by the user and left as is\n",
            comment_text(&s.name)
        ));
    }
    for s in report.settings.iter().filter(|s| s.source == Source::Tuned) {
        if !is_env_name(&s.name) || s.value.contains('\0') {
            out.push_str(&format!(
                "# skipped {}: not a valid variable\n",
                comment_text(&s.name)
            ));
            continue;
        }
        out.push_str(&format!("# {}\n", comment_text(&s.reason)));
        out.push_str(&format!("export {}={}\n", s.name, shell_quote(&s.value)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::fixed_report::report;
    use crate::tune::Setting;

    #[test]
    fn exports_tuned_values_only() {
        let text = render(&report());
        assert!(text.contains("export NCCL_SOCKET_IFNAME='=eth0'\n"));
        assert!(text.contains("# NCCL_DEBUG is set by the user and left as is\n"));
        assert!(!text.contains("export NCCL_DEBUG"));
        for line in text.lines() {
            assert!(
                line.starts_with('#') || line.starts_with("export "),
                "{line}"
            );
        }
    }

    #[test]
    fn hostile_values_stay_quoted() {
        let mut r = report();
        r.settings.push(Setting {
            name: "NCCL_X".into(),
            value: "a'b$(touch /tmp/pwn)`id`\nc".into(),
            reason: "line one\nexport EVIL=1".into(),
            source: Source::Tuned,
        });
        r.settings.push(Setting {
            name: "BAD NAME".into(),
            value: "x".into(),
            reason: "r".into(),
            source: Source::Tuned,
        });
        let text = render(&r);
        assert!(text.contains("export NCCL_X='a'\\''b$(touch /tmp/pwn)`id`\nc'\n"));
        assert!(text.contains("# line one?export EVIL=1\n"));
        assert!(text.contains("# skipped BAD NAME"));
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
    }
}
