//! The JSON report: one document, schema `nccl-preflight/report/v1`.

use crate::report::Report;

pub fn render(report: &Report) -> String {
    // Serializing plain structs with string keys cannot fail; the fallback keeps
    // this path panic-free all the same.
    let mut text = serde_json::to_string_pretty(report).unwrap_or_else(|e| {
        format!(
            "{{\"schema\":\"{}\",\"error\":{:?}}}",
            crate::report::REPORT_SCHEMA,
            e.to_string()
        )
    });
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::fixed_report::report;

    #[test]
    fn carries_the_contract_fields_and_round_trips() {
        let r = report();
        let text = render(&r);
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["schema"], "nccl-preflight/report/v1");
        assert_eq!(v["verdict"], "fail");
        let check = &v["checks"][0];
        for key in ["id", "status", "summary", "remediation", "evidence"] {
            assert!(check.get(key).is_some(), "{key} missing");
        }
        let setting = &v["settings"][0];
        for key in ["name", "value", "reason", "source"] {
            assert!(setting.get(key).is_some(), "{key} missing");
        }
        assert_eq!(v["facts"]["schema"], "nccl-preflight/facts/v1");
        let back: Report = serde_json::from_str(&text).unwrap();
        assert_eq!(back, r);
    }
}
