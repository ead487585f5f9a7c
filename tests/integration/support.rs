//! Running the built binary with a controlled environment, scratch directories,
//! and golden-file comparison.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub const BIN: &str = env!("CARGO_BIN_EXE_nccl-preflight");

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A command for the binary with an empty environment plus `env`.
/// The environment that points NVML and libcuda at files that do not exist: no GPU,
/// whatever this machine has.
pub const NO_GPU_LIBS: [(&str, &str); 2] = [
    ("NCCL_PREFLIGHT_NVML_LIB", "absent/libnvidia-ml.so.1"),
    ("NCCL_PREFLIGHT_CUDA_LIB", "absent/libcuda.so.1"),
];

/// As [`NO_GPU_LIBS`], and libibverbs too.
pub const NO_VENDOR_LIBS: [(&str, &str); 3] = [
    NO_GPU_LIBS[0],
    NO_GPU_LIBS[1],
    ("NCCL_PREFLIGHT_VERBS_LIB", "absent/libibverbs.so.1"),
];

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

/// The fake vendor libraries (tests/fakes), built once per test run, one folder
/// per vendor so a scenario can put exactly the fakes it wants on LD_LIBRARY_PATH.
pub fn fake_libs() -> &'static Path {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fake-libs");
        let cc = |source: &str, out: PathBuf, extra: &[&str]| {
            std::fs::create_dir_all(out.parent().unwrap()).unwrap();
            let status = Command::new("cc")
                .args([
                    "-shared",
                    "-fPIC",
                    "-O1",
                    "-Wall",
                    "-Wno-format-truncation",
                    "-o",
                ])
                .arg(&out)
                .arg(repo().join("tests/fakes").join(source))
                .args(extra)
                .output()
                .expect("cc (build-essential) builds the fake vendor libraries");
            assert!(
                status.status.success(),
                "building {source}: {}",
                String::from_utf8_lossy(&status.stderr)
            );
        };
        cc(
            "fake_nvml.c",
            dir.join("nvidia/libnvidia-ml.so.1"),
            &["-lpthread"],
        );
        cc(
            "fake_cuda.c",
            dir.join("nvidia/libcuda.so.1"),
            &["-lpthread"],
        );
        cc(
            "fake_verbs.c",
            dir.join("verbs/libibverbs.so.1"),
            &["-lpthread"],
        );
        cc("fake_fabric.c", dir.join("fabric/libfabric.so.1"), &[]);
        cc(
            "fake_cudart.c",
            dir.join("cudart/libcudart.so.12"),
            &["-Wl,-soname,libcudart.so.12"],
        );
        cc(
            "fake_nccl.c",
            dir.join("nccl-lib/libnccl.so.2"),
            &["-DFAKE_LIBNCCL"],
        );
        // A libnccl that bootstraps and moves data across processes over TCP, for
        // the multi-process gang tests (tests/integration/gang_fake.rs).
        cc(
            "fake_nccl_gang.c",
            dir.join("nccl-gang/libnccl.so.2"),
            &["-lpthread"],
        );
        cc(
            "fake_nccl.c",
            dir.join("nccl-plugin/libnccl-net.so"),
            &["-DFAKE_NET_PLUGIN"],
        );
        cc(
            "fake_nccl.c",
            dir.join("nccl-plugin-v4/libnccl-net.so"),
            &[
                "-DFAKE_NET_PLUGIN",
                "-DFAKE_NET_V4_ONLY",
                "-DFAKE_OFI_VERSION=\"1.4.0-aws\"",
            ],
        );
        // A plugin that exists but needs a libfabric that is not there, as when
        // aws-ofi-nccl is installed without /opt/amazon/efa/lib on the path.
        let stub = dir.join("stub");
        cc(
            "fake_fabric.c",
            stub.join("libfabric-missing.so.1"),
            &["-Wl,-soname,libfabric-missing.so.1"],
        );
        let stub_flag = format!("-L{}", stub.display());
        cc(
            "fake_nccl.c",
            dir.join("nccl-plugin-broken/libnccl-net.so"),
            &[
                "-DFAKE_NET_PLUGIN",
                &stub_flag,
                "-Wl,--no-as-needed",
                "-l:libfabric-missing.so.1",
            ],
        );
        dir
    })
}

/// `SUBCOMMAND --host-root root --replay-kernel kernel.json ARGS...` run inside fixture
/// `name` with its recorded environment plus `env`. Each scenario file the fixture has
/// (gpu, verbs, fabric, nccl) puts that vendor's fake library on LD_LIBRARY_PATH; a
/// vendor without one gets a library path that does not exist, so fixtures read the
/// same on any machine.
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
    let libs = fake_libs();
    let mut path = Vec::new();
    let scenario = |file: &str| Some(dir.join(file)).filter(|p| p.exists());
    match scenario("gpu.scenario") {
        Some(s) => {
            path.push(libs.join("nvidia"));
            cmd.env("FAKE_GPU_SCENARIO", s);
        }
        None => {
            cmd.envs(NO_GPU_LIBS);
        }
    }
    match scenario("verbs.scenario") {
        Some(s) => {
            path.push(libs.join("verbs"));
            cmd.env("FAKE_VERBS_SCENARIO", s);
        }
        None => {
            cmd.env("NCCL_PREFLIGHT_VERBS_LIB", "absent/libibverbs.so.1");
        }
    }
    match scenario("fabric.scenario") {
        Some(s) => {
            path.push(libs.join("fabric"));
            cmd.env("FAKE_FABRIC_SCENARIO", s)
                .env("NCCL_PREFLIGHT_FABRIC_LIB", "libfabric.so.1");
        }
        None => {
            cmd.env("NCCL_PREFLIGHT_FABRIC_LIB", "absent/libfabric.so.1");
        }
    }
    // cuda.runtime: "version N" puts a fake libcudart.so.12 answering N on the path;
    // without one, no CUDA runtime is looked for but an absent one.
    let runtime = scenario("cuda.runtime")
        .map(|s| std::fs::read_to_string(s).unwrap())
        .unwrap_or_default();
    match runtime.lines().find_map(|l| l.strip_prefix("version ")) {
        Some(v) => {
            path.push(libs.join("cudart"));
            cmd.env("FAKE_CUDART_VERSION", v.trim());
        }
        None => {
            cmd.env("NCCL_PREFLIGHT_CUDART_LIB", "absent/libcudart.so.12");
        }
    }
    // nccl.scenario: "version N" puts a fake libnccl.so.2 answering N on the path;
    // "plugin ok|broken|v4-only|none" a working, a broken, an aws-ofi-nccl 1.4-like
    // (ncclNetPlugin_v4 only) or no libnccl-net.so.
    let nccl = scenario("nccl.scenario")
        .map(|s| std::fs::read_to_string(s).unwrap())
        .unwrap_or_default();
    let word = |key: &str| {
        nccl.lines()
            .find_map(|l| l.strip_prefix(key))
            .map(|v| v.trim().to_string())
    };
    match word("version ") {
        Some(v) => {
            path.push(libs.join("nccl-lib"));
            cmd.env("FAKE_NCCL_VERSION", v);
        }
        None => {
            cmd.env("NCCL_PREFLIGHT_NCCL_LIB", "absent/libnccl.so.2");
        }
    }
    match word("plugin ").as_deref() {
        Some("ok") => path.push(libs.join("nccl-plugin")),
        Some("broken") => path.push(libs.join("nccl-plugin-broken")),
        Some("v4-only") => path.push(libs.join("nccl-plugin-v4")),
        _ => {}
    }
    if !path.is_empty() {
        // Relative to the fixture, so the paths dladdr reports (and the golden files hold)
        // do not depend on where the repository is checked out.
        let relative: Vec<PathBuf> = path.iter().map(|p| relative_to(&dir, p)).collect();
        cmd.env("LD_LIBRARY_PATH", std::env::join_paths(&relative).unwrap());
    }
    cmd.envs(fixture_env(name)).current_dir(dir);
    // The caller's variables win over the fixture's.
    cmd.envs(env.iter().copied());
    cmd
}

/// `target` relative to `base` (both absolute).
fn relative_to(base: &Path, target: &Path) -> PathBuf {
    let (b, t): (Vec<_>, Vec<_>) = (base.components().collect(), target.components().collect());
    let common = b.iter().zip(&t).take_while(|(x, y)| x == y).count();
    let mut out = PathBuf::new();
    for _ in common..b.len() {
        out.push("..");
    }
    for c in &t[common..] {
        out.push(c);
    }
    out
}

/// The JSON a command printed (a report), or a panic showing all it printed.
pub fn report(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}{}", stdout(out), stderr(out)))
}

/// The finding `id` of a JSON report (`checks` of check and init, `findings` of bench).
pub fn finding<'a>(report: &'a serde_json::Value, id: &str) -> &'a serde_json::Value {
    report["checks"]
        .as_array()
        .or_else(|| report["findings"].as_array())
        .and_then(|checks| checks.iter().find(|c| c["id"] == id))
        .unwrap_or_else(|| panic!("no finding {id} in {report}"))
}

/// The tuned setting `name` of a JSON report.
pub fn setting<'a>(report: &'a serde_json::Value, name: &str) -> Option<&'a serde_json::Value> {
    report["settings"]
        .as_array()?
        .iter()
        .find(|s| s["name"] == name)
}

/// This test run's scratch root: a fresh name from tempfile (never a crashed run's
/// leftovers), removed when the test binary exits.
static SCRATCH_ROOT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

extern "C" fn remove_scratch_root() {
    if let Some(root) = SCRATCH_ROOT.get() {
        let _ = std::fs::remove_dir_all(root);
    }
}

/// A fresh empty directory for one test, under this run's scratch root.
pub fn scratch(name: &str) -> PathBuf {
    let root = SCRATCH_ROOT.get_or_init(|| {
        let root = tempfile::Builder::new()
            .prefix("nccl-preflight-it-")
            .tempdir()
            .unwrap()
            .keep();
        // SAFETY: registers a function that takes nothing and only removes files; the
        // test harness leaves through exit(3), which runs it once.
        assert_eq!(unsafe { libc::atexit(remove_scratch_root) }, 0);
        root
    });
    let dir = root.join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Whether this run rewrites the goldens instead of comparing with them.
fn blessing() -> bool {
    std::env::var_os("NCCL_PREFLIGHT_BLESS").is_some()
}

const BLESS_HINT: &str = "(if the change is intended: NCCL_PREFLIGHT_BLESS=1 cargo test --test integration, then read the diff)";

/// Compares `actual` with the golden file; `NCCL_PREFLIGHT_BLESS=1` rewrites it instead.
pub fn golden(path: &Path, actual: &str) {
    if blessing() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e} {BLESS_HINT}", path.display()));
    if expected != actual {
        panic!(
            "{} differs from the output.\n--- expected\n{expected}\n--- actual\n{actual}\n{BLESS_HINT}",
            path.display()
        );
    }
}

/// Golden file `file` of fixture (or topic) `name`: tests/golden/NAME/FILE.
pub fn golden_path(name: &str, file: &str) -> PathBuf {
    repo().join("tests/golden").join(name).join(file)
}

/// The tables that hold one kind of output of every fixture, a line per fixture and
/// item, the fixture's name first (docs/testing.md, "Goldens"): a change that reaches
/// every fixture (a new check) changes one file, not one per fixture.
pub const TABLES: [&str; 3] = ["findings.txt", "settings.txt", "termination-log.txt"];

/// The fixture a table line belongs to: its first word.
pub fn table_key(line: &str) -> &str {
    line.split(' ').next().unwrap_or("")
}

/// A row of a golden table: `name` padded to one column, then `rest`, its control
/// characters (a newline would break the row) escaped.
pub fn table_row(name: &str, rest: &str) -> String {
    let rest: String = rest
        .chars()
        .map(|c| match c {
            c if c.is_control() => c.escape_default().collect(),
            c => c.to_string(),
        })
        .collect();
    format!("{name:<28} {rest}").trim_end().to_string()
}

/// Compares fixture `name`'s lines of the golden table `table` (tests/golden/TABLE) with
/// `rows`; `NCCL_PREFLIGHT_BLESS=1` rewrites those lines only, the fixtures in name order.
/// Fixtures run as parallel tests of one process: a lock keeps their rewrites apart.
pub fn golden_rows(table: &str, name: &str, rows: &[String]) {
    static WRITING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    assert!(
        rows.iter().all(|r| table_key(r) == name),
        "{name}: {rows:?}"
    );
    let path = repo().join("tests/golden").join(table);
    let _held = WRITING.lock().unwrap_or_else(|e| e.into_inner());
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    if blessing() {
        let mut by_fixture: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
        for line in text.lines().filter(|l| table_key(l) != name) {
            by_fixture.entry(table_key(line)).or_default().push(line);
        }
        by_fixture.insert(name, rows.iter().map(String::as_str).collect());
        let lines: Vec<&str> = by_fixture.into_values().flatten().collect();
        std::fs::write(&path, format!("{}\n", lines.join("\n"))).unwrap();
        return;
    }
    let expected: Vec<&str> = text.lines().filter(|l| table_key(l) == name).collect();
    if expected != rows {
        panic!(
            "{}: the lines of {name} differ from the output.\n--- expected\n{}\n--- actual\n{}\n{BLESS_HINT}",
            path.display(),
            expected.join("\n"),
            rows.join("\n")
        );
    }
}

/// Rows of `findings.txt` for a report: its verdict, then each check's status, blame
/// and summary, in the report's order.
pub fn findings_rows(name: &str, report: &serde_json::Value, exit: i32) -> Vec<String> {
    let text = |v: &serde_json::Value| v.as_str().unwrap_or("-").to_string();
    let mut rows = vec![table_row(
        name,
        &format!(
            "{:<15} {:<4} {:<5} exit {exit}",
            "(verdict)",
            text(&report["verdict"]),
            text(&report["fault"])
        ),
    )];
    for check in report["checks"].as_array().unwrap() {
        rows.push(table_row(
            name,
            &format!(
                "{:<15} {:<4} {:<5} {}",
                text(&check["id"]),
                text(&check["status"]),
                text(&check["blame"]),
                text(&check["summary"])
            ),
        ));
    }
    rows
}

/// Rows of `settings.txt` for a report: each setting's source, name, value and reason.
pub fn settings_rows(name: &str, report: &serde_json::Value) -> Vec<String> {
    report["settings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let text = |k: &str| s[k].as_str().unwrap_or("-").to_string();
            table_row(
                name,
                &format!(
                    "{:<5} {}={}  ({})",
                    text("source"),
                    text("name"),
                    s["value"],
                    text("reason")
                ),
            )
        })
        .collect()
}

/// Rows of `termination-log.txt`: the message a line a row, and a last row saying so
/// when it does not end in a newline.
pub fn text_rows(name: &str, text: &str) -> Vec<String> {
    let mut rows: Vec<String> = text.lines().map(|l| table_row(name, l)).collect();
    if !text.ends_with('\n') {
        rows.push(table_row(name, "\\ no newline at end"));
    }
    rows
}

/// The parts of `facts` at each JSON pointer of `paths` ("" for all), nested as in
/// `facts`: the slice of the gathered facts a fixture's golden keeps. A part is the
/// whole facts, a section or a field of one (at most two deep), as the facts fuzz
/// relies on when it lays the parts over whole facts (src/commands.rs).
pub fn facts_slice(facts: &serde_json::Value, paths: &[&str]) -> serde_json::Value {
    let mut slice = serde_json::Value::Null;
    for path in paths {
        assert!(path.matches('/').count() <= 2, "{path}: more than two deep");
        let part = facts
            .pointer(path)
            .unwrap_or_else(|| panic!("the facts have no {path}"));
        if path.is_empty() {
            return part.clone();
        }
        let mut at = &mut slice;
        for key in path[1..].split('/') {
            if !at.is_object() {
                *at = serde_json::json!({});
            }
            at = at
                .as_object_mut()
                .unwrap()
                .entry(key)
                .or_insert(serde_json::Value::Null);
        }
        *at = part.clone();
    }
    slice
}

/// A JSON value as the goldens hold it: pretty, keys sorted, a final newline.
pub fn pretty(value: &serde_json::Value) -> String {
    format!("{}\n", serde_json::to_string_pretty(value).unwrap())
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Tests that need root (unshare, mount, ip netns) skip with a message when not
/// root, unless NCCL_PREFLIGHT_TEST_STRICT is set (CI sets it), where a
/// skip would hide a broken test.
pub fn require_root(test: &str) -> bool {
    if is_root() {
        return true;
    }
    if std::env::var_os("NCCL_PREFLIGHT_TEST_STRICT").is_some() {
        panic!("{test} needs root and NCCL_PREFLIGHT_TEST_STRICT is set");
    }
    eprintln!("skipped {test}: needs root (unshare, mount, ip)");
    false
}

/// A test that needs something this machine may lack skips with a message,
/// unless NCCL_PREFLIGHT_TEST_STRICT is set (CI), where a skip would hide a broken test.
pub fn require(test: &str, found: bool, what: &str) -> bool {
    if found {
        return true;
    }
    if std::env::var_os("NCCL_PREFLIGHT_TEST_STRICT").is_some() {
        panic!("{test} needs {what} and NCCL_PREFLIGHT_TEST_STRICT is set");
    }
    eprintln!("skipped {test}: {what} is not on this machine");
    false
}

/// Data from public projects in `../shared/data/NAME` (DESIGN.md: it stays outside the
/// repository): its path, or None with a skip message when it is not beside the
/// repository, unless NCCL_PREFLIGHT_TEST_STRICT is set (CI), where that fails.
pub fn require_shared(test: &str, name: &str) -> Option<PathBuf> {
    let dir = repo().join("../shared/data").join(name);
    require(test, dir.is_dir(), &format!("../shared/data/{name}")).then_some(dir)
}

/// The test venv's Python (NCCL_PREFLIGHT_TEST_PYTHON, else target/test-venv, made by
/// `scripts/setup.sh test`) when it imports `modules` (e.g. "jsonschema, yaml").
pub fn require_python(test: &str, modules: &str) -> Option<PathBuf> {
    let python = std::env::var_os("NCCL_PREFLIGHT_TEST_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target/test-venv/bin/python3"));
    let found = Command::new(&python)
        .args(["-c", &format!("import {modules}")])
        .status()
        .is_ok_and(|s| s.success());
    let what = format!(
        "{} importing {modules} (run scripts/setup.sh test)",
        python.display()
    );
    require(test, found, &what).then_some(python)
}

/// The real Debian libibverbs and libfabric.
pub fn require_library(test: &str, library: &str) -> bool {
    let found = Command::new("sh")
        .arg("-c")
        .arg(format!("ldconfig -p | grep -q '{library} '"))
        .status()
        .is_ok_and(|s| s.success());
    require(test, found, library)
}

/// Programs on PATH (umoci, runc, ...).
pub fn require_tools(test: &str, tools: &[&str]) -> bool {
    tools.iter().all(|tool| {
        let found = Command::new("sh")
            .arg("-c")
            .arg(format!("command -v {tool} >/dev/null"))
            .status()
            .is_ok_and(|s| s.success());
        require(test, found, tool)
    })
}

/// Facts gathered from a fixture through the fake vendor libraries, with `env` in the pod:
/// for situations a host tree cannot easily show, edited and replayed with `check_saved_facts`.
pub fn gathered_facts(fixture: &str, env: &[(&str, &str)]) -> serde_json::Value {
    let out = fixture_command(fixture, "facts", &[], env)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{fixture}: {}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `check --format json --facts` on `facts` with `flags`: (exit code, report). Each call
/// has its own scratch folder, so tests running side by side never remove another's file.
pub fn check_saved_facts(
    label: &str,
    facts: &serde_json::Value,
    flags: &[&str],
) -> (i32, serde_json::Value) {
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = scratch(&format!("saved-facts-{label}-{call}"));
    let path = dir.join("facts.json");
    std::fs::write(&path, serde_json::to_string(facts).unwrap()).unwrap();
    let path = path.display().to_string();
    let mut args = vec!["check", "--format", "json", "--facts", &path];
    args.extend(flags);
    let out = run(&args, &[]);
    std::fs::remove_dir_all(&dir).unwrap();
    let code = out
        .status
        .code()
        .unwrap_or_else(|| panic!("{label}: killed: {}", stderr(&out)));
    (code, report(&out))
}

/// Leaves the device nodes of the first `keep` uverbs entries, as when the pod requested
/// fewer RDMA devices than the node has (sysfs still lists them all).
pub fn keep_device_nodes(facts: &mut serde_json::Value, keep: usize) {
    for n in facts["rdma"]["uverbs"]["value"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .skip(keep)
    {
        n["open"] = serde_json::Value::Null;
    }
}

/// Every `.rs` file under `dir`, recursively (the source-reading tests: layering, function length).
pub fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `git` in `dir` with a throwaway identity and no signing; fails the test on error.
pub fn git(dir: &std::path::Path, args: &[&str]) {
    let out = std::process::Command::new("git")
        .args([
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "-c",
            "commit.gpgsign=false",
        ])
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {}", stderr(&out));
}
