//! `Report`: the judged result of one run, as every renderer consumes it and as
//! `--format json` prints it (schema `nccl-preflight/report/v1`).

use crate::facts::Facts;
use crate::finding::{Fault, Finding, Status};
use crate::policy::Policy;
use crate::predict::Prediction;
use crate::tune::Setting;
use serde::{Deserialize, Serialize};

pub const REPORT_SCHEMA: &str = "nccl-preflight/report/v1";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Always [`REPORT_SCHEMA`].
    pub schema: String,
    pub tool_version: String,
    /// The worst check status: `pass`, `warn` or `fail`.
    pub verdict: Status,
    /// Where the failures lie (`none`, `job` or `node`), which decides the exit code:
    /// 0, 1 or 3 (docs/failure-policy.md). Absent from reports of older versions.
    #[serde(default)]
    pub fault: Fault,
    pub checks: Vec<Finding>,
    pub settings: Vec<Setting>,
    /// What NCCL will do on this node (crate::predict), schema
    /// `nccl-preflight/nccl-prediction/v1`; absent from reports of older versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nccl: Option<Prediction>,
    pub facts: Facts,
}

impl Report {
    /// The pure pipeline on gathered facts: what NCCL will do, predicted once and handed
    /// to every check and to the report (so the checks and the report's `nccl` section
    /// cannot disagree), the checks judged under `policy`, the settings tuned.
    pub fn judge(facts: Facts, policy: &Policy) -> Self {
        let prediction = crate::predict::predict(&facts);
        let findings = crate::judge::judge(&facts, &prediction, policy);
        let settings = crate::tune::tune(&facts);
        Report::new(facts, prediction, findings, settings)
    }

    /// A report of findings judged (or measured) elsewhere, with the prediction they
    /// were judged against.
    pub fn new(
        facts: Facts,
        prediction: Prediction,
        checks: Vec<Finding>,
        settings: Vec<Setting>,
    ) -> Self {
        let mut report = Report {
            schema: REPORT_SCHEMA.to_string(),
            tool_version: env!("CARGO_PKG_VERSION").to_string(),
            verdict: Status::Pass,
            fault: Fault::None,
            checks,
            settings,
            nccl: Some(prediction),
            facts,
        };
        report.rejudge();
        report
    }

    /// After findings were added or changed: every warning and failure gets its check's
    /// default blame where it has none of its own, then the verdict and the fault are
    /// computed again.
    pub fn rejudge(&mut self) {
        let checks = std::mem::take(&mut self.checks);
        self.checks = checks.into_iter().map(crate::judge::blame).collect();
        self.verdict = crate::finding::verdict(&self.checks);
        self.fault = crate::finding::fault(&self.checks);
    }

    /// Counts of checks by status: (failed, warned, passed, skipped).
    pub fn counts(&self) -> (usize, usize, usize, usize) {
        let n = |s| self.checks.iter().filter(|c| c.status() == s).count();
        (
            n(Status::Fail),
            n(Status::Warn),
            n(Status::Pass),
            n(Status::Skip),
        )
    }

    /// The host name the facts carry, for headers; `unknown` when unreadable.
    pub fn hostname(&self) -> &str {
        self.facts
            .namespaces
            .hostname
            .value()
            .map_or("unknown", String::as_str)
    }

    /// "1 failed, 2 warnings" style counts for one-line summaries.
    pub fn count_text(&self) -> String {
        let (failed, warned, passed, skipped) = self.counts();
        let plural =
            |n: usize, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
        let mut parts = vec![
            format!("{failed} failed"),
            plural(warned, "warning", "warnings"),
            format!("{passed} passed"),
        ];
        if skipped > 0 {
            parts.push(format!("{skipped} skipped"));
        }
        parts.join(", ")
    }
}
