//! `serve --watch-nccl` against a fake NCCL RAS server on loopback: it speaks the
//! server side of RAS's client protocol (NVIDIA/nccl src/ras/client_support.cc,
//! rasClientEventLoop: `CLIENT PROTOCOL`, `TIMEOUT`, `SET FORMAT`, `STATUS`, `VERBOSE
//! STATUS`, `MONITOR`), replays the replies recorded from real NCCL (tests/data/ras), and
//! scripts the failures: a rank that stops, a dead rank, a reply cut mid-way, malformed
//! JSON, a server that accepts and never answers, the trainer restarting (nothing
//! listening, then a new server on the same port). /healthz answers throughout.

use super::serve::{Server, get, raw, start, wait_for};
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/ras");

fn data(name: &str) -> String {
    std::fs::read_to_string(format!("{DATA}/{name}")).unwrap()
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    /// Answer STATUS with the scripted reply.
    Reply,
    /// Accept, read, never answer.
    Silent,
    /// Send half the reply, then close.
    Cut,
    /// Send text that is not RAS's.
    Malformed,
}

struct Script {
    mode: Mode,
    /// Accepts `SET FORMAT json` (2.28.7+).
    json: bool,
    /// Accepts `MONITOR` (2.29+).
    monitor: bool,
    json_reply: String,
    text_reply: String,
    /// Every command received, with when.
    commands: Vec<(Instant, String)>,
    /// Events for MONITOR connections, sent once each.
    events: Vec<String>,
    /// The `DIAGNOSTICS` reply (NCCL 2.31+); empty: `ERROR: Unknown command`, the
    /// connection left open as NCCL leaves it.
    diag_reply: String,
}

struct FakeRas {
    addr: SocketAddr,
    script: Arc<Mutex<Script>>,
    /// Listening (false: the trainer's processes are gone, connections are refused).
    up: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
}

impl Drop for FakeRas {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl FakeRas {
    fn start(json: bool, monitor: bool, json_reply: String, text_reply: String) -> FakeRas {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let fake = FakeRas {
            addr: listener.local_addr().unwrap(),
            script: Arc::new(Mutex::new(Script {
                mode: Mode::Reply,
                json,
                monitor,
                json_reply,
                text_reply,
                commands: Vec::new(),
                events: Vec::new(),
                diag_reply: String::new(),
            })),
            up: Arc::new(AtomicBool::new(true)),
            stop: Arc::new(AtomicBool::new(false)),
        };
        let (script, up, stop, addr) = (
            Arc::clone(&fake.script),
            Arc::clone(&fake.up),
            Arc::clone(&fake.stop),
            fake.addr,
        );
        std::thread::spawn(move || accept_loop(Some(listener), addr, &script, &up, &stop));
        fake
    }

    fn set(&self, f: impl FnOnce(&mut Script)) {
        f(&mut self.script.lock().unwrap());
    }

    fn commands(&self) -> Vec<(Instant, String)> {
        self.script.lock().unwrap().commands.clone()
    }
}

/// Accepts while `up`; closes the listener while not (connections refused) and binds the
/// same port again when `up` comes back: the trainer restarting.
fn accept_loop(
    mut listener: Option<TcpListener>,
    addr: SocketAddr,
    script: &Arc<Mutex<Script>>,
    up: &AtomicBool,
    stop: &Arc<AtomicBool>,
) {
    while !stop.load(Ordering::Relaxed) {
        match (&listener, up.load(Ordering::Relaxed)) {
            (Some(_), false) => listener = None,
            (None, true) => listener = TcpListener::bind(addr).ok(),
            _ => {}
        }
        let Some(l) = &listener else {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        };
        l.set_nonblocking(true).unwrap();
        match l.accept() {
            Ok((s, _)) => {
                let (script, stop) = (Arc::clone(script), Arc::clone(stop));
                std::thread::spawn(move || serve_client(s, &script, &stop));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// The server side of one client connection.
fn serve_client(stream: TcpStream, script: &Mutex<Script>, stop: &AtomicBool) {
    stream.set_nonblocking(false).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let mut out = stream.try_clone().unwrap();
    let mut reader = BufReader::new(stream);
    let mut json = false;
    let mut line = String::new();
    while !stop.load(Ordering::Relaxed) {
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) => return,
            Ok(_) => {}
            Err(_) => continue,
        }
        let cmd = line.trim().to_ascii_lowercase();
        let mut s = script.lock().unwrap();
        s.commands.push((Instant::now(), cmd.clone()));
        if s.mode == Mode::Silent {
            continue;
        }
        let answer = match cmd.as_str() {
            c if c.starts_with("client protocol ") => "SERVER PROTOCOL 2\n".to_string(),
            c if c.starts_with("timeout ") => "OK\n".into(),
            "set format json" if s.json => {
                json = true;
                "OK\n".into()
            }
            "status" | "verbose status" => {
                let reply = match (s.mode, json) {
                    (Mode::Malformed, _) => "<html>not RAS</html>\n".to_string(),
                    (_, true) => s.json_reply.clone(),
                    (_, false) => s.text_reply.clone(),
                };
                let reply = match s.mode {
                    Mode::Cut => reply[..reply.len() / 2].to_string(),
                    _ => reply,
                };
                let _ = out.write_all(reply.as_bytes());
                return;
            }
            "diagnostics" if !s.diag_reply.is_empty() => {
                let reply = match s.mode {
                    Mode::Cut => s.diag_reply[..s.diag_reply.len() / 2].to_string(),
                    _ => s.diag_reply.clone(),
                };
                let _ = out.write_all(reply.as_bytes());
                return;
            }
            c if c.starts_with("monitor") && s.monitor => {
                drop(s);
                let _ = out.write_all(b"OK\n");
                return push_events(out, script, stop);
            }
            c => format!("ERROR: Unknown command {c}\n"),
        };
        let _ = out.write_all(answer.as_bytes());
    }
}

fn push_events(mut out: TcpStream, script: &Mutex<Script>, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        let events = std::mem::take(&mut script.lock().unwrap().events);
        for e in events {
            if out.write_all(format!("{e}\n").as_bytes()).is_err() {
                return;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `serve --watch-nccl` on the fake, querying every `interval`.
fn watch(fake: &FakeRas, interval: &str, extra: &[&str]) -> Server {
    let addr = fake.addr.to_string();
    let mut args = vec![
        "--interval",
        "60m",
        "--watch-nccl",
        "--ras-addr",
        addr.as_str(),
        "--watch-interval",
        interval,
    ];
    args.extend(extra);
    start("healthy-pod", &args)
}

fn job(server: &Server) -> serde_json::Value {
    let (status, _, body) = get(server, "/job");
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// Waits for /job's state, checking on every poll that /healthz still answers 200.
fn wait_state(server: &Server, state: &str) -> serde_json::Value {
    wait_for(server, "/job", |_, body| {
        assert_eq!(get(server, "/healthz").0, 200, "/healthz while watching");
        serde_json::from_str::<serde_json::Value>(body).is_ok_and(|v| v["state"] == state)
    });
    job(server)
}

#[test]
fn a_stopped_rank_is_named_hung_then_dead_and_the_trainer_probe_fails_while_healthz_stays_up() {
    let fake = FakeRas::start(
        true,
        false,
        data("2.28.9/healthy.json"),
        data("2.28.9/healthy.txt"),
    );
    let server = watch(&fake, "1s", &["--hang-after", "3s"]);
    let v = wait_state(&server, "healthy");
    assert_eq!(
        (v["ranks"].as_u64(), v["format"].as_str()),
        (Some(2), Some("json"))
    );
    assert_eq!(get(&server, "/job/livez").0, 200);
    // Rank 1 stops: missing and unresponsive, rank 0's AllReduce frozen at 241.
    let stopped = Instant::now();
    fake.set(|s| s.json_reply = data("2.28.9/stopped-unresponsive.json"));
    wait_state(&server, "suspect");
    let v = wait_state(&server, "hung");
    eprintln!(
        "hung named {:?} after the stop (--hang-after 3s, --watch-interval 1s)",
        stopped.elapsed()
    );
    let headline = v["headline"].as_str().unwrap();
    assert!(
        headline.contains("hung at collective 241 (AllReduce 241): behind: rank 1 (pid 637 on 192.0.2.2, GPU 1) not answering"),
        "{headline}"
    );
    let (status, _, body) = get(&server, "/job/livez");
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("rank 1 (pid 637"), "{body}");
    // 70 s later in the real run: considered dead.
    fake.set(|s| s.json_reply = data("2.28.9/stopped-dead.json"));
    let v = wait_state(&server, "dead");
    assert_eq!(v["ranks_dead"], 1);
    assert!(
        v["last_reply"]["repaired"].as_bool().unwrap(),
        "2.28.9's JSON needed its comma back"
    );
    let (_, _, metrics) = get(&server, "/metrics");
    for needle in [
        "nccl_preflight_job_live 0",
        "nccl_preflight_job_ranks_dead 1",
        "nccl_preflight_job_ranks 2",
    ] {
        assert!(metrics.contains(needle), "{needle} not in\n{metrics}");
    }
    let (_, _, report) = get(&server, "/report");
    let report: serde_json::Value = serde_json::from_str(&report).unwrap();
    let finding = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == "nccl-job")
        .unwrap();
    assert_eq!(finding["status"], "fail", "{finding}");
    // The trainer's processes end (torchrun tore the group down): nothing listens.
    fake.up.store(false, Ordering::Relaxed);
    wait_state(&server, "gone");
    assert_eq!(
        get(&server, "/job/livez").0,
        200,
        "a gone job is the kubelet's business, not a hang"
    );
    // The trainer restarts: a new RAS on the same port, healthy again.
    fake.set(|s| s.json_reply = data("2.28.9/healthy.json"));
    fake.up.store(true, Ordering::Relaxed);
    wait_state(&server, "healthy");
    // Only ncclras's commands were sent, and never VERBOSE STATUS on 2.28.9 (nccl#1762).
    let commands = fake.commands();
    assert!(
        commands.iter().all(|(_, c)| [
            "client protocol 2",
            "timeout 5",
            "set format json",
            "status"
        ]
        .contains(&c.as_str())),
        "{commands:?}"
    );
}

#[test]
fn cut_malformed_and_unanswered_queries_are_failures_that_never_block_healthz() {
    let fake = FakeRas::start(true, false, data("2.28.9/healthy.json"), String::new());
    let server = watch(&fake, "1s", &["--hang-after", "5m"]);
    wait_state(&server, "healthy");
    for (mode, error) in [
        (Mode::Cut, "RAS JSON reply: EOF while parsing"),
        (Mode::Malformed, "RAS JSON reply: expected value"),
        (Mode::Silent, "no answer in time"),
    ] {
        fake.set(|s| s.mode = mode);
        wait_for(&server, "/job", |_, body| {
            assert_eq!(get(&server, "/healthz").0, 200, "/healthz while {mode:?}");
            body.contains(error)
        });
        let v = job(&server);
        assert_eq!(v["state"], "suspect", "{mode:?}: {v}");
        assert_eq!(
            get(&server, "/job/livez").0,
            200,
            "one failed query is not a verdict"
        );
    }
    fake.set(|s| s.mode = Mode::Reply);
    let v = wait_state(&server, "healthy");
    assert!(v["failed_queries"].as_u64().unwrap() >= 3, "{v}");
}

#[test]
fn nccl_2_26_is_read_as_text_without_verbose_status_and_not_before_the_init_grace() {
    let fake = FakeRas::start(false, false, String::new(), data("2.26/mismatch.txt"));
    let server = watch(
        &fake,
        "1s",
        &["--hang-after", "2s", "--watch-init-grace", "3s"],
    );
    let v = wait_state(&server, "hung");
    assert_eq!(v["format"], "text");
    let headline = v["headline"].as_str().unwrap();
    assert!(
        headline.contains("communicator 0x27a079b828ff1a75 hung at collective 6650 (AllReduce 6650): behind: rank 6 (pid 483078 on 172.16.64.210, GPU 6) at AllReduce 6649; rank 7"),
        "{headline}"
    );
    fake.set(|s| s.text_reply = data("2.26/dead.txt"));
    let v = wait_state(&server, "dead");
    assert!(
        v["headline"]
            .as_str()
            .unwrap()
            .contains("process pid 3487984 on 172.16.64.213, GPU 5"),
        "{v}"
    );
    let commands = fake.commands();
    let first = commands.first().unwrap().0;
    let first_status = commands.iter().find(|(_, c)| c == "status").unwrap().0;
    assert!(
        first_status - first >= Duration::from_secs(3),
        "queried {:?} after RAS first answered (nccl#1669)",
        first_status - first
    );
    assert!(
        !commands.iter().any(|(_, c)| c == "verbose status"),
        "VERBOSE STATUS sent to 2.26 (nccl#1762)"
    );
}

#[test]
fn a_monitor_peer_dead_event_is_judged_without_waiting_for_the_interval() {
    let healthy = data("2.28.9/healthy.json").replace("\"2.28.9\"", "\"2.29.2\"");
    let fake = FakeRas::start(true, true, healthy, String::new());
    let server = watch(&fake, "60m", &[]);
    wait_state(&server, "healthy");
    wait_for(&server, "/job", |_, _| {
        fake.commands()
            .iter()
            .any(|(_, c)| c.starts_with("monitor"))
    });
    fake.set(|s| {
        s.events.push(
            "[2026-11-26 07:28:04] PEER_DEAD: Process 637 on node 192.0.2.2 managing GPU 1 ".into(),
        )
    });
    let v = wait_state(&server, "dead");
    assert!(
        v["headline"]
            .as_str()
            .unwrap()
            .contains("pid 637 on 192.0.2.2, GPU 1"),
        "{v}"
    );
    assert_eq!(v["events"].as_array().unwrap().len(), 1);
}

#[test]
fn without_watch_nccl_the_job_endpoints_say_so_and_the_trainer_probe_passes() {
    let server = start("healthy-pod", &["--interval", "60m"]);
    let (status, _, body) = get(&server, "/job");
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("--watch-nccl"), "{body}");
    let (status, _, body) = get(&server, "/job/livez");
    assert_eq!(
        (status, body.as_str()),
        (200, "ok: not watching the job (no --watch-nccl)\n")
    );
    let (_, _, metrics) = get(&server, "/metrics");
    assert!(!metrics.contains("nccl_preflight_job_"), "{metrics}");
}

/// The manifest rule for the trainer's probe (tests/manifests/validate.py
/// check_job_probe): a /job/livez probe with no `serve --watch-nccl` beside it, or one
/// that a sidecar restart would trip, is an error; the shipped recipes pass (deploy.rs).
#[test]
fn a_trainer_probe_without_a_watching_sidecar_or_with_no_restart_tolerance_is_refused() {
    let test = "a_trainer_probe_without_a_watching_sidecar_or_with_no_restart_tolerance_is_refused";
    let Some(python) =
        crate::support::require_python(test, "kubernetes_validate, jsonschema, yaml")
    else {
        return;
    };
    let repo = crate::support::repo();
    let good = std::fs::read_to_string(
        repo.join("examples/manifests/base/pytorchjob-watch/pytorchjob-watch.yaml"),
    )
    .unwrap();
    let dir = crate::support::scratch("ras-manifests");
    let bad = good.replace("- --watch-nccl\n", "").replace(
        "failureThreshold: 3\n              resources",
        "failureThreshold: 1\n              resources",
    );
    std::fs::write(dir.join("bad.yaml"), bad).unwrap();
    let out = std::process::Command::new(python)
        .arg(repo.join("tests/manifests/validate.py"))
        .arg("--json")
        .arg(&dir)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let errors: Vec<&str> = v["errors"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e.as_str())
        .collect();
    assert!(
        errors
            .iter()
            .any(|e| e.contains("no serve --watch-nccl listens there")),
        "{errors:#?}"
    );
    assert!(
        errors.iter().any(|e| e.contains("probe tolerates 30 s")),
        "{errors:#?}"
    );
}

/// The trainer's libnccl (the fixture's fake answers 2.18.5) has no RAS, and nothing
/// listens: said, once the checks have found that library, and never a failed probe.
#[test]
fn an_nccl_without_ras_is_said_to_be_too_old_to_watch() {
    let closed = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    let server = start(
        "rdma-roce-multus",
        &[
            "--interval",
            "60m",
            "--watch-nccl",
            "--ras-addr",
            &closed,
            "--watch-interval",
            "1s",
        ],
    );
    let v = wait_state(&server, "unwatchable");
    let headline = v["headline"].as_str().unwrap();
    assert!(headline.starts_with("NCCL 2.18.5 has no RAS"), "{headline}");
    assert_eq!(get(&server, "/job/livez").0, 200);
}

fn diagnose(server: &Server) -> (u16, String) {
    let (status, _, body) = raw(
        server,
        b"POST /job/diagnose HTTP/1.1\r\nHost: test\r\nContent-Length: 0\r\n\r\n",
    );
    (status, body)
}

/// The 2.32.3 replies as recorded, without the recorder's handshake lines.
fn recorded_232(name: &str) -> String {
    let text = data(&format!("gpu-h200x4-2.32.3/{name}"));
    let start = text
        .find('{')
        .filter(|_| name.ends_with(".json"))
        .unwrap_or(0);
    text[start..].replace("SERVER PROTOCOL 2\n", "")
}

#[test]
fn post_job_diagnose_runs_nccls_diagnostics_once_per_gap_and_judges_them() {
    let fake = FakeRas::start(true, true, recorded_232("healthy.json"), String::new());
    fake.set(|s| s.diag_reply = recorded_232("diagnostics.text"));
    let server = watch(&fake, "1s", &[]);
    let view = wait_state(&server, "healthy");
    assert_eq!(view["nccl_version"], "2.32.3", "{view:#}");
    let (status, body) = diagnose(&server);
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["finding"]["id"], "nccl-diagnostics");
    assert_eq!(v["finding"]["status"], "pass", "{v:#}");
    assert_eq!(v["diagnostics"]["lines"].as_array().unwrap().len(), 20);
    assert!(
        fake.commands().iter().any(|(_, c)| c == "diagnostics"),
        "DIAGNOSTICS was sent"
    );
    // The finding stays on /job and /report until the next run.
    assert_eq!(job(&server)["diagnostics"]["id"], "nccl-diagnostics");
    let (_, _, report) = get(&server, "/report");
    assert!(report.contains("\"nccl-diagnostics\""), "{report}");
    // A second run within the gap is refused without reaching NCCL.
    let asked = fake.commands().len();
    let (status, body) = diagnose(&server);
    assert_eq!(status, 429, "{body}");
    assert!(
        fake.commands()[asked..]
            .iter()
            .all(|(_, c)| c != "diagnostics"),
        "the refused run reached RAS"
    );
    // Other methods and paths stay refused.
    let (status, _, _) = raw(&server, b"POST /job HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(status, 405);
}

#[test]
fn post_job_diagnose_is_bounded_on_a_silent_or_cut_server_and_refused_before_2_31() {
    // Cut mid-way: what came is judged, and the missing completion line makes it a warning.
    let fake = FakeRas::start(true, true, recorded_232("healthy.json"), String::new());
    fake.set(|s| s.diag_reply = recorded_232("diagnostics.text"));
    let server = watch(&fake, "1s", &[]);
    wait_state(&server, "healthy");
    fake.set(|s| s.mode = Mode::Cut);
    let (status, body) = diagnose(&server);
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["finding"]["status"], "warn", "{v:#}");
    assert!(
        v["finding"]["summary"].as_str().unwrap().contains("cut"),
        "{v:#}"
    );
    drop(server);
    // Silent: accepts and never answers; the handshake's bound ends it, /healthz answers
    // meanwhile.
    fake.set(|s| s.mode = Mode::Reply);
    let server = watch(&fake, "1s", &[]);
    wait_state(&server, "healthy");
    fake.set(|s| s.mode = Mode::Silent);
    let started = Instant::now();
    let handle = {
        let addr = server_addr(&server);
        std::thread::spawn(move || diagnose_at(&addr))
    };
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        get(&server, "/healthz").0,
        200,
        "/healthz during a diagnostics run"
    );
    let (status, body) = handle.join().unwrap();
    assert_eq!(status, 502, "{body}");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
    drop(server);
    // A server without the command whose version is not known (its STATUS replies are
    // empty): NCCL answers `ERROR: Unknown command` and keeps the connection open; the
    // answer is 409 at once, not after the reply's 12 s bound.
    let unknown = FakeRas::start(true, false, String::new(), String::new());
    let server = watch(&unknown, "60s", &[]);
    let started = Instant::now();
    let (status, body) = diagnose(&server);
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("Unknown command"), "{body}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    drop(server);
    // NCCL 2.28.9: refused before asking (409).
    let old = FakeRas::start(true, false, data("2.28.9/healthy.json"), String::new());
    let server = watch(&old, "1s", &[]);
    wait_state(&server, "healthy");
    let (status, body) = diagnose(&server);
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("2.31"), "{body}");
    assert!(old.commands().iter().all(|(_, c)| c != "diagnostics"));
}

fn server_addr(server: &Server) -> String {
    server.addr.clone()
}

/// `POST /job/diagnose` from another thread: status and body.
fn diagnose_at(addr: &str) -> (u16, String) {
    use std::io::Read;
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(b"POST /job/diagnose HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, text)
}

#[test]
fn nccl_2_32_3s_recorded_replies_and_monitor_event_name_the_killed_rank() {
    // STATUS replies and the MONITOR line recorded from real NCCL 2.32.3 (4x H200).
    let fake = FakeRas::start(true, true, recorded_232("healthy.json"), String::new());
    let server = watch(&fake, "30s", &[]);
    let view = wait_state(&server, "healthy");
    assert_eq!(view["ranks"], 2, "{view:#}");
    let dead_event = data("gpu-h200x4-2.32.3/monitor.text")
        .lines()
        .find(|l| l.contains("PEER_DEAD"))
        .unwrap()
        .to_string();
    fake.set(|s| {
        s.json_reply = recorded_232("killed-dead.json");
        s.events.push(dead_event);
    });
    // The interval is 30 s: the event, not the poll, brings the dead rank in time.
    let started = Instant::now();
    let view = wait_state(&server, "dead");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    let headline = view["headline"].as_str().unwrap();
    assert!(
        headline.contains("rank 1 (pid 981 on 192.0.2.2, GPU 1)"),
        "{headline}"
    );
    assert!(
        view["events"]
            .to_string()
            .contains("PEER_DEAD: Process 981"),
        "{view:#}"
    );
    assert_eq!(get(&server, "/job/livez").0, 503);
}
