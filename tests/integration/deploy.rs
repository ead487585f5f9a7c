//! Deployment: `install` into a shared volume, and the example manifests.

use crate::support::{BIN, command, scratch, stderr, stdout};
use std::os::unix::fs::PermissionsExt;

#[test]
fn install_copies_this_binary_whole_and_replaces_an_old_copy() {
    let dir = scratch("install");
    std::fs::write(dir.join("nccl-preflight"), "old").unwrap();
    let out = command(&["install", dir.to_str().unwrap()], &[])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let installed = dir.join("nccl-preflight");
    assert_eq!(
        std::fs::read(&installed).unwrap(),
        std::fs::read(BIN).unwrap()
    );
    let mode = std::fs::metadata(&installed).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o755);
    // Only the binary: no temp file left beside it.
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
    let v = std::process::Command::new(&installed)
        .arg("--version")
        .output()
        .unwrap();
    assert!(stdout(&v).starts_with("nccl-preflight "), "{}", stdout(&v));
    // Another name, then bad destinations: exit 2 naming them, nothing written.
    let out = command(&["install", dir.to_str().unwrap(), "--name", "np"], &[])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(dir.join("np").exists());
    for (args, word) in [
        (
            vec![
                "install".to_string(),
                dir.join("missing").display().to_string(),
            ],
            "missing",
        ),
        (
            vec!["install".to_string(), installed.display().to_string()],
            "not a directory",
        ),
        (
            vec![
                "install".into(),
                dir.display().to_string(),
                "--name".into(),
                "../x".into(),
            ],
            "plain file name",
        ),
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = command(&args, &[]).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(stderr(&out).contains(word), "{args:?}: {}", stderr(&out));
    }
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 2);
}
