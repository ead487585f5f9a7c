//! nccl.conf, for NCCL_CONF_FILE: NCCL's own format (src/misc/param.cc).
//!
//! NCCL reads each line with fgets into 4096 bytes, skips lines starting with
//! `#` (2.22 and later; 2.21 has no comments and would turn a comment with `=` into
//! a variable, so comments here never contain `=`), splits at the first `=`,
//! keeps at most 1023 bytes of name and of value, does no unquoting, and applies
//! each with setenv(..., overwrite=0): the environment always wins. A value with a
//! newline, carriage return or NUL cannot be written; it is left out with a comment.
//!
//! Pointing NCCL_CONF_FILE here makes NCCL skip the file it read first until then (the
//! user's own NCCL_CONF_FILE or ~/.nccl.conf; src/misc/param.cc initEnvFunc, 2.23 and
//! later), so its values are carried over into this file: none is lost. /etc/nccl.conf
//! is still read after this file; the tune stage proposes nothing it or the environment
//! sets, so this file never contradicts them.

use super::{comment_text, is_env_name};
use crate::nccl::conf_file::ETC_CONF;
use crate::report::Report;
use crate::tune::Source;

/// NCCL keeps at most this many bytes of a name or a value.
const MAX_FIELD: usize = 1023;

fn conf_comment(text: &str) -> String {
    comment_text(text).replace('=', " is ")
}

/// Why `name=value` cannot be written to nccl.conf, if it cannot.
fn unrepresentable(name: &str, value: &str) -> Option<&'static str> {
    if !is_env_name(name) {
        Some("not a valid variable name")
    } else if name.starts_with("TORCH_") {
        // PyTorch reads these when it creates the process group, before ncclCommInit
        // applies nccl.conf (misc/param.cc initEnv).
        Some(
            "PyTorch reads it before NCCL reads nccl.conf: set it in the trainer's environment (the env file)",
        )
    } else if value.contains(['\n', '\r', '\0']) {
        Some("the value contains a line break or NUL, which nccl.conf cannot carry")
    } else if name.len() > MAX_FIELD || value.len() > MAX_FIELD {
        Some("longer than the 1023 bytes NCCL reads")
    } else {
        None
    }
}

pub fn render(report: &Report) -> String {
    let mut out = conf_comment(&format!(
        "# nccl-preflight {}: tuned NCCL settings for {}. Point NCCL_CONF_FILE here; values already in the environment win.",
        report.tool_version,
        report.hostname()
    ));
    out.push('\n');
    for (name, v) in &report.facts.nccl_env {
        let Some(from) = v.from.as_ref().filter(|f| f.path != ETC_CONF) else {
            continue;
        };
        if unrepresentable(name, &v.value).is_none() {
            out.push_str(&format!(
                "# carried over from {}: NCCL reads that file no longer once NCCL_CONF_FILE points here\n{name}={}\n",
                conf_comment(&from.to_string()),
                v.value
            ));
        }
    }
    for s in report.settings.iter().filter(|s| s.source == Source::Tuned) {
        if let Some(why) = unrepresentable(&s.name, &s.value) {
            out.push_str(&format!("# {} left out: {why}\n", conf_comment(&s.name)));
            continue;
        }
        out.push_str(&format!(
            "# {}\n{}={}\n",
            conf_comment(&s.reason),
            s.name,
            s.value
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::fixed_report::report;
    use crate::tune::Setting;

    #[test]
    fn lines_parse_the_way_nccl_parses_them() {
        let text = render(&report());
        assert!(text.contains("\nNCCL_SOCKET_IFNAME==eth0\n"));
        assert!(!text.contains("NCCL_DEBUG="));
        for line in text.lines() {
            if line.starts_with('#') {
                assert!(
                    !line.contains('='),
                    "comment with '=' would be a variable in NCCL 2.21: {line}"
                );
            } else {
                let (k, v) = line.split_once('=').unwrap();
                assert!(is_env_name(k) && v.len() <= MAX_FIELD);
            }
        }
    }

    #[test]
    fn unrepresentable_values_are_left_out() {
        let mut r = report();
        r.settings.push(Setting {
            name: "NCCL_X".into(),
            value: "a\nNCCL_P2P_DISABLE=1".into(),
            reason: "r".into(),
            source: Source::Tuned,
        });
        let text = render(&r);
        assert!(text.contains("# NCCL_X left out: the value contains a line break"));
        assert!(!text.contains("NCCL_P2P_DISABLE"));
        assert!(unrepresentable("NCCL_Y", &"x".repeat(2000)).is_some());
    }

    #[test]
    fn the_file_it_replaces_is_carried_over_and_etc_left_to_nccl() {
        use crate::facts::{EnvValue, FileLine};
        let mut r = report();
        let from = |path: &str| EnvValue {
            from: Some(FileLine {
                path: path.into(),
                line: 2,
            }),
            ..EnvValue::text("Ring")
        };
        r.facts
            .nccl_env
            .insert("NCCL_ALGO".into(), from("/root/.nccl.conf"));
        r.facts
            .nccl_env
            .insert("NCCL_PROTO".into(), from("/etc/nccl.conf"));
        let text = render(&r);
        assert!(
            text.contains("# carried over from /root/.nccl.conf line 2: NCCL reads that file no longer once NCCL_CONF_FILE points here\nNCCL_ALGO=Ring\n"),
            "{text}"
        );
        assert!(!text.contains("NCCL_PROTO"), "{text}");
    }
}
