//! Issue 39 row 2: a query that could not be made is never reported as a state of the
//! hardware. Every NVML call `check` makes is failed three ways through the real dlopen
//! path: the function absent from the library (a fake NVML linked with a version script
//! that leaves it out, as an older or another driver's libnvidia-ml lacks it), an error
//! return (NVML_ERROR_UNKNOWN, which says nothing of the device), and a hang. Each is
//! proven to degrade the same way: one `gpu-devices` line that says what could not be
//! read, and no check reading the missing answer as a link, a GPU or a node fault.

use crate::support::{fake_libs, fixture_command, scratch};
use std::path::{Path, PathBuf};

/// A fake libnvidia-ml.so.1 whose dynamic symbols are only those `script` (an ld
/// version script) makes global, in `scratch/NAME/`, beside the `libnvidia-ml.so.VERSION`
/// file it links to, as the driver installs it. Returns the folder.
fn fake_nvml(name: &str, script: &str, version: &str) -> PathBuf {
    let dir = scratch(&format!("nvml-{name}"));
    std::fs::write(dir.join("nvml.map"), script).unwrap();
    let file = format!("libnvidia-ml.so.{version}");
    let out = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(dir.join(&file))
        .arg(crate::support::repo().join("tests/fakes/fake_nvml.c"))
        .arg("-lpthread")
        .arg(format!(
            "-Wl,--version-script={}",
            dir.join("nvml.map").display()
        ))
        .output()
        .expect("cc builds the fake NVML");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::os::unix::fs::symlink(&file, dir.join("libnvidia-ml.so.1")).unwrap();
    dir
}

/// A fake NVML with every function but `absent`. An exact name in `local:` wins over
/// the `nvml*` pattern (GNU ld, "VERSION" command: exact matches take precedence).
fn without(absent: &str) -> PathBuf {
    fake_nvml(
        &format!("without-{absent}"),
        &format!("{{ global: nvml*; local: {absent}; *; }};\n"),
        "580.159.04",
    )
}

/// One run's answer: exit code, and each check's (status, summary, evidence).
struct Run {
    code: i32,
    checks: Vec<(String, String, String, Vec<String>)>,
}

impl Run {
    fn check(&self, id: &str) -> &(String, String, String, Vec<String>) {
        self.checks.iter().find(|c| c.0 == id).unwrap()
    }

    /// Every line a check said, summary and evidence.
    fn said(&self, id: &str) -> String {
        let c = self.check(id);
        format!("{}\n{}", c.2, c.3.join("\n"))
    }
}

/// `check --cuda off --format json` on `fixture` with `scenario` and the NVML in `lib`.
fn run(fixture: &str, scenario: &Path, lib: Option<&Path>, extra: &[&str]) -> Run {
    let mut args = vec!["--cuda", "off", "--format", "json", "--timeout", "300ms"];
    args.extend(extra);
    let mut cmd = fixture_command(fixture, "check", &args, &[]);
    let nvidia = fake_libs().join("nvidia");
    let path = match lib {
        Some(l) => format!("{}:{}", l.display(), nvidia.display()),
        None => nvidia.display().to_string(),
    };
    cmd.env("LD_LIBRARY_PATH", path)
        .env("FAKE_GPU_SCENARIO", scenario);
    let out = cmd.output().unwrap();
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}", String::from_utf8_lossy(&out.stderr));
    });
    let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
    let checks = json["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let evidence = c["evidence"].as_array().unwrap().iter().map(text).collect();
            (
                text(&c["id"]),
                text(&c["status"]),
                text(&c["summary"]),
                evidence,
            )
        })
        .collect();
    Run {
        code: out.status.code().unwrap_or(-1),
        checks,
    }
}

/// The NVML functions a healthy run of `fixture` calls, from `--trace`.
fn calls(fixture: &str, scenario: &Path) -> Vec<String> {
    let mut cmd = fixture_command(fixture, "check", &["--cuda", "off", "--trace"], &[]);
    cmd.env("FAKE_GPU_SCENARIO", scenario);
    let out = cmd.output().unwrap();
    let mut seen = Vec::new();
    for line in String::from_utf8_lossy(&out.stderr).lines() {
        let Some(call) = line.strip_prefix("nccl-preflight: trace: ") else {
            continue;
        };
        let names = call.rsplit_once(": ").map_or(call, |(n, _)| n);
        for name in names.split(", ") {
            let function = name.split('(').next().unwrap_or(name).to_string();
            if function.starts_with("nvml") && !seen.contains(&function) {
                seen.push(function);
            }
        }
    }
    seen
}

const STATUS: [&str; 4] = ["skip", "pass", "warn", "fail"];

fn rank(status: &str) -> usize {
    STATUS.iter().position(|s| *s == status).unwrap()
}

/// What no check may say when `function` could not be read, written from what each
/// function reads (nvml.h) before the tool ran: (function, check, forbidden words).
const CLAIMS: &[(&str, &str, &str)] = &[
    ("nvmlDeviceGetNvLinkState", "nvlink", "active NVLink"),
    ("nvmlDeviceGetNvLinkState", "nvlink", "down ("),
    (
        "nvmlDeviceGetNvLinkState",
        "gpu-devices",
        "fabric manager is not running",
    ),
    (
        "nvmlDeviceGetNvLinkState",
        "gpu-p2p",
        "no GPU pair shares NVLink",
    ),
    ("nvmlDeviceGetP2PStatus", "gpu-p2p", "P2P read and write OK"),
    ("nvmlDeviceGetP2PStatus", "gpu-p2p", "without P2P"),
    (
        "nvmlDeviceGetPciInfo_v3",
        "gpu-devices",
        "lost to the driver",
    ),
    (
        "nvmlDeviceGetHandleByIndex_v2",
        "gpu-devices",
        "lost to the driver",
    ),
    (
        "nvmlDeviceGetTotalEccErrors",
        "gpu-health",
        "no uncorrectable ECC errors",
    ),
    (
        "nvmlDeviceGetRemappedRows",
        "gpu-health",
        "no failed or pending remaps",
    ),
    ("nvmlDeviceGetGpuFabricInfo", "mnnvl", "not an MNNVL system"),
    (
        "nvmlDeviceGetTopologyCommonAncestor",
        "gpu-p2p",
        "as expected",
    ),
];

/// Functions without which NVML cannot list the GPUs at all: NCCL's own init fails the
/// same way (NVIDIA/nccl v2.28.9-1 src/misc/nvmlwrap.cc ncclNvmlEnsureInitialized:
/// nvmlInit, then nvmlDeviceGetCount, each failure ncclSystemError).
const NVML_CANNOT_START: &[&str] = &["nvmlInit_v2", "nvmlDeviceGetCount_v2"];

/// Asserts the degradation of one cell and returns its matrix entry.
fn cell(function: &str, outcome: &str, base: &Run, r: &Run, lib: Option<&Path>) -> String {
    let at = format!("{function} {outcome}");
    let devices = r.check("gpu-devices");
    let said = r.said("gpu-devices");
    for (f, check, words) in CLAIMS {
        if *f == function && outcome != "hangs" {
            assert!(
                !r.said(check).contains(words),
                "{at}: {check} says {words:?}: {}",
                r.said(check)
            );
        }
    }
    if outcome == "hangs" {
        // A call that never returns is the driver's state, said with the call's name; no
        // check claims what the unfinished run would have read.
        assert_eq!(r.code, 3, "{at}: a hung driver is the node's");
        assert!(
            devices.2.contains(function) && devices.2.contains("did not return within"),
            "{at}: {}",
            devices.2
        );
        for id in ["gpu-p2p", "nvlink", "gpu-health", "mnnvl"] {
            assert_eq!(r.check(id).1, "skip", "{at}: {id}");
        }
        return format!("fail (node): {function} did not return; GPU checks skip");
    }
    if NVML_CANNOT_START.contains(&function) {
        assert_eq!(devices.1, "fail", "{at}: {said}");
        if outcome == "absent" {
            assert_eq!(r.code, 1, "{at}: the library's fault is the job's: {said}");
            return "fail (job): could not read, not in this NVML".into();
        }
        return "fail (node): NVML failed, as NCCL's init would".into();
    }
    // Everything else: one warning that names the call, and no check worse than with
    // every call answered (a skip for what could not be read), no other exit code.
    assert_eq!(devices.1, "warn", "{at}: {said}");
    let expected = match lib {
        Some(l) => format!(
            "could not read: {function} is not in this NVML ({}/libnvidia-ml.so.1, libnvidia-ml.so.580.159.04)",
            l.display()
        ),
        None => format!("could not read: {function}: "),
    };
    assert!(said.contains(&expected), "{at}: {expected:?} not in {said}");
    assert_eq!(r.code, base.code, "{at}: exit code");
    let mut changed = Vec::new();
    for (id, status, _, _) in &base.checks {
        let now = &r.check(id).1;
        if id != "gpu-devices" && now != status {
            assert!(
                rank(now) <= rank(status),
                "{at}: {id} {status} -> {now}: {}",
                r.said(id)
            );
            changed.push(format!("{id} {now}"));
        }
    }
    let others = if changed.is_empty() {
        String::new()
    } else {
        format!("; {}", changed.join(", "))
    };
    format!("warn: could not read{others}")
}

/// The scenario of `fixture`, with `extra` lines, written to a scratch file.
fn scenario(name: &str, fixture: &str, extra: &str) -> PathBuf {
    let base = std::fs::read_to_string(
        crate::support::repo()
            .join("tests/fixtures")
            .join(fixture)
            .join("gpu.scenario"),
    )
    .unwrap();
    let path = scratch(&format!("scenario-{name}")).join("gpu.scenario");
    std::fs::write(&path, format!("{base}{extra}")).unwrap();
    path
}

/// The failure-injection matrix: every NVML call `check` makes on an HGX H100 (every
/// field of the batch refused, so each per-call function runs, as on drivers before
/// the fields existed) and on a PCIe L40S node (the topology query between GPUs that
/// share no NVLink), each absent, failing and hanging. Printed as a table
/// (`-- --nocapture`).
#[test]
fn every_nvml_call_absent_failing_or_hanging_degrades_to_could_not_read() {
    let refused: String = [
        4, 90, 142, 143, 144, 145, 147, 161, 162, 163, 164, 165, 166, 230,
    ]
    .iter()
    .map(|f| format!("refuse_field {f}\n"))
    .collect();
    let contexts = [
        (
            "gpu-h100-nv18",
            scenario("h100-per-call", "gpu-h100-nv18", &refused),
        ),
        (
            "gpu-g6e-l40s-pcie",
            scenario("l40s", "gpu-g6e-l40s-pcie", ""),
        ),
    ];
    let mut rows = vec![
        "| NVML call | absent from the library | returns NVML_ERROR_UNKNOWN | hangs |".to_string(),
        "|---|---|---|---|".to_string(),
    ];
    let mut done: Vec<String> = Vec::new();
    for (fixture, scen) in &contexts {
        let base = run(fixture, scen, None, &[]);
        for function in calls(fixture, scen) {
            if done.contains(&function) {
                continue;
            }
            let lib = without(&function);
            let absent = run(fixture, scen, Some(&lib), &[]);
            let failing = run(
                fixture,
                &scenario(
                    &format!("fail-{function}"),
                    fixture,
                    &format!(
                        "{}fail {function} 999\n",
                        if *fixture == "gpu-h100-nv18" {
                            refused.as_str()
                        } else {
                            ""
                        }
                    ),
                ),
                None,
                &[],
            );
            let hanging = run(
                fixture,
                &scenario(
                    &format!("hang-{function}"),
                    fixture,
                    &format!(
                        "{}hang {function}\n",
                        if *fixture == "gpu-h100-nv18" {
                            refused.as_str()
                        } else {
                            ""
                        }
                    ),
                ),
                None,
                &[],
            );
            rows.push(format!(
                "| {function} ({fixture}) | {} | {} | {} |",
                cell(&function, "absent", &base, &absent, Some(&lib)),
                cell(&function, "fails", &base, &failing, None),
                cell(&function, "hangs", &base, &hanging, None),
            ));
            done.push(function);
        }
    }
    println!("{}", rows.join("\n"));
    // The calls every run must reach: a trace that lost one would shrink the matrix.
    for needed in [
        "nvmlDeviceGetNvLinkState",
        "nvmlDeviceGetP2PStatus",
        "nvmlDeviceGetTopologyCommonAncestor",
        "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetFieldValues",
    ] {
        assert!(
            done.iter().any(|f| f == needed),
            "{needed} was never called: {done:?}"
        );
    }
}

/// The NVML: only nvmlInit_v2, nvmlDeviceGetCount_v2, the handle, the P2P status
/// and the common ancestor (and nvmlErrorString, nvmlShutdown). Expected, written down
/// before the run: gpu-devices warns "could not read: F is not in this NVML (PATH, FILE)"
/// in one finding that names the library file (so its driver release), nvlink,
/// gpu-health and mnnvl skip, gpu-p2p claims no link, and the exit code is 0: no node
/// fault, no "NVLink down (0 of 18 active)".
#[test]
fn an_nvml_of_five_functions_is_one_could_not_read_warning_and_no_node_fault() {
    let lib = fake_nvml(
        "five-functions",
        "{ global: nvmlInit_v2; nvmlShutdown; nvmlErrorString; nvmlDeviceGetCount_v2; \
         nvmlDeviceGetHandleByIndex_v2; nvmlDeviceGetP2PStatus; \
         nvmlDeviceGetTopologyCommonAncestor; local: *; };\n",
        "535.104.05",
    );
    let scen = scenario("five", "gpu-h100-nv18", "");
    let r = run("gpu-h100-nv18", &scen, Some(&lib), &[]);
    assert_eq!(r.code, 0, "{:?}", r.checks);
    let devices = r.check("gpu-devices");
    assert_eq!(devices.1, "warn");
    let library = format!(
        "{}/libnvidia-ml.so.1, libnvidia-ml.so.535.104.05",
        lib.display()
    );
    assert!(
        devices.2.starts_with("could not read: ") && devices.2.contains(&library),
        "{}",
        devices.2
    );
    for f in [
        "nvmlDeviceGetNvLinkState",
        "nvmlDeviceGetPciInfo_v3",
        "nvmlDeviceGetFieldValues",
    ] {
        assert!(
            r.said("gpu-devices").contains(&format!(
                "could not read: {f} is not in this NVML ({library})"
            )),
            "{f}"
        );
    }
    let naming: Vec<&str> = r
        .checks
        .iter()
        .filter(|c| {
            c.2.contains("is not in this NVML")
                || c.3.iter().any(|e| e.contains("is not in this NVML"))
        })
        .map(|c| c.0.as_str())
        .collect();
    assert_eq!(naming, ["gpu-devices"], "one finding names the library");
    for id in ["nvlink", "gpu-health", "mnnvl", "gpu-p2p"] {
        assert_eq!(r.check(id).1, "skip", "{id}: {}", r.said(id));
    }
    let all: String = r
        .checks
        .iter()
        .map(|c| format!("{}\n{}\n", c.2, c.3.join("\n")))
        .collect();
    for claim in [
        "down (",
        "lost to the driver",
        "fabric manager",
        "as expected",
        "no uncorrectable",
    ] {
        assert!(!all.contains(claim), "claims {claim:?}: {all}");
    }
    // --require nvlink turns "could not read" into a failure of the job's requirement,
    // still with no link called down.
    let strict = run("gpu-h100-nv18", &scen, Some(&lib), &["--require", "nvlink"]);
    assert_eq!(strict.check("nvlink").1, "fail");
    assert!(
        !strict.said("nvlink").contains("down ("),
        "{}",
        strict.said("nvlink")
    );
}
