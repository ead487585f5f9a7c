//! `init --nccl-conf` and the NCCL the image loads: NCCL_CONF_FILE is read from 2.23
//! (FACTS.md section 9), so for an older libnccl init writes the env file only and says
//! why in the report.

use super::support::*;
use std::fs;

fn init(fixture: &str, dir: &std::path::Path) -> (i32, serde_json::Value) {
    let (env_file, conf) = (dir.join("nccl.env"), dir.join("nccl.conf"));
    let out = fixture_command(
        fixture,
        "init",
        &[
            "--env-file",
            env_file.to_str().unwrap(),
            "--nccl-conf",
            conf.to_str().unwrap(),
            "--format",
            "json",
        ],
        &[],
    )
    .output()
    .unwrap();
    assert_eq!(stderr(&out), "", "{fixture}");
    (
        out.status.code().unwrap(),
        serde_json::from_slice(&out.stdout).unwrap(),
    )
}

#[test]
fn nccl_older_than_2_23_gets_the_env_file_only_and_a_warning() {
    // rdma-roce-multus loads a libnccl answering 2.18.5.
    let dir = scratch("nccl-conf-old");
    let (code, report) = init("rdma-roce-multus", &dir);
    assert!(
        !dir.join("nccl.conf").exists(),
        "nccl.conf written for NCCL 2.18.5"
    );
    let env = fs::read_to_string(dir.join("nccl.env")).unwrap();
    assert!(env.contains("export NCCL_SOCKET_IFNAME="), "{env}");
    let warning = finding(&report, "nccl-conf");
    assert_eq!(warning["status"], "warn", "{warning}");
    let summary = warning["summary"].as_str().unwrap();
    assert!(
        summary.contains("NCCL 2.18.5 does not read NCCL_CONF_FILE"),
        "{summary}"
    );
    assert!(summary.contains("in the --env-file only"), "{summary}");
    // A warning: the verdict and exit code are those of the other checks.
    assert_eq!(code, if report["verdict"] == "fail" { 1 } else { 0 });
    fs::remove_dir_all(&dir).unwrap();

    // 2.28.9 reads it: written, and no such finding.
    let dir = scratch("nccl-conf-new");
    let (_, report) = init("rdma-no-gdr", &dir);
    assert!(dir.join("nccl.conf").exists());
    assert!(
        report["checks"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["id"] != "nccl-conf"),
        "{report}"
    );
    fs::remove_dir_all(&dir).unwrap();
}
