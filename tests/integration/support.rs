//! Running the built binary with a controlled environment, scratch directories,
//! and golden-file comparison.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub const BIN: &str = env!("CARGO_BIN_EXE_nccl-preflight");

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A command for the binary with an empty environment plus `env`.
pub fn command(args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

pub fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    command(args, env).output().expect("run nccl-preflight")
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The environment recorded for fixture `name` (tests/fixtures/NAME/env, NAME=value lines).
pub fn fixture_env(name: &str) -> Vec<(String, String)> {
    let text =
        std::fs::read_to_string(repo().join("tests/fixtures").join(name).join("env")).unwrap();
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The fake libnvidia-ml.so.1 and libcuda.so.1 (tests/fakes), built once per test run.
pub fn fake_libs() -> &'static Path {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fake-libs");
        std::fs::create_dir_all(&dir).unwrap();
        for (source, library) in [
            ("fake_nvml.c", "libnvidia-ml.so.1"),
            ("fake_cuda.c", "libcuda.so.1"),
        ] {
            let out = Command::new("cc")
                .args([
                    "-shared",
                    "-fPIC",
                    "-O1",
                    "-Wall",
                    "-Wno-format-truncation",
                    "-o",
                ])
                .arg(dir.join(library))
                .arg(repo().join("tests/fakes").join(source))
                .arg("-lpthread")
                .output()
                .expect("cc (build-essential) builds the fake vendor libraries");
            assert!(
                out.status.success(),
                "building {source}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        dir
    })
}

/// Points a command at the fake NVIDIA libraries with `scenario`, through the same
/// dlopen of libnvidia-ml.so.1 and libcuda.so.1 as on a real node.
pub fn with_fake_gpus(cmd: &mut Command, scenario: &Path) {
    cmd.env("LD_LIBRARY_PATH", fake_libs())
        .env("FAKE_GPU_SCENARIO", scenario);
}

/// `SUBCOMMAND --host-root root --replay-kernel kernel.json ARGS...` run inside fixture
/// `name` with its recorded environment plus `env`. A fixture with a gpu.scenario
/// gets the fake NVIDIA libraries; the others get library paths that do not
/// exist, so they read "no NVIDIA libraries" whatever machine runs the tests.
pub fn fixture_command(
    name: &str,
    subcommand: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> Command {
    let dir = repo().join("tests/fixtures").join(name);
    let mut all = vec![
        subcommand,
        "--host-root",
        "root",
        "--replay-kernel",
        "kernel.json",
    ];
    all.extend(args);
    let mut cmd = command(&all, env);
    let scenario = dir.join("gpu.scenario");
    if scenario.exists() {
        with_fake_gpus(&mut cmd, &scenario);
    } else {
        cmd.env("NCCL_PREFLIGHT_NVML_LIB", "absent/libnvidia-ml.so.1")
            .env("NCCL_PREFLIGHT_CUDA_LIB", "absent/libcuda.so.1");
    }
    cmd.envs(fixture_env(name)).current_dir(dir);
    cmd
}

/// A fresh empty directory for one test.
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("nccl-preflight-it-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Compares `actual` with the golden file; `NCCL_PREFLIGHT_BLESS=1` rewrites it instead.
pub fn golden(path: &Path, actual: &str) {
    if std::env::var_os("NCCL_PREFLIGHT_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run NCCL_PREFLIGHT_BLESS=1 cargo test --test integration to create it)",
            path.display()
        )
    });
    if expected != actual {
        panic!(
            "{} differs from the output.\n--- expected\n{expected}\n--- actual\n{actual}\n(if the change is intended: NCCL_PREFLIGHT_BLESS=1 cargo test --test integration)",
            path.display()
        );
    }
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Tests that need root (unshare, mount, ip netns) skip with a message when not
/// root, unless NCCL_PREFLIGHT_TEST_REQUIRE_ROOT is set (CI sets it), where a
/// skip would hide a broken test.
pub fn require_root(test: &str) -> bool {
    if is_root() {
        return true;
    }
    if std::env::var_os("NCCL_PREFLIGHT_TEST_REQUIRE_ROOT").is_some() {
        panic!("{test} needs root and NCCL_PREFLIGHT_TEST_REQUIRE_ROOT is set");
    }
    eprintln!("skipped {test}: needs root (unshare, mount, ip)");
    false
}
