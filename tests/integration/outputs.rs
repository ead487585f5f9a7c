//! `init` outputs: atomic, complete or absent, and exit 2 with the path named
//! when a destination is unusable.

use super::support::*;
use std::fs;

fn init_in_fixture(extra: &[&str]) -> std::process::Output {
    fixture_command("healthy-pod", "init", extra, &[])
        .output()
        .unwrap()
}

#[test]
fn unusable_destinations_exit_2_and_write_nothing() {
    let dir = scratch("bad-outputs");
    fs::create_dir(dir.join("adir")).unwrap();
    std::os::unix::fs::symlink(dir.join("gone/target"), dir.join("dangling")).unwrap();
    let good = dir.join("nccl.env");
    for (flag, bad) in [
        ("--report", dir.join("adir").display().to_string()),
        ("--report", dir.join("dangling").display().to_string()),
        (
            "--nccl-conf",
            dir.join("missing-dir/nccl.conf").display().to_string(),
        ),
        ("--nccl-conf", "/proc/nccl.conf".to_string()),
    ] {
        let out = init_in_fixture(&["--env-file", good.to_str().unwrap(), flag, &bad]);
        assert_eq!(out.status.code(), Some(2), "{flag} {bad}");
        let err = stderr(&out);
        assert!(err.contains(flag) && err.contains(&bad), "{err}");
        assert!(
            !good.exists(),
            "env file written although another output failed"
        );
    }
    // Only the directory, the dangling link and nothing else: no temp files left.
    let mut names: Vec<_> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["adir", "dangling"]);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn outputs_replace_old_files_whole() {
    let dir = scratch("replace");
    let env_file = dir.join("nccl.env");
    fs::write(&env_file, "export OLD=1\n".repeat(1000)).unwrap();
    let out = init_in_fixture(&["--env-file", env_file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = fs::read_to_string(&env_file).unwrap();
    assert!(!text.contains("OLD") && text.contains("export NCCL_SOCKET_IFNAME='=eth0'"));
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn env_file_sources_in_sh_and_bash() {
    let dir = scratch("source");
    let env_file = dir.join("nccl.env");
    let out = init_in_fixture(&["--env-file", env_file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0));
    for shell in ["sh", "bash"] {
        let got = std::process::Command::new(shell)
            .arg("-c")
            .arg(". \"$1\" && printf %s \"$NCCL_SOCKET_IFNAME\"")
            .arg(shell)
            .arg(&env_file)
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&got.stdout), "=eth0", "{shell}");
    }
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn termination_log_only_when_present_or_named() {
    let dir = scratch("termination");
    let term = dir.join("termination-log");
    let out = init_in_fixture(&[
        "--termination-log",
        term.to_str().unwrap(),
        "--min-shm",
        "1TiB",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let text = fs::read_to_string(&term).unwrap();
    assert!(
        text.starts_with("nccl-preflight: FAIL (job fault: fix the job): 1 failed"),
        "{text}"
    );
    assert!(text.contains("dev-shm [job]: /dev/shm is 16 GiB, below the 1 TiB minimum"));
    assert!(text.len() <= 4096);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn env_file_dev_null_is_refused_not_replaced() {
    // Issue 18: `init --env-file /dev/null` replaced the machine's /dev/null with a
    // regular file and exited 0.
    use std::os::unix::fs::FileTypeExt;
    let out = init_in_fixture(&["--env-file", "/dev/null"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("--env-file /dev/null") && err.contains("character device"),
        "{err}"
    );
    assert!(
        fs::metadata("/dev/null")
            .unwrap()
            .file_type()
            .is_char_device()
    );
}

#[test]
fn termination_log_symlink_does_not_truncate_its_target_and_the_verdict_stands() {
    // Issue 18: `--termination-log` through a planted symlink truncated its target;
    // and a termination log that cannot be written turned exit 1 into exit 2 with no
    // report.
    let dir = scratch("termination-link");
    let victim = dir.join("victim");
    fs::write(&victim, "precious").unwrap();
    let link = dir.join("termination-log");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    let report = dir.join("report.json");
    let out = init_in_fixture(&[
        "--termination-log",
        link.to_str().unwrap(),
        "--report",
        report.to_str().unwrap(),
        "--min-shm",
        "1TiB",
    ]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "the failed check's exit code stands"
    );
    assert_eq!(fs::read_to_string(&victim).unwrap(), "precious");
    let err = stderr(&out);
    assert!(
        err.contains("warning: termination message not written") && err.contains("symbolic link"),
        "{err}"
    );
    assert!(
        stdout(&out).contains("Verdict: FAIL"),
        "the report is printed"
    );
    assert!(report.exists(), "the other outputs are written");
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn outputs_naming_one_file_exit_2_before_writing() {
    // Issue 18: `--env-file X --nccl-conf X` silently lost the env file.
    let dir = scratch("same-file");
    fs::create_dir(dir.join("sub")).unwrap();
    let x = dir.join("x");
    let other = dir.join("sub/../x");
    let out = init_in_fixture(&[
        "--env-file",
        x.to_str().unwrap(),
        "--nccl-conf",
        other.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("name the same file"),
        "{}",
        stderr(&out)
    );
    assert!(!x.exists());
    let out = init_in_fixture(&[
        "--report",
        x.to_str().unwrap(),
        "--termination-log",
        x.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(!x.exists());
    fs::remove_dir_all(&dir).unwrap();
}

/// Issue 31 row 2: another user pre-created `SHARED/nccl.env` 0666 in a sticky shared
/// directory; root's `init` kept the mode (root-owned 0666), the user appended
/// `export LD_PRELOAD=...` and the trainer sourced it. A file that is not ours, or any
/// file in a non-sticky directory others can write, gets 0644; our own file in a sticky
/// or private directory keeps its bits.
#[test]
fn a_planted_world_writable_env_file_does_not_stay_world_writable() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    if !require_root("planted_env_file") || !require_tools("planted_env_file", &["setpriv"]) {
        return;
    }
    // Not under the scratch root (0700): the other user must reach the directories.
    let tmp = tempfile::Builder::new()
        .prefix("nccl-preflight-planted-")
        .tempdir()
        .unwrap();
    let dir = tmp.path().to_path_buf();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
    let mode_of = |p: &std::path::Path| fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    let as_nobody = |script: &str| {
        std::process::Command::new("setpriv")
            .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
            .args(["sh", "-c", script])
            .status()
            .unwrap()
    };
    // (directory mode, who made the old file, its mode, the mode expected after init)
    let cases = [
        (0o1777, "nobody", 0o666, 0o644),
        (0o777, "root", 0o666, 0o644),
        (0o1777, "root", 0o640, 0o640),
        (0o755, "root", 0o600, 0o600),
    ];
    for (i, (dir_mode, owner, old_mode, want)) in cases.into_iter().enumerate() {
        let shared = dir.join(format!("shared{i}"));
        fs::create_dir(&shared).unwrap();
        fs::set_permissions(&shared, fs::Permissions::from_mode(dir_mode)).unwrap();
        let env_file = shared.join("nccl.env");
        if owner == "nobody" {
            let made = as_nobody(&format!("umask 0; echo x > '{}'", env_file.display()));
            assert!(made.success());
        } else {
            fs::write(&env_file, "x\n").unwrap();
        }
        fs::set_permissions(&env_file, fs::Permissions::from_mode(old_mode)).unwrap();
        let out = init_in_fixture(&["--env-file", env_file.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let case = format!("dir {dir_mode:o}, {owner}'s {old_mode:o} file");
        assert_eq!(mode_of(&env_file), want, "{case}");
        assert_eq!(fs::metadata(&env_file).unwrap().uid(), 0, "{case}");
        if owner == "nobody" {
            let append = format!("echo 'export LD_PRELOAD=/x' >> '{}'", env_file.display());
            assert!(!as_nobody(&append).success(), "{case}: still writable");
            assert!(
                !fs::read_to_string(&env_file)
                    .unwrap()
                    .contains("LD_PRELOAD")
            );
        }
    }
}

/// Issue 31 row 9: running the installed binary while `install` replaced it failed with
/// ETXTBSY (22 of 300 runs): the new file was renamed into place while still open for
/// writing. 30 installs against a loop that runs the installed binary: no ETXTBSY.
#[test]
fn running_the_installed_binary_during_install_never_fails_with_etxtbsy() {
    let dir = scratch("install-race");
    let dest = dir.to_str().unwrap().to_string();
    let first = run(&["install", &dest], &[]);
    assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let installer = {
        let (done, dest) = (std::sync::Arc::clone(&done), dest.clone());
        std::thread::spawn(move || {
            for _ in 0..30 {
                let out = run(&["install", &dest], &[]);
                assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
            }
            done.store(true, std::sync::atomic::Ordering::SeqCst);
        })
    };
    let installed = dir.join("nccl-preflight");
    let (mut runs, mut busy) = (0, 0);
    while !done.load(std::sync::atomic::Ordering::SeqCst) {
        match std::process::Command::new(&installed)
            .arg("--version")
            .output()
        {
            Ok(out) => assert!(out.status.success(), "{}", stderr(&out)),
            Err(e) if e.raw_os_error() == Some(nix::errno::Errno::ETXTBSY as i32) => busy += 1,
            Err(e) => panic!("running {}: {e}", installed.display()),
        }
        runs += 1;
    }
    installer.join().unwrap();
    assert!(runs > 0);
    assert_eq!(busy, 0, "{busy} of {runs} runs failed with ETXTBSY");
    fs::remove_dir_all(&dir).unwrap();
}
