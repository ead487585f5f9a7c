//! scripts/gang-gpu.sh, the GPU acceptance of the gang, run here in its dry mode:
//! the same namespaces, veth pair, /32 routes, per-node hostnames and /etc/hosts
//! and tc rate limit the GPU machine gets, with the fake vendor libraries, so the
//! script's plumbing is proved before a GPU machine runs it. Needs root.

use super::support::*;
use std::process::Command;

/// Runs the script with `args` under coreutils' `timeout` (every wait bounded).
fn script(args: &[&str]) -> std::process::Output {
    Command::new("timeout")
        .args(["-k", "5", "180", "bash"])
        .arg(repo().join("scripts/gang-gpu.sh"))
        .args(args)
        .current_dir(repo())
        .output()
        .expect("bash runs scripts/gang-gpu.sh")
}

#[test]
fn gang_gpu_script_refuses_bad_arguments_naming_them() {
    for (args, says) in [
        (
            &["--legs", "a,x"][..],
            "--legs takes letters of p,a,b,c,d,e: a,x",
        ),
        (&["--gpus", "0"][..], "--gpus takes two GPU indices, I,J: 0"),
        (
            &["--within", "5"][..],
            "--within takes seconds, 30 or more: 5",
        ),
        (&["--frobnicate"][..], "unknown option --frobnicate"),
    ] {
        let out = script(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(says), "{args:?}: {}", stderr(&out));
    }
}

#[test]
fn gang_gpu_script_dry_plumbing_gives_two_named_nodes_a_veth_and_a_working_rate_limit() {
    let test = "gang_gpu_script_dry_plumbing_gives_two_named_nodes_a_veth_and_a_working_rate_limit";
    if !require_root(test) {
        return;
    }
    let dir = scratch("gang-script");
    let out_dir = dir.join("out");
    let out = script(&[
        "--dry",
        "--legs",
        "p",
        "/nonexistent/nccl-preflight",
        out_dir.to_str().unwrap(),
    ]);
    let summary = std::fs::read_to_string(out_dir.join("summary.txt")).unwrap_or_default();
    assert_eq!(out.status.code(), Some(0), "{summary}\n{}", stderr(&out));
    assert!(
        summary.contains("PASS p: hostnames node0/node1; node1->node0 by name over /32 routes"),
        "{summary}"
    );
    assert!(summary.contains("gang-gpu: all legs passed"), "{summary}");

    // What the leg left: each node's /32 address on eth0, and tc's own account of
    // the tbf qdisc that was in force while node1 sent.
    let unpacked = dir.join("unpacked");
    std::fs::create_dir_all(&unpacked).unwrap();
    let tar = Command::new("tar")
        .arg("-xzf")
        .arg(out_dir.join("gang-gpu.tar.gz"))
        .arg("-C")
        .arg(&unpacked)
        .output()
        .unwrap();
    assert!(tar.status.success(), "{}", stderr(&tar));
    let read = |p: &str| std::fs::read_to_string(unpacked.join(p)).unwrap();
    assert!(read("node0-addr.txt").contains("10.10.0.1/32"));
    assert!(read("node1-addr.txt").contains("10.10.1.1/32"));
    assert!(read("hosts1").contains("10.10.1.1 node1"));
    let qdisc = read("p/qdisc.txt");
    assert!(
        qdisc.contains("tbf") && qdisc.contains("rate 20Mbit"),
        "{qdisc}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn gang_gpu_script_dry_legs_join_catch_a_differing_nccl_algo_a_missing_pod_and_a_slow_link() {
    let test =
        "gang_gpu_script_dry_legs_join_catch_a_differing_nccl_algo_a_missing_pod_and_a_slow_link";
    if !require_root(test) {
        return;
    }
    let dir = scratch("gang-script-legs");
    let out_dir = dir.join("out");
    let out = script(&["--dry", "--legs", "a,b,c,d", BIN, out_dir.to_str().unwrap()]);
    let summary = std::fs::read_to_string(out_dir.join("summary.txt")).unwrap_or_default();
    assert_eq!(out.status.code(), Some(0), "{summary}\n{}", stderr(&out));
    // The judge's lines: both ranks ran the binary's gang over the veth with the fake
    // libnccl, and each leg shows what it must.
    for line in [
        "PASS a: exit {'0': 0, '1': 0}; rank 0: gang-join pass, gang-consistency pass, gang-bandwidth pass; busbw 1 MiB ",
        "transport ['NET/Socket']",
        "PASS b: exit {'0': 1, '1': 1}; rank 0: gang-consistency fail: ",
        "PASS c: exit 3; gang-join fail after ",
        "names ['node1']",
        "PASS d: exit {'0': ",
    ] {
        assert!(summary.contains(line), "{line}\nnot in:\n{summary}");
    }
    assert!(
        summary
            .lines()
            .any(|l| l.starts_with("PASS b: ") && l.contains("NCCL_ALGO")),
        "{summary}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--pods 4` in its dry mode, the legs of issue 37: a debug variable on one pod is
/// a note (every pod passes), a pod with two GPUs among one-GPU pods is the one
/// named (exit 1), a pod killed mid-measurement is named gone by every other pod
/// (exit 3), 256 idle connections on the gang port fail nobody; one tarball.
#[test]
fn gang_gpu_script_dry_pods_legs_of_issue_37() {
    let test = "gang_gpu_script_dry_pods_legs_of_issue_37";
    if !require_root(test) || !require_tools(test, &["python3", "nsenter"]) {
        return;
    }
    let dir = scratch("gang-script-pods");
    let out_dir = dir.join("out");
    let out = script(&[
        "--dry",
        "--pods",
        "4",
        "--legs",
        "D,G,K,I",
        BIN,
        out_dir.to_str().unwrap(),
    ]);
    let summary = std::fs::read_to_string(out_dir.join("summary.txt")).unwrap_or_default();
    assert_eq!(out.status.code(), Some(0), "{summary}\n{}", stderr(&out));
    for line in [
        "D\tPASS\t",
        "not compared: node 1 (job-worker-0) has NCCL_DEBUG=INFO where the other 3 pod(s) have NCCL_DEBUG unset",
        "G\tPASS\t",
        "rank 0: gang-consistency fail: node 1 (job-worker-0) has 2 GPU(s) where the other 3 pod(s) have 1 GPU(s)",
        "K\tPASS\t",
        "exit {'0': 3, '1': 3, '3': 3}\trank 0: gang-join fail: node 2 (job-worker-1) is gone ",
        "I\tPASS\t",
    ] {
        assert!(summary.contains(line), "{line}\nnot in:\n{summary}");
    }
    assert!(out_dir.join("gang-gpu.tar.gz").is_file(), "{summary}");
    let _ = std::fs::remove_dir_all(&dir);
}
