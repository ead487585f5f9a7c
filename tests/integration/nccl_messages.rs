//! scripts/gen-nccl-messages.py on a small NVIDIA/nccl-shaped git repository with
//! three release tags and a newer release's build: which WARN and INFO calls it
//! extracts (and which macros that WARN it expands at their call sites), how it
//! joins a format's literals, the function and condition of each call, what NCCL
//! does after a WARN, the callers of wrap_ibv_modify_qp, how it merges tags into
//! version ranges with their line spans and extends the newest to a build that
//! still holds the format, and the meaning each row gets (also through
//! `--remap`); and that explain-log's catalog reads and matches what it writes.

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
         #define SYSCHECK(call, name) do {{ \\\n\
         \x20 if ((call) == -1) {{ WARN(\"Call to \" name \" failed: %s\", strerror(errno)); return ncclSystemError; }} \\\n\
         }} while (0)\n\
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
         \x20 SYSCHECK(open(path, O_RDWR), \"open\");\n\
         {peer_warn}\
         \x20 return ncclSuccess;\n\
         }}\n\
         static ncclResult_t ncclIbRtrQp() {{\n\
         \x20 NCCLCHECK(wrap_ibv_modify_qp(qp, &attr, mask));\n\
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

fn generate(args: &[&std::ffi::OsStr]) -> std::process::Output {
    Command::new("python3")
        .arg(repo().join("scripts/gen-nccl-messages.py"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn generator_extracts_formats_conditions_severities_and_ranges_the_catalog_reads() {
    let dir = scratch("nccl-messages");
    let nccl = dir.join("nccl");
    fs::create_dir_all(&nccl).unwrap();
    git(&nccl, &["init", "-q"]);
    release(&nccl, "v2.3.7-1", 0, false);
    release(&nccl, "v2.21.5-1", 0, false);
    release(&nccl, "v2.22.3-1", 2, true);
    git(&nccl, &["tag", "nccl4py-v0.1.1"]);
    // A newer build whose strings still hold one format (and not the others).
    let wheel = dir.join("libnccl.so.2");
    fs::write(
        &wheel,
        b"\x00\x7fELF\x00NET/IB : falling back to sockets\x00junk\x00",
    )
    .unwrap();
    let table = dir.join("nccl_messages.tsv");
    let wheel_arg = format!("2.23.4={}", wheel.display());
    let out = generate(&[
        nccl.join(".git").as_os_str(),
        "--wheel".as_ref(),
        wheel_arg.as_ref(),
        "--out".as_ref(),
        table.as_os_str(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = fs::read_to_string(&table).unwrap();
    // 2.3 is before the table's first version; not-release tags are ignored.
    assert!(
        text.contains("# read: v2.21.5-1 v2.22.3-1 wheel:2.23.4\n"),
        "{text}"
    );
    let f = "src/transport/net_ib.cc";
    for row in [
        // PRIu64 joined into its conversion; a multi-line call; its `if`; NCCL returns an error after it.
        format!(
            "warn\t{f}\t2.21.5\t2.22.3\t9\t11\tabort\tib-area\tf\tx\tCall to %s failed : %lu bytes\n"
        ),
        // Adjacent literals joined; NCCL goes on after it; still in the newer build.
        format!(
            "warn\t{f}\t2.21.5\t2.23.4\t13\t15\tcontinues\tib-area\tf\t-\tNET/IB : falling back to sockets\n"
        ),
        format!(
            "info\t{f}\t2.21.5\t2.22.3\t15\t17\tinfo\tgdr-disabled\tf\t-\tGPU Direct RDMA Disabled for HCA %d\n"
        ),
        // A macro's WARN at its call site, its string argument put in, the call it checks as the condition.
        format!(
            "warn\t{f}\t2.21.5\t2.22.3\t18\t20\tabort\tib-area\tf\tSYSCHECK(open(path, O_RDWR))\tCall to open failed: %s\n"
        ),
        // The caller of wrap_ibv_modify_qp, at its exact line in each release.
        format!(
            "call\t{f}\t2.21.5\t2.21.5\t22\t22\tcall\t-\tncclIbRtrQp\tline 22\twrap_ibv_modify_qp\n"
        ),
        format!(
            "call\t{f}\t2.22.3\t2.22.3\t27\t27\tcall\t-\tncclIbRtrQp\tline 27\twrap_ibv_modify_qp\n"
        ),
        format!(
            "warn\t{f}\t2.22.3\t2.22.3\t21\t21\tabort\trdma-completion\tf\t-\tNET/IB : Got completion from peer %s with status=%d\n"
        ),
    ] {
        assert!(text.contains(&row), "missing {row:?} in:\n{text}");
    }
    for absent in ["commented", "Connected all rings", "not source", "WARN(msg"] {
        assert!(!text.contains(absent), "{absent:?} in:\n{text}");
    }
    let catalog = Catalog::parse(&text).unwrap();
    assert_eq!(catalog.newest, Version::new(2, 23, 4));
    let m = catalog
        .find(
            true,
            "Call to ibv_reg_mr failed : 4096 bytes",
            Some("transport/net_ib.cc:10"),
            &[Version::new(2, 21, 5)],
        )
        .unwrap();
    assert_eq!(
        (m.severity, m.source().as_str()),
        (
            Severity::Abort,
            "src/transport/net_ib.cc:9-11 (f, when x), NCCL 2.21.5-2.22.3"
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
    assert_eq!(m.meaning, "rdma-completion");
    assert_eq!(
        catalog.caller(
            "wrap_ibv_modify_qp",
            "transport/net_ib.cc:22",
            &[Version::new(2, 21, 5)]
        ),
        Some("ncclIbRtrQp")
    );
    assert!(
        catalog
            .find(true, "something else entirely", None, &[])
            .is_none()
    );
    // --remap re-assigns meanings from meanings.txt without an NCCL checkout.
    let stale = text.replace("\tib-area\t", "\tstale-meaning\t");
    fs::write(&table, &stale).unwrap();
    let out = generate(&["--remap".as_ref(), "--out".as_ref(), table.as_os_str()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(fs::read_to_string(&table).unwrap(), text);
}
