//! The Kubernetes termination message: a short summary (at most 4096 bytes, the
//! kubelet's limit) that `kubectl describe pod` shows; one line per failed check.

use crate::finding::Status;
use crate::report::Report;

pub const MAX_BYTES: usize = 4096;

pub fn render(report: &Report) -> String {
    // Failures and warnings only: a count of passed or skipped checks says nothing
    // about why the pod failed, and would change every scenario's message whenever a
    // check is added.
    let (failed, warned, _, _) = report.counts();
    // The fault first (issue 28): `FAIL (node fault: retry elsewhere): ...` is what a
    // person or a controller reading the termination message acts on.
    let counts = format!(
        "{failed} failed, {warned} {}",
        if warned == 1 { "warning" } else { "warnings" }
    );
    let lines_head = match report.fault.advice() {
        Some(advice) if report.verdict == Status::Fail => {
            format!(
                "nccl-preflight: {} ({advice}): {counts}",
                report.verdict.label()
            )
        }
        _ => format!("nccl-preflight: {} ({counts})", report.verdict.label()),
    };
    let mut lines = vec![lines_head];
    let failures: Vec<String> = report
        .checks
        .iter()
        .filter(|c| c.status() == Status::Fail)
        .map(|c| {
            let blame = c.blame().map_or("", |b| b.label());
            format!("{} [{blame}]: {}", c.id, super::comment_text(&c.summary))
        })
        .collect();
    let mut used = lines[0].len() + 1;
    for (i, line) in failures.iter().enumerate() {
        let rest = failures.len() - i;
        let more = format!("... and {rest} more failed checks");
        // Keep room for the "more" line unless this is the last line.
        // One byte of the budget is kept for the final newline.
        let budget = MAX_BYTES - 1;
        let room = if rest > 1 {
            budget - more.len() - 1
        } else {
            budget
        };
        if used + line.len() + 1 > room {
            let mut cut = room.saturating_sub(used + 1).min(line.len());
            while !line.is_char_boundary(cut) {
                cut -= 1;
            }
            if rest == 1 && cut > 0 {
                lines.push(line[..cut].to_string());
            } else {
                lines.push(more);
            }
            break;
        }
        used += line.len() + 1;
        lines.push(line.clone());
    }
    let mut text = lines.join("\n");
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::finding::Finding;
    use crate::render::fixed_report::report;

    #[test]
    fn one_line_per_failure() {
        let text = render(&report());
        assert_eq!(
            text,
            "nccl-preflight: FAIL (job fault: fix the job): 1 failed, 1 warning\ndev-shm [job]: /dev/shm is 64 MiB, below the 1 GiB minimum\n"
        );
    }

    #[test]
    fn stays_within_the_kubelet_limit() {
        let mut r = report();
        for i in 0..200 {
            r.checks
                .push(Finding::fail(&format!("check-{i}"), "é".repeat(40), "fix"));
        }
        let text = render(&r);
        assert!(text.len() <= MAX_BYTES, "{}", text.len());
        assert!(text.ends_with("more failed checks\n"), "{text}");
        let mut one = report();
        one.checks[0].summary = "x".repeat(5000);
        let text = render(&one);
        assert!(text.len() <= MAX_BYTES, "{}", text.len());
    }
}
