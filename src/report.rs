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
    /// When and on which node the report was made (absent from saved facts judged
    /// without a clock, and from reports of older versions). It varies from run to run,
    /// so the golden tests leave it out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generated: Option<Generated>,
    pub facts: Facts,
}

/// When and where a report was made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Generated {
    /// UTC, RFC 3339 to the second (`2026-11-28T17:50:27Z`).
    pub at: String,
    /// The Kubernetes node (`NCCL_PREFLIGHT_NODE_NAME`, from the downward API's
    /// `spec.nodeName`), else the host name the facts hold; absent when neither is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

impl Generated {
    /// `unix` seconds as RFC 3339 UTC, by the civil-from-days algorithm (H. Hinnant,
    /// "chrono-Compatible Low-Level Date Algorithms").
    pub fn at_unix(unix: u64, node: Option<String>) -> Generated {
        let (days, rest) = (unix / 86_400, unix % 86_400);
        let z = days as i64 + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = doy - (153 * mp + 2) / 5 + 1;
        let month = if mp < 10 { mp + 3 } else { mp - 9 };
        let year = yoe + era * 400 + i64::from(month <= 2);
        Generated {
            at: format!(
                "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
                rest / 3600,
                rest % 3600 / 60,
                rest % 60
            ),
            node,
        }
    }
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
            generated: None,
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

#[cfg(test)]
mod tests {
    use super::Generated;

    /// Dates worked out by hand (and with `date -u -d @N`) before the code ran.
    #[test]
    fn unix_seconds_become_rfc_3339_utc() {
        for (unix, text) in [
            (0, "1970-01-01T00:00:00Z"),
            (951_782_400, "2000-02-29T00:00:00Z"),
            (1_709_251_199, "2024-02-29T23:59:59Z"),
            (1_795_888_227, "2026-11-28T17:50:27Z"),
            (4_102_444_800, "2100-01-01T00:00:00Z"),
        ] {
            assert_eq!(Generated::at_unix(unix, None).at, text, "{unix}");
        }
    }
}
