//! NCCL's RAS diagnostics (2.31 and later): the `NCCL DIAG` lines that
//! `NCCL_RUN_RAS_DIAGNOSTICS=1` prints at communicator init and that the RAS port's
//! `DIAGNOSTICS` command returns, parsed and turned into a verdict.
//!
//! NCCL itself never fails on them: every line is tagged `[OK]` or `[INFO]` (the only two
//! tags in 2.32.3's `rasDiagnosticsFormatLine`, strings of libnccl.so.2), so an
//! uncorrected ECC error and an unset NCCL_DEBUG both read `[INFO]`. This module decides
//! which lines fail the job, which warn and which are notes, from the line templates of
//! the 2.31.2 and 2.32.3 binaries (`strings libnccl.so.2`: "ECC: uncorrected volatile
//! errors on rank(s) %s ...", "Xid %u detected ... Restart the affected application ...")
//! and the lines recorded from real NCCL 2.32.3 in tests/data/ras/gpu-h200x4-2.32.3/.
//! The line format, also recorded there: `HOST:PID NCCL DIAG BODY`, BODY being
//! `=== RAS Diagnostics ===`, `[OK]   CHECK: TEXT`, `[INFO] CHECK: TEXT`, an Xid event
//! (`[INFO] Xid 79 detected ...`) or `RAS diagnostics completed in 8.1 ms across 2 ...`.
//! NVIDIA's guide (docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting/
//! diagnostics.html) calls them a readiness probe comparing GPU, driver and NCCL
//! configuration across ranks, without exercising NCCL's data paths.

use crate::finding::Finding;

/// What this tool makes of one line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Pass,
    Note,
    Warn,
    Fail,
}

/// One `NCCL DIAG` line.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Line {
    /// `HOST:PID` of the process that printed or answered it.
    pub origin: String,
    /// NCCL's own tag: `OK`, `INFO`, or empty for untagged lines.
    pub tag: String,
    /// The check, as NCCL names it (`ECC`, `NVLink`, `Xid/SXid`, ...), empty if unknown.
    pub check: String,
    /// The line after the tag, control characters escaped.
    pub text: String,
    pub verdict: Verdict,
    /// What the line means for the job, for the non-passing ones.
    pub meaning: &'static str,
}

/// Every `NCCL DIAG` line of a log or of a `DIAGNOSTICS` reply.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Diagnostics {
    pub lines: Vec<Line>,
    /// `RAS diagnostics completed in 8.1 ms across 2 RAS peers`, when it came.
    pub completed: Option<String>,
    /// An `ERROR: ...` or `BUSY: ...` answer of the RAS port instead of diagnostics.
    pub refused: Option<String>,
}

/// The checks of 2.31.2 and 2.32.3 (`RAS_DIAG_CHECK_*` and their line prefixes).
const CHECKS: &[&str] = &[
    "GPU inventory",
    "CUDA driver version",
    "NVIDIA graphics driver version",
    "ECC",
    "NVLink",
    "NCCL environment",
    "rdma_topo check",
    "IOMMU mode",
    "IOMMU groups",
    "ATS state",
    "Xid/SXid",
    "Paths",
];

/// (check, text that marks the case, verdict, meaning): the first row that matches wins.
/// Rows name only cases this tool judges differently from NCCL's tag.
const RULES: &[(&str, &str, Verdict, &str)] = &[
    (
        "",
        "diagnostics incomplete, gathered",
        Verdict::Warn,
        "some ranks did not answer the diagnostics: dead, stopped or still initialising (see /job)",
    ),
    (
        "Xid/SXid",
        "Restart the affected application",
        Verdict::Fail,
        "an Xid whose documented response is restarting the application: this GPU hit an error during the job",
    ),
    (
        "Xid/SXid",
        "recommends resetting the affected GPU",
        Verdict::Fail,
        "an Xid the catalog answers with a GPU reset: drain the node",
    ),
    (
        "Xid/SXid",
        "Fabric Manager documentation",
        Verdict::Fail,
        "an NVSwitch error (SXid) that needs the fabric manager's response",
    ),
    (
        "Xid/SXid",
        "For the recommended response",
        Verdict::Warn,
        "an Xid with no catalogued action: look it up before retrying on this node",
    ),
    (
        "Xid/SXid",
        "pre-Ampere GPU",
        Verdict::Warn,
        "an Xid on a pre-Ampere GPU: see the archived Xid catalog",
    ),
    (
        "Xid/SXid",
        "No user action",
        Verdict::Note,
        "an Xid or SXid the catalog says needs no action",
    ),
    (
        "Xid/SXid",
        "no kernel-log source",
        Verdict::Warn,
        "NCCL could read no kernel log (dmesg, /var/log) on that host: its Xids are unseen",
    ),
    (
        "Xid/SXid",
        "scan was truncated",
        Verdict::Warn,
        "the kernel-log scan was cut short: older Xids may be missing",
    ),
    (
        "ECC",
        "uncorrected volatile errors on",
        Verdict::Fail,
        "uncorrected ECC errors since the driver loaded: that GPU's memory is failing",
    ),
    (
        "ECC",
        "corrected volatile errors at or above",
        Verdict::Warn,
        "corrected ECC errors over NCCL_DIAGNOSTICS_ECC_THRESHOLD: watch that GPU",
    ),
    (
        "NVLink",
        "inactive link",
        Verdict::Fail,
        "an NVLink is down on that GPU: NCCL routes around it slower, or hangs",
    ),
    (
        "NVLink",
        "inconsistent link speeds",
        Verdict::Warn,
        "NVLinks run at different speeds: the slowest sets the pace",
    ),
    (
        "NVLink",
        "link-count mismatch",
        Verdict::Warn,
        "GPUs have different numbers of NVLinks: unlike nodes or a missing link",
    ),
    (
        "GPU inventory",
        "mismatch",
        Verdict::Warn,
        "ranks see different GPU models or counts: the job spans unlike nodes",
    ),
    (
        "CUDA driver version",
        "mismatch",
        Verdict::Warn,
        "CUDA drivers differ across ranks: nodes on different driver releases",
    ),
    (
        "NVIDIA graphics driver version",
        "mismatch",
        Verdict::Warn,
        "NVIDIA drivers differ across ranks: nodes on different driver releases",
    ),
    (
        "NCCL environment",
        "for NCCL_DEBUG",
        Verdict::Note,
        "only the logging settings differ",
    ),
    (
        "NCCL environment",
        "mismatch across",
        Verdict::Warn,
        "ranks run with different NCCL_* settings: set them once in the job spec",
    ),
    (
        "rdma_topo check",
        "failed on rank",
        Verdict::Warn,
        "NCCL's GPU/NIC topology check failed on those ranks",
    ),
    (
        "IOMMU groups",
        "differ on",
        Verdict::Warn,
        "GPU and NIC sit in different IOMMU groups: GPUDirect RDMA between them may be blocked or slow",
    ),
    (
        "Paths",
        "could not locate",
        Verdict::Warn,
        "NCCL could not find the rank's own GPU in its topology",
    ),
    (
        "",
        "RAS diagnostics skipped",
        Verdict::Warn,
        "RAS is off in the trainer (NCCL_RAS_ENABLE=0): no diagnostics and no watch",
    ),
];

/// Every `NCCL DIAG` line of `text` (a log, or a RAS reply), in order; other lines are
/// skipped, an `ERROR:`/`BUSY:` answer is kept as the refusal.
pub fn parse(text: &str) -> Diagnostics {
    let mut out = Diagnostics::default();
    for raw in text.lines() {
        let raw = raw.trim_end();
        if raw.starts_with("ERROR:") || raw.starts_with("BUSY:") {
            out.refused = Some(printable(raw));
            continue;
        }
        let Some(at) = raw.find(" NCCL DIAG ") else {
            continue;
        };
        let origin = raw[..at].rsplit(' ').next().unwrap_or_default();
        let body = raw[at + " NCCL DIAG ".len()..].trim();
        if body.starts_with("===") {
            continue;
        }
        if body.contains("diagnostics completed in") {
            out.completed = Some(printable(body));
            continue;
        }
        out.lines.push(line(origin, body));
    }
    out
}

fn line(origin: &str, body: &str) -> Line {
    let (tag, rest) = match body.strip_prefix('[').and_then(|b| b.split_once(']')) {
        Some((tag, rest)) => (tag, rest.trim_start()),
        // `INFO RAS diagnostics skipped: NCCL_RAS_ENABLE=0` has its tag unbracketed.
        None => match body.split_once(' ') {
            Some((t, rest)) if t == "INFO" || t == "OK" => (t, rest),
            _ => ("", body),
        },
    };
    let check = if rest.starts_with("Xid ") || rest.starts_with("SXid ") {
        "Xid/SXid"
    } else {
        CHECKS
            .iter()
            .copied()
            .find(|c| rest.starts_with(&format!("{c}:")) || rest.starts_with(&format!("{c} ")))
            .unwrap_or("")
    };
    let rule = RULES
        .iter()
        .find(|(c, needle, _, _)| (c.is_empty() || *c == check) && rest.contains(needle));
    let (verdict, meaning) = match rule {
        Some((_, _, v, m)) => (*v, *m),
        None if tag == "OK" => (Verdict::Pass, ""),
        None => (Verdict::Note, ""),
    };
    Line {
        origin: printable(origin),
        tag: printable(tag),
        check: check.to_string(),
        text: printable(rest),
        verdict,
        meaning,
    }
}

/// Control characters shown as `\xNN` (as `render::visible` does; that module sits
/// above this one): a hostile log line cannot move the cursor or forge a report line.
fn printable(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            c if c.is_control() => format!("\\x{:02x}", c as u32),
            c => c.to_string(),
        })
        .collect()
}

impl Diagnostics {
    /// The worst verdict, `None` when there are no lines.
    pub fn worst(&self) -> Option<Verdict> {
        self.lines.iter().map(|l| l.verdict).max()
    }

    /// The `nccl-diagnostics` finding: fail on a failing line, warn on a warning one or
    /// a refusal, pass otherwise; the non-passing lines are the evidence.
    pub fn finding(&self, source: &str) -> Finding {
        let id = crate::finding::ids::NCCL_DIAGNOSTICS;
        let count = |v| self.lines.iter().filter(|l| l.verdict == v).count();
        let (fails, warns) = (count(Verdict::Fail), count(Verdict::Warn));
        let done = self.completed.as_deref().unwrap_or("no completion line");
        let summary = format!(
            "NCCL's RAS diagnostics ({source}): {fails} failing, {warns} warning, {} ok, {} notes; {done}",
            count(Verdict::Pass),
            count(Verdict::Note),
        );
        let fix = "fail: drain the named GPU's node (the meaning says why); warn: align the nodes or the job's NCCL_* settings; NCCL itself never stops on these lines";
        let mut f = match (self.worst(), &self.refused) {
            (_, Some(why)) if self.lines.is_empty() => Finding::warn(
                id,
                format!("NCCL's RAS diagnostics ({source}): refused: {why}"),
                "retry later (one diagnostics run at a time; text format only)",
            ),
            (None, None) => Finding::warn(
                id,
                format!("NCCL's RAS diagnostics ({source}): no NCCL DIAG lines"),
                "the trainer's NCCL is older than 2.31 or ran without NCCL_RUN_RAS_DIAGNOSTICS=1",
            ),
            (Some(Verdict::Fail), _) => Finding::fail(id, summary, fix),
            // Lines but no `... completed in` line: the output was cut (a reply closed
            // early, a log truncated), so a failing line may be missing.
            (Some(_), _) if self.completed.is_none() => Finding::warn(
                id,
                format!("{summary} (cut before NCCL's completion line)"),
                "run the diagnostics again; a cut reply can hide a failing line",
            ),
            (Some(Verdict::Warn), _) => Finding::warn(id, summary, fix),
            _ => Finding::pass(id, summary),
        };
        // The check's default blame is the node (ECC, NVLink, Xid, drivers); ranks that
        // differ only in their NCCL_* settings were given them by the job's spec.
        let flagged = || self.lines.iter().filter(|l| l.verdict > Verdict::Pass);
        if flagged().next().is_some() && flagged().all(|l| l.check == "NCCL environment") {
            f = f.blamed(crate::finding::Blame::Job);
        }
        // Blame (docs/failure-policy.md): the node's (ECC, NVLink, Xid, drivers), unless
        // every warning is ranks running with different NCCL_* settings: the job's.
        let flagged = || self.lines.iter().filter(|l| l.verdict >= Verdict::Warn);
        let blame =
            if flagged().next().is_some() && flagged().all(|l| l.check == "NCCL environment") {
                crate::finding::Blame::Job
            } else {
                crate::finding::Blame::Node
            };
        f = f.blamed(blame);
        for l in self.lines.iter().filter(|l| l.verdict > Verdict::Pass) {
            let sep = if l.meaning.is_empty() { "" } else { " -- " };
            f = f.evidence(format!(
                "{:?} {}: {}{sep}{}",
                l.verdict, l.origin, l.text, l.meaning
            ));
        }
        f
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::finding::Status;

    const HEALTHY: &str = include_str!("../../tests/data/ras/gpu-h200x4-2.32.3/diagnostics.text");
    const KILLED: &str =
        include_str!("../../tests/data/ras/gpu-h200x4-2.32.3/killed-diagnostics.text");

    #[test]
    fn the_recorded_healthy_reply_passes_with_the_debug_mismatch_as_notes() {
        let d = parse(HEALTHY);
        assert_eq!(d.lines.len(), 20, "{d:#?}");
        assert_eq!(d.worst(), Some(Verdict::Note));
        assert!(
            d.completed
                .as_deref()
                .unwrap()
                .contains("8.1 ms across 2 RAS peers")
        );
        let ecc = d.lines.iter().find(|l| l.check == "ECC").unwrap();
        assert_eq!((ecc.tag.as_str(), ecc.verdict), ("OK", Verdict::Pass));
        assert_eq!(ecc.origin, "vm:980");
        let xid = d.lines.iter().find(|l| l.check == "Xid/SXid").unwrap();
        assert_eq!(xid.verdict, Verdict::Pass);
        let f = d.finding("on demand");
        assert_eq!(f.status(), Status::Pass, "{f:?}");
    }

    #[test]
    fn a_killed_rank_makes_the_recorded_reply_incomplete() {
        let d = parse(KILLED);
        let f = d.finding("on demand");
        assert_eq!(f.status(), Status::Warn, "{f:?}");
        assert!(f.evidence.iter().any(|e| e.contains("gathered 1/2 ranks")));
        assert!(d.completed.unwrap().contains("across 1 RAS peers"));
    }

    #[test]
    fn failing_lines_from_the_binary_templates_fail() {
        // Filled from 2.32.3's format strings (strings libnccl.so.2), not recorded.
        for (body, check, verdict) in [
            (
                "[INFO] ECC: uncorrected volatile errors on rank(s) {3} (worst=2) across 8 ranks in comm 0x1",
                "ECC",
                Verdict::Fail,
            ),
            (
                "[INFO] NVLink: inactive link(s) on rank(s) {5} across 8 ranks in comm 0x1",
                "NVLink",
                Verdict::Fail,
            ),
            (
                "[INFO] Xid 79 detected 1 time on host n1. The NVIDIA Xid catalog recommends resetting the affected GPU. Follow the documented GPU-reset capabilities and limitations: https://x",
                "Xid/SXid",
                Verdict::Fail,
            ),
            (
                "[INFO] Xid 13 detected 2 times on host n1. Restart the affected application. For guidance, see the NVIDIA Xid documentation: https://x",
                "Xid/SXid",
                Verdict::Fail,
            ),
            (
                "[INFO] Xid 63 detected 1 time on host n1. No user action or further investigation is required for this Xid.",
                "Xid/SXid",
                Verdict::Note,
            ),
            (
                "[INFO] Xid/SXid: no kernel-log source was available on host n1",
                "Xid/SXid",
                Verdict::Warn,
            ),
            (
                "[INFO] CUDA driver version: mismatch across 8 ranks in comm 0x1, rank(s) {4-7} differ from rank 0 (13000)",
                "CUDA driver version",
                Verdict::Warn,
            ),
            (
                "[INFO] NCCL environment: mismatch across 2 ranks in comm 0x1 for NCCL_IB_HCA",
                "NCCL environment",
                Verdict::Warn,
            ),
            (
                "INFO RAS diagnostics skipped: NCCL_RAS_ENABLE=0",
                "",
                Verdict::Warn,
            ),
        ] {
            let d = parse(&format!("n1:7 NCCL DIAG {body}\n"));
            assert_eq!(d.lines.len(), 1, "{body}");
            assert_eq!(
                (d.lines[0].check.as_str(), d.lines[0].verdict),
                (check, verdict),
                "{body}"
            );
        }
        let d = parse(
            "n1:7 NCCL DIAG [INFO] NVLink: inactive link(s) on rank(s) {5} across 8 ranks in comm 0x1\n",
        );
        let f = d.finding("gang");
        assert_eq!(f.status(), Status::Fail);
        assert!(f.evidence[0].contains("NVLink is down"), "{f:?}");
        assert_eq!(f.blame(), Some(crate::finding::Blame::Node));
        // Only ranks with different NCCL_* settings: the job's.
        let env = "n1:7 NCCL DIAG [INFO] NCCL environment: mismatch across 2 ranks in comm 0x1 for NCCL_IB_HCA\nn1:7 NCCL DIAG RAS diagnostics completed in 1.0 ms across 2 ranks\n";
        let f = parse(env).finding("gang");
        assert_eq!(
            (f.status(), f.blame()),
            (Status::Warn, Some(crate::finding::Blame::Job))
        );
    }

    #[test]
    fn refusals_and_hostile_text_are_kept_escaped() {
        let d = parse("SERVER PROTOCOL 2\nOK\nERROR: diagnostics only supports text output\n");
        assert!(d.lines.is_empty());
        assert_eq!(d.finding("on demand").status(), Status::Warn);
        let d = parse("h:1 NCCL DIAG [INFO] Paths: x\x1b[2J across 2 ranks\n");
        assert!(d.lines[0].text.contains("\\x1b[2J"), "{:?}", d.lines[0]);
        assert_eq!(
            parse("nothing here\n").finding("gang").status(),
            Status::Warn
        );
    }
}
