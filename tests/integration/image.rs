//! The container image: docker/build-oci.py builds it without an engine, skopeo
//! reads its archive as OCI and as `docker load` input, umoci unpacks it as a
//! container runtime would, and runc runs the tool in it as the image's user, in
//! namespaces of its own, with runc's 64 MiB /dev/shm.

use crate::support::{BIN, finding, repo, require_root, require_tools, scratch, stderr, stdout};
use std::path::Path;
use std::process::{Command, Output, Stdio};

const TAG: &str = "test";
const ENTRYPOINT: &str = "/usr/local/bin/nccl-preflight";

/// Builds the image from the test binary into `out`; returns the manifest digest.
fn build(out: &Path) -> String {
    let run = Command::new("python3")
        .arg(repo().join("docker/build-oci.py"))
        .args(["--binary", BIN, "--tag", TAG, "--out"])
        .arg(out)
        .arg("--debs")
        .arg(repo().join("target/image-debs"))
        .output()
        .unwrap();
    assert!(run.status.success(), "build-oci.py: {}", stderr(&run));
    let text = stdout(&run);
    let line = text
        .lines()
        .find(|l| l.starts_with(&format!("image {TAG}: ")))
        .unwrap_or_else(|| panic!("no image line in {text}"));
    line.rsplit(' ').next().unwrap().to_string()
}

/// Runs the bundle's image with `args` under runc; `shm` replaces runc's 64 MiB /dev/shm.
fn runc(bundle: &Path, args: &[&str], shm: Option<&str>) -> Output {
    let path = bundle.join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    config["process"]["terminal"] = false.into();
    let mut argv = vec![ENTRYPOINT];
    argv.extend(args);
    config["process"]["args"] = argv.into();
    let mounts = config["mounts"].as_array_mut().unwrap();
    mounts.retain(|m| m["destination"] != "/dev/shm");
    let size = shm.unwrap_or("65536k");
    mounts.push(serde_json::json!({
        "destination": "/dev/shm", "type": "tmpfs", "source": "shm",
        "options": ["nosuid", "noexec", "nodev", "mode=1777", format!("size={size}")]
    }));
    std::fs::write(&path, config.to_string()).unwrap();
    let id = format!(
        "nccl-preflight-it-{}-{}",
        std::process::id(),
        args.join("-").len()
    );
    let out = Command::new("runc")
        .args(["run", "--bundle"])
        .arg(bundle)
        .arg(&id)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let _ = Command::new("runc").args(["delete", "-f", &id]).output();
    out
}

#[test]
fn the_image_builds_reproducibly_and_runs_as_nonroot_under_runc() {
    let test = "the_image_builds_reproducibly_and_runs_as_nonroot_under_runc";
    if !require_root(test)
        || !require_tools(
            test,
            &["python3", "dpkg-deb", "apt-get", "umoci", "runc", "skopeo"],
        )
    {
        return;
    }
    let dir = scratch("image");
    let digest = build(&dir.join("a"));
    assert!(digest.starts_with("sha256:"), "{digest}");
    assert_eq!(build(&dir.join("b")), digest, "same inputs, same image");
    // The archive is both an OCI archive and a `docker load` one (manifest.json):
    // skopeo reads the image, every layer included, through each.
    let archive = dir.join("a/nccl-preflight.oci.tar");
    for (n, transport) in ["oci-archive", "docker-archive"].iter().enumerate() {
        let copy = Command::new("skopeo")
            .args(["copy", "--quiet"])
            .arg(format!("{transport}:{}", archive.display()))
            .arg(format!(
                "oci:{}:copy",
                dir.join(format!("copy{n}")).display()
            ))
            .output()
            .unwrap();
        assert!(copy.status.success(), "{transport}: {}", stderr(&copy));
    }

    // umoci checks every digest while unpacking and writes the runtime config.
    let bundle = dir.join("bundle");
    let layout = format!("{}:{TAG}", dir.join("a/layout").display());
    let unpack = Command::new("umoci")
        .args(["unpack", "--image", &layout])
        .arg(&bundle)
        .output()
        .unwrap();
    assert!(unpack.status.success(), "umoci: {}", stderr(&unpack));
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(bundle.join("config.json")).unwrap())
            .unwrap();
    let process = &config["process"];
    assert_eq!(process["user"]["uid"], 65532);
    assert_eq!(process["user"]["gid"], 65532);
    assert_eq!(process["args"], serde_json::json!([ENTRYPOINT, "check"]));
    assert_eq!(process["cwd"], "/home/nonroot");
    // docker/Dockerfile's runtime stage says the same, so the two builds cannot drift apart.
    let dockerfile = std::fs::read_to_string(repo().join("docker/Dockerfile")).unwrap();
    let instruction = |name: &str| {
        dockerfile
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no {name} in docker/Dockerfile"))
            .to_string()
    };
    assert_eq!(instruction("USER"), "65532:65532");
    let entrypoint: serde_json::Value = serde_json::from_str(&instruction("ENTRYPOINT")).unwrap();
    let cmd: serde_json::Value = serde_json::from_str(&instruction("CMD")).unwrap();
    let mut argv = entrypoint.as_array().unwrap().clone();
    argv.extend(cmd.as_array().unwrap().iter().cloned());
    assert_eq!(process["args"], serde_json::Value::from(argv));
    assert_eq!(
        instruction("FROM"),
        "gcr.io/distroless/cc-debian12:nonroot",
        "build-oci.py rebuilds this base's package list"
    );

    // runc's /dev/shm is 64 MiB, like Docker's: the check fails and says why.
    let small = runc(&bundle, &["check", "--format", "json"], None);
    assert_eq!(small.status.code(), Some(1), "{}", stderr(&small));
    let report: serde_json::Value = serde_json::from_str(&stdout(&small)).unwrap();
    let shm = finding(&report, "dev-shm");
    assert_eq!(shm["status"], "fail");
    assert!(
        shm["summary"]
            .as_str()
            .unwrap()
            .contains("/dev/shm is 64 MiB"),
        "{shm}"
    );
    let probe = runc(&bundle, &["probe"], None);
    assert_eq!(probe.status.code(), Some(1));
    assert!(stdout(&probe).contains("dev-shm"), "{}", stdout(&probe));

    // The remediation, a 1 GiB memory-backed /dev/shm, passes in the same image.
    let big = runc(&bundle, &["check", "--format", "json"], Some("1g"));
    assert_eq!(big.status.code(), Some(0), "{}", stdout(&big));

    // The process is user 65532: it can install into its home, not into /usr/local/bin.
    let home = runc(&bundle, &["install", "/home/nonroot"], None);
    assert_eq!(home.status.code(), Some(0), "{}", stderr(&home));
    let installed = bundle.join("rootfs/home/nonroot/nccl-preflight");
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(&installed).unwrap();
    assert_eq!((meta.uid(), meta.mode() & 0o777), (65532, 0o755));
    assert_eq!(
        std::fs::read(&installed).unwrap(),
        std::fs::read(BIN).unwrap()
    );
    let before = std::fs::read_dir(bundle.join("rootfs/usr/local/bin"))
        .unwrap()
        .count();
    let denied = runc(
        &bundle,
        &["install", "/usr/local/bin", "--name", "copy"],
        None,
    );
    assert_eq!(denied.status.code(), Some(2));
    assert!(
        stderr(&denied).contains("/usr/local/bin"),
        "{}",
        stderr(&denied)
    );
    assert_eq!(
        std::fs::read_dir(bundle.join("rootfs/usr/local/bin"))
            .unwrap()
            .count(),
        before,
        "nothing written where the user may not write"
    );
}
