//! The container image: docker/build-oci.py builds it without an engine, skopeo
//! reads its archive as OCI and as `docker load` input, umoci unpacks it as a
//! container runtime would, and runc runs the tool in it as the image's user, in
//! namespaces of its own, with runc's 64 MiB /dev/shm. The image marks itself as
//! nccl-preflight's own (NCCL_PREFLIGHT_IMAGE=own), and the two-step deployment runs
//! end to end: our image's `install /tools`, then a training image built here runs the
//! installed binary's `init`, which judges that image's libraries.

use crate::support::{BIN, finding, repo, require_root, require_tools, scratch, stderr, stdout};
use std::path::Path;
use std::process::{Command, Output, Stdio};

const TAG: &str = "test";
const ENTRYPOINT: &str = "/usr/local/bin/nccl-preflight";
/// Checks of the libraries in the image the tool runs in (FACTS/issue 14): they skip in
/// nccl-preflight's own image, which does not hold the trainer's libraries.
const IMAGE_LEVEL_CHECKS: [&str; 4] = [
    "rdma-devices",
    "rdma-memreg",
    "libfabric",
    "nccl-net-plugin",
];

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
    let mut argv = vec![ENTRYPOINT];
    argv.extend(args);
    runc_argv(bundle, &argv, shm, &[])
}

/// Runs `argv` in the bundle under runc, with `binds` (host directory, path in the
/// container) mounted read-write, as a pod's emptyDir is in each container that mounts it.
fn runc_argv(bundle: &Path, argv: &[&str], shm: Option<&str>, binds: &[(&Path, &str)]) -> Output {
    let path = bundle.join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    config["process"]["terminal"] = false.into();
    config["process"]["args"] = argv.into();
    let mounts = config["mounts"].as_array_mut().unwrap();
    mounts.retain(|m| {
        m["destination"] != "/dev/shm" && !binds.iter().any(|(_, d)| m["destination"] == *d)
    });
    let size = shm.unwrap_or("65536k");
    mounts.push(serde_json::json!({
        "destination": "/dev/shm", "type": "tmpfs", "source": "shm",
        "options": ["nosuid", "noexec", "nodev", "mode=1777", format!("size={size}")]
    }));
    for (source, destination) in binds {
        mounts.push(serde_json::json!({
            "destination": destination, "type": "bind", "source": source,
            "options": ["rbind", "rw"]
        }));
    }
    std::fs::write(&path, config.to_string()).unwrap();
    // Unique per call: the tests of this file run in parallel in one process.
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let id = format!(
        "nccl-preflight-it-{}-{}",
        std::process::id(),
        RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
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

/// Builds the image into `dir/a` and unpacks it with umoci into `dir/bundle`; returns
/// the manifest digest.
fn build_and_unpack(dir: &Path) -> String {
    let digest = build(&dir.join("a"));
    let bundle = dir.join("bundle");
    let layout = format!("{}:{TAG}", dir.join("a/layout").display());
    // umoci checks every digest while unpacking and writes the runtime config.
    let unpack = Command::new("umoci")
        .args(["unpack", "--image", &layout])
        .arg(&bundle)
        .output()
        .unwrap();
    assert!(unpack.status.success(), "umoci: {}", stderr(&unpack));
    digest
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
    let digest = build_and_unpack(&dir);
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

    let bundle = dir.join("bundle");
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
    // The image marks itself as nccl-preflight's own, not the trainer's, in both builds:
    // the ENV of the runtime stage (after the last FROM) and the OCI config's Env.
    let runtime_stage = dockerfile.rsplit("\nFROM ").next().unwrap();
    let envs: Vec<&str> = runtime_stage
        .lines()
        .filter_map(|l| l.strip_prefix("ENV "))
        .collect();
    assert_eq!(envs, ["NCCL_PREFLIGHT_IMAGE=own"], "docker/Dockerfile");
    let env: Vec<&str> = process["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(env.contains(&envs[0]), "build-oci.py's Env: {env:?}");

    // runc's /dev/shm is 64 MiB, like Docker's: the check fails and says why.
    // runc's /dev/shm is 64 MiB, like Docker's: NCCL keeps nothing there (2.24 and
    // later), the job's DataLoader workers may: a warning (issue 36), and a failure of
    // an explicit --min-shm.
    let small = runc(&bundle, &["check", "--format", "json"], None);
    assert_eq!(small.status.code(), Some(0), "{}", stderr(&small));
    let report: serde_json::Value = serde_json::from_str(&stdout(&small)).unwrap();
    let shm = finding(&report, "dev-shm");
    assert_eq!(shm["status"], "warn");
    assert!(
        shm["summary"]
            .as_str()
            .unwrap()
            .contains("/dev/shm is 64 MiB"),
        "{shm}"
    );
    let probe = runc(&bundle, &["probe", "--min-shm", "1GiB"], None);
    assert_eq!(probe.status.code(), Some(1));
    assert!(stdout(&probe).contains("dev-shm"), "{}", stdout(&probe));

    // The remediation, a 1 GiB memory-backed /dev/shm, passes in the same image.
    let big = runc(&bundle, &["check", "--format", "json"], Some("1g"));
    assert_eq!(big.status.code(), Some(0), "{}", stdout(&big));
    // In its own image the tool judges the node, not libraries the trainer will not load:
    // none is even dlopened, and the image-level checks skip.
    let report: serde_json::Value = serde_json::from_str(&stdout(&big)).unwrap();
    assert_eq!(report["facts"]["image"], "own", "{}", report["facts"]);
    let rdma = &report["facts"]["rdma"];
    for library in [&rdma["verbs"], &rdma["libfabric"], &rdma["nccl"]["library"]] {
        let reason = library["state"]["skipped"]["reason"].as_str();
        assert!(reason.is_some_and(|r| r.contains("own image")), "{library}");
    }
    for id in IMAGE_LEVEL_CHECKS {
        assert_eq!(
            finding(&report, id)["status"],
            "skip",
            "{}",
            finding(&report, id)
        );
    }

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

/// Copies `path` from this machine into `rootfs` at the same place, as the file it
/// resolves to (a soname link becomes a copy: the loader only needs the name).
fn copy_into(rootfs: &Path, path: &Path) {
    let to = rootfs.join(path.strip_prefix("/").unwrap());
    std::fs::create_dir_all(to.parent().unwrap()).unwrap();
    std::fs::copy(path, &to).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

/// What `ldd` says `file` loads: the absolute paths, the dynamic loader included.
fn ldd(file: &Path) -> Vec<std::path::PathBuf> {
    let out = Command::new("ldd").arg(file).output().unwrap();
    assert!(
        out.status.success(),
        "ldd {}: {}",
        file.display(),
        stderr(&out)
    );
    stdout(&out)
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let path = l.split_once("=> ").map_or(l, |(_, p)| p);
            let path = path.split(" (").next()?;
            path.starts_with('/')
                .then(|| std::path::PathBuf::from(path))
        })
        .collect()
}

/// A "training image" root filesystem holding only what a container needs to run the
/// installed binary and Debian's libibverbs with its providers: the files `dpkg -L`
/// lists for libibverbs1 and ibverbs-providers (documentation left out) and the shared
/// libraries ldd shows both load (glibc's libc and loader, libgcc_s, libnl-3, libnl-route-3).
fn training_rootfs(rootfs: &Path) {
    let listed = Command::new("dpkg")
        .args(["-L", "libibverbs1", "ibverbs-providers"])
        .output()
        .unwrap();
    assert!(listed.status.success(), "dpkg -L: {}", stderr(&listed));
    let mut files: Vec<std::path::PathBuf> = stdout(&listed)
        .lines()
        .map(std::path::PathBuf::from)
        .filter(|p| p.is_absolute() && !p.starts_with("/usr/share") && p.is_file())
        .collect();
    let verbs = files
        .iter()
        .find(|p| p.file_name().is_some_and(|n| n == "libibverbs.so.1"))
        .cloned()
        .expect("libibverbs1 ships libibverbs.so.1");
    files.extend(ldd(&verbs));
    files.extend(ldd(Path::new(BIN)));
    for file in &files {
        copy_into(rootfs, file);
    }
    for dir in ["tmp", "proc", "sys", "dev", "tools", "nccl"] {
        std::fs::create_dir_all(rootfs.join(dir)).unwrap();
    }
}

#[test]
fn install_then_init_in_the_training_image_judges_its_libraries_under_runc() {
    let test = "install_then_init_in_the_training_image_judges_its_libraries_under_runc";
    if !require_root(test)
        || !require_tools(
            test,
            &[
                "python3", "dpkg", "dpkg-deb", "apt-get", "umoci", "runc", "ldd",
            ],
        )
    {
        return;
    }
    let have_verbs = Command::new("dpkg")
        .args(["-s", "libibverbs1", "ibverbs-providers"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !have_verbs {
        assert!(
            std::env::var_os("NCCL_PREFLIGHT_TEST_STRICT").is_none(),
            "{test}: Debian's libibverbs1 and ibverbs-providers are not installed"
        );
        eprintln!("skipped {test}: libibverbs1 or ibverbs-providers is not installed");
        return;
    }
    let dir = scratch("two-step");
    build_and_unpack(&dir);
    let ours = dir.join("bundle");
    // The pod's emptyDirs: world-writable, as the kubelet makes them.
    let (tools, nccl) = (dir.join("tools"), dir.join("nccl"));
    use std::os::unix::fs::PermissionsExt;
    for d in [&tools, &nccl] {
        std::fs::create_dir_all(d).unwrap();
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o777)).unwrap();
    }

    // First initContainer: our image copies the tool into the shared volume.
    let install = runc_argv(
        &ours,
        &[ENTRYPOINT, "install", "/tools"],
        None,
        &[(&tools, "/tools")],
    );
    assert_eq!(install.status.code(), Some(0), "{}", stderr(&install));
    assert_eq!(
        std::fs::read(tools.join("nccl-preflight")).unwrap(),
        std::fs::read(BIN).unwrap()
    );

    // Second initContainer: the training image, as root (training images usually are),
    // with none of our image's environment, runs the installed binary. `--require rdma`
    // loads libibverbs even on a node without RDMA devices (this one's failure of
    // rdma-devices is the node's, and ignored here so init writes its files).
    let training = dir.join("training");
    training_rootfs(&training.join("rootfs"));
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(ours.join("config.json")).unwrap()).unwrap();
    config["root"] = serde_json::json!({"path": "rootfs", "readonly": false});
    config["process"]["user"] = serde_json::json!({"uid": 0, "gid": 0});
    config["process"]["env"] = serde_json::json!(["PATH=/usr/bin:/bin"]);
    config["process"]["cwd"] = "/".into();
    std::fs::write(training.join("config.json"), config.to_string()).unwrap();
    let init_args = [
        "/tools/nccl-preflight",
        "init",
        "--require=rdma",
        "--ignore=rdma-devices",
        "--cuda=off",
        "--nodes=2",
        "--nccl-conf=/nccl/nccl.conf",
        "--report=/nccl/report.json",
    ];
    let binds = [(tools.as_path(), "/tools"), (nccl.as_path(), "/nccl")];
    let init = runc_argv(&training, &init_args, Some("1g"), &binds);
    let report: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(nccl.join("report.json"))
            .unwrap_or_else(|e| panic!("no report ({e}): {}{}", stdout(&init), stderr(&init))),
    )
    .unwrap();
    assert_eq!(
        init.status.code(),
        Some(0),
        "{}{}",
        stdout(&init),
        stderr(&init)
    );
    assert!(nccl.join("nccl.conf").is_file());
    assert_eq!(report["facts"]["image"], "trainer", "{}", report["facts"]);
    // libibverbs came from the training rootfs: loaded there (the kernel has no
    // verbs support here, which the device list says, not the library state).
    let verbs = &report["facts"]["rdma"]["verbs"];
    assert!(verbs["state"]["loaded"].is_object(), "{verbs}");
    // and only what that image holds: it has no libfabric.
    let fabric = &report["facts"]["rdma"]["libfabric"];
    assert!(fabric["state"]["not_found"].is_object(), "{fabric}");
    // Image-level checks are judged there, none skipped for the image.
    let memreg = finding(&report, "rdma-memreg");
    assert!(
        !memreg["summary"].as_str().unwrap().contains("own image"),
        "{memreg}"
    );

    // The same binary told to judge our image finds no libibverbs in it: the library
    // loaded above is the training image's.
    let ours_as_trainer = runc_argv(
        &ours,
        &[
            ENTRYPOINT,
            "check",
            "--image=trainer",
            "--require=rdma",
            "--cuda=off",
            "--format=json",
        ],
        Some("1g"),
        &[],
    );
    let report: serde_json::Value = serde_json::from_str(&stdout(&ours_as_trainer))
        .unwrap_or_else(|e| panic!("{e}: {}", stderr(&ours_as_trainer)));
    assert_eq!(report["facts"]["image"], "trainer");
    let verbs = &report["facts"]["rdma"]["verbs"];
    assert!(verbs["state"]["not_found"].is_object(), "{verbs}");
}
