//! Stamps `--version` with the commit and the commit's date, so a binary in a pod says
//! exactly what it is. The commit date, not the build time: the same source builds the
//! same binary (the image build is checked to be reproducible). Outside a git checkout
//! (a source tarball) both read "unknown".

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let dir = std::env::var("CARGO_MANIFEST_DIR").ok()?;
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (out.status.success() && !text.is_empty()).then_some(text)
}

fn main() {
    let commit = git(&["rev-parse", "--short=12", "HEAD"]);
    let date = git(&["log", "-1", "--format=%cs"]);
    let unknown = || "unknown".to_string();
    println!(
        "cargo:rustc-env=NCCL_PREFLIGHT_COMMIT={}",
        commit.unwrap_or_else(unknown)
    );
    println!(
        "cargo:rustc-env=NCCL_PREFLIGHT_COMMIT_DATE={}",
        date.unwrap_or_else(unknown)
    );
    // Rebuild when HEAD moves: HEAD itself and the branch it names.
    for path in [
        git(&["rev-parse", "--git-path", "HEAD"]),
        git(&["symbolic-ref", "-q", "HEAD"]).and_then(|r| git(&["rev-parse", "--git-path", &r])),
        git(&["rev-parse", "--git-path", "packed-refs"]),
    ]
    .into_iter()
    .flatten()
    {
        let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default();
        let full = if path.starts_with('/') {
            path
        } else {
            format!("{dir}/{path}")
        };
        println!("cargo:rerun-if-changed={full}");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
