//! `nccl-preflight gang` end to end on loopback: several processes of the built
//! binary, one per "node", each with the fake libcuda and NVML
//! (tests/fakes/fake_cuda.c, fake_nvml.c) and the fake libnccl that bootstraps
//! and moves data across processes over real TCP (tests/fakes/fake_nccl_gang.c),
//! loaded through the same dlopen path as the real ones.
//!
//! Every run is bounded: a process still running at DEADLINE is killed and the
//! test fails saying so. No test asserts a time.

use super::support::*;
use serde_json::Value;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// Longest one gang run may take on a loaded 2-core machine.
const DEADLINE: Duration = Duration::from_secs(90);

/// One H200 per node, or two.
const ONE_GPU: &str = "driver 580.95.05
cuda_version 13000
gpu 0000:1b:00.0 9.0 143771 0 0-47 GPU-aaaa0000-0000-0000-0000-000000000000 NVIDIA H200
";
const TWO_GPUS: &str = "driver 580.95.05
cuda_version 13000
gpu 0000:1b:00.0 9.0 143771 0 0-47 GPU-aaaa0000-0000-0000-0000-000000000000 NVIDIA H200
gpu 0000:43:00.0 9.0 143771 0 0-47 GPU-bbbb0000-0000-0000-0000-000000000000 NVIDIA H200
p2p * * OK OK OK OK OK
";

/// A JSON report, one small all-reduce size and a 20 s gang deadline.
const JSON_64KIB_20S: &[&str] = &[
    "--format",
    "json",
    "--gang-sizes",
    "64KiB",
    "--gang-timeout",
    "20",
];

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A node's own additions to the command line and environment.
#[derive(Default, Clone)]
struct Node {
    args: Vec<String>,
    env: Vec<(String, String)>,
}

fn node() -> Node {
    Node::default()
}

impl Node {
    fn env(mut self, k: &str, v: &str) -> Self {
        self.env.push((k.into(), v.into()));
        self
    }
}

/// How one node's process ended.
struct Ended {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Ended {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}\nstderr: {}", self.stdout, self.stderr))
    }
}

/// The environment every node shares: fake GPU libraries, the gang libnccl, no verbs.
fn base_env(dir: &std::path::Path, scenario: &str) -> Vec<(String, String)> {
    std::fs::write(dir.join("gpu.scenario"), scenario).unwrap();
    let libs = fake_libs();
    vec![
        (
            "FAKE_GPU_SCENARIO".into(),
            dir.join("gpu.scenario").display().to_string(),
        ),
        (
            "LD_LIBRARY_PATH".into(),
            format!(
                "{}:{}",
                libs.join("nvidia").display(),
                libs.join("nccl-gang").display()
            ),
        ),
        (
            "NCCL_PREFLIGHT_VERBS_LIB".into(),
            "absent/libibverbs.so.1".into(),
        ),
        ("TMPDIR".into(), dir.display().to_string()),
    ]
}

/// A gang whose nodes are running: started by `start_gang`, ended by `finish`.
struct Running {
    name: String,
    dir: std::path::PathBuf,
    /// The gang port on 127.0.0.1.
    port: String,
    started: Instant,
    children: Vec<Option<Child>>,
}

/// Starts `nodes[i]` as node i (ranks without an entry never start) of an
/// `n`-node gang on 127.0.0.1 with `args`, and waits for all of them.
fn gang(
    name: &str,
    scenario: &str,
    n: usize,
    args: &[&str],
    nodes: Vec<Option<Node>>,
) -> Vec<Option<Ended>> {
    start_gang(name, scenario, n, args, nodes).finish()
}

/// `gang` without the wait: the nodes run while the caller acts on them.
fn start_gang(
    name: &str,
    scenario: &str,
    n: usize,
    args: &[&str],
    nodes: Vec<Option<Node>>,
) -> Running {
    let dir = scratch(&format!("gang-{name}"));
    let port = free_port().to_string();
    let n_text = n.to_string();
    let env = base_env(&dir, scenario);
    let started = Instant::now();
    let children: Vec<Option<Child>> = nodes
        .iter()
        .enumerate()
        .map(|(rank, spec)| {
            let spec = spec.as_ref()?;
            let rank = rank.to_string();
            let mut all: Vec<&str> = vec![
                "gang",
                "--gang-rank",
                &rank,
                "--gang-nodes",
                &n_text,
                "--gang-root",
                "127.0.0.1",
                "--gang-port",
                &port,
            ];
            all.extend(args);
            all.extend(spec.args.iter().map(String::as_str));
            let mut cmd = command(&all, &[]);
            cmd.envs(env.iter().map(|(k, v)| (k, v)))
                .envs(spec.env.iter().map(|(k, v)| (k, v)))
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            Some(cmd.spawn().expect("start nccl-preflight gang"))
        })
        .collect();
    Running {
        name: name.to_string(),
        dir,
        port,
        started,
        children,
    }
}

impl Running {
    /// Waits for every node (killing any still running after `DEADLINE`, which fails
    /// the test), and checks that no NCCL log was left behind.
    fn finish(self) -> Vec<Option<Ended>> {
        let Running {
            name,
            dir,
            started,
            mut children,
            ..
        } = self;
        let mut ended: Vec<Option<Ended>> = Vec::new();
        for child in children.iter_mut() {
            let Some(child) = child else {
                ended.push(None);
                continue;
            };
            loop {
                if let Some(_status) = child.try_wait().unwrap() {
                    break;
                }
                if started.elapsed() > DEADLINE {
                    let _ = child.kill();
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let out = child_output(child);
            ended.push(Some(out));
        }
        let timed_out = started.elapsed() > DEADLINE;
        assert!(
            !timed_out,
            "gang {name}: a node was still running after {DEADLINE:?}"
        );
        // NCCL's logs went to private files in TMPDIR, removed after each phase.
        let left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|n| n != "gpu.scenario")
            .collect();
        assert!(left.is_empty(), "left behind: {left:?}");
        ended
    }
}

fn child_output(child: &mut Child) -> Ended {
    use std::io::Read;
    let mut stdout = String::new();
    let mut stderr = String::new();
    if let Some(mut s) = child.stdout.take() {
        s.read_to_string(&mut stdout).unwrap();
    }
    if let Some(mut s) = child.stderr.take() {
        s.read_to_string(&mut stderr).unwrap();
    }
    let status = child.wait().unwrap();
    Ended {
        code: status.code(),
        stdout,
        stderr,
    }
}

fn gang_finding<'a>(report: &'a Value, id: &str) -> &'a Value {
    report["gang"]["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["id"] == id)
        .unwrap_or_else(|| panic!("no {id} in {report:#}"))
}

fn text(f: &Value) -> String {
    format!("{} {}", f["summary"], f["evidence"])
}

#[test]
fn four_healthy_nodes_join_agree_and_measure_every_link() {
    let ended = gang(
        "healthy4",
        ONE_GPU,
        4,
        &[
            "--format",
            "json",
            "--gang-sizes",
            "64KiB,256KiB",
            "--gang-iterations",
            "2",
        ],
        vec![Some(node()); 4],
    );
    for (rank, e) in ended.iter().enumerate() {
        let e = e.as_ref().unwrap();
        let r = e.json();
        assert_eq!(r["schema"], "nccl-preflight/report/v1");
        // The bandwidths are measured over loopback between namespaces, on whatever else
        // the machine runs: a node may come out slow, and gang-bandwidth then names it as
        // the straggler, as it should. What this test holds is the rule applied to what
        // was measured (the straggler maths have their unit tests in gang::verdict).
        let straggler = &r["gang"]["straggler"];
        let bandwidth = gang_finding(&r, "gang-bandwidth");
        if straggler.is_null() {
            assert_eq!(e.code, Some(0), "node {rank}: {}\n{}", e.stdout, e.stderr);
            assert_eq!(r["verdict"], "pass");
            assert_eq!(bandwidth["status"], "pass", "{r:#}");
        } else {
            assert_ne!(bandwidth["status"], "pass", "{r:#}");
            assert!(text(bandwidth).contains("straggler"), "{r:#}");
        }
        for id in ["gang-join", "gang-consistency", "gang-bandwidth"] {
            if id != "gang-bandwidth" {
                assert_eq!(gang_finding(&r, id)["status"], "pass", "{id}: {r:#}");
            }
            // The gang's checks are in the report's checks too, under --ignore like any.
            assert!(
                r["checks"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|c| c["id"] == id)
            );
        }
        let g = &r["gang"];
        assert_eq!(g["identity"]["node_rank"], rank as u64);
        assert_eq!(g["fingerprints"].as_array().unwrap().len(), 4);
        assert_eq!(g["fingerprints"][2]["node_rank"], 2);
        assert_eq!(g["fingerprints"][1]["nccl_version"], "2.28.9");
        assert!(
            g["rows"]
                .as_array()
                .unwrap()
                .iter()
                .all(|row| row["odd"].as_array().unwrap().is_empty())
        );
        // Every ordered pair of nodes measured, none with itself.
        let m = g["matrix"].as_array().unwrap();
        assert_eq!(m.len(), 4);
        for (i, row) in m.iter().enumerate() {
            for (j, v) in row.as_array().unwrap().iter().enumerate() {
                assert_eq!(v.is_null(), i == j, "matrix[{i}][{j}] = {v}");
                assert!(i == j || v.as_f64().unwrap() > 0.0);
            }
        }
        let sizes = g["bandwidth"]["allreduce"].as_array().unwrap();
        assert_eq!(sizes.len(), 2);
        assert_eq!(sizes[0]["bytes"], 65536);
        assert!(sizes[1]["busbw_gbps"].as_f64().unwrap() > 0.0);
        // busbw = algbw x 2(n-1)/n with n = 4 ranks.
        let (alg, bus) = (
            sizes[1]["algbw_gbps"].as_f64().unwrap(),
            sizes[1]["busbw_gbps"].as_f64().unwrap(),
        );
        assert!((bus - alg * 1.5).abs() < 1e-9 * bus.max(1.0));
        assert_eq!(
            g["transports"]["NET/Socket"].as_u64().map(|n| n > 0),
            Some(true),
            "{g:#}"
        );
    }
}

#[test]
fn two_gpus_per_node_make_nranks_pods_times_gpus_and_rank_0_prints_the_job() {
    let ended = gang(
        "twogpu",
        TWO_GPUS,
        2,
        &["--gang-sizes", "64KiB", "--gang-iterations", "1"],
        vec![Some(node()); 2],
    );
    let root = ended[0].as_ref().unwrap();
    assert_eq!(root.code, Some(0), "{}\n{}", root.stdout, root.stderr);
    // Rank 0 prints the whole job.
    for want in [
        "Gang: 2 node(s) x 2 GPU(s), root 127.0.0.1:",
        "PASS  gang-join",
        "Consistency: 2 node(s) agree on",
        "All-reduce 64 KiB: busbw",
        "Node x node send/recv, GB/s",
        "Job verdict: PASS",
    ] {
        assert!(
            root.stdout.contains(want),
            "{want:?} not in:\n{}",
            root.stdout
        );
    }
    // Another rank prints its own line and the job verdict.
    let other = ended[1].as_ref().unwrap();
    assert_eq!(other.code, Some(0), "{}\n{}", other.stdout, other.stderr);
    assert!(
        other.stdout.starts_with("gang: node 1") && other.stdout.contains("job verdict PASS"),
        "{}",
        other.stdout
    );
    assert_eq!(other.stdout.lines().count(), 1, "{}", other.stdout);
    // nranks = 2 pods x 2 GPUs; the records met at the rendezvous before NCCL.
    let json = gang(
        "twogpu-json",
        TWO_GPUS,
        2,
        &[
            "--format",
            "json",
            "--gang-sizes",
            "64KiB",
            "--gang-iterations",
            "1",
        ],
        vec![Some(node()); 2],
    );
    let r = json[1].as_ref().unwrap().json();
    assert_eq!(r["gang"]["bandwidth"]["nranks"], 4);
    assert_eq!(r["gang"]["bandwidth"]["local_gpus"], 2);
    assert!(
        r["gang"]["rendezvous_seconds"].is_number(),
        "{:#}",
        r["gang"]
    );
    assert_eq!(r["gang"]["fingerprints"][0]["gpus"], 2);
}

#[test]
fn a_different_nccl_version_fails_every_rank_at_the_rendezvous_before_nccl() {
    let ended = gang(
        "version",
        ONE_GPU,
        3,
        JSON_64KIB_20S,
        vec![
            Some(node()),
            Some(node().env("FAKE_NCCL_VERSION", "22105")),
            Some(node()),
        ],
    );
    for (rank, e) in ended.iter().enumerate() {
        let e = e.as_ref().unwrap();
        assert_eq!(e.code, Some(1), "node {rank}: {}\n{}", e.stdout, e.stderr);
        let r = e.json();
        assert_eq!(r["verdict"], "fail");
        // Every pod met at the rendezvous; the records name the odd pod and NCCL never runs.
        assert_eq!(gang_finding(&r, "gang-join")["status"], "pass");
        let c = gang_finding(&r, "gang-consistency");
        assert_eq!(c["status"], "fail");
        let summary = c["summary"].as_str().unwrap_or("");
        assert!(
            summary.starts_with("node 1 (") && summary.contains(") loads NCCL 2.21.5 ("),
            "node {rank}: {c:#}"
        );
        assert!(
            summary.contains("the other 2 pod(s) NCCL 2.28.9 ("),
            "{c:#}"
        );
        assert_eq!(gang_finding(&r, "gang-bandwidth")["status"], "skip");
        assert!(r["gang"]["bandwidth"].is_null(), "{:#}", r["gang"]);
        // Another NCCL in one image is the job's to fix: exit 1 on every rank.
        assert_eq!(
            (c["blame"].as_str(), r["fault"].as_str()),
            (Some("job"), Some("job"))
        );
        // Every rank still prints its own NCCL version.
        let own = &r["facts"]["rdma"]["nccl"]["library"]["state"]["loaded"]["version"]["value"];
        assert_eq!(own, if rank == 1 { "2.21.5" } else { "2.28.9" });
    }
}

/// The failure-policy contract across the gang: a pod whose own node fails (a
/// row remapping that failed) is named by every pod as the node's fault, so every pod
/// exits 3 and the job retries elsewhere; its record carries its own fault.
#[test]
fn a_pod_whose_own_node_fails_makes_every_rank_exit_3() {
    // Not "gang-sick-node": the gang's own scratch directory is made afresh.
    let dir = scratch("sick-node-scenario");
    let sick = dir.join("sick.scenario");
    std::fs::write(&sick, format!("{ONE_GPU}remap 0 0 0 0 1\n")).unwrap();
    let ended = gang(
        "sick-node",
        ONE_GPU,
        3,
        JSON_64KIB_20S,
        vec![
            Some(node()),
            Some(node().env("FAKE_GPU_SCENARIO", sick.to_str().unwrap())),
            Some(node()),
        ],
    );
    for (rank, e) in ended.iter().enumerate() {
        let e = e.as_ref().unwrap();
        assert_eq!(e.code, Some(3), "node {rank}: {}\n{}", e.stdout, e.stderr);
        let r = e.json();
        assert_eq!(r["fault"], "node", "node {rank}");
        let c = gang_finding(&r, "gang-consistency");
        assert_eq!(
            (c["status"].as_str(), c["blame"].as_str()),
            (Some("fail"), Some("node")),
            "node {rank}: {:#}",
            r["checks"]
        );
        let summary = c["summary"].as_str().unwrap_or("");
        assert!(
            summary.starts_with("node 1 (")
                && summary.contains("failed its own checks: gpu-health"),
            "node {rank}: {c:#}"
        );
        assert_eq!(
            r["gang"]["fingerprints"][1]["local_fault"], "node",
            "{:#}",
            r["gang"]
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_different_nccl_algo_fails_consistency_on_every_rank_without_hanging() {
    let ended = gang(
        "algo",
        ONE_GPU,
        3,
        &["--format", "json", "--gang-sizes", "64KiB"],
        vec![
            Some(node().env("NCCL_ALGO", "Ring")),
            Some(node().env("NCCL_ALGO", "Ring")),
            Some(node().env("NCCL_ALGO", "Tree")),
        ],
    );
    for (rank, e) in ended.iter().enumerate() {
        let e = e.as_ref().unwrap();
        assert_eq!(e.code, Some(1), "node {rank}: {}\n{}", e.stdout, e.stderr);
        let r = e.json();
        assert_eq!(gang_finding(&r, "gang-join")["status"], "pass");
        let c = gang_finding(&r, "gang-consistency");
        assert_eq!(c["status"], "fail");
        assert!(
            // Nodes are named by their host names where the launcher names none.
            // The odd one by majority: two pods hold Ring.
            text(c).contains("node 2 (")
                && text(c)
                    .contains(") has NCCL_ALGO=Tree where the other 2 pod(s) have NCCL_ALGO=Ring"),
            "{c:#}"
        );
        let row = r["gang"]["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|row| row["field"] == "env NCCL_ALGO")
            .unwrap();
        assert_eq!(row["values"], serde_json::json!(["Ring", "Ring", "Tree"]));
        assert_eq!(row["odd"], serde_json::json!([2]));
        // Bandwidth is not measured under tuning the pods disagree on (it could hang).
        assert_eq!(gang_finding(&r, "gang-bandwidth")["status"], "skip");
        assert!(r["gang"]["bandwidth"].is_null());
    }
    // --ignore turns the job's failure into a warning on the rank that asks.
    let ignored = gang(
        "algo-ignored",
        ONE_GPU,
        2,
        &[
            "--format",
            "json",
            "--gang-sizes",
            "64KiB",
            "--ignore",
            "gang-consistency",
        ],
        vec![Some(node().env("NCCL_ALGO", "Ring")), Some(node())],
    );
    for e in ignored.iter().flatten() {
        assert_eq!(e.code, Some(0), "{}\n{}", e.stdout, e.stderr);
        let r = e.json();
        let c = r["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["id"] == "gang-consistency")
            .unwrap();
        assert_eq!(
            (c["status"].as_str(), c["ignored"].as_bool()),
            (Some("warn"), Some(true))
        );
    }
}

#[test]
fn a_rank_that_never_starts_fails_the_others_in_the_timeout_naming_it() {
    let ended = gang(
        "missing",
        ONE_GPU,
        3,
        &[
            "--format",
            "json",
            "--gang-timeout",
            "3",
            "--gang-wait",
            "1",
            "--gang-peers",
            "127.0.0.1,localhost,pod-that-never-started.invalid",
        ],
        // Rank 0 asks for progress lines (--trace); rank 1's stderr is a pipe: none.
        vec![
            Some(Node {
                args: vec!["--trace".into()],
                ..node()
            }),
            Some(node()),
            None,
        ],
    );
    let said = "nccl-preflight: gang: pod 0 of 3: waiting up to 1 s for the pods' names, then up to 3 s for every pod to join at 127.0.0.1:";
    let stderr_of = |rank: usize| ended[rank].as_ref().unwrap().stderr.clone();
    assert!(stderr_of(0).contains(said), "{}", stderr_of(0));
    assert!(
        !stderr_of(1).contains("nccl-preflight: gang: pod"),
        "{}",
        stderr_of(1)
    );
    for (rank, e) in ended.iter().take(2).enumerate() {
        let e = e.as_ref().unwrap();
        assert_eq!(e.code, Some(3), "node {rank}: {}\n{}", e.stdout, e.stderr);
        let r = e.json();
        let join = gang_finding(&r, "gang-join");
        assert_eq!(join["status"], "fail");
        assert!(
            text(join)
                .contains("1 of 3 pod(s) never reached the rendezvous at 127.0.0.1 at 127.0.0.1:"),
            "{join:#}"
        );
        assert!(
            text(join)
                .contains("within --gang-timeout 3 s: node 2 (pod-that-never-started.invalid)"),
            "{join:#}"
        );
        assert!(
            text(join).contains("node 2 (pod-that-never-started.invalid): no DNS record"),
            "{join:#}"
        );
        assert_eq!(r["gang"]["missing"], serde_json::json!([2]));
        // The two records that came agree; nothing is measured without every pod.
        assert_eq!(gang_finding(&r, "gang-consistency")["status"], "pass");
        assert_eq!(gang_finding(&r, "gang-bandwidth")["status"], "skip");
    }
}

#[test]
fn a_users_nccl_comm_id_never_reaches_a_non_root_rank() {
    // 198.51.100.1 (TEST-NET-2) is in no local subnet: a non-root rank whose NCCL saw
    // it would fail init with "No usable listening interface found" (the fake
    // libnccl models NCCL's bootstrapNetInit rule), as on pod networks.
    let ended = gang(
        "comm-id",
        ONE_GPU,
        2,
        &[
            "--format",
            "json",
            "--gang-sizes",
            "64KiB",
            "--gang-timeout",
            "10",
        ],
        vec![Some(node().env("NCCL_COMM_ID", "198.51.100.1:1")); 2],
    );
    for e in ended.iter().flatten() {
        let r = e.json();
        assert_eq!(
            gang_finding(&r, "gang-join")["status"],
            "pass",
            "{}",
            e.stderr
        );
        // The trainer's own NCCL would fail with it (bootstrap binds no address in its
        // subnet): nccl-env fails on the job's setting, exit 1; the gang itself joined.
        let env = r["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["id"] == "nccl-env")
            .unwrap();
        assert_eq!(env["status"], "fail", "{env:#}");
        assert_eq!(e.code, Some(1), "{}\n{}", e.stdout, e.stderr);
    }
}

#[test]
fn a_rank_killed_mid_way_fails_the_others_without_hanging() {
    // Node 1's worker dies (as a SIGKILL'd process reports) at its first collective,
    // the pairwise probe, after everybody joined. Its pod says so at once, every pod
    // stops, and the pods exchange how NCCL ended for each, so every rank names
    // node 1 with the same words.
    let ended = gang(
        "killed",
        ONE_GPU,
        3,
        &["--format", "json", "--gang-timeout", "10"],
        vec![
            Some(node()),
            Some(node().env("FAKE_NCCL_DIE_AFTER", "0")),
            Some(node()),
        ],
    );
    let mut summaries = Vec::new();
    for (rank, e) in ended.iter().enumerate() {
        let e = e.as_ref().unwrap();
        assert_eq!(e.code, Some(3), "node {rank}: {}\n{}", e.stdout, e.stderr);
        let r = e.json();
        let join = gang_finding(&r, "gang-join");
        assert_eq!(join["status"], "fail");
        let summary = join["summary"].as_str().unwrap_or("").to_string();
        assert!(
            summary.starts_with("node 1 (")
                && summary.contains("'s NCCL run broke off ")
                && summary.contains(", at pairwise round 1 with node ")
                && summary.ends_with("the NCCL process ended (exit status: 137) without a result"),
            "node {rank}: {join:#}"
        );
        assert_eq!(gang_finding(&r, "gang-consistency")["status"], "pass");
        assert_eq!(gang_finding(&r, "gang-bandwidth")["status"], "skip");
        summaries.push(summary);
    }
    assert!(
        summaries.iter().all(|s| *s == summaries[0]),
        "{summaries:#?}"
    );
}

#[test]
fn no_libnccl_or_no_gpu_exits_2_naming_what_is_missing() {
    let dir = scratch("gang-nolib");
    let mut env = base_env(&dir, ONE_GPU);
    env.push((
        "NCCL_PREFLIGHT_NCCL_LIB".into(),
        "absent/libnccl.so.2".into(),
    ));
    let flags = [
        "gang",
        "--gang-rank",
        "0",
        "--gang-nodes",
        "2",
        "--gang-root",
        "127.0.0.1",
    ];
    let out = command(&flags, &[])
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("gang: cannot run here: no libnccl: absent/libnccl.so.2"),
        "{}",
        stderr(&out)
    );
    let out = command(&flags, &[NO_GPU_LIBS[0], NO_GPU_LIBS[1]])
        .env("LD_LIBRARY_PATH", fake_libs().join("nccl-gang"))
        .env("NCCL_PREFLIGHT_VERBS_LIB", "absent/libibverbs.so.1")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("no GPU: the CUDA driver is not here"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn elastic_and_missing_identities_are_refused_before_anything_runs() {
    let out = run(
        &["gang"],
        &[
            ("PET_NNODES", "1:4"),
            ("PET_NODE_RANK", "0"),
            ("MASTER_ADDR", "job-master-0"),
        ],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("PET_NNODES=1:4 is an elastic range"),
        "{}",
        stderr(&out)
    );
    let out = run(&["gang"], &[]);
    assert_eq!(out.status.code(), Some(2));
    for var in [
        "--gang-rank",
        "PET_NODE_RANK",
        "OMPI_COMM_WORLD_RANK",
        "JOB_COMPLETION_INDEX",
    ] {
        assert!(stderr(&out).contains(var), "{}", stderr(&out));
    }
    let out = run(
        &[
            "gang",
            "--gang-nodes",
            "2",
            "--nodes",
            "3",
            "--gang-rank",
            "0",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("--gang-nodes 2 and --nodes 3 disagree"),
        "{}",
        stderr(&out)
    );
    // The exec form refuses the same way, and does not start the command.
    let out = run(&["exec", "--gang", "--", "sh", "-c", "echo started"], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(!stdout(&out).contains("started"));
}

#[test]
fn exec_gang_starts_the_command_only_when_the_job_passes() {
    let run_exec = |name: &str, second: Node| gang_exec(name, vec![node(), second]);
    let ok = run_exec("exec-ok", node());
    for e in &ok {
        assert_eq!(e.code, Some(0), "{}\n{}", e.stdout, e.stderr);
        assert_eq!(e.stdout, "started\n", "{}", e.stderr);
    }
    let bad = run_exec("exec-bad", node().env("NCCL_ALGO", "Tree"));
    for e in &bad {
        assert_eq!(e.code, Some(1), "{}\n{}", e.stdout, e.stderr);
        assert!(e.stdout.is_empty(), "the command ran: {}", e.stdout);
        assert!(e.stderr.contains("not starting sh"), "{}", e.stderr);
    }
}

/// Two nodes of `exec --gang -- sh -c 'echo started'`.
fn gang_exec(name: &str, nodes: Vec<Node>) -> Vec<Ended> {
    let dir = scratch(&format!("gang-{name}"));
    let port = free_port().to_string();
    let env = base_env(&dir, ONE_GPU);
    let started = Instant::now();
    let mut children: Vec<Child> = nodes
        .iter()
        .enumerate()
        .map(|(rank, spec)| {
            let rank = rank.to_string();
            let args = [
                "exec",
                "--gang",
                "--gang-rank",
                &rank,
                "--gang-nodes",
                "2",
                "--gang-root",
                "127.0.0.1",
                "--gang-port",
                &port,
                "--gang-sizes",
                "64KiB",
                "--",
                "sh",
                "-c",
                "echo started",
            ];
            let mut cmd = command(&args, &[]);
            cmd.envs(env.iter().map(|(k, v)| (k, v)))
                .envs(spec.env.iter().map(|(k, v)| (k, v)))
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            cmd.spawn().unwrap()
        })
        .collect();
    let mut out = Vec::new();
    for child in &mut children {
        while child.try_wait().unwrap().is_none() {
            if started.elapsed() > DEADLINE {
                let _ = child.kill();
                panic!("exec --gang {name}: still running after {DEADLINE:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        out.push(child_output(child));
    }
    out
}

#[test]
fn mpi_ranks_take_their_identity_from_open_mpi_and_the_hostfile() {
    let dir = scratch("gang-mpi");
    let env = base_env(&dir, ONE_GPU);
    let hostfile = dir.join("hostfile");
    std::fs::write(
        &hostfile,
        "# kubeflow/mpi-operator\n127.0.0.1 slots=1\nlocalhost slots=1\n",
    )
    .unwrap();
    let port = free_port().to_string();
    let handles: Vec<_> = (0..2)
        .map(|rank| {
            let mut cmd = command(
                &[
                    "gang",
                    "--format",
                    "json",
                    "--gang-sizes",
                    "64KiB",
                    "--gang-timeout",
                    "20",
                ],
                &[],
            );
            cmd.envs(env.iter().map(|(k, v)| (k, v)))
                .env("OMPI_COMM_WORLD_RANK", rank.to_string())
                .env("OMPI_COMM_WORLD_SIZE", "2")
                .env("OMPI_COMM_WORLD_LOCAL_SIZE", "1")
                .env("OMPI_MCA_orte_default_hostfile", &hostfile)
                .env("NCCL_PREFLIGHT_GANG_PORT", &port);
            std::thread::spawn(move || cmd.output().unwrap())
        })
        .collect();
    for (rank, h) in handles.into_iter().enumerate() {
        let out = h.join().unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}\n{}",
            stdout(&out),
            stderr(&out)
        );
        let r: Value = serde_json::from_str(&stdout(&out)).unwrap();
        let id = &r["gang"]["identity"];
        assert_eq!(
            (
                id["launcher"].as_str(),
                id["node_rank"].as_u64(),
                id["nodes"].as_u64(),
                id["root"].as_str()
            ),
            (Some("MPI"), Some(rank as u64), Some(2), Some("127.0.0.1"))
        );
        assert_eq!(gang_finding(&r, "gang-join")["status"], "pass");
        assert!(
            id["sources"]
                .as_array()
                .unwrap()
                .iter()
                .any(|s| s == "root from the MPI hostfile's first host"),
            "{id:#}"
        );
    }
}

#[test]
fn an_mpi_hostfile_that_is_a_fifo_or_dev_zero_exits_2_without_waiting() {
    // Issue 31 row 7: a FIFO nobody writes as the hostfile blocked rank 1 for ever, and
    // /dev/zero gave a 1 MiB root "name". Both must be refused at once, naming the file.
    let dir = scratch("gang-mpi-fifo");
    let env = base_env(&dir, ONE_GPU);
    let fifo = dir.join("hostfile-fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    let nuls = dir.join("hostfile-nuls");
    std::fs::write(&nuls, vec![0u8; 1 << 20]).unwrap();
    let cases = [
        (fifo.display().to_string(), "is not a regular file"),
        ("/dev/zero".to_string(), "is not a regular file"),
        (nuls.display().to_string(), "larger than 65536 bytes"),
    ];
    for (hostfile, why) in cases {
        let mut cmd = command(&["gang", "--gang-timeout", "20"], &[]);
        cmd.envs(env.iter().map(|(k, v)| (k, v)))
            .env("OMPI_COMM_WORLD_RANK", "1")
            .env("OMPI_COMM_WORLD_SIZE", "2")
            .env("OMPI_COMM_WORLD_LOCAL_SIZE", "1")
            .env("OMPI_MCA_orte_default_hostfile", &hostfile);
        let out = super::bounded::output_within(&mut cmd, "gang with a hostile hostfile");
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{hostfile}: {err}");
        assert!(err.contains(&hostfile) && err.contains(why), "{err}");
    }
}

#[test]
fn an_nccl_older_than_2_16_is_refused_by_name() {
    let ended = gang(
        "old-nccl",
        ONE_GPU,
        2,
        &["--format", "json", "--gang-timeout", "10"],
        vec![Some(node().env("FAKE_NCCL_VERSION", "21405")); 2],
    );
    for e in ended.iter().flatten() {
        assert_eq!(e.code, Some(1), "{}\n{}", e.stdout, e.stderr);
        let r = e.json();
        let join = gang_finding(&r, "gang-join");
        assert_eq!(join["status"], "fail");
        assert!(
            text(join).contains("NCCL 2.14.5 is older than 2.16"),
            "{join:#}"
        );
    }
}

/// An attacker on the gang port: while two pods join, a stranger connects twice, one
/// connection sending 4 KiB of garbage, one sending nothing and held open. Every rank
/// still ends (bounded), with the job's verdict as a report, never a crash.
#[test]
fn a_stranger_on_the_gang_port_sending_garbage_or_nothing_cannot_hang_the_gang() {
    use std::io::Write;
    let running = start_gang(
        "stranger",
        ONE_GPU,
        2,
        &[
            "--gang-timeout",
            "20s",
            "--format",
            "json",
            "--gang-sizes",
            "64KiB",
            "--gang-iterations",
            "2",
        ],
        vec![Some(node()), Some(node())],
    );
    // As soon as the port answers: garbage on one connection, silence on another,
    // held open until the ranks are done.
    let addr = format!("127.0.0.1:{}", running.port);
    let started = Instant::now();
    let mut silent = None;
    while started.elapsed() < DEADLINE {
        if let Ok(mut garbage) = std::net::TcpStream::connect(&addr) {
            let _ = garbage.write_all(&[0xa5; 4096]);
            silent = std::net::TcpStream::connect(&addr).ok();
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let ended = running.finish();
    drop(silent);
    for (rank, e) in ended.iter().enumerate() {
        let e = e.as_ref().unwrap();
        assert!(
            matches!(e.code, Some(0 | 1)),
            "node {rank}: {:?}\n{}",
            e.code,
            e.stderr
        );
        // Whether the garbage reached the root before the real rank did decides
        // whether the gang joins or fails its join naming the root: never a hang. (The
        // fake libnccl's root aborts on the garbage, as NCCL's root does on a
        // registration with the wrong rank count; the other rank then ends at
        // --gang-timeout.)
        let join = gang_finding(&e.json(), "gang-join").clone();
        match join["status"].as_str() {
            Some("pass") => {}
            Some("fail") => assert!(
                join["evidence"][0]
                    .as_str()
                    .is_some_and(|e| e.starts_with("the gang's root: 127.0.0.1")),
                "node {rank}: {join}"
            ),
            _ => panic!("node {rank}: {join}"),
        }
    }
}

/// The pid of `parent`'s child whose command line holds `word`, if any.
fn child_with(parent: u32, word: &str) -> Option<u32> {
    let list = std::fs::read_to_string(format!("/proc/{parent}/task/{parent}/children")).ok()?;
    list.split_whitespace()
        .filter_map(|p| p.parse::<u32>().ok())
        .find(|p| {
            std::fs::read(format!("/proc/{p}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(word))
        })
}

/// Whether `pid` is gone (or a zombie nobody reaped: it holds no socket).
fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

#[test]
fn regression_a_killed_gang_takes_its_worker_along_and_sigterm_ends_it_at_once() {
    // Issue 31 row 13: SIGKILL to `gang` left gang-worker listening on the root port
    // until its watchdog; SIGTERM waited for the checks to end.
    let mut g = start_gang(
        "killed-parent",
        ONE_GPU,
        2,
        &[
            "--format",
            "json",
            "--gang-timeout",
            "20",
            "--gang-sizes",
            "64KiB",
        ],
        // Rank 1's bootstrap hello never completes: both workers wait in NCCL's join.
        vec![
            Some(node()),
            Some(node().env("FAKE_NCCL_MISMATCH_HANG", "1")),
        ],
    );
    let parent = g.children[0].as_ref().unwrap().id();
    let started = Instant::now();
    let worker = loop {
        if let Some(w) = child_with(parent, "gang-worker") {
            break w;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no worker started"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    // SAFETY: kill(2) on a process this test started.
    unsafe { libc::kill(parent as i32, libc::SIGKILL) };
    let killed = Instant::now();
    while !gone(worker) && killed.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(gone(worker), "gang-worker {worker} outlived its parent");
    // Its NCCL root let the gang port go: a retry can listen there. Another test of
    // this run may be handed the same free port meanwhile and hold it a moment, so
    // binding is tried for a bounded while.
    let port: u16 = g.port.parse().unwrap();
    let freed = Instant::now();
    while std::net::TcpListener::bind(("127.0.0.1", port)).is_err() {
        assert!(
            freed.elapsed() < Duration::from_secs(10),
            "the gang port {port} stayed taken"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    for c in g.children.iter_mut().flatten() {
        let _ = c.kill();
        let _ = c.wait();
    }
    let _ = std::fs::remove_dir_all(&g.dir);

    // SIGTERM at the rendezvous (rank 1 never comes): it ends at once, saying so.
    let g = start_gang(
        "sigterm",
        ONE_GPU,
        2,
        &["--gang-timeout", "30"],
        vec![Some(node()), None],
    );
    let pid = g.children[0].as_ref().unwrap().id();
    std::thread::sleep(Duration::from_secs(2));
    // SAFETY: kill(2) on a process this test started.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let termed = Instant::now();
    let ended = g.finish();
    let e = ended[0].as_ref().unwrap();
    assert!(
        termed.elapsed() < Duration::from_secs(5),
        "{:?}",
        termed.elapsed()
    );
    assert_eq!(e.code, Some(128 + libc::SIGTERM), "{}", e.stderr);
    assert!(e.stderr.contains("stopped by a signal"), "{}", e.stderr);
}

#[test]
fn regression_sigterm_in_the_measurement_leaves_nothing_in_tmpdir() {
    // Issue 39 row 6: SIGTERM to a rank in its measurement left NCCL's private log
    // directory in TMPDIR (an emptyDir, across restarts). `finish` holds TMPDIR empty.
    let g = start_gang(
        "sigterm-measuring",
        ONE_GPU,
        2,
        JSON_64KIB_20S,
        // Rank 1 sticks in its third collective: both ranks are measuring.
        vec![Some(node()), Some(node().env("FAKE_NCCL_HANG_AFTER", "2"))],
    );
    let parents: Vec<u32> = g.children.iter().flatten().map(|c| c.id()).collect();
    let started = Instant::now();
    while parents
        .iter()
        .any(|&p| child_with(p, "gang-worker").is_none())
    {
        assert!(started.elapsed() < Duration::from_secs(30), "no workers");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_secs(2));
    for p in &parents {
        // SAFETY: kill(2) on a process this test started.
        unsafe { libc::kill(*p as i32, libc::SIGTERM) };
    }
    for e in g.finish().iter().flatten() {
        assert_eq!(e.code, Some(128 + libc::SIGTERM), "{}", e.stderr);
    }
}

#[test]
fn regression_exec_gang_as_pid_1_ends_on_sigterm_during_the_checks() {
    // Issue 31 row 13: as PID 1 (a container's first process), `exec --gang` ignored
    // SIGTERM until the checks ended, since the kernel drops a signal PID 1 has no
    // handler for. Here it waits at the rendezvous for a rank that never comes.
    if !require_root("exec_gang_pid_1") || !require_tools("exec_gang_pid_1", &["unshare"]) {
        return;
    }
    let dir = scratch("gang-pid1");
    let port = free_port().to_string();
    let mut cmd = std::process::Command::new("unshare");
    cmd.args(["--pid", "--fork", BIN, "exec", "--gang"])
        .args([
            "--gang-rank",
            "0",
            "--gang-nodes",
            "2",
            "--gang-root",
            "127.0.0.1",
        ])
        .args(["--gang-port", &port, "--gang-timeout", "30", "--", "true"])
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .envs(base_env(&dir, ONE_GPU))
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut unshare = cmd.spawn().expect("unshare");
    let started = Instant::now();
    let pid1 = loop {
        if let Some(p) = child_with(unshare.id(), "exec") {
            break p;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no PID 1 started"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    // In its namespace it is PID 1.
    let status = std::fs::read_to_string(format!("/proc/{pid1}/status")).unwrap();
    assert!(
        status
            .lines()
            .any(|l| l.starts_with("NSpid:") && l.trim_end().ends_with("\t1")),
        "{status}"
    );
    std::thread::sleep(Duration::from_secs(2));
    // SAFETY: kill(2) on a process this test started.
    unsafe { libc::kill(pid1 as i32, libc::SIGTERM) };
    let termed = Instant::now();
    while unshare.try_wait().unwrap().is_none() && termed.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let ended = unshare.try_wait().unwrap();
    if ended.is_none() {
        let _ = unshare.kill();
    }
    let out = unshare.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        termed.elapsed() < Duration::from_secs(5),
        "{:?}: {stderr}",
        termed.elapsed()
    );
    assert!(stderr.contains("stopped by a signal"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn nccl_2_31_or_later_runs_ras_diagnostics_in_the_worker_and_judges_its_diag_lines() {
    // The fake prints the file's NCCL DIAG lines at rank 0's init only when the worker's
    // environment carries NCCL_RUN_RAS_DIAGNOSTICS=1 and its version is 2.31 or later;
    // the file is the 2.32.3 recording with its NVLink line turned into a failing one.
    let diag = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/ras/derived-2.32.3/nvlink-down.text"
    );
    let args = [
        "--format",
        "json",
        "--gang-sizes",
        "64KiB",
        "--gang-iterations",
        "1",
    ];
    let at = |version: &str| {
        let n = || {
            node()
                .env("FAKE_NCCL_VERSION", version)
                .env("FAKE_NCCL_DIAG_FILE", diag)
        };
        gang(
            &format!("diag{version}"),
            ONE_GPU,
            2,
            &args,
            vec![Some(n()), Some(n())],
        )
    };
    let ended = at("23203");
    let r0 = ended[0].as_ref().unwrap().json();
    let f = gang_finding(&r0, "nccl-diagnostics");
    assert_eq!(f["status"], "fail", "{r0:#}");
    assert!(
        text(f).contains("NVLink: inactive link(s) on rank(s) {1}"),
        "{f:#}"
    );
    assert!(text(f).contains("an NVLink is down"), "{f:#}");
    assert_ne!(ended[0].as_ref().unwrap().code, Some(0));
    // Rank 1's NCCL printed no lines: no finding there, rather than a false warning.
    let r1 = ended[1].as_ref().unwrap().json();
    let none = |r: &Value| {
        r["gang"]["findings"]
            .as_array()
            .unwrap()
            .iter()
            .all(|f| f["id"] != "nccl-diagnostics")
    };
    assert!(none(&r1), "{r1:#}");
    // Before 2.31 the worker is not asked to run them, so the fake prints nothing either.
    let old = at("22809");
    for e in &old {
        assert!(none(&e.as_ref().unwrap().json()));
    }
}

/// Issue 39, re-run of the PID-1 signal cases for `exec --gang`: once a one-pod gang
/// has passed and CMD runs, SIGTERM to PID 1 reaches CMD (here `sleep`, which handles
/// nothing and as PID 1 itself would have ignored it), and PID 1 exits 128 + SIGTERM
/// with CMD, leaving no process behind in the namespace.
#[test]
fn exec_gang_as_pid_1_passes_sigterm_on_to_the_command() {
    if !require_root("exec_gang_pid_1_cmd") || !require_tools("exec_gang_pid_1_cmd", &["unshare"]) {
        return;
    }
    let dir = scratch("gang-pid1-cmd");
    let port = free_port().to_string();
    let mut cmd = std::process::Command::new("unshare");
    cmd.args(["--pid", "--fork", BIN, "exec", "--gang"])
        .args([
            "--gang-rank",
            "0",
            "--gang-nodes",
            "1",
            "--gang-root",
            "127.0.0.1",
        ])
        .args([
            "--gang-port",
            &port,
            "--gang-timeout",
            "30",
            // One pod moves nothing between pods: its bus bandwidth is 0 by definition,
            // which gang-bandwidth reads as a dead network (a finding for its judge).
            "--ignore",
            "gang-bandwidth",
            "--",
            "sleep",
            "60",
        ])
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .envs(base_env(&dir, ONE_GPU))
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut unshare = cmd.spawn().expect("unshare");
    let started = Instant::now();
    let (pid1, sleep) = loop {
        if let Some(p) = child_with(unshare.id(), "exec")
            && let Some(s) = child_with(p, "sleep")
        {
            break (p, s);
        }
        if unshare.try_wait().unwrap().is_some() || started.elapsed() > Duration::from_secs(60) {
            let _ = unshare.kill();
            let out = unshare.wait_with_output().unwrap();
            panic!(
                "the command never ran: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // SAFETY: kill(2) on a process this test started.
    unsafe { libc::kill(pid1 as i32, libc::SIGTERM) };
    let termed = Instant::now();
    while unshare.try_wait().unwrap().is_none() && termed.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = unshare.kill();
    let out = unshare.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(128 + libc::SIGTERM), "{stderr}");
    assert!(gone(sleep) && gone(pid1), "left behind");
    let _ = std::fs::remove_dir_all(&dir);
}
