//! RDMA paths beyond the fixtures: the real Debian libibverbs (no kernel uverbs
//! here: the ENOSYS path) and libfabric 1.17 (tcp and shm, no efa), a device
//! node this process may not open, memory registration against the real
//! memlock limit, a verbs call that hangs, and hundreds of devices with
//! garbage in their sysfs attributes.

use super::support::*;
use std::process::Command;

#[test]
fn real_debian_libibverbs_and_libfabric() {
    if !require_library("real_debian_libibverbs_and_libfabric", "libibverbs.so.1")
        || !require_library("real_debian_libibverbs_and_libfabric", "libfabric.so.1")
    {
        return;
    }
    // `check` loads libibverbs and libfabric only where RDMA or EFA devices exist; `doctor` always.
    let out = run(&["check", "--format", "json"], &[]);
    let r = report(&out);
    if r["facts"]["rdma"]["devices"]["value"]
        .as_array()
        .unwrap()
        .is_empty()
    {
        assert_eq!(
            r["facts"]["rdma"]["verbs"]["state"]["skipped"]["reason"],
            "no RDMA device"
        );
        assert_eq!(
            r["facts"]["rdma"]["libfabric"]["state"]["skipped"]["reason"],
            "no EFA device"
        );
    }
    let out = run(&["doctor", "--format", "json"], &[]);
    let r = report(&out);
    let verbs = &r["facts"]["rdma"]["verbs"];
    assert_eq!(verbs["library"], "libibverbs.so.1");
    // This kernel has no RDMA verbs: libibverbs loads and says ENOSYS; an RDMA node would list devices.
    let devices = &verbs["state"]["loaded"]["devices"];
    if r["facts"]["rdma"]["devices"]["value"]
        .as_array()
        .unwrap()
        .is_empty()
    {
        let message = devices["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.starts_with("ENOSYS")
                || devices["value"].as_array().is_some_and(|d| d.is_empty()),
            "{verbs}"
        );
    }
    let fabric = &r["facts"]["rdma"]["libfabric"]["state"]["loaded"];
    let providers: Vec<&str> = fabric["providers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect();
    assert!(
        providers.contains(&"tcp") && providers.contains(&"shm"),
        "{providers:?}"
    );
    assert_eq!(fabric["efa_rdm"]["value"], 0, "no EFA device here");
    assert!(fabric["version"].as_str().unwrap().starts_with("1."));
    assert_eq!(finding(&r, "libfabric")["status"], "pass");
    assert_eq!(finding(&r, "rdma-devices")["status"], "skip");
    // --require efa turns the same libraries into failures naming what is missing.
    let out = run(&["check", "--format", "json", "--require", "efa"], &[]);
    assert_eq!(out.status.code(), Some(1));
    let r = report(&out);
    assert_eq!(finding(&r, "rdma-devices")["status"], "fail");
    assert_eq!(finding(&r, "libfabric")["status"], "fail");
    assert_eq!(finding(&r, "nccl-net-plugin")["status"], "fail");
}

#[test]
fn a_device_node_this_process_cannot_open_fails() {
    if !require_root("a_device_node_this_process_cannot_open_fails") {
        return;
    }
    // A copy of the InfiniBand node in which uverbs3 is root's alone, checked as nobody.
    let dir = scratch("uverbs-denied");
    let fixture = repo().join("tests/fixtures/rdma-ib-ndr");
    assert!(
        Command::new("cp")
            .arg("-a")
            .arg(&fixture)
            .arg(dir.join("f"))
            .status()
            .unwrap()
            .success()
    );
    use std::os::unix::fs::PermissionsExt;
    for entry in std::fs::read_dir(dir.join("f/root/dev/infiniband")).unwrap() {
        let path = entry.unwrap().path();
        let mode = if path.ends_with("uverbs3") {
            0o600
        } else {
            0o666
        };
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let libs = fake_libs();
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(BIN)
        .args([
            "check",
            "--format",
            "json",
            "--host-root",
            "root",
            "--replay-kernel",
            "kernel.json",
        ])
        .current_dir(dir.join("f"))
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("LD_LIBRARY_PATH", libs.join("verbs"))
        .env("FAKE_VERBS_SCENARIO", dir.join("f/verbs.scenario"))
        .envs(NO_GPU_LIBS)
        .output()
        .unwrap();
    let r = report(&out);
    // The provider can give up on every device over one it cannot open: NCCL on TCP,
    // degraded (issue 36), the pod spec's.
    let devices = finding(&r, "rdma-devices");
    assert_eq!(devices["status"], "warn", "{devices}");
    assert_eq!(devices["blame"], "job", "{devices}");
    let summary = devices["summary"].as_str().unwrap();
    assert!(
        summary.contains("mlx5_3: /dev/infiniband/uverbs3 exists but cannot be opened"),
        "{summary}"
    );
    assert!(summary.contains("Permission denied"), "{summary}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn memory_registration_meets_the_real_memlock_limit() {
    if !require_root("memory_registration_meets_the_real_memlock_limit") {
        return;
    }
    // The fake libibverbs registers like the kernel: above RLIMIT_MEMLOCK without CAP_IPC_LOCK, ENOMEM.
    let cmd = fixture_command(
        "rdma-ib-ndr",
        "check",
        &["--format", "json", "--memreg-size", "16MiB"],
        &[],
    );
    let program = cmd.get_program().to_owned();
    let args: Vec<_> = cmd.get_args().map(|a| a.to_owned()).collect();
    let mut wrapped = Command::new("setpriv");
    wrapped
        .args([
            "--bounding-set=-ipc_lock",
            "--inh-caps=-ipc_lock",
            "prlimit",
            "--memlock=8388608:8388608",
        ])
        .arg(program)
        .args(args);
    wrapped.env_clear();
    for (k, v) in cmd.get_envs() {
        if let Some(v) = v {
            wrapped.env(k, v);
        }
    }
    wrapped.current_dir(cmd.get_current_dir().unwrap());
    let out = wrapped.output().unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let r = report(&out);
    let memreg = finding(&r, "rdma-memreg");
    assert_eq!(memreg["status"], "fail");
    assert!(
        memreg["summary"]
            .as_str()
            .unwrap()
            .contains("registering 16 MiB failed (ENOMEM"),
        "{memreg}"
    );
    assert!(memreg["remediation"].as_str().unwrap().contains("IPC_LOCK"));
    // The same under --trace with a stderr that refuses every write: the trace line after
    // ibv_reg_mr fails (ENOSPC) and must not replace the registration's own errno.
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let out = wrapped
        .env("NCCL_PREFLIGHT_TRACE", "1")
        .stderr(full)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    let summary = finding(&report(&out), "rdma-memreg")["summary"].to_string();
    assert!(
        summary.contains("registering 16 MiB failed (ENOMEM"),
        "{summary}"
    );
    // With the capability, the same registration works.
    let ok = fixture_command(
        "rdma-ib-ndr",
        "check",
        &["--format", "json", "--memreg-size", "16MiB"],
        &[],
    )
    .output()
    .unwrap();
    assert_eq!(finding(&report(&ok), "rdma-memreg")["status"], "pass");
}

#[test]
fn a_hung_verbs_call_fails_on_time() {
    let dir = scratch("verbs-hang");
    let scenario = dir.join("verbs.scenario");
    let fixture = repo().join("tests/fixtures/rdma-ib-ndr");
    let text = std::fs::read_to_string(fixture.join("verbs.scenario")).unwrap() + "hang mlx5_2\n";
    std::fs::write(&scenario, text).unwrap();
    // A bounded wait: a deadline that never fires fails the test, it does not hang it.
    let out = crate::bounded::output_within(
        &mut fixture_command(
            "rdma-ib-ndr",
            "check",
            &["--format", "json", "--timeout", "1s"],
            &[("FAKE_VERBS_SCENARIO", scenario.to_str().unwrap())],
        ),
        "check with a hung ibv_open_device",
    );
    let r = report(&out);
    // NCCL's IB init calls the same ibv_open_device: it hangs there too.
    let devices = finding(&r, "rdma-devices");
    assert_eq!(devices["status"], "fail");
    assert_eq!(devices["outcome"]["kind"], "hangs", "{devices}");
    assert!(
        devices["summary"]
            .as_str()
            .unwrap()
            .contains("ibv_open_device(mlx5_2)"),
        "{devices}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn hundreds_of_devices_with_garbage_attributes() {
    let dir = scratch("many-rdma");
    let root = dir.join("root");
    for i in 0..300 {
        let name = format!("mlx5_{i}");
        let dev = root.join(format!(
            "sys/devices/pci0000:00/0000:00:01.0/0000:{:02x}:00.{}/infiniband/{name}",
            i / 8,
            i % 8
        ));
        let port = dev.join("ports/1");
        std::fs::create_dir_all(port.join("gids")).unwrap();
        let garbage: &[u8] = match i % 4 {
            0 => b"4: ACTIVE\n",
            1 => b"",
            2 => b"\xff\xfe not utf8",
            _ => b"banana",
        };
        std::fs::write(port.join("state"), garbage).unwrap();
        std::fs::write(
            port.join("gids/0"),
            "0000:0000:0000:0000:0000:0000:0000:0000\n",
        )
        .unwrap();
        if i % 5 == 0 {
            std::fs::create_dir_all(port.join("link_layer")).unwrap(); // a directory where a file belongs
        }
        std::fs::create_dir_all(port.join("counters")).unwrap();
        std::fs::write(port.join("counters/link_downed"), format!("{}\n", i % 3)).unwrap();
        std::fs::write(
            port.join("counters/symbol_error"),
            if i % 7 == 0 { "lots\n" } else { "0\n" },
        )
        .unwrap();
        std::fs::create_dir_all(root.join("sys/class/infiniband")).unwrap();
        std::os::unix::fs::symlink(&dev, root.join(format!("sys/class/infiniband/{name}")))
            .unwrap();
    }
    let out = command(
        &[
            "check",
            "--format",
            "json",
            "--host-root",
            root.to_str().unwrap(),
        ],
        &NO_VENDOR_LIBS,
    )
    .output()
    .unwrap();
    assert_eq!(stderr(&out), "");
    let r = report(&out);
    let devices = r["facts"]["rdma"]["devices"]["value"].as_array().unwrap();
    assert_eq!(devices.len(), 300);
    let device = |name: &str| devices.iter().find(|d| d["name"] == name).unwrap();
    assert_eq!(device("mlx5_0")["ports"][0]["state"], "ACTIVE");
    assert_eq!(
        device("mlx5_3")["ports"][0]["state"],
        "banana",
        "odd text is kept as it is"
    );
    assert!(
        device("mlx5_2")["unreadable"][0]["message"]
            .as_str()
            .unwrap()
            .contains("UTF-8")
    );
    let unreadable = device("mlx5_5")["unreadable"].as_array().unwrap();
    assert!(
        unreadable
            .iter()
            .any(|e| e["source"].as_str().unwrap().ends_with("link_layer")),
        "{unreadable:?}"
    );
    // Error counters: numbers kept, garbage named.
    assert_eq!(
        device("mlx5_2")["ports"][0]["error_counters"]["link_downed"],
        2
    );
    assert_eq!(
        device("mlx5_2")["ports"][0]["error_counters"]["symbol_error"],
        0
    );
    assert!(
        device("mlx5_7")["ports"][0]["error_counters"]
            .get("symbol_error")
            .is_none()
    );
    assert!(
        device("mlx5_7")["unreadable"]
            .to_string()
            .contains("\\\"lots\\\" is not a counter value"),
        "{}",
        device("mlx5_7")["unreadable"]
    );
    assert_eq!(
        device("mlx5_0")["ports"][0]["gids"]
            .as_array()
            .unwrap()
            .len(),
        0,
        "zero GIDs are unused slots"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
