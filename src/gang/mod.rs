//! `gang`: the whole job checked across its pods before training starts. One
//! process per pod; every pod runs the same sequence, and every NCCL call
//! happens in a child process (`gang-worker`), never in the process that may
//! exec the trainer.
//!
//! Call sequence (NVIDIA/nccl tags v2.18.5-1 .. v2.30.7-1):
//! 1. Identity from the launcher or the flags (`layout::gang_identity`): node
//!    rank, pod count (`layout::job_nodes`, the judges' count), root host, port
//!    (the trainer's port + 1, else 29501), attempt.
//! 2. Names (`names`): the root's and every peer's, resolved concurrently until
//!    `--gang-wait`; rank 0 takes its own address for the root, never a
//!    Service IP, because its NCCL binds it (src/bootstrap.cc `bootstrapCreateRoot`).
//! 3. Rendezvous (`rendezvous`), before NCCL: rank 0 listens on the gang port,
//!    every pod sends its fingerprint record (`fingerprint`: the trainer's
//!    libnccl and its path, driver, GPUs, NICs, effective NCCL_*/FI_* variables,
//!    the gang's options, every local check's status and the failed ones'
//!    summaries) and receives the whole table. Every pod judges the same table
//!    (`verdict::consistency`), so every pod's log and termination message carry
//!    the same job verdict naming the odd pod, also when the stacks are too
//!    different for NCCL to form a communicator. A pod whose own checks failed
//!    reports, then stops with the rest.
//! 4. NCCL only where it can work: the records agree on what NCCL needs (one
//!    NCCL version, the same collective tuning). Every rank builds the same
//!    128-byte ncclUniqueId (`handle`); only rank 0's worker gets
//!    `NCCL_COMM_ID=<ip>:<gang port>`, which starts NCCL's bootstrap root there
//!    (src/init.cc `ncclCommInitRankDev`, "start the bootstrap root before
//!    bootstrapping") once the rendezvous has let the port go. A pod that reached
//!    the rendezvous but not NCCL's join is told which ports to open: NCCL's
//!    other listeners bind port 0 (src/misc/socket.cc `ncclSocketListen`), so the
//!    ephemeral range must be open between the pods.
//! 5. The worker (`worker`, spawned by `spawn`, NCCL's log through `log`)
//!    joins every local GPU non-blocking under the deadline, probes every node
//!    pair with a small pairwise exchange, then fits the all-reduce sizes and a
//!    larger pairwise size to what is left of `--gang-timeout`; what was
//!    measured is judged even when the budget ran out (`findings`, `verdict`).

pub mod command;
pub(crate) mod environment;
pub(crate) mod findings;
pub(crate) mod fingerprint;
pub(crate) mod handle;
pub(crate) mod log;
pub(crate) mod names;
pub(crate) mod outcome;
pub(crate) mod render;
pub(crate) mod rendezvous;
pub(crate) mod spawn;
pub(crate) mod verdict;
pub mod worker;

use crate::cli::GangOpts;
use crate::finding::{Finding, Status, ids};
use crate::layout::GangIdentity;
use crate::report::Report;
use fingerprint::Fingerprint;
pub(crate) use names::Peer;
use rendezvous::{Duplicate, Table};
use serde::Serialize;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Instant;
use worker::WorkerResult;

/// Everything one gang run saw, for the report's `gang` object.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct GangRun {
    pub identity: GangIdentity,
    /// The root's address this rank used (`ip:port`).
    pub root_address: Option<String>,
    pub peers: Vec<Peer>,
    /// Seconds from this pod's hello to the table (None: no table).
    pub rendezvous_seconds: Option<f64>,
    /// Ranks that never reported at the rendezvous.
    pub missing: Vec<u64>,
    /// Ranks claimed twice.
    pub duplicates: Vec<Duplicate>,
    /// Connections rank 0 refused (another job or attempt, not a gang peer).
    pub refused: Vec<String>,
    pub bandwidth: Option<WorkerResult>,
    /// How each pod's NCCL run ended, as exchanged after it (None: not received).
    pub outcomes: Vec<Option<outcome::Outcome>>,
    /// Each node's fingerprint as gathered (None: unreadable or never sent).
    pub fingerprints: Vec<Option<Fingerprint>>,
    fingerprint_errors: Vec<String>,
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
    fn new(identity: &GangIdentity) -> GangRun {
        GangRun {
            identity: identity.clone(),
            root_address: None,
            peers: Vec::new(),
            rendezvous_seconds: None,
            missing: Vec::new(),
            duplicates: Vec::new(),
            refused: Vec::new(),
            bandwidth: None,
            outcomes: Vec::new(),
            fingerprints: Vec::new(),
            fingerprint_errors: Vec::new(),
            rows: Vec::new(),
            p2p_bytes: 0,
            matrix: Vec::new(),
            straggler: None,
            transports: BTreeMap::new(),
            findings: Vec::new(),
        }
    }

    /// Each node's display name: its pod name where known.
    pub(crate) fn names(&self) -> Vec<String> {
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
pub(crate) struct Settings<'a> {
    pub opts: &'a GangOpts,
    pub cuda_lib: String,
    pub nccl_candidates: Vec<String>,
    pub host_root: PathBuf,
    /// The trainer's environment: the user's, plus tuned settings the user did not set.
    pub trainer_env: Vec<(OsString, OsString)>,
    /// The trainer's libnccl has RAS diagnostics (2.31+): the worker's NCCL runs them
    /// (NCCL_RUN_RAS_DIAGNOSTICS=1) and its `NCCL DIAG` lines become a finding.
    pub ras_diagnostics: bool,
}

/// Why the gang could not run here at all (exit 2).
pub(crate) fn unavailable(report: &Report) -> Option<String> {
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

/// The interface NCCL's sockets will use: the first that the user's
/// NCCL_SOCKET_IFNAME admits, else the tuned NCCL_SOCKET_IFNAME's, else the
/// tuning's own choice (`nccl::interface::choose_interface`).
fn socket_interface(report: &Report) -> Option<String> {
    use crate::nccl::bootstrap::{SocketEnv, find_interfaces};
    let net = &report.facts.network;
    let version = crate::nccl::version(&report.facts);
    let first = |value: &str| {
        // A value NCCL ignores (one character or less) is no interface of the user's.
        if value.len() <= 1 {
            return None;
        }
        let (links, addrs) = (net.interfaces.value()?, net.addresses.value()?);
        let env = SocketEnv {
            ifname: Some(value),
            ..SocketEnv::default()
        };
        find_interfaces(version, env, links, addrs, 1)
            .pop()
            .map(|e| e.interface)
    };
    let user = report
        .facts
        .nccl_env
        .get("NCCL_SOCKET_IFNAME")
        .map(|v| v.value.clone());
    let tuned = report
        .settings
        .iter()
        .find(|s| s.name == "NCCL_SOCKET_IFNAME")
        .map(|s| s.value.clone());
    match user.or(tuned) {
        Some(value) => first(&value),
        None => crate::nccl::interface::choose_interface(&report.facts).map(|c| c.name),
    }
}

/// The interface NCCL's sockets use and its link speed in Mb/s (read by gather).
fn socket_speed(report: &Report, host_root: &Path) -> (Option<String>, Option<u64>) {
    let Some(name) = socket_interface(report) else {
        return (None, None);
    };
    // A virtual link's speed is made up (veth reports 10000 whatever carries it), so
    // it gives no figure: a pod's eth0 on most CNIs is one end of a veth pair.
    let kind = report
        .facts
        .network
        .interfaces
        .value()
        .and_then(|l| l.iter().find(|i| i.name == name))
        .and_then(|i| i.kind.clone());
    if kind.as_deref().is_some_and(|k| VIRTUAL_KINDS.contains(&k)) {
        return (Some(name), None);
    }
    let host = crate::gather::host::Host::new(host_root);
    let speed = crate::gather::network::link_speed_mbps(&host, &name);
    (Some(name), speed)
}

/// The gang's own options as text, compared across pods.
fn options_text(opts: &GangOpts) -> String {
    let sizes: Vec<String> = opts
        .gang_sizes
        .iter()
        .map(|b| crate::units::format_bytes(*b))
        .collect();
    format!(
        "sizes {} iterations {} timeout {:.1} s",
        sizes.join(","),
        opts.gang_iterations,
        opts.gang_timeout.as_secs_f64()
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
        options_text(settings.opts),
    );
    mine.encode().map_err(|e| {
        vec![
            Finding::skip(ids::GANG_JOIN, "the gang did not start"),
            Finding::fail(
                ids::GANG_CONSISTENCY,
                e,
                "Unset NCCL/FI variables the job does not need",
            ),
            Finding::skip(ids::GANG_BANDWIDTH, "the gang did not start"),
        ]
    })
}

/// The root's address: this pod's own on rank 0, the resolved name elsewhere.
fn root_ip(run: &GangRun, report: &Report, identity: &GangIdentity) -> Option<IpAddr> {
    if identity.node_rank == 0 {
        names::root_address_here(&identity.root, report)
    } else {
        run.peers
            .iter()
            .find(|p| p.node == 0)
            .and_then(|p| p.address.as_ref())
            .and_then(|a| a.parse().ok())
    }
}

/// The rendezvous for this pod: rank 0 serves it, the others join it. The table
/// waits up to `--gang-timeout`; a joining pod waits that long after it connected.
fn meet(
    identity: &GangIdentity,
    opts: &GangOpts,
    root: SocketAddr,
    record: &[u8],
) -> Result<Table, rendezvous::Failure> {
    let job = handle::magic(identity);
    let deadline = Instant::now() + opts.gang_timeout;
    if identity.node_rank == 0 {
        rendezvous::serve(root, job, identity.nodes, record, deadline)
    } else {
        let within = opts.gang_timeout + rendezvous::HELLO_WITHIN;
        rendezvous::join(
            root,
            job,
            identity.node_rank,
            identity.nodes,
            record,
            deadline,
            within,
        )
    }
}

/// Decodes the table's records into `run` and judges gang-consistency.
fn judge_table(run: &mut GangRun, table: &Table) -> Finding {
    let mut unreadable = Vec::new();
    for (i, record) in table.records.iter().enumerate() {
        let decoded = record.as_deref().map(Fingerprint::decode);
        match decoded {
            Some(Ok(f)) if f.node_rank == i as u64 => run.fingerprints.push(Some(f)),
            Some(Ok(f)) => {
                let why = format!("its record says rank {}", f.node_rank);
                run.fingerprint_errors.push(format!("node {i}: {why}"));
                unreadable.push((i, why));
                run.fingerprints.push(None);
            }
            Some(Err(e)) => {
                run.fingerprint_errors.push(format!("node {i}: {e}"));
                unreadable.push((i, e.to_string()));
                run.fingerprints.push(None);
            }
            None => run.fingerprints.push(None),
        }
    }
    run.rows = verdict::rows(&run.fingerprints);
    let names = run.names();
    verdict::consistency(&verdict::TableInput {
        rows: &run.rows,
        fps: &run.fingerprints,
        names: &names,
        unreadable: &unreadable,
    })
}

/// Runs the gang for this pod, after its local checks (`report`).
pub(crate) fn run(report: &Report, identity: &GangIdentity, settings: &Settings<'_>) -> GangRun {
    let opts = settings.opts;
    let mut run = GangRun::new(identity);
    run.peers = names::wait_for_names(identity, opts.gang_wait);
    let unresolved = findings::unresolved(&run.peers);
    let Some(root_ip) = root_ip(&run, report, identity) else {
        run.findings = findings::no_root(identity, opts, unresolved);
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
    let started = Instant::now();
    let table = match meet(identity, opts, root, &record) {
        Ok(t) => t,
        Err(failure) => {
            run.findings = findings::no_table(&run, &failure, opts, unresolved);
            return run;
        }
    };
    run.rendezvous_seconds = Some(started.elapsed().as_secs_f64());
    run.missing = table.missing().into_iter().map(|i| i as u64).collect();
    run.duplicates = table.duplicates.clone();
    run.refused = table.refused.clone();
    let consistency = judge_table(&mut run, &table);
    let join = findings::table_join(&run, opts, &unresolved);
    if join.status() == Status::Fail || consistency.status() == Status::Fail {
        let why = if join.status() == Status::Fail {
            "not measured: not every pod reached the rendezvous (see gang-join)"
        } else {
            "not measured: the pods disagree (see gang-consistency)"
        };
        run.findings = vec![join, consistency, Finding::skip(ids::GANG_BANDWIDTH, why)];
        return run;
    }
    let worker_started = Instant::now();
    let (result, transports, diagnostics) = spawn::run(identity, settings, root);
    run.transports = transports;
    let mine = outcome::Outcome::of(&result);
    run.outcomes = outcome::exchange(identity, opts.gang_timeout, root, &mine, worker_started);
    let (join, bandwidth) = findings::after_nccl(&mut run, &result, join, opts);
    run.bandwidth = Some(result);
    run.findings = vec![join, consistency, bandwidth];
    // NCCL prints the diagnostics' summary on one rank (rank 0 in the 2.32.3 recording):
    // the other pods add the finding only when their log has the lines.
    if settings.ras_diagnostics && (identity.node_rank == 0 || !diagnostics.lines.is_empty()) {
        run.findings.push(diagnostics.finding("gang"));
    }
    run
}
