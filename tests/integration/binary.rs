//! The binary's load-time dependencies: glibc only. Vendor libraries (NVML,
//! libcuda, libibverbs, libfabric, libnccl) must be dlopen'ed, never linked.

use super::support::BIN;

/// glibc's libraries and the compiler runtime; nothing else may be NEEDED.
const ALLOWED: &[&str] = &[
    "libc.so.6",
    "libm.so.6",
    "libpthread.so.0",
    "libdl.so.2",
    "librt.so.1",
    "libgcc_s.so.1",
    "ld-linux-x86-64.so.2",
    "ld-linux-aarch64.so.1",
];

/// NEEDED entries of an ELF file, from `readelf -d`.
pub fn needed(path: &str) -> Vec<String> {
    let out = std::process::Command::new("readelf")
        .args(["-d", path])
        .output()
        .expect("readelf (binutils) must be installed");
    assert!(out.status.success(), "readelf failed on {path}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .filter_map(|l| Some(l.split('[').nth(1)?.trim_end_matches(']').to_string()))
        .collect()
}

#[test]
fn links_only_glibc() {
    let libs = needed(BIN);
    assert!(libs.iter().any(|l| l == "libc.so.6"), "{libs:?}");
    for lib in &libs {
        assert!(
            ALLOWED.contains(&lib.as_str()),
            "{BIN} needs {lib}: vendor libraries must be dlopen'ed"
        );
    }
}

/// The newest GLIBC_x.y symbol version an ELF file requires, from `readelf -V`.
fn newest_glibc(path: &str) -> (u32, u32) {
    let out = std::process::Command::new("readelf")
        .args(["-V", path])
        .output()
        .expect("readelf");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("GLIBC_"))
        .filter_map(|v| {
            let mut parts = v.split('.').map(|p| p.parse::<u32>().ok());
            Some((parts.next()??, parts.next()??))
        })
        .max()
        .unwrap_or((0, 0))
}

/// Run by scripts/release.sh on the cargo-zigbuild output (NCCL_PREFLIGHT_RELEASE_BIN).
#[test]
#[ignore = "needs the release binary: run scripts/release.sh"]
fn release_binary_needs_only_glibc_2_17() {
    let path = std::env::var("NCCL_PREFLIGHT_RELEASE_BIN")
        .expect("NCCL_PREFLIGHT_RELEASE_BIN names the release binary");
    for lib in needed(&path) {
        assert!(ALLOWED.contains(&lib.as_str()), "{path} needs {lib}");
    }
    let newest = newest_glibc(&path);
    assert!(
        newest <= (2, 17),
        "{path} requires GLIBC_{}.{}, newer than 2.17",
        newest.0,
        newest.1
    );
    assert!(
        newest >= (2, 2),
        "no GLIBC version found in {path}: not a glibc binary?"
    );
}

/// Issue 13: a FIFO in place of a file under --host-root hung `check` for ever.
/// In a copy of a fixture tree, /proc/self/mountinfo becomes a FIFO nobody writes.
#[test]
fn fifo_in_the_host_root_fails_its_fact_instead_of_hanging() {
    use super::support::*;
    let fixture = repo().join("tests/fixtures/healthy-pod");
    let dir = scratch("fifo-root");
    let copied = std::process::Command::new("cp")
        .arg("-a")
        .arg(fixture.join("root"))
        .arg(&dir)
        .status()
        .unwrap();
    assert!(copied.success());
    let mountinfo = dir.join("root/proc/self/mountinfo");
    std::fs::remove_file(&mountinfo).unwrap();
    nix::unistd::mkfifo(&mountinfo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    let root = dir.join("root");
    let kernel = fixture.join("kernel.json");
    let mut env: Vec<(String, String)> = fixture_env("healthy-pod");
    env.extend(
        NO_VENDOR_LIBS
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string())),
    );
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let mut child = command(
        &[
            "check",
            "--format",
            "json",
            "--timeout",
            "2s",
            "--host-root",
            root.to_str().unwrap(),
            "--replay-kernel",
            kernel.to_str().unwrap(),
        ],
        &env,
    )
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    // Bounded wait: a regression hangs, and the test must fail rather than hang too.
    let started = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > std::time::Duration::from_secs(60) {
            let _ = child.kill();
            panic!("check still waits on the FIFO");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let r = report(&out);
    let text = finding(&r, "dev-shm").to_string();
    assert!(
        text.contains("proc/self/mountinfo") && text.contains("a FIFO, not a regular file"),
        "{text}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
