//! `gang`: the whole job checked across its pods before training starts, on
//! NCCL itself. One process per pod; every pod runs the same sequence, and
//! every NCCL call happens in a child process (`gang-worker`), never in the
//! process that may exec the trainer.
//!
//! Call sequence (research notes A1-A10; NVIDIA/nccl tags v2.18.5-1 .. v2.30.7-1):
//! 1. Identity from the launcher or the flags (`layout::gang_identity`): node
//!    rank, pod count, root host, port (the trainer's port + 1, else 29501).
//! 2. Root address: rank 0 takes its own address (the one the root name
//!    resolves to when it is local, else the default route's interface), never a
//!    Service IP, because its NCCL binds it (src/bootstrap.cc
//!    `bootstrapCreateRoot` binds the handle's address). Other ranks resolve the
//!    root's name every second until `--gang-wait` runs out: NCCL resolves once
//!    and fails at once (src/misc/socket.cc `ncclSocketGetAddrFromString`). Peer
//!    names, where the launcher's naming is known, are resolved the same way so a
//!    missing pod is named.
//! 3. Every rank builds the same 128-byte ncclUniqueId itself (`handle`): a
//!    job-derived magic, the root's sockaddr, zeros.
//! 4. Only rank 0's child gets `NCCL_COMM_ID=<ip>:<port>`, which makes its
//!    ncclCommInitRank start the bootstrap root at that address (src/init.cc
//!    `ncclCommInitRankDev`: "start the bootstrap root before bootstrapping",
//!    v2.28.9-1 lines 2017-2026). A non-root rank with NCCL_COMM_ID would need a
//!    local interface in the root's subnet (src/bootstrap.cc `bootstrapNetInit`,
//!    `ncclFindInterfaceMatchSubnet`) and fails with "No usable listening
//!    interface found" on pod networks (/32 or per-node /24), so it never gets
//!    it. NCCL_SOCKET_RETRY_CNT/_SLEEP_MSEC (2.24+, src/misc/socket.cc) are set,
//!    unless the user did, so NCCL's connect retries fit the timeout.
//! 5. Rank 0 on 2.22+ compares NCCL's own ncclGetUniqueId address bytes with the
//!    hand-built handle (src/bootstrap.cc `bootstrapGetUniqueId`): a layout check.
//! 6. Non-blocking init of every local GPU inside one group
//!    (`ncclCommInitRankConfig`, blocking = 0), 7. polled with
//!    `ncclCommGetAsyncError` under the deadline, 8. grouped `ncclCommAbort` on
//!    timeout or error and a watchdog that `_exit`s the child a few seconds after
//!    the deadline (`worker`).
//! 9. Two children in sequence, because NCCL caches its parameters per process:
//!    *consistency*, with the collective-tuning NCCL_* variables removed (their
//!    user values travel in the fingerprint), one rank per pod, all-gathers the
//!    fingerprints; then, only if every pod agrees, *bandwidth*, with the
//!    trainer's exact environment and every local GPU (nranks = pods x GPUs):
//!    all-reduce busbw at `--gang-sizes`, then pairwise send/recv rounds for the
//!    node x node matrix: O(N) rounds (N - 1 for even N, N for odd, one node idle
//!    per round) of disjoint pairs, both directions at once within a pair, every
//!    pair once (`verdict::schedule`), so each link's time is its own and a slow
//!    node's links stand out; a final tiny all-reduce as a barrier.
//! 10. A different NCCL version on one pod stops NCCL's own init before any
//!     all-gather ("Mismatched NCCL version detected", src/init.cc since
//!     v2.23.4-1): it is reported from init's error and ncclGetLastError.
//!
//! Every rank computes the same verdict from the same all-gathered data, so
//! every rank exits with the job's verdict.

pub mod command;
pub mod fingerprint;
pub mod handle;
pub mod render;
pub mod verdict;
pub mod worker;

use crate::cli::GangOpts;
use crate::finding::{Finding, Status, ids};
use crate::layout::GangIdentity;
use crate::report::Report;
use fingerprint::Fingerprint;
use handle::Phase;
use serde::Serialize;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::Write;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use worker::{Plan, WorkerResult};

/// Collective-tuning variables removed for the consistency phase: ranks that
/// disagree on them hang in the gang's own all-gather (NVIDIA/nccl#1136, #626;
/// NCCL_ALGO/NCCL_PROTO read per communicator in src/graph/tuning.cc). Transport
/// and interface variables stay, so the path is the trainer's.
pub const COLLECTIVE_TUNING: &[&str] = &[
    "NCCL_ALGO",
    "NCCL_PROTO",
    "NCCL_NTHREADS",
    "NCCL_MIN_NCHANNELS",
    "NCCL_MAX_NCHANNELS",
    "NCCL_MIN_CTAS",
    "NCCL_MAX_CTAS",
    "NCCL_BUFFSIZE",
    "NCCL_P2P_NET_CHUNKSIZE",
    "NCCL_TUNER_PLUGIN",
    "NCCL_NET_OVERHEAD",
];

fn is_collective_tuning(name: &str) -> bool {
    COLLECTIVE_TUNING.contains(&name) || (name.starts_with("NCCL_") && name.ends_with("_THRESHOLD"))
}

/// How a peer's name resolved while the gang waited.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Peer {
    pub node: u64,
    pub name: String,
    pub address: Option<String>,
}

/// Everything one gang run saw, for the report's `gang` object.
#[derive(Debug, Clone, Serialize)]
pub struct GangRun {
    pub identity: GangIdentity,
    /// The root's address this rank used (`ip:port`).
    pub root_address: Option<String>,
    pub peers: Vec<Peer>,
    pub consistency: Option<WorkerResult>,
    pub bandwidth: Option<WorkerResult>,
    /// Each node's fingerprint as all-gathered (None: unreadable).
    pub fingerprints: Vec<Option<Fingerprint>>,
    pub fingerprint_errors: Vec<String>,
    pub rows: Vec<verdict::Row>,
    /// Bytes each end sends per pairwise exchange, and GB/s per node pair
    /// (symmetric: a pair's exchange runs both ways at once).
    pub p2p_bytes: u64,
    pub matrix: Vec<Vec<Option<f64>>>,
    pub straggler: Option<verdict::Straggler>,
    /// Connections per transport NCCL logged in the bandwidth phase.
    pub transports: BTreeMap<String, u64>,
    pub findings: Vec<Finding>,
}

impl GangRun {
    /// Each node's display name: its pod name where known.
    pub fn names(&self) -> Vec<String> {
        (0..self.identity.nodes as usize)
            .map(|i| {
                self.identity
                    .peers
                    .get(i)
                    .cloned()
                    .or_else(|| {
                        self.fingerprints
                            .get(i)
                            .and_then(|f| f.as_ref())
                            .map(|f| f.host.clone())
                    })
                    .unwrap_or_default()
            })
            .collect()
    }
}

/// What the gang needs besides the identity.
pub struct Settings<'a> {
    pub opts: &'a GangOpts,
    pub cuda_lib: String,
    pub nccl_candidates: Vec<String>,
    pub host_root: PathBuf,
    /// The trainer's environment: the user's, plus tuned settings the user did not set.
    pub trainer_env: Vec<(OsString, OsString)>,
}

/// Why the gang could not run here at all (exit 2).
pub fn unavailable(report: &Report) -> Option<String> {
    use crate::facts::gpu::LibraryState;
    let facts = &report.facts;
    if let LibraryState::NotFound { message } = &facts.rdma.nccl.library.state {
        return Some(format!("no libnccl: {message}"));
    }
    match &facts.gpus.cuda.state {
        LibraryState::NotFound { message } => {
            Some(format!("no GPU: the CUDA driver is not here ({message})"))
        }
        LibraryState::Failed(e) => Some(format!("no GPU: the CUDA driver failed ({e})")),
        LibraryState::Loaded(c) if c.devices.is_empty() => {
            Some("no GPU: the CUDA driver sees no device".to_string())
        }
        _ => None,
    }
}

/// Resolves `name` (an address or a host name) within `limit`; prefers IPv4.
fn resolve(name: &str, limit: Duration) -> Option<IpAddr> {
    if let Ok(ip) = name.trim_matches(['[', ']']).parse::<IpAddr>() {
        return Some(ip);
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let owned = name.to_string();
    // getaddrinfo has no deadline of its own: it runs on a thread that is left
    // behind if the resolver hangs.
    std::thread::Builder::new()
        .name("gang-resolve".into())
        .spawn(move || {
            let found = (owned.as_str(), 0).to_socket_addrs().ok().and_then(|it| {
                let all: Vec<SocketAddr> = it.collect();
                all.iter()
                    .find(|a| a.is_ipv4())
                    .or(all.first())
                    .map(|a| a.ip())
            });
            let _ = tx.send(found);
        })
        .ok()?;
    rx.recv_timeout(limit).ok().flatten()
}

/// True when this host owns `ip` (a bind to it succeeds).
fn is_local(ip: IpAddr) -> bool {
    std::net::TcpListener::bind((ip, 0)).is_ok()
}

/// Rank 0's own address for the root: the root name's address when it is local,
/// else the address of the default route's interface (the pod IP).
fn root_address_here(root: &str, report: &Report) -> Option<IpAddr> {
    if let Some(ip) = resolve(root, Duration::from_secs(2)).filter(|ip| is_local(*ip)) {
        return Some(ip);
    }
    let net = &report.facts.network;
    let route = net.default_routes.value()?.first()?;
    net.addresses
        .value()?
        .iter()
        .filter(|a| a.interface == route.interface)
        .filter_map(|a| a.address.parse::<IpAddr>().ok())
        .find(|ip| ip.is_ipv4() && is_local(*ip))
}

/// Waits, polling every second until `limit`, for the names this rank needs: the
/// root's (non-root ranks) and every peer's where known.
fn wait_for_names(identity: &GangIdentity, limit: Duration) -> Vec<Peer> {
    let me = identity.node_rank;
    let mut peers: Vec<Peer> = if identity.peers.is_empty() {
        vec![Peer {
            node: 0,
            name: identity.root.clone(),
            address: None,
        }]
    } else {
        identity
            .peers
            .iter()
            .enumerate()
            .map(|(i, n)| Peer {
                node: i as u64,
                name: if i == 0 {
                    identity.root.clone()
                } else {
                    n.clone()
                },
                address: None,
            })
            .collect()
    };
    // Rank 0 never needs its own name; no rank needs its own.
    peers.retain(|p| p.node != me);
    let deadline = Instant::now() + limit;
    loop {
        for p in peers.iter_mut().filter(|p| p.address.is_none()) {
            p.address = resolve(&p.name, Duration::from_secs(2)).map(|ip| ip.to_string());
        }
        if peers.iter().all(|p| p.address.is_some()) || Instant::now() >= deadline {
            return peers;
        }
        std::thread::sleep(
            Duration::from_secs(1).min(deadline.saturating_duration_since(Instant::now())),
        );
    }
}

/// Link kinds (rtnetlink) whose sysfs speed is not a wire's.
const VIRTUAL_KINDS: &[&str] = &[
    "veth",
    "bridge",
    "dummy",
    "tun",
    "vxlan",
    "geneve",
    "wireguard",
    "ipip",
    "gre",
];

/// The interface NCCL's sockets use and its sysfs speed in Mb/s.
fn socket_speed(report: &Report, host_root: &Path) -> (Option<String>, Option<u64>) {
    let Some(choice) = crate::nccl::interface::choose_interface(&report.facts) else {
        return (None, None);
    };
    // A virtual link's speed is made up (veth reports 10000 whatever carries it), so
    // it gives no figure: a pod's eth0 on most CNIs is one end of a veth pair.
    let kind = report
        .facts
        .network
        .interfaces
        .value()
        .and_then(|l| l.iter().find(|i| i.name == choice.name))
        .and_then(|i| i.kind.clone());
    if kind.as_deref().is_some_and(|k| VIRTUAL_KINDS.contains(&k)) {
        return (Some(choice.name), None);
    }
    // /sys/class/net/<if>/speed: Mb/s; -1 or EINVAL for virtual interfaces.
    let path = host_root
        .join("sys/class/net")
        .join(&choice.name)
        .join("speed");
    let speed = std::fs::read_to_string(path)
        .ok()
        .and_then(|t| t.trim().parse::<i64>().ok())
        .filter(|&s| s > 0)
        .map(|s| s as u64);
    (Some(choice.name), speed)
}

/// NCCL's log file for one phase: created here, exclusively and private.
struct Log(PathBuf);

impl Log {
    fn create(phase: Phase) -> Result<Log, String> {
        use std::os::unix::fs::OpenOptionsExt;
        let path = std::env::temp_dir().join(format!(
            "nccl-preflight-gang.{}.{phase:?}.log",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&path);
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| format!("creating NCCL's log file {}: {e}", path.display()))?;
        Ok(Log(path))
    }

    fn transports(&self) -> BTreeMap<String, u64> {
        std::fs::File::open(&self.0)
            .ok()
            .and_then(|f| crate::explain::summarize(f).ok())
            .map(|s| s.transport_counts)
            .unwrap_or_default()
    }
}

impl Drop for Log {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// NCCL_SOCKET_RETRY_CNT so that NCCL's connect retries (sleep n x 100 ms before
/// attempt n+1, src/misc/socket.cc since v2.24) last about as long as `timeout`.
fn retry_count(timeout: Duration) -> u64 {
    let budget_ms = timeout.as_millis() as f64;
    // 100 x c(c+1)/2 >= budget
    (((1.0 + 8.0 * budget_ms / 100.0).sqrt() - 1.0) / 2.0)
        .ceil()
        .max(1.0) as u64
}

/// The worker's environment for one phase.
fn worker_env(
    trainer: &[(OsString, OsString)],
    phase: Phase,
    comm_id: Option<&str>,
    log: &Path,
    timeout: Duration,
) -> Vec<(OsString, OsString)> {
    let drop_names = [
        "NCCL_COMM_ID",
        "NCCL_DEBUG",
        "NCCL_DEBUG_SUBSYS",
        "NCCL_DEBUG_FILE",
    ];
    let mut env: Vec<(OsString, OsString)> = trainer
        .iter()
        .filter(|(k, _)| {
            let k = k.to_string_lossy();
            let stripped = phase == Phase::Consistency && is_collective_tuning(&k);
            !(drop_names.contains(&k.as_ref()) || stripped)
        })
        .cloned()
        .collect();
    let has = |env: &[(OsString, OsString)], name: &str| env.iter().any(|(k, _)| k == name);
    if let Some(id) = comm_id {
        env.push(("NCCL_COMM_ID".into(), id.into()));
    }
    env.push(("NCCL_DEBUG".into(), "INFO".into()));
    env.push(("NCCL_DEBUG_SUBSYS".into(), "INIT,ENV".into()));
    env.push(("NCCL_DEBUG_FILE".into(), log.as_os_str().to_owned()));
    if !has(&env, "NCCL_SOCKET_RETRY_SLEEP_MSEC") && !has(&env, "NCCL_SOCKET_RETRY_CNT") {
        env.push(("NCCL_SOCKET_RETRY_SLEEP_MSEC".into(), "100".into()));
        env.push((
            "NCCL_SOCKET_RETRY_CNT".into(),
            retry_count(timeout).to_string().into(),
        ));
    }
    env
}

/// Runs one worker and reads its result; the child is killed past `limit`.
fn spawn_worker(
    plan: &Plan,
    env: Vec<(OsString, OsString)>,
    limit: Duration,
) -> Result<WorkerResult, String> {
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let mut child = Command::new(exe)
        .arg("gang-worker")
        .env_clear()
        .envs(env)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting the gang worker: {e}"))?;
    let text = serde_json::to_string(plan).map_err(|e| e.to_string())?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(text.as_bytes());
    }
    let crate::run::Finished {
        status,
        stdout,
        stderr,
    } = crate::run::wait_child(child, limit)
        .map_err(|e| format!("waiting for the gang worker: {e}"))?;
    let last = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'));
    match (
        last.and_then(|l| serde_json::from_str::<WorkerResult>(l).ok()),
        status,
    ) {
        (Some(r), _) => Ok(r),
        (None, None) => Err(format!(
            "the gang worker did not finish within {:.1} s and was killed",
            limit.as_secs_f64()
        )),
        (None, Some(s)) => Err(format!(
            "the gang worker ended ({s}) without a result: {}",
            stderr.trim().chars().take(2000).collect::<String>()
        )),
    }
}

/// One phase end to end: plan, log, child, transports.
fn phase(
    identity: &GangIdentity,
    settings: &Settings<'_>,
    which: Phase,
    root: SocketAddr,
    fingerprint: &[u8],
) -> (Result<WorkerResult, String>, BTreeMap<String, u64>) {
    let opts = settings.opts;
    let log = match Log::create(which) {
        Ok(l) => l,
        Err(e) => return (Err(e), BTreeMap::new()),
    };
    let plan = Plan {
        phase: which,
        handle: handle::to_hex(&handle::build(handle::magic(identity, which), root)),
        node_rank: identity.node_rank,
        nodes: identity.nodes,
        fingerprint: handle::to_hex(fingerprint),
        sizes: opts.gang_sizes.clone(),
        iterations: opts.gang_iterations,
        p2p_bytes: opts.gang_sizes.iter().copied().min().unwrap_or(4),
        timeout_ms: opts.gang_timeout.as_millis() as u64,
        cuda_lib: settings.cuda_lib.clone(),
        nccl_candidates: settings.nccl_candidates.clone(),
    };
    let comm_id = handle::comm_id(root);
    let env = worker_env(
        &settings.trainer_env,
        which,
        (identity.node_rank == 0).then_some(comm_id.as_str()),
        &log.0,
        opts.gang_timeout,
    );
    let limit = opts.gang_timeout + worker::GRACE + Duration::from_secs(5);
    let result = spawn_worker(&plan, env, limit);
    (result, log.transports())
}

/// The ranks NCCL named in "Mismatched NCCL version detected : rank A version X rank
/// B version Y" (src/init.cc), mapped to nodes (the consistency phase has one rank per pod).
fn version_mismatch(text: &str) -> Option<(u64, String, u64, String)> {
    let at = text.find("Mismatched NCCL version detected")?;
    let w: Vec<&str> = text[at..].split_whitespace().collect();
    // Mismatched NCCL version detected : rank A version X rank B version Y
    let num = |i: usize| {
        w.get(i).and_then(|s| {
            s.trim_matches(|c: char| !c.is_ascii_digit())
                .parse::<u64>()
                .ok()
        })
    };
    let (a, x, b, y) = (num(6)?, num(8)?, num(10)?, num(12)?);
    Some((
        a,
        crate::vendor::nccl::version_text(x as i32),
        b,
        crate::vendor::nccl::version_text(y as i32),
    ))
}

/// Runs the gang for this pod, after its local checks (`report`).
pub fn run(report: &Report, identity: &GangIdentity, settings: &Settings<'_>) -> GangRun {
    let opts = settings.opts;
    let mut run = GangRun {
        identity: identity.clone(),
        root_address: None,
        peers: Vec::new(),
        consistency: None,
        bandwidth: None,
        fingerprints: Vec::new(),
        fingerprint_errors: Vec::new(),
        rows: Vec::new(),
        p2p_bytes: opts.gang_sizes.iter().copied().min().unwrap_or(4),
        matrix: Vec::new(),
        straggler: None,
        transports: BTreeMap::new(),
        findings: Vec::new(),
    };
    // 2. Names and the root's address.
    run.peers = wait_for_names(identity, opts.gang_wait);
    let missing_text = run
        .peers
        .iter()
        .filter(|p| p.address.is_none())
        .map(|p| format!("node {} ({}): no DNS record", p.node, p.name))
        .collect::<Vec<_>>();
    let Some(root_ip) = root_ip(&run, report, identity) else {
        let mut f = no_root(identity, opts);
        f.evidence.extend(missing_text);
        run.findings = vec![
            f,
            Finding::skip(ids::GANG_CONSISTENCY, "the gang did not join"),
            Finding::skip(ids::GANG_BANDWIDTH, "the gang did not join"),
        ];
        return run;
    };
    let root = SocketAddr::new(root_ip, identity.port);
    run.root_address = Some(root.to_string());
    let record = match own_record(report, identity, settings) {
        Ok(r) => r,
        Err(findings) => {
            run.findings = findings;
            return run;
        }
    };
    // 4-9, consistency phase.
    let first = finished(phase(identity, settings, Phase::Consistency, root, &record).0);
    let join = join_finding(&run, &first, identity, opts, &missing_text);
    if !first.joined {
        return not_joined(run, first, join);
    }
    if !first.done {
        return exchange_unfinished(run, first, join);
    }
    let consistency = compare_fingerprints(&mut run, &first);
    run.consistency = Some(strip(first));
    // Every rank sees the same rows, so every rank decides the same here.
    if consistency.status() == Status::Fail {
        run.findings = vec![
            join,
            consistency,
            Finding::skip(
                ids::GANG_BANDWIDTH,
                "not measured: the pods disagree (see gang-consistency)",
            ),
        ];
        return run;
    }
    let bandwidth = bandwidth_phase(&mut run, identity, settings, root, &record);
    run.findings = vec![join, consistency, bandwidth];
    run
}

/// The root's address: this pod's own on rank 0, the resolved name elsewhere.
fn root_ip(run: &GangRun, report: &Report, identity: &GangIdentity) -> Option<IpAddr> {
    if identity.node_rank == 0 {
        root_address_here(&identity.root, report)
    } else {
        run.peers
            .iter()
            .find(|p| p.node == 0)
            .and_then(|p| p.address.as_ref())
            .and_then(|a| a.parse().ok())
    }
}

/// gang-join's failure when the root has no address.
fn no_root(identity: &GangIdentity, opts: &GangOpts) -> Finding {
    let why = if identity.node_rank == 0 {
        format!(
            "rank 0 has no local address for the root {:?} (not local, and no default route's address)",
            identity.root
        )
    } else {
        format!(
            "the root {:?} did not resolve within --gang-wait {:.0} s (its pod is not Ready or not scheduled)",
            identity.root,
            opts.gang_wait.as_secs_f64()
        )
    };
    Finding::fail(
        ids::GANG_JOIN,
        why,
        "Check that the rank-0 pod is running and its Service name resolves (kubectl get pods, nslookup), or pass --gang-root",
    )
}

/// This pod's encoded fingerprint, or the findings that end the gang when it
/// cannot be encoded.
fn own_record(
    report: &Report,
    identity: &GangIdentity,
    settings: &Settings<'_>,
) -> Result<Vec<u8>, Vec<Finding>> {
    let gpus = report
        .facts
        .gpus
        .cuda
        .loaded()
        .map_or(0, |c| c.devices.len() as u32);
    let mine = fingerprint::from_report(
        report,
        identity.node_rank,
        gpus,
        socket_speed(report, &settings.host_root),
    );
    mine.encode().map_err(|e| {
        vec![
            Finding::skip(ids::GANG_JOIN, "the gang did not start"),
            Finding::fail(
                ids::GANG_CONSISTENCY,
                e.to_string(),
                "Unset NCCL/FI variables the job does not need",
            ),
            Finding::skip(ids::GANG_BANDWIDTH, "the gang did not start"),
        ]
    })
}

/// A phase's result; a worker that could not run becomes one with its error.
fn finished(result: Result<WorkerResult, String>) -> WorkerResult {
    result.unwrap_or_else(|e| WorkerResult {
        error: Some(e),
        ..WorkerResult::default()
    })
}

/// gang-join from the consistency phase's result.
fn join_finding(
    run: &GangRun,
    first: &WorkerResult,
    identity: &GangIdentity,
    opts: &GangOpts,
    missing_text: &[String],
) -> Finding {
    let nodes_text = format!("{} pod(s)", identity.nodes);
    if first.joined {
        return Finding::pass(
            ids::GANG_JOIN,
            format!(
                "all {nodes_text} joined in {:.2} s",
                first.join_seconds.unwrap_or(0.0)
            ),
        );
    }
    let mut f = Finding::fail(
        ids::GANG_JOIN,
        if first.timed_out {
            format!(
                "not all {nodes_text} joined within --gang-timeout {:.0} s (this is node {})",
                opts.gang_timeout.as_secs_f64(),
                identity.node_rank
            )
        } else {
            format!(
                "NCCL could not form the gang's communicator: {}",
                first.error.clone().unwrap_or_else(|| "no result".into())
            )
        },
        "Check that every pod started (kubectl get pods), that pods reach each other on the gang port (NetworkPolicy, security groups), and the NCCL WARN line above",
    );
    f.evidence.extend(missing_text.iter().cloned());
    // Where every rank was to meet: an unreachable root is the commonest cause.
    if let Some(addr) = &run.root_address {
        f.evidence
            .push(format!("the gang's root: {} at {addr}", identity.root));
    }
    if missing_text.is_empty() && !run.peers.is_empty() && first.timed_out {
        f.evidence.push(
            "every peer name resolved: a pod that exists but never reached NCCL (crashed, stuck in an earlier step, or blocked on the network)".into(),
        );
    }
    if let Some(e) = &first.error {
        f.evidence.push(format!("error: {e}"));
    }
    stopped(&mut f, first);
    f
}

/// NCCL's last error and the worker's stage, as evidence of where it stopped.
fn stopped(f: &mut Finding, result: &WorkerResult) {
    if let Some(e) = &result.last_error {
        f.evidence.push(format!("NCCL: {e}"));
    }
    f.evidence.push(format!("stopped at: {}", result.stage));
}

/// The gang did not join: a version mismatch names its ranks, anything else skips.
fn not_joined(mut run: GangRun, first: WorkerResult, join: Finding) -> GangRun {
    // 10. A version mismatch stops NCCL's init before any all-gather.
    let mismatch = first
        .last_error
        .as_deref()
        .and_then(version_mismatch)
        .or_else(|| first.error.as_deref().and_then(version_mismatch));
    let consistency = match mismatch {
        Some((a, x, b, y)) => {
            let names = run.names();
            Finding::fail(
                ids::GANG_CONSISTENCY,
                "NCCL could not form a communicator: ranks load different NCCL versions",
                "Build every pod from the same image (one libnccl for the whole job)",
            )
            .evidence(format!(
                "{} loads NCCL {x}, {} loads NCCL {y}",
                verdict::node_name(a as usize, &names),
                verdict::node_name(b as usize, &names)
            ))
        }
        None => Finding::skip(ids::GANG_CONSISTENCY, "the gang did not join"),
    };
    run.consistency = Some(strip(first));
    run.findings = vec![
        join,
        consistency,
        Finding::skip(ids::GANG_BANDWIDTH, "the gang did not join"),
    ];
    run
}

/// Joined, then a peer died or the exchange stalled: nothing to compare.
fn exchange_unfinished(mut run: GangRun, first: WorkerResult, join: Finding) -> GangRun {
    let mut f = Finding::fail(
        ids::GANG_CONSISTENCY,
        format!(
            "the fingerprint exchange did not finish: {}",
            first.error.clone().unwrap_or_else(|| "no result".into())
        ),
        "A pod left the gang mid-way (crashed, killed or its network failed): check every pod's state and logs",
    );
    stopped(&mut f, &first);
    run.consistency = Some(strip(first));
    run.findings = vec![
        join,
        f,
        Finding::skip(ids::GANG_BANDWIDTH, "the gang did not finish its exchange"),
    ];
    run
}

/// Decodes every node's fingerprint into `run` and judges gang-consistency.
fn compare_fingerprints(run: &mut GangRun, first: &WorkerResult) -> Finding {
    for (i, hex) in first.fingerprints.iter().enumerate() {
        match handle::from_hex(hex)
            .ok_or(fingerprint::DecodeError::NotARecord)
            .and_then(|b| Fingerprint::decode(&b))
        {
            Ok(f) => run.fingerprints.push(Some(f)),
            Err(e) => {
                run.fingerprint_errors.push(format!("node {i}: {e}"));
                run.fingerprints.push(None);
            }
        }
    }
    run.rows = verdict::rows(&run.fingerprints);
    let consistency = verdict::consistency(&run.rows, &run.names());
    if run.fingerprint_errors.is_empty() {
        return consistency;
    }
    // A record that does not decode fails the check whatever the readable ones say.
    let summary = if consistency.status() == Status::Fail {
        consistency.summary.clone()
    } else {
        format!(
            "{} pod(s) sent a fingerprint this build cannot read",
            run.fingerprint_errors.len()
        )
    };
    let fix = consistency
        .remediation()
        .unwrap_or("Run the same nccl-preflight version in every pod")
        .to_string();
    let mut f = Finding::fail(ids::GANG_CONSISTENCY, summary, fix);
    f.evidence = consistency.evidence.clone();
    f.evidence.extend(run.fingerprint_errors.iter().cloned());
    f
}

/// The bandwidth phase and its gang-bandwidth finding.
fn bandwidth_phase(
    run: &mut GangRun,
    identity: &GangIdentity,
    settings: &Settings<'_>,
    root: SocketAddr,
    record: &[u8],
) -> Finding {
    let (second, transports) = phase(identity, settings, Phase::Bandwidth, root, record);
    run.transports = transports;
    let second = finished(second);
    let bandwidth = if second.done {
        run.matrix = verdict::matrix(&second.round_seconds, run.p2p_bytes);
        run.straggler = verdict::straggler(&run.matrix);
        let names = run.names();
        verdict::bandwidth(&verdict::BandwidthInput {
            sizes: &second.allreduce,
            fps: &run.fingerprints,
            names: &names,
            transports: &run.transports,
            matrix: &run.matrix,
            straggler: run.straggler.as_ref(),
        })
    } else {
        let mut f = Finding::fail(
            ids::GANG_BANDWIDTH,
            format!(
                "the bandwidth phase did not finish: {}",
                second.error.clone().unwrap_or_else(|| "no result".into())
            ),
            "Rerun with NCCL_DEBUG=INFO; check the network between the pods and each pod's NCCL variables",
        );
        stopped(&mut f, &second);
        f
    };
    run.bandwidth = Some(strip(second));
    bandwidth
}

/// A worker result without the raw fingerprint records (decoded into the run).
fn strip(mut r: WorkerResult) -> WorkerResult {
    r.fingerprints.clear();
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_count_covers_the_timeout() {
        for secs in [1u64, 5, 30, 300] {
            let c = retry_count(Duration::from_secs(secs));
            let window_ms = 100 * c * (c + 1) / 2;
            assert!(window_ms >= secs * 1000, "{secs}: {c}");
            assert!(
                c == 1 || 100 * (c - 1) * c / 2 < secs * 1000,
                "{secs}: {c} is more than needed"
            );
        }
    }

    #[test]
    fn worker_env_gives_comm_id_to_rank_0_only_and_strips_tuning_in_phase_one() {
        let trainer: Vec<(OsString, OsString)> = [
            ("NCCL_ALGO", "Ring"),
            ("NCCL_LL_THRESHOLD", "0"),
            ("NCCL_SOCKET_IFNAME", "eth0"),
            ("NCCL_COMM_ID", "10.9.9.9:1"),
            ("PATH", "/bin"),
        ]
        .iter()
        .map(|(k, v)| (OsString::from(k), OsString::from(v)))
        .collect();
        let log = Path::new("/tmp/x.log");
        let get = |env: &[(OsString, OsString)], k: &str| {
            env.iter()
                .filter(|(n, _)| n == k)
                .map(|(_, v)| v.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
        };
        let one = worker_env(
            &trainer,
            Phase::Consistency,
            None,
            log,
            Duration::from_secs(30),
        );
        assert!(get(&one, "NCCL_ALGO").is_empty());
        assert!(get(&one, "NCCL_LL_THRESHOLD").is_empty());
        assert_eq!(get(&one, "NCCL_SOCKET_IFNAME"), ["eth0"]);
        // A non-root rank never gets NCCL_COMM_ID, not even the user's.
        assert!(get(&one, "NCCL_COMM_ID").is_empty());
        assert_eq!(get(&one, "NCCL_DEBUG_FILE"), ["/tmp/x.log"]);
        let two = worker_env(
            &trainer,
            Phase::Bandwidth,
            Some("10.0.0.1:29501"),
            log,
            Duration::from_secs(30),
        );
        assert_eq!(get(&two, "NCCL_ALGO"), ["Ring"]);
        assert_eq!(get(&two, "NCCL_COMM_ID"), ["10.0.0.1:29501"]);
        assert_eq!(
            get(&two, "NCCL_SOCKET_RETRY_CNT"),
            [retry_count(Duration::from_secs(30)).to_string()]
        );
    }

    #[test]
    fn version_mismatch_names_both_ranks() {
        let text = "host:1:2 [0] init.cc:890 NCCL WARN Mismatched NCCL version detected : rank 1 version 22105 rank 0 version 22809";
        assert_eq!(
            version_mismatch(text),
            Some((1, "2.21.5".into(), 0, "2.28.9".into()))
        );
        assert_eq!(
            version_mismatch("Mismatched NCCL version detected : rank"),
            None
        );
        assert_eq!(version_mismatch("other"), None);
    }
}
