//! Fixture host trees (tests/fixtures/NAME/root with kernel.json and env), run
//! through the real binary with `--host-root` and compared with the goldens in
//! tests/golden (docs/testing.md, "Goldens"): every fixture's verdict and findings in
//! one table (`findings.txt`), its tuned settings in another (`settings.txt`), its
//! termination message in a third (`termination-log.txt`); the gathered facts only
//! where gather is under test (`FACTS_UNDER_TEST`); whole reports for a few
//! (`FULL_REPORTS`). Regenerate: NCCL_PREFLIGHT_BLESS=1 cargo test --test integration

use super::support::*;
use std::fs;

/// The fixtures whose gathered facts are a golden (NAME/facts.json), each with the parts
/// of the facts (JSON pointers; "" is all of them) whose gathering it is the proof of.
/// Together they reach every gather path: the host tree's files and the syscalls whole
/// (healthy-pod) and each one unreadable (unreadable); memlock refused by the kernel
/// and the runtime's /dev/shm; the interface kinds, routes and names NCCL chooses among;
/// the user's NCCL variables; NVML on an NVSwitch node (NVLink per link, one down; P2P
/// per ordered pair), over a PCIe switch, one GPU of eight, hung, and not loaded; the
/// GPU fabric and IMEX channels of a GB200 tray; a CUDA runtime found in a Python
/// wheel; verbs, uverbs, libfabric, NCCL, its net plugin and GDR on EFA, InfiniBand (a
/// port down) and RoCE (with Multus); a plugin that fails to load, none, one too old,
/// a libfabric too old, no GDR. The other fixtures gather along the same paths with
/// other values: their findings (findings.txt) are their proof.
pub const FACTS_UNDER_TEST: &[(&str, &[&str])] = &[
    ("healthy-pod", &[""]),
    ("unreadable", &[""]),
    ("runtime-defaults", &["/memlock", "/dev_shm"]),
    ("no-default-route", &["/network"]),
    ("multi-interface", &["/network"]),
    ("ifname-prefix-bridge", &["/network"]),
    ("nccl-env-typos", &["/nccl_env"]),
    ("multus-network-missing", &["/nccl_env"]),
    ("gpu-nvlink-down", &["/gpus/nvml"]),
    ("gpu-pcie-switch-pair", &["/gpus/nvml", "/gpus/pci_gpus"]),
    ("gpu-one-of-eight", &["/gpus/nvml", "/gpus/cuda"]),
    (
        "gpu-hung-p2p-query",
        &["/gpus/call_timeout_ms", "/gpus/nvml"],
    ),
    ("gpu-driver-not-loaded", &["/gpus/nvml", "/gpus/cuda"]),
    ("gpu-gb200-nvl72-broken", &["/gpus"]),
    ("gpu-gb200-nvl72", &["/gpus/imex_channels"]),
    ("gpu-cuda-runtime-too-new", &["/gpus/cuda_runtime"]),
    ("rdma-p4d-efa", &["/rdma"]),
    ("rdma-port-down", &["/rdma"]),
    ("rdma-roce-multus", &["/network", "/rdma"]),
    ("rdma-plugin-broken", &["/rdma/nccl"]),
    ("rdma-efa-no-plugin", &["/rdma/libfabric", "/rdma/nccl"]),
    ("rdma-plugin-api-too-old", &["/rdma/nccl"]),
    ("rdma-libfabric-too-old", &["/rdma/libfabric"]),
    ("rdma-no-gdr", &["/rdma/gdr"]),
];

/// The fixtures that keep whole reports: the text (`report.txt`), the JSON but its facts
/// (`report.json`: verdict, findings with evidence and remediation, settings, what NCCL
/// will do), the env file and nccl.conf; `doctor.txt` beside two of them. A pod that
/// passes with no GPU, an RDMA node that warns, and an NVSwitch node that fails on the
/// node's fault (exit 3).
pub const FULL_REPORTS: [&str; 3] = ["healthy-pod", "rdma-roce-multus", "gpu-nvlink-down"];

/// Whether the fixture's libnccl reads NCCL_CONF_FILE (2.23 and later, or none loaded):
/// for an older one init writes no nccl.conf and warns (`nccl-conf`, which `check` does
/// not report), so the fixtures of old NCCL get no `--nccl-conf`; tests/integration/
/// nccl_conf.rs covers that case.
fn reads_conf_file(name: &str) -> bool {
    let scenario = fs::read_to_string(
        repo()
            .join("tests/fixtures")
            .join(name)
            .join("nccl.scenario"),
    )
    .unwrap_or_default();
    scenario
        .lines()
        .find_map(|l| l.strip_prefix("version "))
        .and_then(|v| v.trim().parse::<u32>().ok())
        .is_none_or(|v| v >= 22300)
}

/// Runs `init` on a fixture, writing every output, and checks them against the goldens:
/// its rows of the tables, its facts where gather is under test, its whole report where
/// it is one of `FULL_REPORTS`.
fn scenario(name: &str, expected_exit: i32) -> serde_json::Value {
    let out_dir = scratch(&format!("fixture-{name}"));
    let path = |f: &str| out_dir.join(f).display().to_string();
    let mut outputs = vec![
        "--env-file".to_string(),
        path("nccl.env"),
        "--report".into(),
        path("report.json"),
        "--termination-log".into(),
        path("termination-log"),
    ];
    let conf = reads_conf_file(name);
    if conf {
        outputs.extend(["--nccl-conf".into(), path("nccl.conf")]);
    }
    let outputs: Vec<&str> = outputs.iter().map(String::as_str).collect();
    let out = crate::bounded::output_within(
        &mut fixture_command(name, "init", &outputs, &[]),
        &format!("init in {name}"),
    );
    assert_eq!(
        out.status.code(),
        Some(expected_exit),
        "{name}: {}{}",
        stdout(&out),
        stderr(&out)
    );
    assert_eq!(stderr(&out), "", "{name} wrote to stderr");
    let read = |file: &str| fs::read_to_string(out_dir.join(file)).unwrap();
    let report: serde_json::Value = serde_json::from_str(&read("report.json"))
        .unwrap_or_else(|e| panic!("{name}: the report is not JSON: {e}"));
    golden_rows(
        "findings.txt",
        name,
        &findings_rows(name, &report, expected_exit),
    );
    golden_rows("settings.txt", name, &settings_rows(name, &report));
    golden_rows(
        "termination-log.txt",
        name,
        &text_rows(name, &read("termination-log")),
    );
    if let Some((_, paths)) = FACTS_UNDER_TEST.iter().find(|(n, _)| *n == name) {
        let slice = facts_slice(&report["facts"], paths);
        golden(&golden_path(name, "facts.json"), &pretty(&slice));
    }
    if FULL_REPORTS.contains(&name) {
        golden(&golden_path(name, "report.txt"), &stdout(&out));
        let mut rest = report.clone();
        // The facts have their own goldens; when and on which node varies from run to
        // run (its shape is held by the schema test).
        for part in ["facts", "generated"] {
            rest.as_object_mut().unwrap().remove(part);
        }
        golden(&golden_path(name, "report.json"), &pretty(&rest));
        for file in ["nccl.env", "nccl.conf"]
            .into_iter()
            .filter(|f| conf || *f != "nccl.conf")
        {
            golden(&golden_path(name, file), &read(file));
        }
    }
    // `check` prints the same report and exits the same way.
    let check = fixture_command(name, "check", &[], &[]).output().unwrap();
    assert_eq!(check.status.code(), Some(expected_exit));
    assert_eq!(stdout(&check), stdout(&out));
    fs::remove_dir_all(&out_dir).unwrap();
    report
}

/// Every file under tests/golden is one the tests write: a table, a fixture's facts
/// where gather is under test, a full report, a doctor page, help or an explain-log
/// answer; and every table line names a fixture that exists. A golden left behind by a
/// fixture removed or moved out of a list fails here, not silently (on the run after a
/// bless, which rewrites the goldens while this reads them).
#[test]
fn every_golden_file_is_one_the_tests_write() {
    if std::env::var_os("NCCL_PREFLIGHT_BLESS").is_some() {
        return;
    }
    let goldens = repo().join("tests/golden");
    let fixtures = repo().join("tests/fixtures");
    for table in TABLES {
        let text = fs::read_to_string(goldens.join(table)).unwrap();
        for line in text.lines() {
            assert!(
                fixtures.join(table_key(line)).join("root").is_dir(),
                "{table}: no fixture {}",
                table_key(line)
            );
        }
    }
    let doctor = ["gpu-nvlink-down", "rdma-roce-multus", "h200x2"];
    for entry in fs::read_dir(&goldens).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().to_string_lossy().into_owned();
        if !entry.file_type().unwrap().is_dir() {
            assert!(TABLES.contains(&name.as_str()), "tests/golden/{name}");
            continue;
        }
        if ["help", "logs"].contains(&name.as_str()) {
            continue;
        }
        for file in fs::read_dir(entry.path()).unwrap() {
            let file = file.unwrap().file_name().to_string_lossy().into_owned();
            let written = match file.as_str() {
                "facts.json" => FACTS_UNDER_TEST.iter().any(|(n, _)| *n == name),
                "doctor.txt" => doctor.contains(&name.as_str()),
                "report.txt" | "report.json" | "nccl.env" | "nccl.conf" => {
                    FULL_REPORTS.contains(&name.as_str())
                }
                _ => false,
            };
            assert!(written, "tests/golden/{name}/{file}: no test writes it");
        }
    }
}

fn status<'a>(report: &'a serde_json::Value, id: &str) -> &'a str {
    finding(report, id)["status"].as_str().unwrap()
}

#[test]
fn healthy_pod_passes_and_pins_eth0() {
    let r = scenario("healthy-pod", 0);
    assert_eq!(r["verdict"], "pass");
    assert_eq!(setting(&r, "NCCL_SOCKET_IFNAME").unwrap()["value"], "=eth0");
    assert_eq!(
        r["facts"]["platform"]["product_name"]["value"],
        "Standard PC (Q35 + ICH9, 2009)"
    );
    assert_eq!(r["facts"]["nccl_env"]["NCCL_DEBUG"]["value"], "INFO");
}

#[test]
fn runtime_defaults_warn_on_shm_and_note_memlock() {
    // Issue 36: NCCL 2.28.9 keeps no SHM buffers in /dev/shm, so a 64 MiB one risks the
    // job's DataLoader workers, which depends on their batches: undetermined, a warning;
    // without an RDMA device NCCL registers no memory, so an 8 MiB memlock is a note.
    let r = scenario("runtime-defaults", 0);
    assert_eq!(status(&r, "dev-shm"), "warn");
    assert_eq!(finding(&r, "dev-shm")["outcome"]["kind"], "undetermined");
    assert_eq!(status(&r, "memlock"), "pass");
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
    for id in ["dev-shm", "host-ipc", "stack-limit", "nccl-env"] {
        assert_eq!(status(&r, id), "warn", "{id}");
        assert_eq!(finding(&r, id)["outcome"]["kind"], "undetermined", "{id}");
    }
    // No RDMA device: whatever the memlock limit, NCCL registers nothing: not judged.
    assert_eq!(status(&r, "memlock"), "skip");
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
    // Failed queries beside the facts they spoil are kept, not dropped.
    assert_eq!(facts["network"]["errors"][0]["errno"], 13);
    assert_eq!(facts["memlock"]["probe_errors"][0]["errno"], 12);
    assert!(
        finding(&r, "memlock")["evidence"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e == "mlock probe could not run: mmap(65536): ENOMEM: Cannot allocate memory"),
        "{}",
        finding(&r, "memlock")
    );
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
    // Alike in all but when the report was made (`generated`, to the second).
    let judged = |out: &std::process::Output| {
        let mut report = report(out);
        report.as_object_mut().unwrap().remove("generated");
        report
    };
    assert_eq!(replayed.status.code(), live.status.code());
    assert_eq!(judged(&replayed), judged(&live));
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
    assert_eq!(judged(&again), judged(&live));
    fs::remove_dir_all(&scratch).unwrap();
}

#[test]
fn gpu_scenarios_through_the_fake_nvidia_libraries() {
    // (fixture, exit code, check -> status)
    type Expectation = (&'static str, i32, &'static [(&'static str, &'static str)]);
    let cases: &[Expectation] = &[
        (
            "gpu-p4d-a100",
            0,
            &[
                ("gpu-devices", "pass"),
                ("gpu-p2p", "pass"),
                ("nvlink", "pass"),
                ("pod-placement", "pass"),
            ],
        ),
        (
            "gpu-h100-nv18",
            0,
            &[
                ("gpu-devices", "pass"),
                ("gpu-p2p", "pass"),
                ("nvlink", "pass"),
                ("cuda-runtime", "pass"),
            ],
        ),
        (
            "gpu-g6e-l40s-pcie",
            0,
            &[
                ("gpu-devices", "pass"),
                ("gpu-p2p", "pass"),
                ("nvlink", "skip"),
            ],
        ),
        (
            "gpu-pcie-switch-pair",
            0,
            &[("gpu-p2p", "pass"), ("nvlink", "skip")],
        ),
        // A link down: NCCL runs over the others, degraded (issue 36).
        (
            "gpu-nvlink-down",
            0,
            &[("nvlink", "warn"), ("gpu-p2p", "pass")],
        ),
        // NVLink pairs whose NVML P2P write is not OK: NCCL's ncclTopoCheckP2p
        // (src/graph/paths.cc, 2.13-2.30) wants read and write and fails init on an
        // NVLink path ("P2P is disabled between NVLINK connected GPUs").
        ("gpu-p2p-read-only", 3, &[("gpu-p2p", "fail")]),
        // GB200 NVL72 tray: one NVLink cluster and clique, IMEX channel0 in the pod.
        (
            "gpu-gb200-nvl72",
            0,
            &[("mnnvl", "pass"), ("gpu-devices", "pass")],
        ),
        // No IMEX channel, one GPU's fabric in progress, one in another cluster.
        ("gpu-gb200-nvl72-broken", 1, &[("mnnvl", "fail")]),
        // A CUDA 13.0 PyTorch wheel on a CUDA 12.4 driver: the first CUDA call fails.
        (
            "gpu-cuda-runtime-too-new",
            1,
            &[("cuda-runtime", "fail"), ("gpu-devices", "pass")],
        ),
        (
            "gpu-one-of-eight",
            0,
            // Eight one-GPU pods on p4d without EFA: slow placement, and TCP between nodes:
            // both degraded runs (issue 36).
            &[
                ("pod-placement", "warn"),
                ("gpu-p2p", "skip"),
                ("rdma-devices", "warn"),
            ],
        ),
        ("gpu-fabric-manager-down", 3, &[("gpu-devices", "fail")]),
        (
            "gpu-a100-fabric-manager-down",
            3,
            &[("gpu-devices", "fail"), ("nvlink", "warn")],
        ),
        (
            "gpu-driver-not-loaded",
            3,
            &[("gpu-devices", "fail"), ("nvlink", "skip")],
        ),
    ];
    for (name, code, statuses) in cases {
        let r = scenario(name, *code);
        for (id, want) in *statuses {
            assert_eq!(status(&r, id), *want, "{name}: {id}");
        }
    }
}

#[test]
fn fake_libraries_report_what_nvidia_smi_would() {
    let r = scenario_report_only("gpu-p4d-a100");
    let nvml = &r["facts"]["gpus"]["nvml"]["state"]["loaded"];
    assert_eq!(nvml["gpus"].as_array().unwrap().len(), 8);
    assert_eq!(nvml["gpus"][0]["pci_bus_id"]["value"], "0000:10:1c.0");
    // The gate leaves what no check judges unread: the CPU affinity, the P2P
    // capabilities past read and write, and the PCIe path of GPUs that share NVLink.
    assert!(nvml["gpus"][4].get("cpu_affinity").is_none());
    assert!(nvml["pairs"][0].get("p2p_atomics").is_none());
    assert!(nvml["pairs"][0].get("common_ancestor").is_none());
    assert_eq!(nvml["pairs"][0]["p2p_read"]["value"], "OK");
    // `facts` reads them all.
    let out = fixture_command("gpu-p4d-a100", "facts", &[], &[])
        .output()
        .unwrap();
    let facts: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let all = &facts["gpus"]["nvml"]["state"]["loaded"];
    assert_eq!(all["gpus"][4]["cpu_affinity"]["value"], "24-47,72-95");
    assert_eq!(all["pairs"][0]["p2p_atomics"]["value"], "OK");
    assert_eq!(all["pairs"][0]["common_ancestor"]["value"], "SINGLE");
    assert_eq!(nvml["gpus"][0]["nvlink_speed_mbps"]["value"], 25000);
    assert_eq!(
        nvml["gpus"][0]["nvlinks"][11]["remote_type"]["value"],
        "switch"
    );
    assert_eq!(nvml["pairs"].as_array().unwrap().len(), 56);
    let cuda = &r["facts"]["gpus"]["cuda"]["state"]["loaded"];
    assert_eq!(cuda["devices"][7]["pci_bus_id"]["value"], "0000:a0:1d.0");
    // sysfs lists the 8 GPUs and not the NVIDIA bridge function.
    assert_eq!(
        r["facts"]["gpus"]["pci_gpus"]["value"]
            .as_array()
            .unwrap()
            .len(),
        8
    );
}

fn scenario_report_only(name: &str) -> serde_json::Value {
    let out = fixture_command(name, "check", &["--format", "json"], &[])
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Issue 14: on an A100 NVSwitch node (p4d, DGX A100) NVML has no fabric state, and
/// `probe`, `serve` and `--cuda off` skip the cuInit that reports a stopped fabric
/// manager. Every NVLink to the NVSwitches down is what NVML shows instead; the healthy
/// p4d passes the same way.
#[test]
fn a100_fabric_manager_down_fails_gpu_devices_without_cuda() {
    for (name, fails) in [
        ("gpu-a100-fabric-manager-down", true),
        ("gpu-p4d-a100", false),
    ] {
        let check = fixture_command(name, "check", &["--cuda", "off", "--format", "json"], &[])
            .output()
            .unwrap();
        let r: serde_json::Value = serde_json::from_slice(&check.stdout).unwrap();
        let gpu = finding(&r, "gpu-devices");
        let probe = fixture_command(name, "probe", &[], &[]).output().unwrap();
        let line = stdout(&probe);
        if fails {
            // The fabric manager is the node's: retry elsewhere.
            assert_eq!(check.status.code(), Some(3), "{name}");
            assert_eq!(gpu["status"], "fail", "{name}: {gpu}");
            assert_eq!(
                (gpu["blame"].as_str(), r["fault"].as_str()),
                (Some("node"), Some("node"))
            );
            assert!(
                gpu["summary"]
                    .as_str()
                    .unwrap()
                    .contains("every NVLink of the 8 GPU(s) is down on an NVSwitch system (1 NVSwitch(es) on the PCI bus)"),
                "{gpu}"
            );
            assert!(
                gpu["remediation"]
                    .as_str()
                    .unwrap()
                    .contains("systemctl enable --now nvidia-fabricmanager"),
                "{gpu}"
            );
            assert_eq!(probe.status.code(), Some(3), "{line}");
            assert!(
                line.starts_with("fail: ") && line.contains("gpu-devices: every NVLink"),
                "{line}"
            );
        } else {
            assert_eq!(check.status.code(), Some(0), "{name}: {}", stdout(&check));
            assert_eq!(gpu["status"], "pass", "{name}: {gpu}");
            assert_eq!(probe.status.code(), Some(0), "{line}");
            assert!(line.starts_with("ok: "), "{line}");
        }
    }
}

/// The NVML values batched in one nvmlDeviceGetFieldValues call per GPU fall back to the
/// per-call functions, value by value, where a driver refuses the field (older drivers;
/// Blackwell drops the NVLink error fields): both ways give the same facts, and
/// `read_paths` says which way each value came.
#[test]
fn nvml_fields_refused_by_the_driver_fall_back_to_per_call_reads() {
    let dir = scratch("nvml-field-fallback");
    fs::create_dir_all(&dir).unwrap();
    let base = fs::read_to_string(repo().join("tests/fixtures/gpu-h100-nv18/gpu.scenario"))
        .unwrap()
        + "nvlink_errors * 3 1 7\nremap 1 2 0 1 0\necc 1 4\n";
    let refuse: String = [4, 142, 143, 144, 145, 147, 161, 162, 163, 165, 166]
        .iter()
        .map(|f| format!("refuse_field {f}\n"))
        .collect();
    let gpus = |text: &str, file: &str| {
        let path = dir.join(file);
        fs::write(&path, text).unwrap();
        let path = path.display().to_string();
        let out = fixture_command(
            "gpu-h100-nv18",
            "facts",
            &[],
            &[("FAKE_GPU_SCENARIO", path.as_str())],
        )
        .output()
        .unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let facts: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        facts["gpus"]["nvml"]["state"]["loaded"]["gpus"].clone()
    };
    let mut batched = gpus(&base, "batched.scenario");
    let mut per_call = gpus(&(base + &refuse), "per-call.scenario");
    for (gpus, want) in [(&mut batched, "field_values"), (&mut per_call, "per_call")] {
        for g in gpus.as_array_mut().unwrap() {
            let paths = g.as_object_mut().unwrap().remove("read_paths").unwrap();
            for what in [
                "nvlink_state",
                "nvlink_version",
                "nvlink_remote_type",
                "nvlink_errors",
                "ecc_uncorrected_volatile",
                "remapped_rows",
            ] {
                assert_eq!(paths[what], want, "{what}: {paths}");
            }
            // Asked per call, the remote end of an NVSwitch link is still not read.
            for l in g["nvlinks"].as_array_mut().unwrap() {
                l.as_object_mut().unwrap().remove("remote_pci_bus_id");
            }
        }
    }
    assert_eq!(batched, per_call);
    // The values themselves came through: counters, memory health, link state.
    let gpu1 = &batched[1];
    assert_eq!(
        gpu1["nvlinks"][17]["error_counters"],
        serde_json::json!({"replay": 3, "recovery": 1, "crc_data": 7})
    );
    assert_eq!(gpu1["health"]["ecc_uncorrected_volatile"]["value"], 4);
    assert_eq!(gpu1["health"]["remapped_rows"]["value"]["correctable"], 2);
    assert_eq!(gpu1["health"]["remapped_rows"]["value"]["pending"], true);
    assert_eq!(gpu1["nvlinks"].as_array().unwrap().len(), 18);
    assert_eq!(gpu1["nvlinks"][0]["version"]["value"], "4.0");
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_hung_driver_call_fails_on_time_and_names_the_call() {
    // scenario() waits at most bounded::WAIT: a deadline that never fires fails the
    // test instead of hanging it. How fast the deadline fires is not asserted.
    let r = scenario("gpu-hung-p2p-query", 3);
    assert_eq!(status(&r, "gpu-devices"), "fail");
    let summary = finding(&r, "gpu-devices")["summary"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        summary.contains("nvmlDeviceGetP2PStatus(GPU 0, GPU 1, read)")
            && summary.contains("did not return within 1.0 s"),
        "{summary}"
    );
}

#[test]
fn cuda_visible_devices_is_applied_by_the_driver_and_mapped_by_bus_id() {
    let out = fixture_command(
        "gpu-p4d-a100",
        "check",
        &["--format", "json"],
        &[("CUDA_VISIBLE_DEVICES", "7,0,12,3")],
    )
    .output()
    .unwrap();
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let cuda = &r["facts"]["gpus"]["cuda"]["state"]["loaded"]["devices"];
    // The driver stops at 12: ordinals 0 and 1 are NVML GPUs 7 and 0.
    assert_eq!(cuda.as_array().unwrap().len(), 2);
    assert_eq!(cuda[0]["pci_bus_id"]["value"], "0000:a0:1d.0");
    let devices = finding(&r, "gpu-devices");
    assert_eq!(devices["status"], "warn");
    assert!(
        devices["summary"].as_str().unwrap().contains("\"12\""),
        "{devices}"
    );
    assert_eq!(status(&r, "gpu-p2p"), "pass");
}

#[test]
fn doctor_prints_nvidia_smi_matrices() {
    // An NVLink down is a warning (NCCL runs over the links left): doctor exits 0.
    let out = fixture_command("gpu-nvlink-down", "doctor", &[], &[])
        .output()
        .unwrap();
    // Issue 36: an NVLink down is a degraded run, a warning: exit 0.
    assert_eq!(out.status.code(), Some(0));
    golden(&golden_path("gpu-nvlink-down", "doctor.txt"), &stdout(&out));
    let json = fixture_command("gpu-pcie-switch-pair", "doctor", &["--format", "json"], &[])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(v["schema"], "nccl-preflight/report/v1");
    assert_eq!(
        v["gpu_matrices"]["topology"],
        serde_json::json!([["X", "PIX"], ["PIX", "X"]])
    );
    assert_eq!(
        v["gpu_matrices"]["p2p_nvlink"],
        serde_json::json!([["X", "NS"], ["NS", "X"]])
    );
    let none = fixture_command("healthy-pod", "doctor", &[], &[])
        .output()
        .unwrap();
    assert!(
        stdout(&none).starts_with("GPUs: no NVML (absent/libnvidia-ml.so.1"),
        "{}",
        stdout(&none)
    );
}

#[test]
fn cuda_off_skips_cuinit_and_nvml_still_sees_the_fabric_manager() {
    let out = fixture_command(
        "gpu-fabric-manager-down",
        "check",
        &["--format", "json", "--cuda", "off"],
        &[],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(3));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        r["facts"]["gpus"]["cuda"]["state"]["skipped"]["reason"],
        "--cuda off"
    );
    let devices = finding(&r, "gpu-devices");
    let summary = devices["summary"].as_str().unwrap();
    assert!(
        summary.contains("NVSwitch fabric registration incomplete")
            && summary.contains("GPU 7 not_started"),
        "{summary}"
    );
    assert!(
        devices["remediation"]
            .as_str()
            .unwrap()
            .contains("nvidia-fabricmanager")
    );
}

#[test]
fn rdma_scenarios_through_the_fake_vendor_libraries() {
    type Expectation = (&'static str, i32, &'static [(&'static str, &'static str)]);
    let cases: &[Expectation] = &[
        (
            "rdma-p4d-efa",
            0,
            &[
                ("rdma-devices", "pass"),
                ("rdma-memreg", "pass"),
                ("libfabric", "pass"),
                ("nccl-net-plugin", "pass"),
                ("gdr", "pass"),
            ],
        ),
        (
            "rdma-p5-efa",
            0,
            &[
                ("rdma-devices", "pass"),
                ("libfabric", "pass"),
                ("gdr", "pass"),
            ],
        ),
        // Issue 36: NCCL without a plugin that drives EFA runs on NET/Socket (src/net.cc
        // ncclNetInit skips a network that does not load or init): degraded, a warning.
        (
            "rdma-efa-no-plugin",
            0,
            &[("libfabric", "warn"), ("nccl-net-plugin", "warn")],
        ),
        (
            "rdma-plugin-broken",
            0,
            &[("nccl-net-plugin", "warn"), ("libfabric", "pass")],
        ),
        // aws-ofi-nccl refuses a GDR-required instance without GDR; NCCL drops it: TCP.
        ("rdma-no-gdr", 0, &[("gdr", "warn")]),
        // aws-ofi-nccl 1.4 exports ncclNetPlugin_v4 only; NCCL 2.23 looks for v8 to v5.
        (
            "rdma-plugin-api-too-old",
            0,
            &[("nccl-net-plugin", "warn"), ("libfabric", "pass")],
        ),
        // aws-ofi-nccl 1.14 refuses the efa provider of libfabric 1.21.
        (
            "rdma-libfabric-too-old",
            0,
            &[("libfabric", "warn"), ("nccl-net-plugin", "pass")],
        ),
        (
            "rdma-roce-multus",
            0,
            &[
                ("rdma-devices", "pass"),
                ("nccl-net-plugin", "pass"),
                ("libfabric", "skip"),
                ("gdr", "warn"),
            ],
        ),
        (
            "rdma-ib-ndr",
            0,
            &[
                ("rdma-devices", "pass"),
                ("rdma-memreg", "pass"),
                ("gdr", "pass"),
            ],
        ),
        // NCCL skips a port that is not ACTIVE and runs on the others: degraded.
        ("rdma-port-down", 0, &[("rdma-devices", "warn")]),
    ];
    for (name, code, statuses) in cases {
        let r = scenario(name, *code);
        for (id, want) in *statuses {
            assert_eq!(status(&r, id), *want, "{name}: {id}");
        }
    }
}

#[test]
fn doctor_shows_nics_ports_and_gpu_nic_affinity() {
    let out = fixture_command("rdma-roce-multus", "doctor", &[], &[])
        .output()
        .unwrap();
    golden(
        &golden_path("rdma-roce-multus", "doctor.txt"),
        &stdout(&out),
    );
    let text = stdout(&out);
    assert!(
        text.contains(
            "port 1: ACTIVE (LinkUp), Ethernet, 200 Gb/sec (4X HDR), RoCE v2 GID index 1,3"
        ),
        "{text}"
    );
    let json = fixture_command("rdma-p4d-efa", "doctor", &["--format", "json"], &[])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let m = &v["gpu_nic_affinity"];
    let nic = m["nics"]
        .as_array()
        .unwrap()
        .iter()
        .position(|n| n == "rdmap16s27")
        .unwrap();
    // The EFA NIC at 0000:10:1b.0 shares a PCIe switch with GPUs 0 and 1 only (p4d-24xl-topo.xml).
    let column: Vec<&str> = m["levels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row[nic].as_str().unwrap())
        .collect();
    assert_eq!(
        column,
        ["PIX", "PIX", "PHB", "PHB", "PHB", "PHB", "PHB", "PHB"]
    );
}

/// `check --format json` on the 2x H200 (driver 580) after NVML's values moved into one
/// field-values call per GPU: the real driver answered every batched field (no per-call
/// fallback), and the report replays to the same pass.
#[test]
fn a_real_h200_reads_every_batched_nvml_value_as_a_field() {
    let report = repo().join("tests/data/h200x2/nvml/check-report.json");
    let out = run(
        &[
            "check",
            "--format",
            "json",
            "--facts",
            report.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for id in ["gpu-devices", "gpu-p2p", "nvlink", "gpu-health"] {
        assert_eq!(finding(&r, id)["status"], "pass", "{id}");
    }
    let gpus = r["facts"]["gpus"]["nvml"]["state"]["loaded"]["gpus"]
        .as_array()
        .unwrap();
    assert_eq!(gpus.len(), 2);
    for g in gpus {
        let paths = g["read_paths"].as_object().unwrap();
        assert_eq!(paths.len(), 6, "{paths:?}");
        assert!(paths.values().all(|p| p == "field_values"), "{paths:?}");
        assert_eq!(g["nvlinks"].as_array().unwrap().len(), 18);
    }
}

#[test]
fn a_real_h200_capture_replays() {
    let facts = repo().join("tests/data/h200x2/facts.json");
    let out = run(&["doctor", "--facts", facts.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    golden(&golden_path("h200x2", "doctor.txt"), &stdout(&out));
    let json = run(
        &[
            "doctor",
            "--format",
            "json",
            "--facts",
            facts.to_str().unwrap(),
        ],
        &[],
    );
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    // What nvidia-smi topo -m and -p2p rw printed on that machine (../shared/data/h200x2).
    assert_eq!(
        v["gpu_matrices"]["topology"],
        serde_json::json!([["X", "NV18"], ["NV18", "X"]])
    );
    assert_eq!(
        v["gpu_matrices"]["p2p_read_write"],
        serde_json::json!([["X", "OK"], ["OK", "X"]])
    );
    for id in ["gpu-devices", "gpu-p2p", "nvlink", "pod-placement"] {
        assert_eq!(status(&v, id), "pass", "{id}");
    }
}

fn settings_of(r: &serde_json::Value) -> Vec<(String, String, String)> {
    r["settings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap().into(),
                s["value"].as_str().unwrap().into(),
                s["source"].as_str().unwrap().into(),
            )
        })
        .collect()
}

#[test]
fn tuned_settings_per_fabric() {
    let names = |r: &serde_json::Value| {
        settings_of(r)
            .into_iter()
            .map(|(n, _, _)| n)
            .collect::<Vec<_>>()
    };
    let p4d = scenario_report_only("rdma-p4d-efa");
    assert_eq!(
        names(&p4d),
        [
            "NCCL_BUFFSIZE",
            "NCCL_P2P_NET_CHUNKSIZE",
            "NCCL_SOCKET_IFNAME",
            "NCCL_TOPO_FILE"
        ],
        "libfabric 1.22: no FI_EFA_USE_DEVICE_RDMA"
    );
    let p5en = scenario_report_only("rdma-p5en-efa");
    assert!(names(&p5en).contains(&"NCCL_NETDEVS_POLICY".to_string()));
    assert!(
        !names(&scenario_report_only("rdma-p5-efa")).contains(&"NCCL_NETDEVS_POLICY".to_string())
    );
    // RoCE on OpenShift: NCCL's traffic on the Multus net1, only the NIC this pod was given.
    let roce = settings_of(&scenario_report_only("rdma-roce-multus"));
    assert!(
        roce.contains(&("NCCL_SOCKET_IFNAME".into(), "=net1".into(), "tuned".into())),
        "{roce:?}"
    );
    assert!(
        roce.iter()
            .any(|(n, v, _)| n == "NCCL_IB_HCA" && v == "=mlx5_0:1"),
        "{roce:?}"
    );
    assert!(
        roce.iter()
            .any(|(n, v, _)| n == "NCCL_IB_GID_INDEX" && v == "3"),
        "NCCL 2.18.5 predates dynamic GID selection: {roce:?}"
    );
    // InfiniBand with every NIC up and close: NCCL's own choice is right, nothing IB-specific.
    assert_eq!(
        names(&scenario_report_only("rdma-ib-ndr")),
        ["NCCL_SOCKET_IFNAME"]
    );
    // A PCIe-only node and a plain pod: only the socket interface.
    assert_eq!(
        names(&scenario_report_only("gpu-g6e-l40s-pcie")),
        ["NCCL_SOCKET_IFNAME"]
    );
}

#[test]
fn conflicting_user_values_are_kept_and_never_written() {
    let dir = scratch("conflicts");
    let (env_file, conf) = (dir.join("nccl.env"), dir.join("nccl.conf"));
    let out = fixture_command(
        "rdma-p4d-efa",
        "init",
        &[
            "--env-file",
            env_file.to_str().unwrap(),
            "--nccl-conf",
            conf.to_str().unwrap(),
            "--format",
            "json",
        ],
        &[
            ("NCCL_BUFFSIZE", "4194304"),
            ("NCCL_TOPO_FILE", "/etc/my-topo.xml"),
        ],
    )
    .output()
    .unwrap();
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let s = settings_of(&r);
    assert!(
        s.contains(&("NCCL_BUFFSIZE".into(), "4194304".into(), "user".into())),
        "{s:?}"
    );
    let buff = setting(&r, "NCCL_BUFFSIZE").unwrap();
    assert!(
        buff["reason"]
            .as_str()
            .unwrap()
            .contains("nccl-preflight would set \"8388608\"")
    );
    let env_text = std::fs::read_to_string(&env_file).unwrap();
    let conf_text = std::fs::read_to_string(&conf).unwrap();
    for text in [&env_text, &conf_text] {
        assert!(
            !text.contains("4194304") && !text.contains("8388608"),
            "{text}"
        );
        assert!(text.contains("NCCL_P2P_NET_CHUNKSIZE"), "{text}");
    }
    // The user's NCCL_TOPO_FILE does not exist here: NCCL detects the topology itself,
    // so it is a note on a pass (issue 36), and the value is kept.
    assert_eq!(status(&r, "nccl-env"), "pass");
    assert!(
        finding(&r, "nccl-env")["summary"]
            .as_str()
            .unwrap()
            .contains("note: NCCL_TOPO_FILE"),
        "{}",
        finding(&r, "nccl-env")
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_real_h200_reports_no_recovery_action() {
    // `check` on the 2x H200 (driver 580) after gpu-health learned NVML field 230.
    let facts = repo().join("tests/data/h200x2/check-facts.json");
    let out = run(
        &[
            "check",
            "--format",
            "json",
            "--facts",
            facts.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(status(&v, "gpu-health"), "pass");
    let gpus = v["facts"]["gpus"]["nvml"]["state"]["loaded"]["gpus"]
        .as_array()
        .unwrap();
    assert_eq!(gpus.len(), 2);
    for g in gpus {
        assert_eq!(
            g["health"]["recovery_action"],
            serde_json::json!({"value": 0})
        );
    }
    let health = finding(&v, "gpu-health");
    assert!(
        health["summary"]
            .as_str()
            .unwrap()
            .contains("no recovery action asked"),
        "{health}"
    );
}

#[test]
fn own_image_skips_the_image_checks_on_healthy_efa_roce_and_ib_nodes() {
    // The shipped EKS/RoCE initContainers ran in this image and failed healthy nodes.
    for name in ["rdma-p5-efa", "rdma-roce-multus", "rdma-ib-ndr"] {
        let out = fixture_command(
            name,
            "check",
            &["--format", "json"],
            &[("NCCL_PREFLIGHT_IMAGE", "own")],
        )
        .output()
        .unwrap();
        let r = report(&out);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{name}: {}",
            serde_json::to_string_pretty(&r["checks"]).unwrap()
        );
        assert_eq!(r["facts"]["image"], "own");
        for id in ["libfabric", "nccl-net-plugin", "rdma-memreg"] {
            assert_eq!(status(&r, id), "skip", "{name}: {id}");
            assert!(
                finding(&r, id)["summary"]
                    .as_str()
                    .unwrap()
                    .contains("training image"),
                "{name}: {id} says how to get it judged"
            );
        }
        assert_eq!(
            status(&r, "rdma-devices"),
            "pass",
            "{name}: node-level checks still run"
        );
        assert_eq!(
            r["facts"]["rdma"]["verbs"]["state"]["skipped"]["reason"]
                .as_str()
                .map(|s| s.contains("own image")),
            Some(true)
        );
    }
    // The trainer's image without the libraries is judged: NCCL there runs over TCP (a
    // warning, issue 36), failed under --require efa.
    let out = fixture_command(
        "rdma-efa-no-plugin",
        "check",
        &["--format", "json", "--image", "trainer"],
        &[],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(status(&report(&out), "nccl-net-plugin"), "warn");
    let out = fixture_command(
        "rdma-efa-no-plugin",
        "check",
        &["--format", "json", "--image", "trainer", "--require", "efa"],
        &[],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn pod_without_the_rdma_resource_is_scoped_to_the_job() {
    let mut facts = gathered_facts("rdma-p5-efa", &[]);
    keep_device_nodes(&mut facts, 0);
    // One node: NCCL uses no NIC, a note (issue 36).
    let (code, r) = check_saved_facts("fixture", &facts, &["--nodes", "1"]);
    assert_eq!(code, 0, "one node: nothing changes for NCCL");
    assert_eq!(status(&r, "rdma-devices"), "pass");
    for id in ["libfabric", "nccl-net-plugin", "memlock"] {
        assert_ne!(status(&r, id), "fail", "{id}");
    }
    // Across nodes: TCP, degraded, the pod spec's to fix.
    let (code, r) = check_saved_facts("fixture", &facts, &["--nodes", "16"]);
    assert_eq!(code, 0);
    let f = finding(&r, "rdma-devices");
    assert_eq!(
        (f["status"].as_str(), f["blame"].as_str()),
        (Some("warn"), Some("job")),
        "{f}"
    );
    assert!(
        f["remediation"]
            .as_str()
            .unwrap()
            .starts_with("Request the EFA devices"),
        "the fix leads with the resource: {f}"
    );
    assert!(
        f["remediation"]
            .as_str()
            .unwrap()
            .contains("vpc.amazonaws.com/efa: 32")
    );
}

/// --nodes is a typed fact (`nodes`) now; facts saved while it was the launcher
/// variable NCCL_PREFLIGHT_NODES still load with their span, and a report's facts show
/// the typed field, not the variable.
#[test]
fn facts_saved_with_the_old_nodes_variable_keep_their_span() {
    let mut facts = gathered_facts("rdma-p5-efa", &[]);
    keep_device_nodes(&mut facts, 0);
    assert!(facts.get("nodes").is_none(), "no --nodes, no field");
    facts["launcher"]["NCCL_PREFLIGHT_NODES"] = serde_json::json!({"value": "16"});
    let (code, r) = check_saved_facts("fixture", &facts, &[]);
    assert_eq!((code, status(&r, "rdma-devices")), (0, "warn"));
    assert!(
        finding(&r, "rdma-devices")["summary"]
            .as_str()
            .unwrap()
            .contains("the job spans 16 nodes"),
        "{}",
        finding(&r, "rdma-devices")
    );
    assert_eq!(r["facts"]["nodes"], 16);
    assert!(r["facts"]["launcher"].get("NCCL_PREFLIGHT_NODES").is_none());
    // The command line still wins over what was saved.
    let (code, r) = check_saved_facts("fixture", &facts, &["--nodes", "1"]);
    assert_eq!((code, status(&r, "rdma-devices")), (0, "pass"));
    assert_eq!(r["facts"]["nodes"], 1);
}

#[test]
fn partial_efa_allocation_warns_multi_node_jobs_with_the_count() {
    // p5: 8 of 32 EFA usable from an 8-GPU pod: a quarter of the network, degraded
    // (issue 36), and a failure under --require efa.
    let mut facts = gathered_facts("rdma-p5-efa", &[]);
    keep_device_nodes(&mut facts, 8);
    let (code, r) = check_saved_facts("fixture", &facts, &["--nodes", "4"]);
    assert_eq!(code, 0);
    let f = finding(&r, "rdma-devices");
    assert_eq!(f["outcome"]["kind"], "degraded", "{f}");
    assert!(
        f["summary"]
            .as_str()
            .unwrap()
            .contains("8 of the 32 EFA devices"),
        "{f}"
    );
    let (code, r) = check_saved_facts("fixture", &facts, &["--nodes", "1"]);
    assert_eq!((code, status(&r, "rdma-devices")), (0, "pass"));
    let (code, _) = check_saved_facts("fixture", &facts, &["--nodes", "1", "--require", "efa"]);
    assert_eq!(code, 1, "--require efa means enough EFA for these GPUs");
    let (code, _) = check_saved_facts("fixture", &facts, &["--nodes", "1", "--require", "efa=8"]);
    assert_eq!(code, 0);
    // p4d: 1 of 4.
    let mut facts = gathered_facts("rdma-p4d-efa", &[]);
    keep_device_nodes(&mut facts, 1);
    let (code, r) = check_saved_facts("fixture", &facts, &["--nodes", "2"]);
    assert_eq!(code, 0);
    assert!(
        finding(&r, "rdma-devices")["summary"]
            .as_str()
            .unwrap()
            .contains("1 of the 4 EFA devices")
    );
}

#[test]
fn efa_gdr_through_efas_own_driver_passes_without_nvidia_peermem() {
    let mut facts = gathered_facts("rdma-no-gdr", &[]);
    // Without GDR on a p5 aws-ofi-nccl refuses to start and NCCL runs over TCP: degraded,
    // the node's (issue 36).
    let (code, r) = check_saved_facts("fixture", &facts, &[]);
    assert_eq!((code, status(&r, "gdr")), (0, "warn"));
    for d in facts["rdma"]["devices"]["value"].as_array_mut().unwrap() {
        d["efa_p2p"] = "NVIDIA".into();
    }
    let (code, r) = check_saved_facts("fixture", &facts, &[]);
    assert_eq!(
        (code, status(&r, "gdr")),
        (0, "pass"),
        "{}",
        finding(&r, "gdr")
    );
}

#[test]
fn more_ranks_than_visible_gpus_fails() {
    let out = fixture_command(
        "gpu-h100-nv18",
        "check",
        &["--format", "json"],
        &[("LOCAL_WORLD_SIZE", "16")],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let r = report(&out);
    let f = finding(&r, "pod-placement");
    assert_eq!(f["status"], "fail");
    assert!(
        f["summary"]
            .as_str()
            .unwrap()
            .contains("invalid device ordinal"),
        "{f}"
    );
}

#[test]
fn a_degraded_hca_link_is_named_on_a_multi_node_job() {
    // An NDR HCA that trained at HDR after a bad cable: every ring runs at its speed.
    let mut facts = gathered_facts("rdma-ib-ndr", &[]);
    let (code, _) = check_saved_facts("fixture", &facts, &[]);
    assert_eq!(code, 0);
    facts["rdma"]["devices"]["value"][3]["ports"][0]["rate"] = "200 Gb/sec (4X HDR)".into();
    // NCCL runs, every ring at the slow NIC's pace: degraded, a warning that names it
    // and blames the node (issue 36).
    let (code, r) = check_saved_facts("fixture", &facts, &[]);
    assert_eq!(code, 0);
    let f = finding(&r, "rdma-devices");
    assert_eq!(
        (f["status"].as_str(), f["blame"].as_str()),
        (Some("warn"), Some("node")),
        "{f}"
    );
    assert_eq!(f["outcome"]["kind"], "degraded", "{f}");
    assert!(
        f["summary"]
            .as_str()
            .unwrap()
            .contains("mlx5_3 port 1 runs at 200 Gb/sec (4X HDR), its peers at 400"),
        "{f}"
    );
}

/// The seeds' own mistakes: `NCCL_IB_HBA=mlx5_1` (a typo for NCCL_IB_HCA that
/// passed as "checked"), a legacy `NCCL_P2P_LEVEL=5`, a forced NCCL_ALGO, and
/// NCCL_VERSION from an NVIDIA image, which is metadata and neither listed nor
/// linted; plus `NCCL_BUFFSIZE=4MB`, which NCCL's strtoll reads as 4 bytes and
/// which killed every rank with SIGFPE (NCCL 2.28.9, 2x H200): a failure.
#[test]
fn nccl_env_seed_typos_and_a_buffsize_that_crashes() {
    let r = scenario("nccl-env-typos", 1);
    assert_eq!(status(&r, "nccl-env"), "fail");
    let f = finding(&r, "nccl-env");
    let text = f["evidence"].to_string();
    for expected in [
        "a typo for NCCL_IB_HCA",
        "reads it as SYS",
        "NCCL reads the leading number only, 4",
        "SIGFPE",
        "overrides NCCL's tuner",
        "NCCL version unknown",
    ] {
        assert!(text.contains(expected), "{expected}: {text}");
    }
    assert!(!text.contains("NCCL_VERSION"), "{text}");
    assert!(setting(&r, "NCCL_VERSION").is_none());
}

/// Issue 13/14: the pod's Multus network was not attached, so net1 and the
/// RDMA device are both missing on a two-node job: fail, and point at the
/// annotation and the NetworkAttachmentDefinition, not at eth0.
#[test]
fn multus_network_missing_fails_pointing_at_the_annotation() {
    let r = scenario("multus-network-missing", 1);
    assert_eq!(status(&r, "nccl-env"), "fail");
    let fix = finding(&r, "nccl-env")["remediation"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(fix.contains("NetworkAttachmentDefinition"), "{fix}");
    assert!(fix.contains("rdma/rdma_shared_device_a"), "{fix}");
    assert!(!fix.contains("NCCL_SOCKET_IFNAME='=eth0'"), "{fix}");
}

/// Issue 14: `NCCL_SOCKET_IFNAME=eth` matches eth0 and the bridge eth1, and
/// NCCL's socket transport sends over both.
#[test]
fn ifname_prefix_matching_a_bridge_warns_with_the_exact_value() {
    let r = scenario("ifname-prefix-bridge", 0);
    assert_eq!(status(&r, "nccl-env"), "warn");
    let f = finding(&r, "nccl-env");
    assert!(f["summary"].as_str().unwrap().contains("eth0, eth1"), "{f}");
    assert!(
        f["remediation"]
            .as_str()
            .unwrap()
            .starts_with("NCCL_SOCKET_IFNAME='=eth")
    );
}

/// PyTorch's wheels bring their CUDA runtime as the nvidia-cuda-runtime wheel under
/// site-packages, off the loader's path: it is found there (here through PYTHONPATH), dated
/// by its own cudaRuntimeGetVersion, and a 12.8 runtime on a 12.4 driver runs only under
/// minor-version compatibility.
#[test]
fn cuda_runtime_in_a_python_wheel_is_found_and_dated() {
    let site = scratch("cudart-wheel").join("site-packages");
    let lib = site.join("nvidia/cuda_runtime/lib");
    fs::create_dir_all(&lib).unwrap();
    fs::copy(
        fake_libs().join("cudart/libcudart.so.12"),
        lib.join("libcudart.so.12"),
    )
    .unwrap();
    let site_text = site.display().to_string();
    let mut cmd = fixture_command(
        "gpu-g6e-l40s-pcie",
        "check",
        &["--format", "json"],
        &[
            ("PYTHONPATH", site_text.as_str()),
            ("FAKE_CUDART_VERSION", "12080"),
        ],
    );
    cmd.env_remove("NCCL_PREFLIGHT_CUDART_LIB");
    let out = cmd.output().unwrap();
    let r = report(&out);
    fs::remove_dir_all(site.parent().unwrap()).unwrap();
    let runtimes = r["facts"]["gpus"]["cuda_runtime"]["libraries"]
        .as_array()
        .unwrap();
    let wheel = runtimes
        .iter()
        .find(|l| l["found_by"] == "python wheel")
        .unwrap_or_else(|| panic!("{runtimes:?}"));
    assert_eq!(wheel["path"], format!("{}/libcudart.so.12", lib.display()));
    assert_eq!(wheel["version"]["value"], 12080);
    let f = finding(&r, "cuda-runtime");
    assert_eq!(f["status"], "warn", "{f}");
    assert!(
        f["summary"]
            .as_str()
            .unwrap()
            .contains("minor-version compatibility"),
        "{f}"
    );
}

/// The failure-policy contract (docs/failure-policy.md) on real scenarios: a node-only
/// failure exits 3, a job failure 1, a mixed run 1; the JSON report, the termination
/// message and `--ignore` say and move the same.
#[test]
fn exit_codes_follow_the_blame_node_3_job_1_mixed_1() {
    // (fixture, extra flags, exit code, fault, failed check -> blame)
    type Case = (
        &'static str,
        &'static [&'static str],
        i32,
        &'static str,
        &'static [(&'static str, &'static str)],
    );
    let cases: &[Case] = &[
        (
            "gpu-fabric-manager-down",
            &[],
            3,
            "node",
            &[("gpu-devices", "node")],
        ),
        (
            "runtime-defaults",
            &["--min-shm", "1GiB"],
            1,
            "job",
            &[("dev-shm", "job")],
        ),
        (
            "gpu-gb200-nvl72-broken",
            &[],
            1,
            "job",
            &[("gpu-devices", "node"), ("mnnvl", "job")],
        ),
        // The job's part ignored, the node's failure is left: retry elsewhere.
        (
            "gpu-gb200-nvl72-broken",
            &["--ignore", "mnnvl"],
            3,
            "node",
            &[("gpu-devices", "node")],
        ),
        (
            "gpu-gb200-nvl72-broken",
            &["--ignore", "all"],
            0,
            "none",
            &[],
        ),
    ];
    for (name, flags, code, fault, failed) in cases {
        let dir = scratch(&format!("blame-{name}"));
        let log = dir.join("termination-log");
        let mut args = vec![
            "--format",
            "json",
            "--termination-log",
            log.to_str().unwrap(),
        ];
        args.extend_from_slice(flags);
        let out = fixture_command(name, "init", &args, &[]).output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(*code),
            "{name} {flags:?}: {}",
            stderr(&out)
        );
        let r = report(&out);
        assert_eq!(r["fault"], *fault, "{name} {flags:?}");
        let blames: Vec<(String, String)> = r["checks"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["status"] == "fail")
            .map(|c| {
                (
                    c["id"].as_str().unwrap().into(),
                    c["blame"].as_str().unwrap().into(),
                )
            })
            .collect();
        let want: Vec<(String, String)> = failed
            .iter()
            .map(|(i, b)| (i.to_string(), b.to_string()))
            .collect();
        assert_eq!(blames, want, "{name} {flags:?}");
        let message = fs::read_to_string(&log).unwrap();
        let first = message.lines().next().unwrap();
        let said = match *fault {
            "node" => "nccl-preflight: FAIL (node fault: retry elsewhere): ",
            "job" => "nccl-preflight: FAIL (job fault: fix the job): ",
            _ => "nccl-preflight: WARN (0 failed",
        };
        assert!(first.starts_with(said), "{name} {flags:?}: {message}");
        for (id, blame) in *failed {
            assert!(
                message.contains(&format!("\n{id} [{blame}]: ")),
                "{message}"
            );
        }
        // `probe`, what an exec probe or node-problem-detector runs, exits the same.
        let probe = fixture_command(name, "probe", flags, &[]).output().unwrap();
        assert_eq!(probe.status.code(), Some(*code), "probe {name} {flags:?}");
        fs::remove_dir_all(&dir).unwrap();
    }
}

/// Issue 36: the `gdr` check is judged from the report's own prediction (`nccl.gdr`),
/// so on every fixture they say the same: a pass where NCCL uses GPUDirect RDMA on some
/// GPU, a warning or failure where a GPU is within NCCL_NET_GDR_LEVEL of its NIC but
/// nothing provides it (or ACS redirects the traffic of pairs that use it), a skip where
/// no GPU is within reach of the NIC NCCL uses.
#[test]
fn gdr_check_and_prediction_agree_on_every_fixture() {
    let mut judged = 0;
    for entry in fs::read_dir(repo().join("tests/fixtures")).unwrap() {
        let dir = entry.unwrap().path();
        if !dir.join("root").is_dir() {
            continue;
        }
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let r = scenario_report_only(&name);
        let gdr = finding(&r, "gdr");
        let pairs = r["nccl"]["gdr"].as_array().unwrap();
        let used = pairs.iter().any(|p| p["used"] == true);
        let in_reach = pairs.iter().any(|p| p["in_reach"] == true);
        let summary = gdr["summary"].as_str().unwrap();
        let agrees = match gdr["status"].as_str().unwrap() {
            "skip" => !in_reach,
            "pass" => used,
            _ if summary.starts_with("could not determine") => pairs.is_empty(),
            _ if summary.contains("ACS redirects") => used,
            _ if summary.contains("beyond NCCL_NET_GDR_LEVEL") => {
                pairs.iter().any(|p| p["in_reach"] == false)
            }
            _ => in_reach && !used,
        };
        assert!(agrees, "{name}: gdr {gdr:#} against nccl.gdr {pairs:#?}");
        judged += usize::from(in_reach);
    }
    // Some fixtures have GPUs within reach of a NIC, or the comparison proves little.
    assert!(judged >= 3, "{judged}");
}
