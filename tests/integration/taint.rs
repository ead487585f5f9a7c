//! `serve --taint-node` against a fake API server over HTTPS: a node fault that holds
//! for --taint-after runs taints the Node (its other taints kept), health that holds as
//! long removes the taint, and nothing is written in between.

use crate::kube_fake::FakeApi;
use crate::support::{fixture_command, repo, require_tools, scratch};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

const NODE: &str = "/api/v1/nodes/gpu-node-1";

/// Waits (at most 60 s) until the fake API's Node satisfies `done`.
fn wait_for_node(api: &FakeApi, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let node = api.object(NODE);
        if done(&node) {
            return node;
        }
        assert!(Instant::now() < until, "{what}: the Node is still {node}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn ours(node: &Value) -> Option<&Value> {
    node["spec"]["taints"]
        .as_array()?
        .iter()
        .find(|t| t["key"] == "nccl-preflight.io/node-fault")
}

/// Written down before the run: GPU 6's driver asks for a drain and reset (NVML
/// recovery action 4), a node fault (gpu-health fails, the node's blame, exit 3); with
/// --taint-after 2 the Node gets `nccl-preflight.io/node-fault=gpu-health:NoSchedule`
/// after the second run, by one PATCH whose first operation tests the resourceVersion;
/// the GPU operator's own taint stays. Healed, the taint goes after two healthy runs.
#[test]
fn a_lasting_node_fault_taints_the_node_and_health_removes_the_taint() {
    let test = "a_lasting_node_fault_taints_the_node_and_health_removes_the_taint";
    if !require_tools(test, &["openssl"]) {
        return;
    }
    let dir = scratch("taint");
    let node = json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "gpu-node-1", "resourceVersion": "5", "labels": {"nvidia.com/gpu.present": "true"}},
        "spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]}});
    let api = FakeApi::start(&dir, [(NODE.to_string(), node)].into());
    let healthy =
        std::fs::read_to_string(repo().join("tests/fixtures/gpu-h100-nv18/gpu.scenario")).unwrap();
    let scenario = dir.join("gpu.scenario");
    std::fs::write(&scenario, format!("{healthy}recovery * 0\nrecovery 6 4\n")).unwrap();
    let account = api.account.display().to_string();
    let mut env: Vec<(String, String)> = api.env();
    env.push(("FAKE_GPU_SCENARIO".into(), scenario.display().to_string()));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let args = [
        "--listen",
        "127.0.0.1:0",
        "--interval",
        "1s",
        "--taint-node",
        "--taint-after",
        "2",
        "--node-name",
        "gpu-node-1",
        "--service-account",
        &account,
    ];
    let server =
        crate::serve::start_command(fixture_command("gpu-h100-nv18", "serve", &args, &env));
    let tainted = wait_for_node(&api, "tainted", |n| ours(n).is_some());
    assert_eq!(
        tainted["spec"]["taints"],
        json!([{"key": "nvidia.com/gpu", "effect": "NoSchedule"},
               {"key": "nccl-preflight.io/node-fault", "value": "gpu-health", "effect": "NoSchedule"}])
    );
    // More failing runs: no more writes.
    std::thread::sleep(Duration::from_secs(3));
    let seen = api.seen.lock().unwrap().clone();
    let patches: Vec<_> = seen.iter().filter(|s| s.method == "PATCH").collect();
    assert_eq!(patches.len(), 1, "{seen:?}");
    assert_eq!(patches[0].content_type, "application/json-patch+json");
    assert_eq!(patches[0].path, NODE);
    assert_eq!(patches[0].authorization, "Bearer test-token");
    let patch: Value = serde_json::from_str(&patches[0].body).unwrap();
    assert_eq!(
        patch[0],
        json!({"op": "test", "path": "/metadata/resourceVersion", "value": "5"})
    );
    // Healed: the taint goes, the GPU operator's stays.
    std::fs::write(&scenario, &healthy).unwrap();
    let healed = wait_for_node(&api, "untainted", |n| ours(n).is_none());
    assert_eq!(
        healed["spec"]["taints"],
        json!([{"key": "nvidia.com/gpu", "effect": "NoSchedule"}])
    );
    drop(server);
}

/// Asked to taint without knowing its node, or with a name that is no Node's: exit 2
/// at start, naming the flag.
#[test]
fn taint_node_without_a_valid_node_name_refuses_to_start() {
    for (extra, says) in [
        (&[][..], "--taint-node needs --node-name"),
        (&["--node-name", "../nodes/x"][..], "not a Node name"),
    ] {
        let mut args = vec!["--listen", "127.0.0.1:0", "--taint-node"];
        args.extend(extra);
        let out = fixture_command("gpu-h100-nv18", "serve", &args, &[])
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(2),
            "{}",
            crate::support::stderr(&out)
        );
        assert!(
            crate::support::stderr(&out).contains(says),
            "{}",
            crate::support::stderr(&out)
        );
    }
}
