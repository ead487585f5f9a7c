//! scripts/gen-nccl-messages.py on a small NVIDIA/nccl-shaped git repository with
//! three release tags: which WARN and INFO calls it extracts, how it joins a
//! format's literals, judges what NCCL does after a WARN, and merges tags into
//! version ranges with their line spans; and that explain-log's catalog reads
//! and matches what it writes.

use super::support::*;
use nccl_preflight::explain::catalog::{Catalog, Severity};
use nccl_preflight::nccl::Version;
use std::fs;
use std::path::Path;
use std::process::Command;

/// One release; `pad` blank lines move the calls down, `peer` adds a WARN.
fn release(dir: &Path, tag: &str, pad: usize, peer: bool) {
    let peer_warn = if peer {
        "  WARN(\"NET/IB : Got completion from peer %s with status=%d\", addr,\n       status);\n  return ncclRemoteError;\n"
    } else {
        ""
    };
    let text = format!(
        "{}#define WARN(...) log(__VA_ARGS__)\n\
         static ncclResult_t f() {{\n\
         \x20 // WARN(\"commented out\");\n\
         \x20 /* WARN(\"also commented\"); */\n\
         \x20 if (x) {{\n\
         \x20   WARN(\"Call to %s failed : %\" PRIu64 \" bytes\", name,\n\
         \x20        size);\n\
         \x20   return ncclSystemError;\n\
         \x20 }}\n\
         \x20 WARN(\"NET/IB : falling back\"\n\
         \x20      \" to sockets\");\n\
         \x20 INFO(NCCL_NET, \"GPU Direct RDMA Disabled for HCA %d\", d);\n\
         \x20 INFO(NCCL_INIT, \"Connected all rings\");\n\
         \x20 WARN(msg);\n\
         {peer_warn}\
         \x20 return ncclSuccess;\n\
         }}\n",
        "\n".repeat(pad)
    );
    let p = dir.join("src/transport/net_ib.cc");
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, text).unwrap();
    fs::write(dir.join("README.md"), "WARN(\"not source\");\n").unwrap();
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-q", "--allow-empty", "-m", tag]);
    git(dir, &["tag", tag]);
}

#[test]
fn generator_extracts_formats_severities_and_ranges_the_catalog_reads() {
    let dir = scratch("nccl-messages");
    let nccl = dir.join("nccl");
    fs::create_dir_all(&nccl).unwrap();
    git(&nccl, &["init", "-q"]);
    release(&nccl, "v2.3.7-1", 0, false);
    release(&nccl, "v2.21.5-1", 0, false);
    release(&nccl, "v2.22.3-1", 2, true);
    git(&nccl, &["tag", "nccl4py-v0.1.1"]);
    let table = dir.join("nccl_messages.tsv");
    let out = Command::new("python3")
        .arg(repo().join("scripts/gen-nccl-messages.py"))
        .arg(nccl.join(".git"))
        .arg(&table)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let text = fs::read_to_string(&table).unwrap();
    // 2.3 is before the catalog's first version; not-release tags are ignored.
    assert!(
        text.contains("# tags read: v2.21.5-1 v2.22.3-1\n"),
        "{text}"
    );
    let f = "src/transport/net_ib.cc";
    for row in [
        // PRIu64 joined into its conversion; a multi-line call; NCCL returns an error after it.
        format!("warn\t{f}\t2.21.5\t2.22.3\t6\t8\tabort\tCall to %s failed : %lu bytes\n"),
        // Adjacent literals joined; NCCL goes on after it.
        format!("warn\t{f}\t2.21.5\t2.22.3\t10\t12\tcontinues\tNET/IB : falling back to sockets\n"),
        format!("info\t{f}\t2.21.5\t2.22.3\t12\t14\tinfo\tGPU Direct RDMA Disabled for HCA %d\n"),
        format!(
            "warn\t{f}\t2.22.3\t2.22.3\t17\t17\tabort\tNET/IB : Got completion from peer %s with status=%d\n"
        ),
    ] {
        assert!(text.contains(&row), "missing {row:?} in:\n{text}");
    }
    for absent in ["commented", "Connected all rings", "not source", "WARN(msg"] {
        assert!(!text.contains(absent), "{absent:?} in:\n{text}");
    }
    let catalog = Catalog::parse(&text).unwrap();
    assert_eq!(catalog.newest, Version::new(2, 22, 3));
    let m = catalog
        .find(
            true,
            "Call to ibv_reg_mr failed : 4096 bytes",
            Some("transport/net_ib.cc:7"),
            &[Version::new(2, 21, 5)],
        )
        .unwrap();
    assert_eq!(
        (m.severity, m.source().as_str()),
        (
            Severity::Abort,
            "src/transport/net_ib.cc:6-8, NCCL 2.21.5-2.22.3"
        )
    );
    let m = catalog
        .find(
            true,
            "NET/IB : Got completion from peer 10.0.0.2<4> with status=12",
            None,
            &[],
        )
        .unwrap();
    assert_eq!(m.class().unwrap().id, "log-rdma-completion");
    assert!(
        catalog
            .find(true, "something else entirely", None, &[])
            .is_none()
    );
}
