//! `probe --npd`: the answer of a node-problem-detector custom plugin.
//!
//! NPD's contract (kubernetes/node-problem-detector v1.37.0-alpha.1,
//! pkg/custompluginmonitor/plugin/plugin.go `run`, docs/custom_plugin_monitor.md): the
//! plugin's exit code is the status (0 OK, 1 NonOK, anything else Unknown) and its
//! standard output, trimmed and cut at `max_output_length` bytes (default 80, config.go
//! `defaultMaxOutputLength`), is the node condition's message. So a failed check is 1
//! whoever is to blame (on a node, a failure is the node's condition), a tool that could
//! not run, or a run that could read nothing, is 2, and the line is made to fit: the
//! failed check ids first (short, and what an alert or a human greps for), then as much
//! of the first failure's summary as fits.
//! `probe` without `--npd` answers from the same parts (the ok line, the failed checks,
//! the escape), with every failed check's summary and no cut.

use crate::finding::{Finding, Status};
use crate::report::Report;

/// NPD's `max_output_length` default.
pub const DEFAULT_MAX_OUTPUT: usize = 80;
/// NPD's statuses, as exit codes.
const NPD_OK: u8 = 0;
const NPD_NON_OK: u8 = 1;
const NPD_UNKNOWN: u8 = 2;

/// `probe`'s own line (without `--npd`): every failed check with its summary, or the
/// counts when none failed; not cut to a length, unlike NPD's.
pub fn probe_line(report: &Report) -> String {
    if report.verdict != Status::Fail {
        return ok_line(report);
    }
    let list: Vec<String> = failed(report)
        .map(|c| format!("{}: {}", c.id, one_line(&c.summary)))
        .collect();
    format!("fail: {}", list.join("; "))
}

fn ok_line(report: &Report) -> String {
    let (_, warned, passed, _) = report.counts();
    format!("ok: {passed} passed, {warned} warning(s)")
}

fn failed(report: &Report) -> impl Iterator<Item = &Finding> {
    report.checks.iter().filter(|c| c.status() == Status::Fail)
}

/// The exit code and the one line (no newline) for a finished run.
pub fn answer(report: &Report, max: usize) -> (u8, String) {
    if let Some(line) = nothing_read(report) {
        return (NPD_UNKNOWN, fit(&line, max));
    }
    if report.verdict != Status::Fail {
        return (NPD_OK, fit(&ok_line(report), max));
    }
    let failed: Vec<_> = failed(report).collect();
    let ids: Vec<&str> = failed.iter().map(|c| c.id.as_str()).collect();
    let first = failed.first().map(|c| c.summary.as_str()).unwrap_or("");
    let line = format!("fail: {}: {}", ids.join(", "), one_line(first));
    (NPD_NON_OK, fit(&line, max))
}

/// The line for a run that failed nothing but read nothing either: every check that
/// judged something (did not skip) could not determine it (issue 39 row 4: the
/// `unreadable` fixture answered `ok`, and NPD marked the condition healthy). NPD's
/// Unknown, with the checks and the first one's reason.
fn nothing_read(report: &Report) -> Option<String> {
    let judged: Vec<&Finding> = report
        .checks
        .iter()
        .filter(|c| c.status() != Status::Skip)
        .collect();
    let first = judged.first()?;
    if report.verdict == Status::Fail || !judged.iter().all(|c| c.is_undetermined()) {
        return None;
    }
    let ids: Vec<&str> = judged.iter().map(|c| c.id.as_str()).collect();
    Some(format!(
        "unknown: nothing could be read: {}: {}",
        ids.join(", "),
        one_line(&first.summary)
    ))
}

/// The exit code and the line for a run that could not happen (bad flags, unreadable input).
pub fn unknown(error: &anyhow::Error, max: usize) -> (u8, String) {
    (
        NPD_UNKNOWN,
        fit(
            &format!("unknown: {}", one_line(&format!("{error:#}"))),
            max,
        ),
    )
}

/// Text from the host or the checks on one line, safe for a terminal and a node
/// condition: line breaks become spaces, other control characters visible escapes.
/// Not `render::comment_text`, which turns every control character into `?` for the
/// files and the termination message: a probe's line is read where `\x1b` says more.
fn one_line(text: &str) -> String {
    let flat: String = text
        .chars()
        .map(|c| if c == '\n' || c == '\r' { ' ' } else { c })
        .collect();
    super::visible(&flat).into_owned()
}

/// `text` cut to at most `max` bytes on a character boundary, ending in `...` when cut,
/// so NPD never has to cut it (its cut is by bytes, and can split a character).
pub fn fit(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max.saturating_sub(3);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", text[..end].trim_end())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::finding::{Finding, Status};

    fn report(findings: Vec<Finding>) -> Report {
        let mut report = crate::render::fixed_report::report();
        let failed = findings.iter().any(|c| c.status() == Status::Fail);
        report.verdict = if failed { Status::Fail } else { Status::Pass };
        report.checks = findings;
        report
    }

    #[test]
    fn a_failure_names_every_failed_check_first_and_fits_the_limit() {
        let long = "GPU 3: the driver's recovery action is GPU reset: drain the node and reset \
                    the GPU (nvidia-smi -r), then run the checks again";
        let r = report(vec![
            Finding::fail("gpu-health", long, "fix"),
            Finding::pass("dev-shm", "ok"),
            Finding::fail("nvlink", "GPU 3: link 4 is down", "fix"),
        ]);
        let (code, line) = answer(&r, DEFAULT_MAX_OUTPUT);
        assert_eq!(code, NPD_NON_OK);
        assert!(line.len() <= DEFAULT_MAX_OUTPUT, "{line}");
        assert!(
            line.starts_with("fail: gpu-health, nvlink: GPU 3: the driver's"),
            "{line}"
        );
        assert!(line.ends_with("..."), "{line}");
        let (_, whole) = answer(&r, 400);
        assert!(whole.ends_with("run the checks again"), "{whole}");
    }

    #[test]
    fn probes_line_names_every_failure_on_one_escaped_line() {
        let r = report(vec![
            Finding::fail("nccl-env", "NCCL_X=\u{1b}[2J\nsecond line", "fix"),
            Finding::pass("dev-shm", "ok"),
            Finding::fail("nvlink", "GPU 3: link 4 is down", "fix"),
        ]);
        assert_eq!(
            probe_line(&r),
            "fail: nccl-env: NCCL_X=\\x1b[2J second line; nvlink: GPU 3: link 4 is down"
        );
        let ok = report(vec![
            Finding::pass("dev-shm", "ok"),
            Finding::warn("stack-limit", "unlimited", "fix"),
        ]);
        assert_eq!(probe_line(&ok), "ok: 1 passed, 1 warning(s)");
        assert_eq!(answer(&ok, 80).1, probe_line(&ok));
    }

    /// Issue 39 row 4: a run where every check that judged something could not
    /// determine it is NPD's Unknown, naming them; one determined warning beside them
    /// (or one pass) makes it OK again, and a failure stays NonOK.
    #[test]
    fn a_run_that_read_nothing_is_unknown_not_ok() {
        let unread =
            |id: &str| Finding::warn(id, format!("could not determine {id}"), "fix").undetermined();
        let r = report(vec![
            unread("memlock"),
            Finding::skip("gpu-devices", "no NVML"),
            unread("dev-shm"),
        ]);
        let (code, line) = answer(&r, 400);
        assert_eq!(code, NPD_UNKNOWN);
        assert_eq!(
            line,
            "unknown: nothing could be read: memlock, dev-shm: could not determine memlock"
        );
        let with_pass = report(vec![unread("memlock"), Finding::pass("dev-shm", "ok")]);
        assert_eq!(answer(&with_pass, 400).0, NPD_OK);
        let with_warning = report(vec![
            unread("memlock"),
            Finding::warn("dev-shm", "64 MiB", "fix"),
        ]);
        assert_eq!(answer(&with_warning, 400).0, NPD_OK);
        let failed = report(vec![
            unread("memlock"),
            Finding::fail("nvlink", "down", "fix"),
        ]);
        assert_eq!(answer(&failed, 400).0, NPD_NON_OK);
        // Nothing judged at all (every check skipped) is not "nothing could be read".
        let skipped = report(vec![Finding::skip("gpu-devices", "no NVML")]);
        assert_eq!(answer(&skipped, 400).0, NPD_OK);
    }

    #[test]
    fn a_pass_is_ok_and_an_error_is_unknown_and_host_text_cannot_break_the_line() {
        let r = report(vec![Finding::warn("stack-limit", "unlimited", "fix")]);
        assert_eq!(
            answer(&r, 80),
            (NPD_OK, "ok: 0 passed, 1 warning(s)".to_string())
        );
        let e = anyhow::anyhow!("reading --facts /x\u{1b}[2J\nnext");
        let (code, line) = unknown(&e, 80);
        assert_eq!(code, NPD_UNKNOWN);
        assert_eq!(line, "unknown: reading --facts /x\\x1b[2J next");
        // Cut on a character boundary: "é" is two bytes.
        assert_eq!(fit("ééééé", 8), "éé...");
        assert_eq!(fit("abc", 3), "abc");
    }
}
