//! The fake libnccl for the gang (tests/fakes/fake_nccl_gang.c), proved with
//! its C driver (tests/fakes/gang_driver.c) before the Rust gang check uses it:
//! several driver processes, one per "node", bootstrap at NCCL_COMM_ID over
//! real TCP, all-gather, all-reduce, broadcast and ring-shift send/recv; a rank
//! that never joins, one that hangs in init, one killed mid-way, mismatched
//! NCCL versions; then (as root) nodes in network namespaces joined through a
//! bridge (tests/integration/netns.rs), an unreachable NCCL_COMM_ID and a tc
//! rate limit on one node's link.
//!
//! Every run is bounded: a process still running at its deadline is killed and
//! the test fails saying so. No test asserts a time, only that a limited link
//! is slower than the unlimited one by a wide factor.

use super::netns::*;
use super::support::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// Longest any one gang run may take on a loaded 2-core machine.
const DEADLINE: Duration = Duration::from_secs(60);

/// The driver program, built once per test run next to the fake libraries.
fn driver() -> &'static Path {
    static BIN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        let out = fake_libs().join("gang/gang_driver");
        std::fs::create_dir_all(out.parent().unwrap()).unwrap();
        let built = Command::new("cc")
            .args(["-O1", "-Wall", "-Wextra", "-o"])
            .arg(&out)
            .arg(repo().join("tests/fakes/gang_driver.c"))
            .arg("-ldl")
            .output()
            .expect("cc (build-essential) builds the gang driver");
        assert!(
            built.status.success(),
            "building gang_driver.c: {}",
            String::from_utf8_lossy(&built.stderr)
        );
        out
    })
}

fn gang_lib() -> PathBuf {
    fake_libs().join("nccl-gang/libnccl.so.2")
}

/// A port nobody listens on now, for one gang on loopback.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One driver process: node `node` of the gang, run on `place` (a node of a
/// [`Net`]; None: this namespace) with `env` on top of the gang's. A `stuck`
/// node is expected to outlive the others: it is killed once they have ended.
struct Node {
    node: usize,
    place: Option<Command>,
    env: Vec<(String, String)>,
    stuck: bool,
}

fn node(n: usize) -> Node {
    Node {
        node: n,
        place: None,
        env: vec![],
        stuck: false,
    }
}

impl Node {
    fn env(mut self, k: &str, v: &str) -> Self {
        self.env.push((k.into(), v.into()));
        self
    }
    fn stuck(mut self) -> Self {
        self.stuck = true;
        self
    }
    /// Runs on node `i` of `net`.
    fn on(mut self, net: &Net, i: usize) -> Self {
        self.place = Some(net.command(i, driver()));
        self
    }
}

/// The `rate` of each `p2p shift K rank R ...` line, as (K, R, bytes per second).
fn rates(e: &Ended) -> Vec<(usize, usize, f64)> {
    e.stdout
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w.len() == 15 && w[0] == "p2p" && w[13] == "rate").then(|| {
                (
                    w[2].parse().unwrap(),
                    w[4].parse().unwrap(),
                    w[14].parse().unwrap(),
                )
            })
        })
        .collect()
}

/// Runs `nodes` of an `nnodes` x `local` gang at `comm_id` together (see
/// [`run_together`]: a hang fails the test).
fn gang(
    name: &str,
    nnodes: usize,
    local: usize,
    comm_id: &str,
    env: &[(&str, &str)],
    nodes: Vec<Node>,
) -> Vec<Ended> {
    let lib = gang_lib();
    let launches = nodes
        .into_iter()
        .map(|n| {
            let mut cmd = n.place.unwrap_or_else(|| Command::new(driver()));
            cmd.args([n.node.to_string(), nnodes.to_string(), local.to_string()])
                .env_clear()
                .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
                .env("GANG_NCCL_LIB", &lib)
                .env("NCCL_COMM_ID", comm_id)
                .envs(env.iter().copied())
                .envs(n.env.iter().map(|(k, v)| (k, v)));
            let launch = Launch::new(n.node, cmd);
            if n.stuck { launch.stuck() } else { launch }
        })
        .collect();
    let ended = run_together(name, DEADLINE, launches);
    for e in &ended {
        assert!(
            !e.left_behind,
            "{name}: node {} left processes: {e:#?}",
            e.node
        );
    }
    ended
}

/// Everything a healthy node prints: every local rank joined, the sums and
/// records right, one timed ring-shift round per other rank.
fn assert_healthy(e: &Ended, nranks: usize, local: usize) {
    assert_eq!(e.code, Some(0), "{e:#?}");
    // Like NCCL, the fake says nothing on stderr unless NCCL_DEBUG asks (or NCCL_DEBUG_FILE takes it).
    assert_eq!(e.stderr, "", "{e:#?}");
    for l in 0..local {
        let rank = e.node * local + l;
        assert!(
            e.has(&format!("joined rank {rank} nranks {nranks} device {l}")),
            "{e:#?}"
        );
    }
    for line in [
        &format!("allgather ok {nranks} records")[..],
        "allreduce float32 ok",
        "allreduce int32 ok",
        "allreduce uint8 max ok",
        "broadcast ok",
        "done",
    ] {
        assert!(e.has(line), "{line}: {e:#?}");
    }
    let rates = rates(e);
    assert_eq!(rates.len(), (nranks - 1) * local, "{e:#?}");
    for k in 1..nranks {
        for l in 0..local {
            assert!(
                rates
                    .iter()
                    .any(|&(s, r, rate)| s == k && r == e.node * local + l && rate > 0.0),
                "shift {k}: {e:#?}"
            );
        }
    }
}

#[test]
fn four_nodes_join_and_agree_on_loopback() {
    let id = format!("127.0.0.1:{}", free_port());
    let ended = gang("healthy", 4, 1, &id, &[], (0..4).map(node).collect());
    for e in &ended {
        assert_healthy(e, 4, 1);
        assert!(e.has("version 22809"), "{e:#?}");
    }
}

#[test]
fn two_nodes_of_two_gpus_form_one_communicator_that_explain_log_reads() {
    let id = format!("127.0.0.1:{}", free_port());
    let logs = scratch("gang-logs");
    let file = logs.join("nccl.%h.%p.log");
    let env = [
        ("NCCL_DEBUG", "INFO"),
        ("NCCL_DEBUG_FILE", file.to_str().unwrap()),
        // Blocking init inside the group: ncclGroupEnd returns when all have joined.
        ("GANG_BLOCKING", "1"),
    ];
    // NCCL_HOSTID is what NCCL counts nodes by; both processes share this host's name.
    let nodes = vec![
        node(0).env("NCCL_HOSTID", "a"),
        node(1).env("NCCL_HOSTID", "b"),
    ];
    for e in gang("two-by-two", 2, 2, &id, &env, nodes) {
        assert_healthy(&e, 4, 2);
    }
    let mut text = String::new();
    for f in std::fs::read_dir(&logs).unwrap() {
        text.push_str(&std::fs::read_to_string(f.unwrap().path()).unwrap());
    }
    let mut explain = command(&["explain-log", "--format", "json", "-"], &[])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut explain.stdin.take().unwrap(), text.as_bytes()).unwrap();
    let out = explain.wait_with_output().unwrap();
    let v = report(&out);
    // Each of 4 ranks logs a send and a receive line per peer.
    assert_eq!(v["transport_counts"], serde_json::json!({"NET/Socket": 24}));
    assert_eq!(v["nccl_versions"], serde_json::json!(["2.28.9+cuda12.8"]));
    assert_eq!(v["networks"], serde_json::json!(["Socket"]));
    let comms = v["communicators"].as_object().unwrap();
    assert_eq!(comms.len(), 1, "one commId for every rank: {comms:?}");
    let comm = comms.values().next().unwrap();
    assert_eq!(comm["ranks_total"], 4);
    assert_eq!(comm["nodes"], 2);
    assert_eq!(comm["ranks"].as_object().unwrap().len(), 4);
    std::fs::remove_dir_all(&logs).unwrap();
}

#[test]
fn device_buffers_from_the_fake_libcuda_all_reduce_across_processes() {
    // fake_cuda.c's cuMemAlloc_v2 hands out host memory: the fake libnccl can
    // move "device" buffers the gang allocates through the CUDA driver API.
    let id = format!("127.0.0.1:{}", free_port());
    let scenario = repo().join("tests/fixtures/gpu-p4d-a100/gpu.scenario");
    let cuda = fake_libs().join("nvidia/libcuda.so.1");
    let env = [
        ("GANG_CUDA_LIB", cuda.to_str().unwrap()),
        ("FAKE_GPU_SCENARIO", scenario.to_str().unwrap()),
    ];
    for e in gang("cuda-buffers", 2, 2, &id, &env, vec![node(0), node(1)]) {
        assert_healthy(&e, 4, 2);
        assert!(e.has("allreduce cuda float32 ok"), "{e:#?}");
    }
}

/// The waiting ranks of a gang whose rank `missing` never joined: each one's
/// bounded wait ran out and ncclCommAbort returned ncclSuccess, or (a
/// non-root rank) the root aborted first and closed its bootstrap connection.
fn assert_gave_up_cleanly(ended: &[Ended], nranks: usize) {
    for e in ended {
        let timed_out = e.code == Some(3)
            && e.has("init timeout after 1500 ms")
            && e.has(&format!("abort rank {} returned 0 in", e.node));
        let root_gone = e.node != 0
            && e.code == Some(4)
            && e.stdout.contains("the rank table from the bootstrap root")
            && e.stdout.contains("connection closed by remote peer");
        assert!(timed_out || root_gone, "{nranks} ranks: {e:#?}");
        assert!(!e.has("joined"), "{e:#?}");
    }
}

#[test]
fn a_rank_that_never_starts_times_out_the_others_and_abort_returns() {
    let env = [("GANG_TIMEOUT_MS", "1500")];
    // Rank 2 of 4 never starts: the root waits for it, the others for the root's table.
    let id = format!("127.0.0.1:{}", free_port());
    let ended = gang(
        "never-starts",
        4,
        1,
        &id,
        &env,
        vec![node(0), node(1), node(3)],
    );
    assert_eq!(ended[0].code, Some(3), "the root itself waited: {ended:#?}");
    assert_gave_up_cleanly(&ended, 4);
    // The root (rank 0) never starts: the others retry connecting until they give up.
    let id = format!("127.0.0.1:{}", free_port());
    let ended = gang("no-root", 4, 1, &id, &env, (1..4).map(node).collect());
    for e in &ended {
        assert_eq!(e.code, Some(3), "{e:#?}");
    }
    assert_gave_up_cleanly(&ended, 4);
    // FAKE_NCCL_HANG_INIT: rank 1 starts but never joins; its own abort ends it too.
    let id = format!("127.0.0.1:{}", free_port());
    let nodes = vec![node(0), node(1).env("FAKE_NCCL_HANG_INIT", "1"), node(2)];
    let ended = gang("hangs-in-init", 3, 1, &id, &env, nodes);
    assert_eq!(ended[1].code, Some(3), "{:#?}", ended[1]);
    assert_gave_up_cleanly(&ended, 3);
}

#[test]
fn blocking_init_ends_at_the_fakes_init_timeout_and_connects_retry_as_nccls_do() {
    // Blocking init cannot be bounded by its caller: FAKE_NCCL_INIT_TIMEOUT_MS is
    // the fake's backstop (NCCL itself would wait for rank 2 forever).
    let id = format!("127.0.0.1:{}", free_port());
    let env = [
        ("GANG_BLOCKING", "1"),
        ("FAKE_NCCL_INIT_TIMEOUT_MS", "1500"),
    ];
    let ended = gang("init-timeout", 3, 1, &id, &env, vec![node(0), node(1)]);
    for e in &ended {
        assert_eq!(e.code, Some(4), "{e:#?}");
        assert!(
            e.has("init failed: group end: 6 remote process exited or there was a network error"),
            "{e:#?}"
        );
    }
    assert!(
        ended[0]
            .stdout
            .contains("rank 0 timed out waiting for all ranks to join the bootstrap root"),
        "{ended:#?}"
    );
    // No root: refused connections are retried NCCL_SOCKET_RETRY_CNT times
    // (src/misc/socket.cc), then init fails with ncclRemoteError.
    let id = format!("127.0.0.1:{}", free_port());
    let env = [
        ("NCCL_SOCKET_RETRY_CNT", "2"),
        ("NCCL_SOCKET_RETRY_SLEEP_MSEC", "50"),
    ];
    let ended = gang("retries", 2, 1, &id, &env, vec![node(1)]);
    let e = &ended[0];
    assert_eq!(e.code, Some(4), "{e:#?}");
    assert!(
        e.stdout.contains(&format!(
            "connect to {}<{}> returned Connection refused, exceeded error retry count after 3 attempts",
            "127.0.0.1",
            id.rsplit(':').next().unwrap()
        )),
        "{e:#?}"
    );
}

#[test]
fn a_rank_killed_mid_way_fails_the_others_next_collective() {
    let id = format!("127.0.0.1:{}", free_port());
    // Two calls (all-gather, float all-reduce) succeed, the third exits the process.
    let nodes = vec![
        node(0),
        node(1),
        node(2).env("FAKE_NCCL_DIE_AFTER", "2"),
        node(3),
    ];
    let ended = gang("killed", 4, 1, &id, &[], nodes);
    let dead = &ended[2];
    assert_eq!(dead.code, Some(137), "{dead:#?}");
    assert!(dead.has("allreduce float32 ok"), "{dead:#?}");
    assert!(!dead.has("allreduce int32 ok"), "{dead:#?}");
    for e in ended.iter().filter(|e| e.node != 2) {
        assert_eq!(e.code, Some(5), "{e:#?}");
        assert!(e.has("allreduce float32 ok"), "{e:#?}");
        assert!(
            e.has("ncclAllReduce failed: 6 remote process exited or there was a network error"),
            "{e:#?}"
        );
    }
}

#[test]
fn a_rank_stuck_in_a_collective_holds_the_others_until_their_op_timeout() {
    let id = format!("127.0.0.1:{}", free_port());
    // Rank 1's third call never returns and its sockets stay open: the others
    // wait in their all-reduce as NCCL's would, until the fake's backstop.
    let nodes = vec![
        node(0),
        node(1).env("FAKE_NCCL_HANG_AFTER", "2").stuck(),
        node(2),
    ];
    let env = [("FAKE_NCCL_OP_TIMEOUT_MS", "1500")];
    let ended = gang("stuck", 3, 1, &id, &env, nodes);
    assert_eq!(
        ended[1].code, None,
        "still stuck when killed: {:#?}",
        ended[1]
    );
    assert!(ended[1].has("allreduce float32 ok"), "{:#?}", ended[1]);
    for e in [&ended[0], &ended[2]] {
        assert_eq!(e.code, Some(5), "{e:#?}");
        assert!(
            e.has("ncclAllReduce failed: 6 remote process exited or there was a network error"),
            "{e:#?}"
        );
    }
    // The first to time out may exit before the other does, which then sees it leave.
    assert!(
        [&ended[0], &ended[2]].iter().any(|e| e
            .stdout
            .contains("timed out waiting for an operation to complete")),
        "{ended:#?}"
    );
}

#[test]
fn mismatched_nccl_versions_fail_init_on_every_rank_as_nccl_does() {
    let id = format!("127.0.0.1:{}", free_port());
    let nodes = vec![node(0), node(1).env("FAKE_NCCL_VERSION", "21805"), node(2)];
    let ended = gang("versions", 3, 1, &id, &[], nodes);
    for e in &ended {
        assert_eq!(e.code, Some(4), "{e:#?}");
        // NVIDIA/nccl src/init.cc: every rank compares every peer's version.
        assert!(
            e.stdout
                .contains("invalid usage (run with NCCL_DEBUG=WARN for details): Mismatched NCCL version detected : rank"),
            "{e:#?}"
        );
        assert!(e.stdout.contains("version 21805"), "{e:#?}");
    }
}

#[test]
fn a_missing_or_malformed_nccl_comm_id_or_config_is_named() {
    for (id, words) in [
        ("", "needs NCCL_COMM_ID=<host>:<port>"),
        ("10.0.0.1", "Invalid NCCL_COMM_ID, please use format"),
        ("10.0.0.1:99999", "Invalid NCCL_COMM_ID, please use format"),
        ("[::1:29500", "Invalid NCCL_COMM_ID, please use format"),
    ] {
        let ended = gang("bad-id", 1, 1, id, &[], vec![node(0)]);
        let e = &ended[0];
        assert_eq!(e.code, Some(4), "{id}: {e:#?}");
        assert!(e.stdout.contains("ncclGetUniqueId failed"), "{id}: {e:#?}");
        assert!(e.stdout.contains(words), "{id}: {e:#?}");
    }
    // ncclConfig_t not set by NCCL_CONFIG_INITIALIZER: refused as init.cc parseCommConfig does.
    let id = format!("127.0.0.1:{}", free_port());
    let ended = gang(
        "bad-config",
        1,
        1,
        &id,
        &[("GANG_BAD_CONFIG", "1")],
        vec![node(0)],
    );
    let e = &ended[0];
    assert_eq!(e.code, Some(4), "{e:#?}");
    assert!(
        e.has("init failed: rank 0: 4 invalid argument (run with NCCL_DEBUG=WARN for details): ncclConfig_t argument not initialized via NCCL_CONFIG_INITIALIZER"),
        "{e:#?}"
    );
}

/// The slowest ring-shift rate any rank of the gang measured.
fn slowest_rate(ended: &[Ended]) -> f64 {
    let rates: Vec<f64> = ended.iter().flat_map(rates).map(|(_, _, r)| r).collect();
    assert!(!rates.is_empty(), "{ended:#?}");
    rates.into_iter().fold(f64::INFINITY, f64::min)
}

#[test]
fn two_namespaces_over_veth_and_a_rate_limited_link_is_slower() {
    let Some(net) = Net::new("two_namespaces_over_veth", 2) else {
        return;
    };
    let id = format!("{}:29500", net.addr(0));
    // Two GPUs per node across the bridge: every check as on loopback.
    let nodes = || vec![node(0).on(&net, 0), node(1).on(&net, 1)];
    for e in gang("netns-2x2", 2, 2, &id, &[], nodes()) {
        assert_healthy(&e, 4, 2);
    }
    // One GPU per node, so the one ring-shift round crosses the link both ways;
    // small all-reduces, so the limited run is mostly that round.
    let env = [("GANG_P2P_BYTES", "1048576"), ("GANG_FLOATS", "16384")];
    let unlimited = gang("netns-unlimited", 2, 1, &id, &env, nodes());
    for e in &unlimited {
        assert_healthy(e, 2, 1);
    }
    // 4 Mbit/s (0.5 MB/s) into and out of node 0: tbf cannot pass 1 MiB faster
    // than that whatever the load (its burst is 4 KB), while the unlimited veth
    // moved 740 MB/s on an idle 2-core machine and about 50 MB/s on a loaded one:
    // a ratio of 100 or more where the assertion asks for 4.
    net.limit(0, "4mbit");
    let limited = gang("netns-limited", 2, 1, &id, &env, nodes());
    for e in &limited {
        assert_healthy(e, 2, 1);
    }
    let (fast, slow) = (slowest_rate(&unlimited), slowest_rate(&limited));
    eprintln!("ring-shift over veth: unlimited {fast:.0} B/s, tbf 4mbit {slow:.0} B/s");
    // What tbf lets through bounds the limited rate from above, load or not.
    assert!(slow < 1e6, "tbf 4mbit let {slow:.0} B/s through");
    assert!(
        slow * 4.0 < fast,
        "the limited link ({slow:.0} B/s) should be far slower than the unlimited one ({fast:.0} B/s)"
    );
    // NCCL_COMM_ID on the nodes' subnet where nobody answers: the bounded wait
    // still ends with ncclCommAbort interrupting the connection attempts.
    let nodes = vec![node(1).on(&net, 1)];
    let env = [("GANG_TIMEOUT_MS", "1500")];
    let ended = gang("netns-unreachable", 2, 1, "10.77.0.200:29500", &env, nodes);
    assert_gave_up_cleanly(&ended, 2);
}

#[test]
fn four_namespaces_through_a_bridge_with_their_own_host_names() {
    let Some(net) = Net::new("four_namespaces_bridge", 4) else {
        return;
    };
    // The root by name, as a launcher's MASTER_ADDR gives it: each node
    // resolves it through its own /etc/hosts.
    let id = format!("{}:29500", net.host(0));
    let logs = scratch("gang-netns-logs");
    let file = logs.join("nccl.%h.log");
    let env = [
        ("NCCL_DEBUG", "INFO"),
        ("NCCL_DEBUG_FILE", file.to_str().unwrap()),
    ];
    let nodes = (0..4).map(|i| node(i).on(&net, i)).collect();
    for e in gang("netns-4", 4, 1, &id, &env, nodes) {
        assert_healthy(&e, 4, 1);
    }
    // %h is each process's host name: four UTS namespaces, four files, and
    // each node bootstrapped from its own address on the bridge.
    for i in 0..4 {
        let text = std::fs::read_to_string(logs.join(format!("nccl.node{i}.log")))
            .unwrap_or_else(|e| panic!("node{i}'s log: {e}"));
        assert!(
            text.contains(&format!("Bootstrap: Using eth0:{}<0>", net.addr(i))),
            "node{i}: {text}"
        );
    }
    std::fs::remove_dir_all(&logs).unwrap();
}
