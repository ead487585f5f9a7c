//! Which libnccl the trainer loads, through the real dynamic loader: a PyTorch-like
//! install (a libtorch_cuda.so built here, DT_NEEDED libnccl.so.2 with the wheels'
//! DT_RUNPATH `$ORIGIN/../../nvidia/nccl/lib`), the nvidia-nccl wheel's copy and a
//! "system" copy of another version on LD_LIBRARY_PATH, each a fake libnccl whose
//! ncclGetVersion is fixed at build time, loaded by the binary through dlopen.

use super::support::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

const SITE: &str = "lib/python3.12/site-packages";

fn cc(args: &[&str], out: &Path) {
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    let status = Command::new("cc")
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(out)
        .args(args)
        .output()
        .expect("cc builds the fake libraries");
    assert!(
        status.status.success(),
        "cc {args:?}: {}",
        String::from_utf8_lossy(&status.stderr)
    );
}

fn fake_nccl(out: &Path, code: u32) {
    let source = repo().join("tests/fakes/fake_nccl.c");
    cc(
        &[
            source.to_str().unwrap(),
            "-DFAKE_LIBNCCL",
            &format!("-DFAKE_NCCL_DEFAULT_VERSION={code}"),
            "-Wl,-soname,libnccl.so.2",
        ],
        out,
    );
}

/// How libtorch_cuda.so names the wheel's directory.
#[derive(Clone, Copy, PartialEq)]
enum Torch {
    None,
    /// DT_RUNPATH: searched after LD_LIBRARY_PATH.
    Runpath,
    /// DT_RPATH, as PyTorch 2.11's wheel has it (read off the GPU machine with
    /// readelf -d): searched before LD_LIBRARY_PATH.
    Rpath,
}

/// A virtualenv at `root/name` with the nvidia-nccl wheel's libnccl 2.28.9 and,
/// unless `Torch::None`, a libtorch_cuda.so that links it as PyTorch's wheels do.
fn venv(root: &Path, name: &str, torch: Torch) -> PathBuf {
    let venv = root.join(name);
    let wheel = venv.join(SITE).join("nvidia/nccl/lib");
    fake_nccl(&wheel.join("libnccl.so.2"), 22809);
    std::fs::create_dir_all(venv.join("bin")).unwrap();
    std::fs::write(venv.join("bin/python3"), "").unwrap();
    if torch != Torch::None {
        let source = root.join("torch.c");
        std::fs::write(&source, "int torch_cuda_marker;\n").unwrap();
        let dtags = match torch {
            Torch::Rpath => "-Wl,--disable-new-dtags",
            _ => "-Wl,--enable-new-dtags",
        };
        cc(
            &[
                source.to_str().unwrap(),
                "-Wl,--no-as-needed",
                &format!("-L{}", wheel.display()),
                "-l:libnccl.so.2",
                dtags,
                "-Wl,-rpath,$ORIGIN/../../nvidia/nccl/lib",
            ],
            &venv.join(SITE).join("torch/lib/libtorch_cuda.so"),
        );
    }
    venv
}

/// The nccl-library finding of `check` run with `env`.
fn nccl_library(env: &[(&str, &str)]) -> Value {
    let mut all: Vec<(&str, &str)> = NO_VENDOR_LIBS.to_vec();
    all.push(("NCCL_PREFLIGHT_FABRIC_LIB", "absent/libfabric.so.1"));
    all.extend(env);
    let out = run(&["check", "--cuda", "off", "--format", "json"], &all);
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    let checks = report["checks"].as_array().expect("checks");
    checks
        .iter()
        .find(|c| c["id"] == "nccl-library")
        .cloned()
        .expect("an nccl-library finding")
}

/// The path as the loader names it: the search directory joined with the file name.
fn real(p: &Path) -> String {
    p.display().to_string()
}

fn text(v: &Value, key: &str) -> String {
    v[key].as_str().unwrap_or_default().to_string()
}

/// A libnccl the loader finds by soname on this machine (ld.so.cache) changes what
/// a trainer without LD_LIBRARY_PATH loads; the cases that depend on it say so.
fn system_has_libnccl() -> bool {
    Command::new("ldconfig")
        .arg("-p")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("libnccl.so.2"))
        .unwrap_or(false)
}

#[test]
fn torchs_runpath_picks_the_wheel_unless_ld_library_path_names_another_copy() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let venv = venv(root, "venv", Torch::Runpath);
    let system = root.join("system");
    fake_nccl(&system.join("libnccl.so.2"), 22803);
    let wheel = real(&venv.join(SITE).join("nvidia/nccl/lib/libnccl.so.2"));
    let venv_s = venv.display().to_string();

    if !system_has_libnccl() {
        let got = nccl_library(&[("VIRTUAL_ENV", &venv_s)]);
        assert_eq!(got["status"], "pass", "{got}");
        let summary = text(&got, "summary");
        assert!(
            summary.contains(&format!("NCCL 2.28.9 from {wheel}")),
            "{summary}"
        );
        assert!(summary.contains("RUNPATH of libtorch_cuda.so"), "{summary}");
    }

    // LD_LIBRARY_PATH comes before DT_RUNPATH: the system copy wins, and the image
    // holding both versions is named.
    let got = nccl_library(&[
        ("VIRTUAL_ENV", &venv_s),
        ("LD_LIBRARY_PATH", &system.display().to_string()),
    ]);
    assert_eq!(got["status"], "warn", "{got}");
    let summary = text(&got, "summary");
    assert!(
        summary.contains("NCCL 2.28.3 (LD_LIBRARY_PATH, which the trainer loads)"),
        "{summary}"
    );
    assert!(
        summary.contains(&format!("2.28.9 at {wheel} (RUNPATH of libtorch_cuda.so)")),
        "{summary}"
    );
}

#[test]
fn without_torch_the_loader_comes_first_then_the_wheels() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let venv = venv(root, "plain", Torch::None);
    let system = root.join("system");
    fake_nccl(&system.join("libnccl.so.2"), 22803);
    let wheel = real(&venv.join(SITE).join("nvidia/nccl/lib/libnccl.so.2"));
    let venv_s = venv.display().to_string();

    let got = nccl_library(&[
        ("VIRTUAL_ENV", &venv_s),
        ("LD_LIBRARY_PATH", &system.display().to_string()),
    ]);
    assert_eq!(got["status"], "warn", "{got}");
    let summary = text(&got, "summary");
    assert!(
        summary.contains("NCCL 2.28.3 (LD_LIBRARY_PATH, which the trainer loads)"),
        "{summary}"
    );
    assert!(
        summary.contains(&format!(
            "2.28.9 at {wheel} (nvidia-nccl wheel (VIRTUAL_ENV))"
        )),
        "{summary}"
    );

    if !system_has_libnccl() {
        // The first python3 on PATH is the interpreter when no VIRTUAL_ENV says.
        let path = format!("{}/bin:/usr/bin:/bin", venv.display());
        let got = nccl_library(&[("PATH", &path)]);
        assert_eq!(got["status"], "pass", "{got}");
        let summary = text(&got, "summary");
        assert!(
            summary.contains(&format!(
                "from {wheel} (nvidia-nccl wheel (python3 on PATH))"
            )),
            "{summary}"
        );
    }
}

#[test]
fn nccl_lib_names_the_one_library_and_nothing_is_searched() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let venv = venv(root, "venv", Torch::Runpath);
    let system = root.join("system/libnccl.so.2");
    fake_nccl(&system, 22803);
    let got = nccl_library(&[
        ("VIRTUAL_ENV", &venv.display().to_string()),
        ("NCCL_PREFLIGHT_NCCL_LIB", &system.display().to_string()),
    ]);
    assert_eq!(got["status"], "pass", "{got}");
    assert!(text(&got, "summary").contains("NCCL 2.28.3"), "{got}");
    assert_eq!(got["evidence"].as_array().map(Vec::len), Some(1), "{got}");
}

#[test]
fn torchs_rpath_picks_the_wheel_even_over_ld_library_path() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let venv = venv(root, "venv", Torch::Rpath);
    let system = root.join("system");
    fake_nccl(&system.join("libnccl.so.2"), 22803);
    let wheel = real(&venv.join(SITE).join("nvidia/nccl/lib/libnccl.so.2"));
    let got = nccl_library(&[
        ("VIRTUAL_ENV", &venv.display().to_string()),
        ("LD_LIBRARY_PATH", &system.display().to_string()),
    ]);
    assert_eq!(got["status"], "warn", "{got}");
    let summary = text(&got, "summary");
    assert!(
        summary.contains("NCCL 2.28.9 (RPATH of libtorch_cuda.so, which the trainer loads)"),
        "{summary}"
    );
    assert!(summary.contains("2.28.3 at"), "{summary}");
    // The fix puts the trainer's (the wheel's) directory first.
    let dir = wheel.rsplit_once('/').map(|(d, _)| d).unwrap();
    let fix = text(&got, "remediation");
    assert!(fix.contains(&format!("LD_LIBRARY_PATH={dir}:")), "{fix}");
}
