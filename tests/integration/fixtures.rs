//! Fixture host trees (tests/fixtures/NAME/root with kernel.json and env), run
//! through the real binary with `--host-root` and compared with the golden
//! outputs in tests/golden/NAME. Regenerate: NCCL_PREFLIGHT_BLESS=1 cargo test --test integration

use super::support::*;
use std::fs;

/// Runs `init` on a fixture, writing every output, and checks each against its golden file.
fn scenario(name: &str, expected_exit: i32) -> serde_json::Value {
    let out_dir = scratch(&format!("fixture-{name}"));
    let path = |f: &str| out_dir.join(f).display().to_string();
    let outputs = [
        "--env-file",
        &path("nccl.env"),
        "--nccl-conf",
        &path("nccl.conf"),
        "--report",
        &path("report.json"),
        "--termination-log",
        &path("termination-log"),
    ];
    let out = fixture_command(name, "init", &outputs, &[])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(expected_exit),
        "{name}: {}{}",
        stdout(&out),
        stderr(&out)
    );
    assert_eq!(stderr(&out), "", "{name} wrote to stderr");
    let golden_dir = repo().join("tests/golden").join(name);
    golden(&golden_dir.join("report.txt"), &stdout(&out));
    for file in ["nccl.env", "nccl.conf", "report.json", "termination-log"] {
        golden(
            &golden_dir.join(file),
            &fs::read_to_string(out_dir.join(file)).unwrap(),
        );
    }
    // `check` prints the same report and exits the same way.
    let check = fixture_command(name, "check", &[], &[]).output().unwrap();
    assert_eq!(check.status.code(), Some(expected_exit));
    assert_eq!(stdout(&check), stdout(&out));
    let report = fs::read_to_string(out_dir.join("report.json")).unwrap();
    fs::remove_dir_all(&out_dir).unwrap();
    serde_json::from_str(&report).unwrap()
}

fn status<'a>(report: &'a serde_json::Value, id: &str) -> &'a str {
    report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == id)
        .unwrap()["status"]
        .as_str()
        .unwrap()
}

fn setting<'a>(report: &'a serde_json::Value, name: &str) -> Option<&'a serde_json::Value> {
    report["settings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
}

#[test]
fn healthy_pod_passes_and_pins_eth0() {
    let r = scenario("healthy-pod", 0);
    assert_eq!(r["verdict"], "pass");
    assert_eq!(setting(&r, "NCCL_SOCKET_IFNAME").unwrap()["value"], "=eth0");
    assert_eq!(
        r["facts"]["platform"]["product_name"]["value"],
        "p4d.24xlarge"
    );
    assert_eq!(r["facts"]["nccl_env"]["NCCL_DEBUG"]["value"], "INFO");
}

#[test]
fn runtime_defaults_fail_on_shm_and_warn_on_memlock() {
    let r = scenario("runtime-defaults", 1);
    assert_eq!(status(&r, "dev-shm"), "fail");
    assert_eq!(status(&r, "memlock"), "warn");
    assert_eq!(
        r["facts"]["memlock"]["enforcement_probe"]["refused"],
        "ENOMEM: Cannot allocate memory"
    );
}

#[test]
fn no_default_route_falls_back_to_the_pod_ip() {
    let r = scenario("no-default-route", 0);
    let s = setting(&r, "NCCL_SOCKET_IFNAME").unwrap();
    assert_eq!(s["value"], "=eth0");
    assert!(s["reason"].as_str().unwrap().contains("10.0.0.7"));
}

#[test]
fn multi_interface_node_catches_the_lo_trap() {
    let r = scenario("multi-interface", 1);
    assert_eq!(status(&r, "nccl-env"), "fail");
    let user = setting(&r, "NCCL_SOCKET_IFNAME").unwrap();
    assert_eq!(
        (user["value"].as_str(), user["source"].as_str()),
        (Some("^docker0"), Some("user"))
    );
    let kinds: Vec<_> = r["facts"]["network"]["interfaces"]["value"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["kind"].clone())
        .collect();
    assert!(kinds.contains(&serde_json::json!("macvlan")));
}

#[test]
fn unreadable_host_degrades_to_warnings_naming_paths() {
    let r = scenario("unreadable", 0);
    assert_eq!(r["verdict"], "warn");
    for id in ["memlock", "dev-shm", "host-ipc", "stack-limit", "nccl-env"] {
        assert_eq!(status(&r, id), "warn", "{id}");
    }
    let facts = &r["facts"];
    assert!(
        facts["platform"]["product_name"]["error"]["source"]
            .as_str()
            .unwrap()
            .ends_with("dmi/id/product_name")
    );
    assert!(
        facts["dev_shm"]["mount"]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("line 1")
    );
    assert!(facts["network"]["default_routes"]["error"].is_object());
    assert!(
        facts["namespaces"]["ipc"]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("garbage")
    );
}

#[test]
fn saved_facts_replay_to_the_same_report() {
    let facts = fixture_command("multi-interface", "facts", &[], &[])
        .output()
        .unwrap();
    assert_eq!(facts.status.code(), Some(0));
    let scratch = scratch("replay");
    let saved = scratch.join("node.json");
    fs::write(&saved, &facts.stdout).unwrap();
    let live = fixture_command("multi-interface", "check", &["--format", "json"], &[])
        .output()
        .unwrap();
    // Replayed anywhere, with no environment at all: the facts carry it.
    let replayed = run(
        &[
            "check",
            "--facts",
            saved.to_str().unwrap(),
            "--format",
            "json",
        ],
        &[],
    );
    assert_eq!(replayed.status.code(), live.status.code());
    assert_eq!(stdout(&replayed), stdout(&live));
    // A report is accepted as facts too.
    let report_file = scratch.join("report.json");
    fs::write(&report_file, &live.stdout).unwrap();
    let again = run(
        &[
            "check",
            "--facts",
            report_file.to_str().unwrap(),
            "--format",
            "json",
        ],
        &[],
    );
    assert_eq!(stdout(&again), stdout(&live));
    fs::remove_dir_all(&scratch).unwrap();
}
