//! The module graph flows one way: gather -> judge -> tune -> render, under one run
//! pipeline that the commands call. Every top-level module of src/ has a layer, and a
//! module may use only modules of lower layers (`crate::NAME` anywhere in its files,
//! tests included). A new module must be given a layer here; a new back-edge fails.

use super::support::{repo, rust_files};
use std::collections::BTreeSet;
use std::path::Path;

/// (module, layer, what it is). Modules of one layer do not use each other.
const LAYERS: &[(&str, u32, &str)] = &[
    ("facts", 0, "what gather saw, plain data"),
    ("finding", 0, "finding types and the check-id registry"),
    ("remediation", 0, "fixes shared by checks and explain-log"),
    (
        "diagnostic",
        0,
        "lines to standard error that a closed stderr cannot break",
    ),
    ("units", 1, "sizes, limits and durations"),
    (
        "child",
        1,
        "a child process of this binary: one framed reply under a deadline",
    ),
    ("platform", 1, "known machine types"),
    (
        "layout",
        1,
        "the job's layout from the launcher's variables",
    ),
    ("nccl", 1, "how NCCL reads its variables"),
    ("topology", 1, "GPU and NIC topology from facts"),
    ("policy", 2, "what the user asked the judge to enforce"),
    ("predict", 2, "what NCCL will do, from the facts"),
    ("cli", 2, "flags"),
    ("gather", 3, "the only stage that touches the host"),
    ("judge", 3, "facts -> findings"),
    ("tune", 3, "facts -> settings"),
    ("explain", 3, "NCCL logs -> findings"),
    ("report", 4, "findings, settings and facts in one document"),
    ("output", 4, "writing files atomically"),
    ("render", 5, "report -> text"),
    ("run", 6, "the pipeline every command shares"),
    ("bench", 7, "measurements"),
    ("serve", 7, "the sidecar"),
    (
        "gang",
        8,
        "the job across its pods (reuses bench's CUDA driver wrapper)",
    ),
    ("commands", 9, "the subcommands"),
];

/// Test-only support that any module's tests may use, and that may use anything below `run`.
const TEST_SUPPORT: &str = "test_facts";

fn layer(module: &str) -> Option<u32> {
    LAYERS
        .iter()
        .find(|(m, _, _)| *m == module)
        .map(|(_, l, _)| *l)
}

/// The `crate::NAME` paths a file uses, comments left out.
fn crate_uses(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(i) = rest.find("crate::") {
            rest = &rest[i + "crate::".len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                out.insert(name);
            }
        }
    }
    out
}

/// (module, dependency) edges that break the layering.
fn back_edges(src: &Path) -> Vec<String> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut bad = Vec::new();
    for file in files {
        let rel = file.strip_prefix(src).unwrap();
        let top = rel.iter().next().unwrap().to_string_lossy();
        let module = top.trim_end_matches(".rs").to_string();
        if module == "main" || module == "lib" {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        for dep in crate_uses(&text) {
            if dep == module || dep == TEST_SUPPORT {
                continue;
            }
            let allowed = if module == TEST_SUPPORT {
                layer(&dep).is_some_and(|d| d < layer("run").unwrap())
            } else {
                match (layer(&module), layer(&dep)) {
                    (Some(m), Some(d)) => d < m,
                    (None, _) => {
                        bad.push(format!(
                            "{}: module {module} has no layer in LAYERS",
                            rel.display()
                        ));
                        continue;
                    }
                    (_, None) => false,
                }
            };
            if !allowed {
                bad.push(format!("{}: {module} uses crate::{dep}", rel.display()));
            }
        }
    }
    bad.sort();
    bad.dedup();
    bad
}

#[test]
fn modules_use_only_lower_layers() {
    let bad = back_edges(&repo().join("src"));
    assert!(bad.is_empty(), "back-edges:\n{}", bad.join("\n"));
}

#[test]
fn a_back_edge_is_caught() {
    // A tree where judge uses tune (same layer) and gather uses render (higher).
    let dir = super::support::scratch("layering");
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("judge")).unwrap();
    std::fs::write(
        src.join("judge/mod.rs"),
        "use crate::tune::Setting; // crate::render in a comment\n",
    )
    .unwrap();
    std::fs::write(
        src.join("gather.rs"),
        "fn f() { crate::render::human::render(); }\n",
    )
    .unwrap();
    std::fs::write(src.join("tune.rs"), "use crate::facts::Facts;\n").unwrap();
    std::fs::write(src.join("newthing.rs"), "\n").unwrap();
    std::fs::write(src.join("other.rs"), "use crate::newthing::X;\n").unwrap();
    let bad = back_edges(&src);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(
        bad,
        vec![
            "gather.rs: gather uses crate::render".to_string(),
            "judge/mod.rs: judge uses crate::tune".to_string(),
            "other.rs: module other has no layer in LAYERS".to_string(),
        ]
    );
}
