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
