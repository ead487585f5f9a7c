//! The JSON Schemas shipped in schema/ (report/v1, explain-log/v1) against every golden
//! report and the explain-log answer for every synthetic log, through
//! tests/schema/validate.py and the jsonschema package of the test venv.

use super::support::*;
use std::path::PathBuf;

/// Runs the validator on `files`: its exit status and output.
fn validate(python: &PathBuf, files: &[PathBuf]) -> (bool, String) {
    let out = std::process::Command::new(python)
        .arg(repo().join("tests/schema/validate.py"))
        .arg(repo().join("schema"))
        .args(files)
        .output()
        .unwrap();
    (
        out.status.success(),
        format!("{}{}", stdout(&out), stderr(&out)),
    )
}

/// Every fixture's golden report, put back together from its facts and findings parts.
fn golden_reports() -> Vec<(String, serde_json::Value)> {
    let mut names: Vec<String> = std::fs::read_dir(repo().join("tests/golden"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| golden_path(n, Part::Findings, "checks.json").exists())
        .collect();
    names.sort();
    let read = |p: PathBuf| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
    };
    names
        .into_iter()
        .map(|n| {
            let mut report = read(golden_path(&n, Part::Findings, "checks.json"));
            report["facts"] = read(golden_path(&n, Part::Facts, "facts.json"));
            report["settings"] = read(golden_path(&n, Part::Facts, "settings.json"));
            (n, report)
        })
        .collect()
}

/// A change that breaks a report.
type Damage = Box<dyn Fn(&mut serde_json::Value)>;

#[test]
fn golden_reports_and_explain_log_answers_match_the_shipped_schemas() {
    let test = "golden_reports_and_explain_log_answers_match_the_shipped_schemas";
    let Some(python) = require_python(test, "jsonschema, referencing") else {
        return;
    };
    let dir = scratch("schema");
    let mut files = Vec::new();
    let reports = golden_reports();
    assert!(reports.len() > 20, "{}", reports.len());
    for (name, report) in &reports {
        let path = dir.join(format!("report-{name}.json"));
        std::fs::write(&path, report.to_string()).unwrap();
        files.push(path);
    }
    let mut logs: Vec<PathBuf> = std::fs::read_dir(repo().join("tests/logs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    logs.sort();
    assert!(logs.len() > 5, "{logs:?}");
    for log in &logs {
        let out = run(
            &["explain-log", "--format", "json", log.to_str().unwrap()],
            &[],
        );
        let path = dir.join(format!(
            "explain-{}.json",
            log.file_stem().unwrap().to_string_lossy()
        ));
        std::fs::write(&path, &out.stdout).unwrap();
        files.push(path);
    }
    let (ok, output) = validate(&python, &files);
    assert!(ok, "{output}");
    assert!(
        output.contains(&format!("checked {} document(s), 0 error(s)", files.len())),
        "{output}"
    );

    // The schemas refuse what breaks the contract: a failure without its fix, an
    // unknown status, a pass with a blame, a failed verdict without a fault, a report
    // without facts.
    let (_, mut report) = reports.into_iter().next().unwrap();
    let broken: [(&str, Damage); 5] = [
        (
            "checks/0/remediation",
            Box::new(|r| {
                r["checks"][0]["status"] = "fail".into();
                r["checks"][0]["remediation"] = serde_json::Value::Null;
            }),
        ),
        (
            "checks/0/status",
            Box::new(|r| r["checks"][0]["status"] = "ok".into()),
        ),
        (
            "False schema does not allow 'node'",
            Box::new(|r| {
                r["checks"][0]["status"] = "pass".into();
                r["checks"][0]["remediation"] = serde_json::Value::Null;
                r["checks"][0]["blame"] = "node".into();
            }),
        ),
        (
            "fault",
            Box::new(|r| {
                r["verdict"] = "fail".into();
                r["fault"] = "none".into();
            }),
        ),
        (
            "'facts' is a required property",
            Box::new(|r| {
                r.as_object_mut().unwrap().remove("facts");
            }),
        ),
    ];
    for (want, damage) in broken {
        let mut doc = report.clone();
        damage(&mut doc);
        let path = dir.join("broken.json");
        std::fs::write(&path, doc.to_string()).unwrap();
        let (ok, output) = validate(&python, &[path]);
        assert!(!ok && output.contains(want), "{want}: {output}");
    }
    // A check id the schema has never seen is fine: new checks need no schema edit.
    report["checks"][0]["id"] = "some-future-check".into();
    let path = dir.join("new-check.json");
    std::fs::write(&path, report.to_string()).unwrap();
    let (ok, output) = validate(&python, &[path]);
    assert!(ok, "{output}");
    std::fs::remove_dir_all(&dir).unwrap();
}
