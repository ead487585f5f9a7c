//! scripts/gen-nccl-vars.py on a small NVIDIA/nccl-shaped git repository with
//! three release tags: what it extracts, how it merges versions into ranges,
//! and that the catalog the binary embeds parses what it writes.

use super::support::*;
use nccl_preflight::nccl::Version;
use nccl_preflight::nccl::catalog::{Catalog, Kind, Lookup};
use std::fs;
use std::path::Path;
use std::process::Command;

fn write(dir: &Path, path: &str, text: &str) {
    let p = dir.join(path);
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, text).unwrap();
}

/// One release: `foo_default` for NCCL_FOO, NCCL_BAR read or not, PAT or not.
fn release(dir: &Path, tag: &str, foo_default: &str, bar: bool, pat: bool) {
    let algos = if pat {
        r#""Tree", "Ring", "PAT""#
    } else {
        r#""Tree", "Ring""#
    };
    write(
        dir,
        "src/init.cc",
        &format!(
            "const char* ncclAlgoStr[NCCL_NUM_ALGORITHMS] = {{ {algos} }};\n\
             const char* ncclProtoStr[NCCL_NUM_PROTOCOLS] = {{ \"LL\", \"LL128\", \"Simple\" }};\n\
             NCCL_PARAM(Foo, \"FOO\", {foo_default});\n\
             NCCL_PARAM(Shift, \"SHIFT\", (1 << 22));\n\
             static void algo() {{ const char* a = ncclGetEnv(\"NCCL_ALGO\"); INFO(NCCL_ENV, \"%s %s\", \"NCCL_NOT_A_READ\", a); }}\n"
        ),
    );
    let bar_read = if bar {
        "const char* b = getenv(\"NCCL_BAR\");\n"
    } else {
        ""
    };
    write(dir, "src/misc/bar.cc", bar_read);
    write(
        dir,
        "src/graph/topo.h",
        "#define PATH_LOC 0\n#define PATH_NVL 1\n#define PATH_PIX 2\n#define PATH_PHB 3\n#define PATH_SYS 4\n#define PATH_NET 5\n",
    );
    write(
        dir,
        "src/graph/topo.cc",
        "const char* topoPathTypeStr[] = { \"LOC\", \"NVL\", \"PIX\", \"PHB\", \"SYS\", \"NET\" };\n",
    );
    write(
        dir,
        "src/graph/paths.cc",
        "static const int levelsOldToNew[] = { PATH_LOC, PATH_PIX, PATH_PHB, PATH_SYS, PATH_SYS };\n\
         NCCLCHECK(ncclGetLevel(&level, \"NCCL_P2P_DISABLE\", \"NCCL_P2P_LEVEL\"));\n",
    );
    // Build scripts and example plugins.
    write(
        dir,
        "src/device/generate.py",
        "os.environ.get(\"NCCL_USE_CMAKE\")\n",
    );
    write(
        dir,
        "ext-tuner/example/plugin.c",
        "const char* f = getenv(\"NCCL_TUNER_CONFIG_FILE\");\n",
    );
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-q", "--allow-empty", "-m", tag]);
    git(dir, &["tag", tag]);
}

#[test]
fn generator_merges_tags_into_version_ranges_the_catalog_reads() {
    let dir = scratch("nccl-vars");
    let nccl = dir.join("nccl");
    fs::create_dir_all(&nccl).unwrap();
    git(&nccl, &["init", "-q"]);
    release(&nccl, "v2.20.3-1", "4", true, false);
    release(&nccl, "v2.21.5-1", "4", false, false);
    release(&nccl, "v2.23.4-1", "8", false, true);
    // Not a release tag: ignored.
    git(&nccl, &["tag", "nccl4py-v0.1.1"]);
    let table = dir.join("variables.tsv");
    let out = Command::new("python3")
        .arg(repo().join("scripts/gen-nccl-vars.py"))
        .arg(nccl.join(".git"))
        .arg(&table)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let text = fs::read_to_string(&table).unwrap();
    assert!(
        text.contains("# tags read: v2.20.3-1 v2.21.5-1 v2.23.4-1\n"),
        "{text}"
    );
    for row in [
        "var\tNCCL_FOO\tcore\tint\t2.20.3\t2.21.5\t4\n",
        "var\tNCCL_FOO\tcore\tint\t2.23.4\t2.23.4\t8\n",
        "var\tNCCL_SHIFT\tcore\tint\t2.20.3\t2.23.4\t(1 << 22)\n",
        "var\tNCCL_BAR\tcore\tstring\t2.20.3\t2.20.3\t-\n",
        "var\tNCCL_ALGO\tcore\talgo-list\t2.20.3\t2.23.4\t-\n",
        "var\tNCCL_P2P_LEVEL\tcore\tlevel\t2.20.3\t2.23.4\t-\n",
        "var\tNCCL_P2P_DISABLE\tcore\tint\t2.20.3\t2.23.4\t-\n",
        "var\tNCCL_TUNER_CONFIG_FILE\tplugin\tstring\t2.20.3\t2.23.4\t-\n",
        "values\talgo\t2.20.3\t2.21.5\tTree,Ring\n",
        "values\talgo\t2.23.4\t2.23.4\tTree,Ring,PAT\n",
        "values\tlevel\t2.20.3\t2.23.4\tLOC,NVL,PIX,PHB,SYS\n",
        "values\told-level\t2.20.3\t2.23.4\tLOC,PIX,PHB,SYS,SYS\n",
    ] {
        assert!(text.contains(row), "missing {row:?} in:\n{text}");
    }
    assert!(
        !text.contains("NCCL_USE_CMAKE"),
        "build scripts are not NCCL"
    );
    assert!(
        !text.contains("NCCL_NOT_A_READ"),
        "log messages are not reads"
    );
    let catalog = Catalog::parse(&text).unwrap();
    assert_eq!(catalog.latest(), Version::new(2, 23, 4));
    assert!(matches!(
        catalog.lookup("NCCL_BAR", Some(Version::new(2, 21, 5))),
        Lookup::OtherVersions(_)
    ));
    match catalog.lookup("NCCL_P2P_LEVEL", None) {
        Lookup::Reads(row) => assert_eq!(row.kind, Kind::Level),
        other => panic!("{other:?}"),
    }
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn generator_refuses_a_directory_without_release_tags() {
    let dir = scratch("nccl-vars-empty");
    git(&dir, &["init", "-q"]);
    let out = Command::new("python3")
        .arg(repo().join("scripts/gen-nccl-vars.py"))
        .arg(dir.join(".git"))
        .arg(dir.join("out.tsv"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("no NCCL release tags"),
        "{}",
        stderr(&out)
    );
    assert!(!dir.join("out.tsv").exists(), "nothing half-written");
    fs::remove_dir_all(&dir).unwrap();
}

/// Releases past the newest source tag are read from their binaries: a core variable
/// whose name the binary no longer holds ends, a new name becomes a `string` row, and
/// names the baseline binary (of the newest tag) holds without reading them are not
/// variables.
#[test]
fn generator_reads_releases_past_the_tags_from_their_binaries() {
    let dir = scratch("nccl-vars-binary");
    let nccl = dir.join("nccl");
    fs::create_dir_all(&nccl).unwrap();
    git(&nccl, &["init", "-q"]);
    release(&nccl, "v2.23.4-1", "8", true, true);
    // Baseline: what 2.23.4 reads, plus an enum name that is no variable.
    let bin = |name: &str, text: &str| {
        let path = dir.join(name);
        fs::write(&path, format!("\x7fELF\0{text}\0")).unwrap();
        format!("{}", path.display())
    };
    let base = bin(
        "base.so",
        "NCCL_FOO\0NCCL_SHIFT\0NCCL_BAR\0NCCL_ALGO\0NCCL_P2P_LEVEL\0NCCL_P2P_DISABLE\0NCCL_PROTO\0NCCL_LOG_WARN",
    );
    // The next release: NCCL_BAR gone, NCCL_RUN_DIAGNOSTICS new, the enum name still there.
    let next = bin(
        "next.so",
        "NCCL_FOO\0NCCL_SHIFT\0NCCL_ALGO\0NCCL_P2P_LEVEL\0NCCL_P2P_DISABLE\0NCCL_PROTO\0NCCL_LOG_WARN\0NCCL_RUN_DIAGNOSTICS set by environment",
    );
    let table = dir.join("variables.tsv");
    let out = Command::new("python3")
        .arg(repo().join("scripts/gen-nccl-vars.py"))
        .arg(nccl.join(".git"))
        .arg(&table)
        .args([
            "--binary",
            &format!("2.23.4={base}"),
            "--binary",
            &format!("2.24.3={next}"),
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let text = fs::read_to_string(&table).unwrap();
    assert!(
        text.contains("# tags read: v2.23.4-1 v2.24.3-binary\n"),
        "{text}"
    );
    for row in [
        "var\tNCCL_FOO\tcore\tint\t2.23.4\t2.24.3\t8\n",
        "var\tNCCL_BAR\tcore\tstring\t2.23.4\t2.23.4\t-\n",
        "var\tNCCL_RUN_DIAGNOSTICS\tcore\tstring\t2.24.3\t2.24.3\t-\n",
        "var\tNCCL_TUNER_CONFIG_FILE\tplugin\tstring\t2.23.4\t2.24.3\t-\n",
        "values\talgo\t2.23.4\t2.24.3\tTree,Ring,PAT\n",
    ] {
        assert!(text.contains(row), "missing {row:?} in:\n{text}");
    }
    assert!(!text.contains("NCCL_LOG_WARN"), "{text}");
    let catalog = Catalog::parse(&text).unwrap();
    assert_eq!(catalog.latest(), Version::new(2, 24, 3));
    // Without the baseline the generator refuses rather than guess.
    let out = Command::new("python3")
        .arg(repo().join("scripts/gen-nccl-vars.py"))
        .arg(nccl.join(".git"))
        .arg(dir.join("refused.tsv"))
        .args(["--binary", &format!("2.24.3={next}")])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(stderr(&out).contains("baseline"), "{}", stderr(&out));
    assert!(!dir.join("refused.tsv").exists());
    fs::remove_dir_all(&dir).unwrap();
}

/// The embedded table knows what NCCL 2.31 and 2.32 added (read from their PyPI
/// binaries): such a variable is never called unknown.
#[test]
fn the_embedded_table_knows_the_variables_of_2_31_and_2_32() {
    let catalog = Catalog::parse(include_str!("../../src/nccl/variables.tsv")).unwrap();
    assert_eq!(catalog.latest(), Version::new(2, 32, 3));
    for (name, first) in [
        ("NCCL_RUN_DIAGNOSTICS", Version::new(2, 31, 2)),
        ("NCCL_RUN_RAS_DIAGNOSTICS", Version::new(2, 31, 2)),
        ("NCCL_PROGRESS_COUNTERS", Version::new(2, 32, 3)),
        (
            "NCCL_PROGRESS_COUNTER_MONITOR_POLL_MS",
            Version::new(2, 32, 3),
        ),
    ] {
        assert!(
            matches!(
                catalog.lookup(name, Some(Version::new(2, 32, 3))),
                Lookup::Reads(_)
            ),
            "{name}"
        );
        assert!(
            matches!(catalog.lookup(name, Some(first)), Lookup::Reads(_)),
            "{name}"
        );
        assert!(
            matches!(
                catalog.lookup(name, Some(Version::new(2, 30, 7))),
                Lookup::OtherVersions(_)
            ),
            "{name}"
        );
    }
    // Still read by the newest releases, with the type the source gave it.
    match catalog.lookup("NCCL_SOCKET_NTHREADS", Some(Version::new(2, 32, 3))) {
        Lookup::Reads(row) => assert_eq!(row.kind, Kind::Int),
        other => panic!("{other:?}"),
    }
}
