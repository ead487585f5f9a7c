//! The prediction (the report's `nccl` object) against real NCCL on real GPUs: the
//! 2x H200 machine's facts (tests/data/h200x2/facts.json) replayed with the NCCL the
//! trainer loaded there (2.28.9, PyTorch's wheel), and the transports NCCL 2.28.9
//! printed on the same machine with NCCL_DEBUG=INFO (../shared/data/h200x2:
//! `via P2P/CUMEM` by default, `via SHM/direct/direct` with NCCL_P2P_DISABLE=1,
//! `Using network Socket` with no RDMA device).

use super::support::*;
use serde_json::{Value, json};

/// The transport names NCCL printed for its channels ("... via P2P/CUMEM"), reduced to
/// the transport (SHM/direct/direct is the SHM transport).
fn logged_transports(log: &str) -> Vec<String> {
    let mut out: Vec<String> = log
        .lines()
        .filter(|l| l.contains("NCCL INFO Channel"))
        .filter_map(|l| l.split(" via ").nth(1))
        .map(|t| match t.trim() {
            t if t.starts_with("SHM") => "SHM".to_string(),
            t => t.to_string(),
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

fn logged_network(log: &str) -> Option<String> {
    log.lines()
        .find_map(|l| l.split("NCCL INFO Using network ").nth(1))
        .map(|n| n.trim().to_string())
}

/// The h200x2 facts with the trainer's NCCL and the run's variables.
fn predicted(env: &[(&str, &str)]) -> Value {
    let text = std::fs::read_to_string(repo().join("tests/data/h200x2/facts.json")).unwrap();
    let mut facts: Value = serde_json::from_str(&text).unwrap();
    facts["rdma"]["nccl"]["library"]["state"]["loaded"]["version"] = json!({"value": "2.28.9"});
    for (k, v) in env {
        facts["nccl_env"][*k] = json!({ "value": v });
    }
    let (_, report) = check_saved_facts("prediction-h200x2", &facts, &[]);
    report["nccl"].clone()
}

#[test]
fn transports_on_2x_h200_match_what_nccl_2_28_9_printed() {
    let test = "transports_on_2x_h200_match_what_nccl_2_28_9_printed";
    let Some(dir) = require_shared(test, "h200x2") else {
        return;
    };
    for (log, env) in [
        ("nccl-allreduce-default.log", &[][..]),
        (
            "nccl-allreduce-p2p-disabled.log",
            &[("NCCL_P2P_DISABLE", "1")][..],
        ),
    ] {
        let text = std::fs::read_to_string(dir.join(log)).unwrap();
        let want = logged_transports(&text);
        assert_eq!(
            want.len(),
            1,
            "{log}: one transport between the two GPUs: {want:?}"
        );
        let p = predicted(env);
        let pairs = p["intra_node"].as_array().unwrap();
        assert_eq!(pairs.len(), 1, "{p}");
        assert_eq!(
            pairs[0]["transport"],
            want[0].as_str(),
            "{log}: {}",
            pairs[0]
        );
        assert_eq!(
            p["inter_node"]["value"]["name"].as_str(),
            logged_network(&text).as_deref(),
            "{log}"
        );
        // NCCL 2.28.9 on a CUDA 13.0 driver keeps SHM buffers in cuMem host memory:
        // the FACTS.md measurement (1 MiB /dev/shm, P2P disabled: still 27 GB/s).
        assert_eq!(p["shm"]["value"]["in_dev_shm"], false, "{log}");
    }
}

#[test]
fn the_log_readers_read_nccl_lines() {
    let log = "vm:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM\n\
               vm:1:1 [0] NCCL INFO Channel 00 : 0[0] -> 1[1] via SHM/direct/direct\n\
               vm:1:1 [0] NCCL INFO Using network Socket\n";
    assert_eq!(logged_transports(log), ["P2P/CUMEM", "SHM"]);
    assert_eq!(logged_network(log).as_deref(), Some("Socket"));
}
