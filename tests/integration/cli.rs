//! Flags, their NCCL_PREFLIGHT_* variables, and the exit-code contract.

use super::support::*;

fn in_fixture(name: &str, args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    fixture_command(name, "check", args, env).output().unwrap()
}

#[test]
fn bad_flag_values_exit_2_naming_the_flag() {
    for (args, needle) in [
        (vec!["check", "--min-shm", "12XB"], "--min-shm"),
        (vec!["check", "--min-memlock", "lots"], "--min-memlock"),
        (vec!["check", "--require", "gpus=eight"], "--require"),
        (vec!["check", "--format", "yaml"], "--format"),
        (vec!["frobnicate"], "frobnicate"),
    ] {
        let out = run(&args, &[]);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(stderr(&out).contains(needle), "{args:?}: {}", stderr(&out));
        assert_eq!(stdout(&out), "", "{args:?} printed a report");
    }
}

#[test]
fn every_flag_reads_its_environment_variable() {
    let out = run(&["check"], &[("NCCL_PREFLIGHT_MIN_SHM", "12XB")]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--min-shm"));
    // runtime-defaults' 64 MiB /dev/shm fails the variable form of --min-shm 1GiB (a
    // requirement the gate holds: issue 36); the variable form of --ignore turns it into
    // a warning.
    let strict = in_fixture(
        "runtime-defaults",
        &[],
        &[("NCCL_PREFLIGHT_MIN_SHM", "1GiB")],
    );
    assert_eq!(strict.status.code(), Some(1));
    let lenient = in_fixture(
        "runtime-defaults",
        &[],
        &[
            ("NCCL_PREFLIGHT_MIN_SHM", "1GiB"),
            ("NCCL_PREFLIGHT_IGNORE", "dev-shm"),
        ],
    );
    assert_eq!(lenient.status.code(), Some(0), "{}", stdout(&lenient));
    assert!(stdout(&lenient).contains("(failure ignored by --ignore)"));
    let json = in_fixture(
        "runtime-defaults",
        &[],
        &[
            ("NCCL_PREFLIGHT_FORMAT", "json"),
            ("NCCL_PREFLIGHT_MIN_SHM", "64MiB"),
        ],
    );
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(v["schema"], "nccl-preflight/report/v1");
    assert_eq!(json.status.code(), Some(0));
    // Our own variables are not taken for NCCL's.
    assert!(
        v["facts"]["nccl_env"]
            .as_object()
            .unwrap()
            .keys()
            .all(|k| !k.starts_with("NCCL_PREFLIGHT_"))
    );
}

/// The configuration file's place in the order (docs/configuration.md), on the binary:
/// the file's [check] section over its top, the variable over the file, the flag over
/// the variable. runtime-defaults fails only on dev-shm (64 MiB /dev/shm), so `ignore`
/// and `min-shm` show in the exit code and `format` in the output.
#[test]
fn the_configuration_file_is_under_the_variables_and_the_flags() {
    let dir = scratch("config-precedence");
    let file = dir.join("config");
    std::fs::write(
        &file,
        "# cluster\nformat = json\nmin-shm = 1GiB\nignore = memlock\n[check]\nignore = dev-shm\n[serve]\nignore = all\n",
    )
    .unwrap();
    let config = format!("--config={}", file.display());
    let is_json = |out: &std::process::Output| stdout(out).starts_with('{');
    // The file alone: JSON, and dev-shm ignored by the [check] section over the top's
    // memlock: exit 0.
    let out = in_fixture("runtime-defaults", &[&config], &[]);
    assert!(is_json(&out), "{}", stdout(&out));
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    // The variables beat the file: human output, only memlock ignored, so dev-shm
    // fails against the file's 1 GiB.
    let vars = [
        ("NCCL_PREFLIGHT_FORMAT", "human"),
        ("NCCL_PREFLIGHT_IGNORE", "memlock"),
    ];
    let out = in_fixture("runtime-defaults", &[&config], &vars);
    assert!(!is_json(&out), "{}", stdout(&out));
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    // The flags beat the variables and the file: JSON, and 32 MiB is enough.
    let out = in_fixture(
        "runtime-defaults",
        &[&config, "--format", "json", "--min-shm", "32MiB"],
        &vars,
    );
    assert!(is_json(&out), "{}", stdout(&out));
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    // The file named by the variable works the same; a typo in it is exit 2 naming the line.
    let out = in_fixture(
        "runtime-defaults",
        &[],
        &[("NCCL_PREFLIGHT_CONFIG", file.to_str().unwrap())],
    );
    assert!(is_json(&out));
    std::fs::write(&file, "format = json\nrequre = gpus=8\n").unwrap();
    let out = in_fixture("runtime-defaults", &[&config], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains(":2: unknown key `requre`"),
        "{}",
        stderr(&out)
    );
    assert_eq!(stdout(&out), "");
}

#[test]
fn ignore_all_and_require_host_ipc() {
    let out = in_fixture("runtime-defaults", &["--ignore", "all"], &[]);
    assert_eq!(out.status.code(), Some(0));
    let out = in_fixture("healthy-pod", &["--require", "host-ipc"], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stdout(&out).contains("FAIL  host-ipc"));
    let out = in_fixture("healthy-pod", &["--ignore", "no-such-check"], &[]);
    assert_eq!(out.status.code(), Some(0));
    assert!(stderr(&out).contains("no check has this id"));
}

#[test]
fn bad_facts_files_exit_2() {
    let dir = scratch("facts-files");
    let cases = [
        ("malformed.json", "{\"schema\": ", "not valid JSON"),
        (
            "future.json",
            "{\"schema\": \"nccl-preflight/facts/v9\"}",
            "another nccl-preflight version",
        ),
        (
            "foreign.json",
            "{\"hello\": 1}",
            "not an nccl-preflight facts document",
        ),
        (
            "partial.json",
            "{\"schema\": \"nccl-preflight/facts/v1\"}",
            "missing field",
        ),
    ];
    for (file, text, needle) in cases {
        let path = dir.join(file);
        std::fs::write(&path, text).unwrap();
        let out = run(&["check", "--facts", path.to_str().unwrap()], &[]);
        assert_eq!(out.status.code(), Some(2), "{file}");
        let err = stderr(&out);
        assert!(err.contains(file) && err.contains(needle), "{file}: {err}");
    }
    let out = run(
        &[
            "check",
            "--facts",
            dir.join("absent.json").to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("absent.json"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn help_and_version_exit_0() {
    assert_eq!(run(&["--help"], &[]).status.code(), Some(0));
    let out = run(&["--version"], &[]);
    assert_eq!(out.status.code(), Some(0));
    let text = stdout(&out);
    assert!(text.starts_with("nccl-preflight "), "{text}");
    // The release, then the commit and its date (build.rs): a pod's binary says what it is.
    let words: Vec<&str> = text.split_whitespace().collect();
    assert_eq!(words[1], env!("CARGO_PKG_VERSION"), "{text}");
    assert_eq!(words[2], "(commit", "{text}");
    assert!(words[3].trim_end_matches(',').len() >= 7, "{text}");
}

#[test]
fn colour_only_on_a_terminal() {
    // Output to a pipe: never colour, whatever NO_COLOR says.
    let out = in_fixture("runtime-defaults", &[], &[]);
    assert!(!stdout(&out).contains('\x1b'));
}

#[test]
fn boolean_variables_accept_1_0_yes_no_on_off() {
    // Issue 16: NCCL_PREFLIGHT_TRACE=1 (and DRY_RUN, BENCH) exited 2: clap's default
    // parser for a flag's variable takes only true/false.
    let dry_run = |value: &str| {
        fixture_command(
            "healthy-pod",
            "exec",
            &["--", "/bin/true"],
            &[("NCCL_PREFLIGHT_DRY_RUN", value)],
        )
        .output()
        .unwrap()
    };
    for (value, on) in [
        ("1", true),
        ("yes", true),
        ("on", true),
        ("true", true),
        ("0", false),
        ("no", false),
        ("off", false),
        ("false", false),
    ] {
        let out = dry_run(value);
        assert_eq!(out.status.code(), Some(0), "{value}: {}", stderr(&out));
        // A dry run prints `exec CMD` instead of running it.
        assert_eq!(
            stdout(&out).contains("/bin/true"),
            on,
            "{value}: {}",
            stdout(&out)
        );
    }
    let out = dry_run("maybe");
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--dry-run"), "{}", stderr(&out));
    for (value, on) in [("yes", true), ("1", true), ("no", false), ("0", false)] {
        let out = in_fixture("healthy-pod", &[], &[("NCCL_PREFLIGHT_TRACE", value)]);
        assert_eq!(out.status.code(), Some(0), "{value}: {}", stderr(&out));
        assert_eq!(stderr(&out).contains("trace: nvmlInit"), on, "{value}");
    }
    // BENCH=0 is "no bench", so it does not conflict with --facts (clap counted a
    // variable set to false as the flag given); BENCH=1 does.
    let facts = golden_path("healthy-pod", "facts.json");
    for (value, code) in [("0", 0), ("1", 2)] {
        let out = run(
            &["init", "--facts", facts.to_str().unwrap()],
            &[("NCCL_PREFLIGHT_BENCH", value)],
        );
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(code), "{value}: {err}");
        assert_eq!(
            err.contains("--bench") && err.contains("--facts"),
            code == 2,
            "{err}"
        );
    }
}

#[test]
fn check_into_a_closed_pipe_ends_quietly_with_the_verdicts_code() {
    // Issue 16: `nccl-preflight check | head` panicked on the broken pipe and exited 2
    // "internal error". The read end is closed before the tool writes, so the first
    // write fails with EPIPE every time.
    for (fixture, code) in [("healthy-pod", 0), ("runtime-defaults", 1)] {
        let (read, write) = nix::unistd::pipe().unwrap();
        drop(read);
        // --min-shm 1GiB: runtime-defaults' 64 MiB /dev/shm fails a requirement given.
        let out = fixture_command(fixture, "check", &["--min-shm", "1GiB"], &[])
            .stdout(std::process::Stdio::from(write))
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(code), "{fixture}: {}", stderr(&out));
        assert_eq!(stderr(&out), "", "{fixture}: nothing on standard error");
    }
}

/// Regression: `eprintln!` panicked when standard error was a pipe whose reader had gone
/// (a log collector that died): the panic turned the verdict into "internal error",
/// exit 2, or Rust's 101 when it happened while reporting an error. Every stderr line
/// now tolerates EPIPE; a closed descriptor 2 (EBADF) must not change the code either.
#[test]
fn a_closed_standard_error_leaves_the_exit_code_unchanged() {
    let dir = scratch("closed-stderr");
    let absent = dir.join("absent.json");
    let absent = absent.to_str().unwrap();
    // (fixture or none, args, exit code, what it writes to stderr)
    let cases: [(Option<&str>, Vec<&str>, i32, &str); 3] = [
        (
            Some("healthy-pod"),
            vec!["--ignore", "no-such-check"],
            0,
            "no check has this id",
        ),
        (
            Some("runtime-defaults"),
            vec!["--ignore", "no-such-check", "--min-shm", "1GiB"],
            1,
            "no check has this id",
        ),
        (None, vec!["check", "--facts", absent], 2, "absent.json"),
    ];
    let command = |fixture: Option<&str>, args: &[&str]| match fixture {
        Some(f) => fixture_command(f, "check", args, &[]),
        None => command(args, &[]),
    };
    for (fixture, args, code, says) in &cases {
        // With a readable stderr: the code, and the line that the closed stderr will lose.
        let open = command(*fixture, args).output().unwrap();
        assert_eq!(
            open.status.code(),
            Some(*code),
            "{args:?}: {}",
            stderr(&open)
        );
        assert!(stderr(&open).contains(says), "{args:?}: {}", stderr(&open));
        // A pipe with no reader: every write to stderr fails with EPIPE.
        let (read, write) = nix::unistd::pipe().unwrap();
        drop(read);
        let out = command(*fixture, args)
            .stderr(std::process::Stdio::from(write))
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(*code),
            "{args:?} with stderr a closed pipe"
        );
        assert!(!stdout(&out).contains("internal error"), "{args:?}");
        // Descriptor 2 closed before exec.
        let mut closed = command(*fixture, args);
        // SAFETY: close(2) is async-signal-safe, allocates nothing, and touches only
        // the child's descriptor table between fork and exec.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut closed, || {
                libc::close(2);
                Ok(())
            });
        }
        let out = closed
            .stdout(std::process::Stdio::piped())
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(*code),
            "{args:?} with stderr closed"
        );
        assert!(!stdout(&out).contains("internal error"), "{args:?}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn relative_nccl_topo_file_is_found_in_the_working_directory() {
    // Issue 16: a relative NCCL_TOPO_FILE was reported missing when it existed; NCCL
    // opens it with fopen, relative to the working directory.
    let dir = scratch("relative-topo");
    std::fs::write(dir.join("topo.xml"), "<system/>").unwrap();
    let out = command(
        &["facts", "--cuda", "off"],
        &[
            ("NCCL_TOPO_FILE", "topo.xml"),
            ("NCCL_CONF_FILE", "missing.conf"),
        ],
    )
    .current_dir(&dir)
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let facts: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let files = &facts["nccl_files"];
    let topo = &files["named"][0];
    assert_eq!(topo["variable"], "NCCL_TOPO_FILE", "{files}");
    assert_eq!(topo["value"], "topo.xml");
    assert!(
        topo["file"]["path"]
            .as_str()
            .unwrap()
            .ends_with("/topo.xml")
    );
    assert_eq!(topo["file"]["text"]["value"], "<system/>");
    let conf = &files["conf"][0];
    assert!(
        conf["path"].as_str().unwrap().ends_with("/missing.conf"),
        "{files}"
    );
    assert_eq!(conf["text"], serde_json::json!({ "value": null }));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn facts_dev_zero_is_refused_at_the_size_cap() {
    // Issue 13: `check --facts /dev/zero` grew to 8.8 GB RSS before anything stopped it.
    for flag in ["--facts", "--replay-kernel"] {
        let out = run(&["check", flag, "/dev/zero"], &[]);
        assert_eq!(out.status.code(), Some(2), "{flag}");
        let err = stderr(&out);
        assert!(
            err.contains(&format!("{flag} /dev/zero: larger than 64 MiB")),
            "{flag}: {err}"
        );
    }
}

#[test]
fn two_thousand_gpus_and_100k_interfaces_replay_with_capped_output() {
    // Issue 18: 2,000 GPUs in `doctor` took 59 s and 1.85 GB (200 MB printed);
    // 100k interfaces took over 120 s. Both are now linear, and the matrices capped.
    let dir = scratch("absurd-sizes");
    let mut facts = gathered_facts("gpu-h100-nv18", &[]);
    let nvml = &mut facts["gpus"]["nvml"]["state"]["loaded"];
    let template = nvml["gpus"][0].clone();
    nvml["gpus"] = (0..2000)
        .map(|i| {
            let mut g = template.clone();
            g["index"] = i.into();
            g["pci_bus_id"] =
                serde_json::json!({"value": format!("0000:{:02x}:{:02x}.0", i / 256, i % 256)});
            g
        })
        .collect();
    nvml["pairs"] = serde_json::json!([]);
    let net = &mut facts["network"];
    let mut interfaces = net["interfaces"]["value"].as_array().unwrap().clone();
    let mut addresses = net["addresses"]["value"].as_array().unwrap().clone();
    for i in 0..100_000u32 {
        let name = format!("veth{i}");
        interfaces.push(serde_json::json!({"name": name, "up": true, "running": true, "loopback": false, "kind": "veth"}));
        addresses.push(serde_json::json!({"interface": name, "family": "inet",
            "address": format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255), "prefix_len": 32}));
    }
    net["interfaces"]["value"] = interfaces.into();
    net["addresses"]["value"] = addresses.into();
    let path = dir.join("facts.json");
    std::fs::write(&path, facts.to_string()).unwrap();
    let out = run(&["doctor", "--facts", path.to_str().unwrap()], &[]);
    assert!(matches!(out.status.code(), Some(0 | 1)), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("(the first 128 GPUs; 1872 more left out of the matrices)"),
        "{}",
        &text[..text.len().min(2000)]
    );
    assert!(text.len() < 4 << 20, "doctor printed {} bytes", text.len());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A flag the mode does not read exits 2 naming the flag and the mode (clap's usage
/// line), before anything is gathered (src/cli.rs walks every mode; these go through
/// the binary).
#[test]
fn a_flag_the_mode_does_not_read_exits_2_naming_both() {
    let cases: &[(&[&str], &str)] = &[
        (&["probe", "--cuda", "on"], "--cuda"),
        (&["serve", "--cuda", "on"], "--cuda"),
        (&["bench", "--memreg-size", "1MiB"], "--memreg-size"),
        (&["facts", "--nodes", "2"], "--nodes"),
        (&["init", "--gang-timeout", "5s"], "--gang-timeout"),
        (&["serve", "--ras-addr", "h:1"], "--ras-addr"),
        (
            &["check", "--facts", "absent.json", "--host-root", "/"],
            "--host-root",
        ),
    ];
    for (args, flag) in cases {
        let out = run(args, &[]);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = stderr(&out);
        let mode = format!("nccl-preflight {}", args[0]);
        assert!(err.contains(flag) && err.contains(&mode), "{args:?}: {err}");
        assert_eq!(stdout(&out), "", "{args:?}");
    }
}

/// The variable twin of a flag the mode does not read is left alone, as is that of a
/// flag read only under a switch that is off: one env list often feeds several modes
/// of a pod (src/cli.rs, `parse`).
#[test]
fn a_variable_the_mode_does_not_read_is_ignored() {
    let cases = [
        ("probe", ("NCCL_PREFLIGHT_CUDA", "on")),
        ("init", ("NCCL_PREFLIGHT_GANG_TIMEOUT", "5s")),
    ];
    for (mode, variable) in cases {
        let out = fixture_command("healthy-pod", mode, &[], &[variable])
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{mode} {variable:?}: {}",
            stderr(&out)
        );
        if mode == "probe" {
            assert!(stdout(&out).starts_with("ok: "), "{}", stdout(&out));
        }
    }
}

/// Each mode's help: `-h` is the golden (tests/golden/help/MODE.txt); in `--help` the
/// library-path heading comes last and no flag the mode never reads is offered.
#[test]
fn help_is_grouped_with_library_paths_last() {
    let modes = [
        "check",
        "probe",
        "init",
        "exec",
        "doctor",
        "facts",
        "explain-log",
        "bench",
        "serve",
        "gang",
        "install",
    ];
    golden(
        &repo().join("tests/golden/help/nccl-preflight.txt"),
        &stdout(&run(&["--help"], &[])),
    );
    for mode in modes {
        let short = run(&[mode, "-h"], &[]);
        assert_eq!(short.status.code(), Some(0));
        golden(
            &repo().join(format!("tests/golden/help/{mode}.txt")),
            &stdout(&short),
        );
        let long = stdout(&run(&[mode, "--help"], &[]));
        let headings: Vec<&str> = long
            .lines()
            .filter(|l| !l.starts_with(' ') && l.ends_with(':'))
            .collect();
        if long.contains("--nvml-lib") {
            assert_eq!(
                headings.last(),
                Some(&"Where the host and its libraries are:"),
                "{mode}: {headings:?}"
            );
        }
        assert!(headings.len() <= 7, "{mode}: {headings:?}");
    }
    assert!(!stdout(&run(&["probe", "--help"], &[])).contains("--cuda <CUDA>"));
    assert!(!stdout(&run(&["serve", "--help"], &[])).contains("--format"));
    assert!(!stdout(&run(&["bench", "--help"], &[])).contains("--memreg-size"));
}

/// A step that can take seconds says so on standard error where someone watches: with
/// --trace (or a terminal), never in a pod's collected log otherwise.
#[test]
fn bench_says_what_it_measures_only_when_asked() {
    let line = "nccl-preflight: bench: measuring peer copies and NCCL all-reduce for up to 3 s";
    let asked = run(&["bench", "--bench-seconds", "3s", "--trace"], &NO_GPU_LIBS);
    assert!(stderr(&asked).contains(line), "{}", stderr(&asked));
    let quiet = run(&["bench", "--bench-seconds", "3s"], &NO_GPU_LIBS);
    assert!(
        !stderr(&quiet).contains("nccl-preflight: bench: measuring"),
        "{}",
        stderr(&quiet)
    );
    // The verdict does not change with it.
    assert_eq!(asked.status.code(), quiet.status.code());
}
