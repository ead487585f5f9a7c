//! The NCCL truth table (issue 36 item 4): scripts/gpu-nccl-truth.sh's table of
//! situations, each with the outcome written from NCCL's source before any run, and the
//! replay of its captures (tests/data/<machine>/nccl-truth/, made by
//! scripts/nccl-truth-import.py from the script's tarball): for every captured row, the
//! tool's prediction from the facts gathered in that situation, set beside what real
//! NCCL did there (its INFO log and each rank's result). A disagreement fails the test
//! unless the capture's disagreements.tsv names it (row, field, why); a listed one that
//! no longer happens fails too, so the list only ever holds what is still open.

use crate::support::{check_saved_facts, repo};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// One row of the table: id | ranks | devices | namespaces | library | variables |
/// files | expected.
struct Row {
    id: String,
    ranks: usize,
    devices: Vec<u32>,
    each: bool,
    fields: Vec<String>,
}

fn table() -> Vec<Row> {
    let script = std::fs::read_to_string(repo().join("scripts/gpu-nccl-truth.sh")).unwrap();
    let start = script.find("<<'ROWS'\n").expect("the table's heredoc") + 9;
    let end = start + script[start..].find("\nROWS\n").expect("the table's end");
    script[start..end]
        .lines()
        .map(|line| {
            let fields: Vec<String> = line.split('|').map(str::to_string).collect();
            assert_eq!(fields.len(), 8, "{line}: 8 fields");
            let (each, list) = match fields[2].strip_prefix("each:") {
                Some(list) => (true, list),
                None => (false, fields[2].as_str()),
            };
            Row {
                id: fields[0].clone(),
                ranks: fields[1]
                    .parse()
                    .unwrap_or_else(|_| panic!("{line}: ranks")),
                devices: list.split(',').map(|d| d.parse().unwrap()).collect(),
                each,
                fields,
            }
        })
        .collect()
}

#[test]
fn the_truth_table_has_forty_situations_each_with_its_outcome_written_from_source() {
    let rows = table();
    assert!(rows.len() >= 40, "{} rows", rows.len());
    let script = std::fs::read_to_string(repo().join("scripts/gpu-nccl-truth.sh")).unwrap();
    let mut ids = BTreeSet::new();
    for row in &rows {
        let f = &row.fields;
        assert!(ids.insert(row.id.clone()), "{}: id twice", row.id);
        assert!(matches!(row.ranks, 2 | 4), "{}: 2 or 4 ranks", row.id);
        if row.each {
            assert_eq!(row.devices.len(), row.ranks, "{}: a GPU per rank", row.id);
        } else {
            assert!(
                row.devices.len() >= row.ranks,
                "{}: GPUs for every rank",
                row.id
            );
        }
        assert!(row.devices.iter().all(|&d| d < 4), "{}: 4 GPUs", row.id);
        let ns = ["none", "ipc", "uts", "uts+ipc", "etc"];
        assert!(
            ns.contains(&f[3].as_str()),
            "{}: namespaces {}",
            row.id,
            f[3]
        );
        let lib = f[4].as_str();
        assert!(
            lib == "wheel" || lib == "system" || lib.starts_with("v2."),
            "{}: library {lib}",
            row.id
        );
        // NVLS is never switched on on the lent machine.
        assert!(!f[5].contains("NCCL_NVLS_ENABLE"), "{}: sets NVLS", row.id);
        assert!(
            f[6] == "none" || script.contains(&format!("        {})", f[6])),
            "{}: files variant {} is not written by files_for",
            row.id,
            f[6]
        );
        let expected: Vec<&str> = f[7].split(';').collect();
        assert_eq!(expected.len(), 3, "{}: transport;init;bootstrap", row.id);
        assert!(
            expected[1] == "ok" || expected[1].starts_with("fail:"),
            "{}: init outcome {}",
            row.id,
            expected[1]
        );
    }
    // The classes of issue 36 item 4, each present.
    for class in [
        "NCCL_P2P_DISABLE",
        "NCCL_P2P_LEVEL",
        "NCCL_SHM_DISABLE",
        "NCCL_ALGO",
        "NCCL_PROTO",
        "NCCL_CUMEM_ENABLE",
        "NCCL_SOCKET_IFNAME",
        "NCCL_COMM_ID",
    ] {
        assert!(rows.iter().any(|r| r.fields[5].contains(class)), "{class}");
    }
    for ns in ["ipc", "uts", "etc"] {
        assert!(rows.iter().any(|r| r.fields[3] == ns), "namespace {ns}");
    }
    assert!(rows.iter().any(|r| r.each), "a GPU per rank");
    assert!(rows.iter().any(|r| r.fields[4] != "wheel"), "another NCCL");
}

/// What one side says of a row: the transports between the row's GPUs, whether NCCL
/// fails (init or the first collective), and the bootstrap interface.
#[derive(Debug, PartialEq)]
struct Outcome {
    transports: BTreeSet<String>,
    fails: bool,
    bootstrap: Option<String>,
}

/// `P2P/CUMEM/read` -> `P2P/CUMEM`, `SHM/direct/direct` -> `SHM`, `NET/Socket/0` ->
/// `NET/Socket`: the transport, without the mode NCCL appends (src/transport.cc
/// ncclTransportP2pSetup's "via %s" of the connector's transport name and options).
fn transport(token: &str) -> String {
    let parts: Vec<&str> = token.split('/').collect();
    if parts[0] == "SHM" {
        return "SHM".into();
    }
    parts[..parts.len().min(2)].join("/")
}

/// What NCCL did: the `via` channel lines and `Bootstrap: Using IF:ADDR` of every rank's
/// log, and each rank's result (init, all-reduce and a correct sum).
fn observed(dir: &Path, ranks: usize) -> Outcome {
    let mut transports = BTreeSet::new();
    let mut bootstrap = None;
    let mut fails = false;
    for r in 0..ranks {
        let log = std::fs::read_to_string(dir.join(format!("rank{r}.log"))).unwrap_or_default();
        for line in log.lines() {
            if let Some((_, via)) = line.split_once(" via ") {
                transports.insert(transport(via.split_whitespace().next().unwrap_or("")));
            }
            if let Some((_, using)) = line.split_once("Bootstrap: Using ") {
                bootstrap.get_or_insert_with(|| using.split(':').next().unwrap_or("").to_string());
            }
        }
        let text = std::fs::read_to_string(dir.join(format!("rank{r}.json"))).unwrap();
        let result: serde_json::Value = serde_json::from_str(&text).unwrap();
        fails |= !(result["init"] == 0 && result["allreduce"] == 0 && result["correct"] == true);
    }
    Outcome {
        transports,
        fails,
        bootstrap,
    }
}

/// What the tool predicts from the facts gathered in rank 0's situation.
fn predicted(dir: &Path, row: &Row) -> Outcome {
    let facts: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("facts.json")).unwrap()).unwrap();
    let (_, report) = check_saved_facts(&format!("truth-{}", row.id), &facts, &[]);
    let nccl = &report["nccl"];
    // NVML's indices, the same as CUDA's on a machine of identical GPUs in PCI order.
    let visible: BTreeSet<u64> = row.devices.iter().map(|&d| u64::from(d)).collect();
    let transports = nccl["intra_node"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| {
            let a = p["a"].as_u64().unwrap_or(u64::MAX);
            visible.contains(&a) && p["b"].as_u64().is_some_and(|b| visible.contains(&b))
        })
        .filter_map(|p| p["transport"].as_str().map(transport))
        .collect();
    let bootstrap = nccl["sockets"]["value"]["bootstrap"]["interface"]
        .as_str()
        .map(str::to_string);
    Outcome {
        transports,
        fails: report["verdict"] == "fail",
        bootstrap,
    }
}

/// The fields on which the tool and NCCL differ: transports only where NCCL ran, the
/// bootstrap interface only where NCCL logged one.
fn disagreements(tool: &Outcome, nccl: &Outcome) -> Vec<&'static str> {
    let mut out = Vec::new();
    if tool.fails != nccl.fails {
        out.push("init");
    }
    if !nccl.fails && tool.transports != nccl.transports {
        out.push("transport");
    }
    if nccl.bootstrap.is_some() && tool.bootstrap != nccl.bootstrap {
        out.push("bootstrap");
    }
    out
}

fn captures() -> Vec<PathBuf> {
    let mut out = Vec::new();
    for machine in std::fs::read_dir(repo().join("tests/data"))
        .unwrap()
        .flatten()
    {
        let capture = machine.path().join("nccl-truth");
        if capture.join("rows").is_dir() {
            out.push(capture);
        }
    }
    out.sort();
    out
}

#[test]
fn every_captured_situation_replays_to_what_real_nccl_did_there() {
    let rows: BTreeMap<String, Row> = table().into_iter().map(|r| (r.id.clone(), r)).collect();
    for capture in captures() {
        let listed = std::fs::read_to_string(capture.join("disagreements.tsv")).unwrap_or_default();
        let listed: BTreeSet<String> = listed
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .map(|l| l.splitn(3, '\t').take(2).collect::<Vec<_>>().join("\t"))
            .collect();
        let mut found = BTreeSet::new();
        let mut report = String::new();
        for entry in std::fs::read_dir(capture.join("rows")).unwrap().flatten() {
            let id = entry.file_name().to_string_lossy().into_owned();
            let row = rows
                .get(&id)
                .unwrap_or_else(|| panic!("{id}: not in the table"));
            let (tool, nccl) = (
                predicted(&entry.path(), row),
                observed(&entry.path(), row.ranks),
            );
            for field in disagreements(&tool, &nccl) {
                found.insert(format!("{id}\t{field}"));
                report.push_str(&format!("{id} {field}: tool {tool:?}, NCCL {nccl:?}\n"));
            }
        }
        let new: Vec<_> = found.difference(&listed).collect();
        let gone: Vec<_> = listed.difference(&found).collect();
        assert!(
            new.is_empty() && gone.is_empty(),
            "{}: new disagreements {new:?}, listed but gone {gone:?}\n{report}",
            capture.display()
        );
    }
}

#[test]
fn nccl_log_lines_become_transports_and_the_bootstrap_interface() {
    let dir = crate::support::scratch("nccl-truth-log");
    // The lines as NCCL 2.28.9 prints them (src/transport.cc, src/bootstrap.cc).
    let log = "h:1:1 [0] NCCL INFO Bootstrap: Using eth0:10.0.0.2<0>\n\
               h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read\n\
               h:1:1 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via SHM/direct/direct\n";
    std::fs::write(dir.join("rank0.log"), log).unwrap();
    std::fs::write(
        dir.join("rank0.json"),
        r#"{"init":0,"allreduce":0,"correct":true}"#,
    )
    .unwrap();
    std::fs::write(dir.join("rank1.json"), r#"{"init":3,"last_error":"x"}"#).unwrap();
    let nccl = observed(&dir, 2);
    let want: BTreeSet<String> = ["P2P/CUMEM", "SHM"].map(String::from).into();
    assert_eq!(nccl.transports, want);
    assert_eq!(nccl.bootstrap.as_deref(), Some("eth0"));
    assert!(nccl.fails, "rank 1's init failed");
    let tool = Outcome {
        transports: want,
        fails: false,
        bootstrap: Some("lo".into()),
    };
    assert_eq!(disagreements(&tool, &nccl), ["init", "bootstrap"]);
}
