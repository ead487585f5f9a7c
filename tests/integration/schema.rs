//! The JSON Schemas shipped in schema/ (report/v1, explain-log/v1) against the report of
//! every fixture and the explain-log answer for every synthetic log, through
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

/// The report `check --format json` gives on every fixture of the goldens' findings
/// table (tests/golden/findings.txt): all of it, facts included, which the goldens
/// keep only where gather is under test.
fn fixture_reports() -> Vec<(String, serde_json::Value)> {
    let table = std::fs::read_to_string(repo().join("tests/golden/findings.txt")).unwrap();
    let mut names: Vec<&str> = table.lines().map(table_key).collect();
    names.dedup();
    std::thread::scope(|s| {
        let runs: Vec<_> = names
            .iter()
            .map(|name| {
                s.spawn(move || {
                    let out = crate::bounded::output_within(
                        &mut fixture_command(name, "check", &["--format", "json"], &[]),
                        &format!("check in {name}"),
                    );
                    (name.to_string(), report(&out))
                })
            })
            .collect();
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    })
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
    let reports = fixture_reports();
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
