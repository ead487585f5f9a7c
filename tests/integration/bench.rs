//! `bench` against the fake libcuda and libnccl: the fakes copy and sum real
//! bytes in host memory and advance a virtual clock at the scenario's speed,
//! so figures are exact; faults are injected per test.

use crate::support::{command, fake_libs, finding, scratch, stderr, stdout};
use serde_json::Value;
use std::process::Output;

/// Two H200s joined by 18 NVLinks (478.1 GB/s one way), as on the lent machine.
const TWO_H200: &str = "driver 580.95.05
cuda_version 13000
gpu 0000:1b:00.0 9.0 143771 0 0-47 GPU-aaaa0000-0000-0000-0000-000000000000 NVIDIA H200
gpu 0000:43:00.0 9.0 143771 0 0-47 GPU-bbbb0000-0000-0000-0000-000000000000 NVIDIA H200
link 0 0-17 1 6 gpu1 gpu
link 1 0-17 1 6 gpu0 gpu
speed * 26562
pcie * 5 16
p2p * * OK OK OK OK OK
";

fn bench(name: &str, scenario: &str, args: &[&str], env: &[(&str, &str)]) -> (Output, Value) {
    let dir = scratch(&format!("bench-{name}"));
    std::fs::write(dir.join("gpu.scenario"), scenario).unwrap();
    let libs = fake_libs();
    let path = format!(
        "{}:{}",
        libs.join("nvidia").display(),
        libs.join("nccl-lib").display()
    );
    let mut all = vec!["bench", "--format", "json"];
    all.extend(args);
    let mut cmd = command(&all, env);
    cmd.env("FAKE_GPU_SCENARIO", dir.join("gpu.scenario"))
        .env("LD_LIBRARY_PATH", path)
        .env("TMPDIR", &dir);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = crate::bounded::output_within(&mut cmd, &format!("bench {name}"));
    let json = serde_json::from_str(&stdout(&out))
        .unwrap_or_else(|e| panic!("{e}: {}\nstderr: {}", stdout(&out), stderr(&out)));
    // NCCL's log went to a private file in TMPDIR; nothing is left behind.
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n != "gpu.scenario")
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    (out, json)
}

fn near(v: &Value, want: f64) -> bool {
    (v.as_f64().unwrap_or(f64::NAN) - want).abs() < want * 1e-3
}

#[test]
fn healthy_nvlink_pair_measures_exact_figures_and_passes() {
    let scenario = format!("{TWO_H200}cuda_bw 0 1 400\ncuda_bw 1 0 380\n");
    let (out, r) = bench(
        "healthy",
        &scenario,
        &["--size", "4MiB", "--nccl-sizes", "1MiB,8MiB"],
        &[("FAKE_NCCL_BUSBW", "300")],
    );
    assert_eq!(out.status.code(), Some(0), "{r:#}");
    assert_eq!(r["verdict"], "pass");
    let pairs = r["p2p"]["pairs"].as_array().unwrap();
    assert_eq!(pairs.len(), 2);
    let (ab, ba) = (&pairs[0], &pairs[1]);
    assert_eq!((ab["src"].as_u64(), ab["dst"].as_u64()), (Some(0), Some(1)));
    assert!(near(&ab["unidirectional_gbps"], 400.0), "{ab}");
    assert!(near(&ba["unidirectional_gbps"], 380.0), "{ba}");
    // Both ways at once: the slower direction sets the time, 2 x 380.
    assert!(near(&ab["bidirectional_gbps"], 760.0), "{ab}");
    assert!(near(&ab["expected_gbps"], 18.0 * 26.562), "{ab}");
    assert_eq!(ab["expected_basis"], "18 NVLinks x 26.562 GB/s");
    assert!(
        near(&ab["unidirectional_fraction"], 400.0 / 478.116),
        "{ab}"
    );
    assert_eq!(ab["verified"], true);
    let nccl = &r["nccl"];
    assert_eq!(nccl["version"], "2.28.9");
    let sizes = nccl["sizes"].as_array().unwrap();
    assert_eq!(sizes.len(), 2);
    // Two GPUs: busbw = algbw x 2(n-1)/n = algbw.
    for s in sizes {
        assert!(near(&s["busbw_gbps"], 300.0), "{s}");
        assert!(near(&s["algbw_gbps"], 300.0), "{s}");
        assert_eq!(s["verified"], true);
    }
    assert_eq!(nccl["transports"]["P2P/CUMEM"], 4, "{nccl}");
    assert_eq!(finding(&r, "gpu-bandwidth")["status"], "pass");
    assert!(
        finding(&r, "gpu-bandwidth")["evidence"][0]
            .as_str()
            .unwrap()
            .starts_with("slowest: GPU1 -> GPU0: 380.0 GB/s one way (79%)")
    );
    assert_eq!(finding(&r, "nccl-allreduce")["status"], "pass");
}

#[test]
fn a_slow_link_or_corrupted_copy_fails_with_the_pair_named() {
    let scenario = format!("{TWO_H200}cuda_bw 0 1 100\ncuda_corrupt 1 0\n");
    let (out, r) = bench("degraded", &scenario, &["p2p", "--size", "4MiB"], &[]);
    assert_eq!(out.status.code(), Some(3));
    assert!(r.get("nccl").is_none());
    let f = finding(&r, "gpu-bandwidth");
    assert_eq!(f["status"], "fail");
    let evidence = f["evidence"].to_string();
    assert!(
        evidence.contains("GPU0 -> GPU1: 100.0 GB/s one way (21%)"),
        "{evidence}"
    );
    // The flipped byte sits at the start of the third 1 MiB chunk.
    assert!(
        evidence.contains("GPU1 -> GPU0: data did not arrive intact: byte 2097152:"),
        "{evidence}"
    );
    assert!(
        f["remediation"]
            .as_str()
            .unwrap()
            .contains("nvidia-smi nvlink -e")
    );
    // A lower threshold forgives the slow link but never the corruption.
    let (out, r) = bench(
        "degraded-low",
        &scenario,
        &["p2p", "--size", "4MiB", "--min-bandwidth-fraction", "0.2"],
        &[],
    );
    assert_eq!(out.status.code(), Some(3));
    let evidence = finding(&r, "gpu-bandwidth")["evidence"].to_string();
    assert!(
        evidence.contains("slowest: GPU0 -> GPU1: 100.0 GB/s one way (21%)"),
        "{evidence}"
    );
    assert!(evidence.contains("did not arrive intact"), "{evidence}");
}

#[test]
fn nccl_errors_wrong_sums_and_the_wrong_transport_fail() {
    let args = ["nccl", "--nccl-sizes", "1MiB"];
    let (out, r) = bench("nccl-init", TWO_H200, &args, &[("FAKE_NCCL_FAIL", "init")]);
    assert_eq!(out.status.code(), Some(3));
    let f = finding(&r, "nccl-allreduce");
    assert_eq!(f["summary"], "NCCL all-reduce did not complete");
    assert!(
        f["evidence"].to_string().contains(
            "ncclCommInitAll(2 GPUs): unhandled system error (run with NCCL_DEBUG=INFO for details) (2)"
        ),
        "{f}"
    );
    let (out, r) = bench("nccl-wrong", TWO_H200, &args, &[("FAKE_NCCL_WRONG", "1")]);
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(
        finding(&r, "nccl-allreduce")["summary"],
        "NCCL all-reduce returned wrong sums"
    );
    let (out, r) = bench(
        "nccl-shm",
        TWO_H200,
        &args,
        &[("FAKE_NCCL_TRANSPORT", "SHM/direct/direct")],
    );
    assert_eq!(out.status.code(), Some(3));
    let f = finding(&r, "nccl-allreduce");
    assert_eq!(f["summary"], "NCCL used SHM between GPUs joined by NVLink");
    assert!(
        f["remediation"]
            .as_str()
            .unwrap()
            .contains("NCCL_(P2P|SHM)_DISABLE")
    );
    // Slow all-reduce: 100 GB/s over 478 GB/s of NVLink.
    let (out, r) = bench("nccl-slow", TWO_H200, &args, &[("FAKE_NCCL_BUSBW", "100")]);
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(
        finding(&r, "nccl-allreduce")["summary"],
        "busbw 100.0 GB/s at 1 MiB, 21% of the slowest link"
    );
}

#[test]
fn hung_calls_fail_on_time_naming_the_call() {
    for (name, scenario, env) in [
        (
            "hang-cuda",
            format!("{TWO_H200}hang cuEventSynchronize\n"),
            vec![],
        ),
        (
            "hang-nccl",
            TWO_H200.to_string(),
            vec![("FAKE_NCCL_HANG", "1")],
        ),
    ] {
        // bench() waits at most bounded::WAIT, so a call the deadline misses fails
        // the test instead of hanging it; how fast the deadline fires is not asserted.
        let (out, r) = bench(
            name,
            &scenario,
            &[
                "--size",
                "2MiB",
                "--nccl-sizes",
                "1MiB",
                "--timeout",
                "300ms",
            ],
            &env,
        );
        assert_eq!(out.status.code(), Some(3), "{name}");
        let text = r["findings"].to_string();
        let call = if name == "hang-cuda" {
            "cuEventSynchronize(0)"
        } else {
            "ncclGroupEnd"
        };
        assert!(
            text.contains(call) && text.contains("did not return within 0.3 s"),
            "{text}"
        );
    }
}

#[test]
fn what_cannot_be_measured_is_skipped_or_refused_clearly() {
    // No libcuda: nothing to measure, both skip. Issue 13: that is not a pass (it
    // printed "PASS in 0.00 s" and exited 0): the verdict is skip and the exit code 2.
    let (out, r) = bench(
        "no-driver",
        TWO_H200,
        &[],
        &[("NCCL_PREFLIGHT_CUDA_LIB", "absent/libcuda.so.1")],
    );
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(r["verdict"], "skip");
    assert!(
        stderr(&out).contains("nothing was measured"),
        "{}",
        stderr(&out)
    );
    assert_eq!(finding(&r, "gpu-bandwidth")["status"], "skip");
    assert_eq!(
        finding(&r, "nccl-allreduce")["summary"],
        "no CUDA driver on this machine"
    );
    // One visible GPU.
    let (out, r) = bench("one-gpu", TWO_H200, &[], &[("CUDA_VISIBLE_DEVICES", "1")]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        finding(&r, "gpu-bandwidth")["summary"],
        "1 GPU visible: nothing to measure between GPUs"
    );
    // cuInit refused: a failure.
    let (out, r) = bench(
        "init-802",
        &format!("{TWO_H200}cuda_init 802\n"),
        &["p2p"],
        &[],
    );
    assert_eq!(out.status.code(), Some(3));
    assert!(
        finding(&r, "gpu-bandwidth")["evidence"]
            .to_string()
            .contains("CUDA_ERROR_SYSTEM_NOT_READY (802)")
    );
    // No NCCL library.
    let (out, r) = bench(
        "no-nccl",
        TWO_H200,
        &["nccl", "--nccl-sizes", "1MiB"],
        &[("NCCL_PREFLIGHT_NCCL_LIB", "absent/libnccl.so.2")],
    );
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        finding(&r, "nccl-allreduce")["summary"],
        "no NCCL library found"
    );
    // No peer access: a warning, nothing copied.
    let (out, r) = bench(
        "no-peer",
        &format!("{TWO_H200}cuda_peer * * 0\n"),
        &["p2p", "--size", "1MiB"],
        &[],
    );
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(finding(&r, "gpu-bandwidth")["status"], "warn");
    // A budget too small to start: what was not measured fails.
    let slow_init = format!("{TWO_H200}cuda_init_ms 200\n");
    let (out, r) = bench(
        "budget",
        &slow_init,
        &["p2p", "--bench-seconds", "100ms", "--size", "1MiB"],
        &[],
    );
    assert_eq!(out.status.code(), Some(3));
    assert!(
        finding(&r, "gpu-bandwidth")["evidence"]
            .to_string()
            .contains("budget ran out")
    );
}

#[test]
fn bad_flags_exit_2_naming_the_flag() {
    for (args, word) in [
        (vec!["bench", "--size", "1000"], "--size"),
        (
            vec!["bench", "--min-bandwidth-fraction", "2"],
            "--min-bandwidth-fraction",
        ),
        (vec!["bench", "--nccl-sizes", "6"], "--nccl-sizes"),
        (vec!["bench", "--iterations", "0"], "--iterations"),
        (vec!["bench", "sideways"], "sideways"),
    ] {
        let out = command(&args, &[]).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(stderr(&out).contains(word), "{args:?}: {}", stderr(&out));
        assert!(out.stdout.is_empty());
    }
}

#[test]
fn init_bench_adds_measured_checks_under_the_same_ignore_policy() {
    let dir = scratch("init-bench");
    let base = crate::support::repo().join("tests/fixtures/gpu-h100-nv18/gpu.scenario");
    let slow = dir.join("slow.scenario");
    let text = std::fs::read_to_string(&base).unwrap();
    std::fs::write(&slow, format!("{text}cuda_bw 2 5 60\n")).unwrap();
    let report = dir.join("report.json");
    let report_flag = report.to_str().unwrap();
    let small = [
        ("NCCL_PREFLIGHT_BENCH_SIZE", "1MiB"),
        ("NCCL_PREFLIGHT_NCCL_SIZES", "1MiB"),
    ];
    let run = |extra: &[&str], scenario: &std::path::Path| {
        let mut args = vec!["--bench", "--report", report_flag];
        args.extend(extra);
        let mut env = small.to_vec();
        env.push(("FAKE_GPU_SCENARIO", scenario.to_str().unwrap()));
        let out = crate::support::fixture_command("gpu-h100-nv18", "init", &args, &env)
            .output()
            .unwrap();
        let r: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
        (out, r)
    };
    let (out, r) = run(&[], &base);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    let checks = &r["checks"];
    let bw = checks
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == "gpu-bandwidth")
        .unwrap();
    assert_eq!(bw["status"], "pass", "{bw}");
    assert_eq!(
        bw["summary"],
        "56 peer directions at 50% of their links or better, data verified"
    );
    // NCCL's all-reduce only with --bench-nccl; the fixture has no libnccl: skipped,
    // not failed.
    let has_nccl = |r: &Value| {
        r["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["id"] == "nccl-allreduce")
            .map(|c| c["status"].clone())
    };
    assert_eq!(has_nccl(&r), None, "{:#}", r["checks"]);
    let (out, r) = run(&["--bench-nccl"], &base);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert_eq!(has_nccl(&r), Some(Value::from("skip")));
    // --bench-nccl without --bench is refused, naming both.
    let out = crate::support::fixture_command("gpu-h100-nv18", "init", &["--bench-nccl"], &[])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    assert!(stderr(&out).contains("--bench-nccl"), "{}", stderr(&out));
    // One slow pair fails the pod; --ignore turns it into a flagged warning.
    let (out, r) = run(&[], &slow);
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(r["verdict"], "fail");
    assert!(
        r["checks"]
            .to_string()
            .contains("GPU2 -> GPU5: 60.0 GB/s one way (13%)"),
        "{:#}",
        r["checks"]
    );
    let (out, r) = run(&["--ignore", "gpu-bandwidth"], &slow);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        !stderr(&out).contains("no check has this id"),
        "{}",
        stderr(&out)
    );
    let bw = finding(&r, "gpu-bandwidth");
    assert_eq!(
        (&bw["status"], &bw["ignored"]),
        (&Value::from("warn"), &Value::from(true))
    );
    // --bench measures this machine: it cannot judge saved facts.
    let out = command(&["init", "--bench", "--facts", "x.json"], &[])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--facts"), "{}", stderr(&out));
}

/// The bench runs NCCL with the settings the trainer gets: every NCCL_ variable init
/// writes for the trainer reached the bench's ncclCommInitAll.
#[test]
fn init_bench_runs_nccl_with_the_settings_the_trainer_gets() {
    let dir = scratch("init-bench-env");
    let (env_log, env_file) = (dir.join("nccl-env.log"), dir.join("trainer.env"));
    let env = [
        ("NCCL_PREFLIGHT_BENCH_SIZE", "1MiB"),
        ("NCCL_PREFLIGHT_NCCL_SIZES", "1MiB"),
        ("FAKE_NCCL_ENV_LOG", env_log.to_str().unwrap()),
    ];
    let args = [
        "--bench",
        "--bench-nccl",
        "--env-file",
        env_file.to_str().unwrap(),
        "--trace",
    ];
    let out = crate::support::fixture_command("rdma-ib-ndr", "init", &args, &env)
        .output()
        .unwrap();
    let seen = std::fs::read_to_string(&env_log)
        .unwrap_or_else(|e| panic!("{e}: NCCL never ran\n{}", stderr(&out)));
    let tuned: Vec<String> = std::fs::read_to_string(&env_file)
        .unwrap()
        .lines()
        .filter_map(|l| l.strip_prefix("export ").or(Some(l)))
        .filter(|l| l.starts_with("NCCL_"))
        .map(|l| l.replace(['\'', '"'], ""))
        .collect();
    assert!(
        !tuned.is_empty(),
        "no NCCL_ setting tuned:\n{}",
        stdout(&out)
    );
    for line in &tuned {
        assert!(
            seen.lines().any(|s| s == line),
            "{line} did not reach NCCL; it saw:\n{seen}"
        );
    }
    // The child's phases come back as trace lines, through the parent's standard error.
    let err = stderr(&out);
    let p2p = err.find("trace: phase p2p:");
    let nccl = err.find("trace: phase nccl:");
    assert!(p2p.is_some() && nccl > p2p, "{err}");
}

/// `init --bench` initialises CUDA once, in the bench's process: init's checks get
/// the CUDA facts from it and judge exactly as when init reads them itself.
#[test]
fn init_bench_initialises_cuda_in_one_process_and_judges_the_same() {
    let dir = scratch("init-bench-one-cuinit");
    let log = dir.join("cuinit.log");
    let report = dir.join("report.json");
    let run = |args: &[&str], scenario: Option<&std::path::Path>| {
        let _ = std::fs::remove_file(&log);
        let mut all = vec!["--report", report.to_str().unwrap()];
        all.extend(args);
        let mut env = vec![
            ("NCCL_PREFLIGHT_BENCH_SIZE", "1MiB"),
            ("FAKE_CUDA_INIT_LOG", log.to_str().unwrap()),
        ];
        if let Some(s) = scenario {
            env.push(("FAKE_GPU_SCENARIO", s.to_str().unwrap()));
        }
        let child = crate::support::fixture_command("gpu-h100-nv18", "init", &all, &env)
            .spawn()
            .unwrap();
        let pid = child.id().to_string();
        let out = child.wait_with_output().unwrap();
        let r: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
        let pids: std::collections::BTreeSet<String> = std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .map(String::from)
            .collect();
        (out, r, pid, pids)
    };
    let without_bench = |r: &Value| -> Vec<Value> {
        let mut checks: Vec<Value> = r["checks"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["id"] != "gpu-bandwidth")
            .cloned()
            .collect();
        checks.sort_by_key(|c| c["id"].to_string());
        checks
    };
    let (out, plain, init_pid, pids) = run(&[], None);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert_eq!(pids, [init_pid].into(), "init alone calls cuInit itself");
    let (out, benched, init_pid, pids) = run(&["--bench"], None);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert_eq!(pids.len(), 1, "one process initialises CUDA: {pids:?}");
    assert!(!pids.contains(&init_pid), "init called cuInit itself");
    assert_eq!(without_bench(&benched), without_bench(&plain));
    assert_eq!(finding(&benched, "gpu-p2p")["status"], "pass");
    // A peer-access refusal that only CUDA reports still reaches init's gpu-p2p.
    let base = crate::support::repo().join("tests/fixtures/gpu-h100-nv18/gpu.scenario");
    let text = std::fs::read_to_string(base).unwrap();
    let no_peer = dir.join("no-peer.scenario");
    std::fs::write(
        &no_peer,
        format!("{text}cuda_peer 0 1 0\ncuda_peer 1 0 0\n"),
    )
    .unwrap();
    let (_, plain, _, _) = run(&[], Some(&no_peer));
    let (_, benched, _, _) = run(&["--bench"], Some(&no_peer));
    assert_ne!(finding(&plain, "gpu-p2p")["status"], "pass");
    assert_eq!(finding(&benched, "gpu-p2p"), finding(&plain, "gpu-p2p"));
    // A cuInit that never returns: the bench's process gives up on its deadline, and
    // init fails the driver the same way, as the node's, without hanging.
    let hung = dir.join("hung.scenario");
    std::fs::write(&hung, format!("{text}hang cuInit\n")).unwrap();
    let (out, plain, _, _) = run(&["--timeout", "300ms"], Some(&hung));
    assert_eq!(out.status.code(), Some(3), "{}", stdout(&out));
    let (out, benched, _, _) = run(&["--timeout", "300ms", "--bench"], Some(&hung));
    assert_eq!(out.status.code(), Some(3), "{}", stdout(&out));
    assert!(
        benched
            .to_string()
            .contains("cuInit: did not return within"),
        "{benched:#}"
    );
    assert_eq!(without_bench(&benched), without_bench(&plain));
    assert_eq!(finding(&benched, "gpu-bandwidth")["status"], "fail");
}
