//! `gang`: the whole job checked across its pods before training starts. One
//! process per pod; every pod runs the same sequence, top to bottom in [`run`], and
//! every NCCL call happens in a child process (`gang-worker`), never in the process
//! that may exec the trainer. NVIDIA/nccl tags v2.18.5-1 .. v2.30.7-1.
//!
//! 1. Command (`command`): the identity from the launcher or the flags
//!    (`layout::gang_identity`: node rank, pod count, root host, port = the
//!    trainer's port + 1 else 29501, attempt) and every option, resolved once into
//!    [`Settings`] before anything is gathered; then the pod's own checks.
//! 2. Names (`names`): the root's and every peer's, resolved concurrently until
//!    `--gang-wait`; rank 0 takes its own address for the root, never a Service
//!    IP, because it listens there.
//! 3. Rendezvous (`session`, before NCCL): rank 0 listens on the gang port, every
//!    pod sends its record (`fingerprint`: the trainer's libnccl and its path,
//!    driver, GPUs, NICs, effective NCCL_*/FI_* variables, the gang's options,
//!    every local check) and receives the whole table. Every pod judges the same
//!    table (`verdict::consistency`), so every pod's log and termination message
//!    carry the same verdict naming the odd pod, also when the stacks are too
//!    different for NCCL to form a communicator.
//! 4. Measurement, only where the records agree: every rank builds the same
//!    128-byte ncclUniqueId (`handle`) for NCCL's root, which rank 0's worker starts
//!    (`NCCL_COMM_ID`, src/init.cc `ncclCommInitRankDev`) on a port rank 0 chose and
//!    sent in the table. The worker (`worker`, run by `spawn`, NCCL's log through
//!    `log`) joins every local GPU non-blocking under the deadline, probes every
//!    node pair, then fits the all-reduce sizes and a larger pairwise size to what
//!    is left of `--gang-timeout`. Meanwhile the session beats: a pod that dies or
//!    falls silent, or whose NCCL run ends early, stops every pod's run at once.
//! 5. Verdict: every pod's outcome comes back through rank 0; gang-join names the
//!    pods that never came, that left or that NCCL could not join (`findings`,
//!    `verdict::departures`), gang-bandwidth judges what was measured
//!    (`verdict::bandwidth`, `verdict::matrix`), even when the run stopped early.

pub mod command;
pub(crate) mod environment;
pub(crate) mod findings;
pub(crate) mod fingerprint;
pub(crate) mod handle;
pub(crate) mod log;
pub(crate) mod names;
pub(crate) mod outcome;
pub(crate) mod record;
pub(crate) mod render;
pub(crate) mod session;
pub(crate) mod spawn;
pub(crate) mod verdict;
pub(crate) mod wire;
pub mod worker;

use crate::cli::GangOpts;
use crate::finding::{Finding, Status, ids};
use crate::layout::GangIdentity;
use crate::report::Report;
use fingerprint::Fingerprint;
pub(crate) use names::Peer;
use serde::Serialize;
use session::{Live, Meeting, Outcomes, Session};
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use wire::{Duplicate, Table};
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
    /// Connections rank 0 refused (another job or attempt, not a gang peer, idle):
    /// the first few, and how many in all.
    pub refused: Vec<String>,
    pub refused_count: u64,
    pub bandwidth: Option<WorkerResult>,
    /// How every pod's NCCL run ended, the pods that left it and the pods that came
    /// after the gang went on, as rank 0 sent them.
    pub ended: Outcomes,
    /// Each node's fingerprint as gathered (None: unreadable or never sent).
    pub fingerprints: Vec<Option<Fingerprint>>,
    fingerprint_errors: Vec<String>,
    pub rows: Vec<verdict::consistency::Row>,
    /// Bytes each end sends per pairwise exchange, and GB/s per node pair
    /// (symmetric: a pair's exchange runs both ways at once).
    pub p2p_bytes: u64,
    pub matrix: Vec<Vec<Option<f64>>>,
    pub straggler: Option<verdict::matrix::Straggler>,
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
            refused_count: 0,
            bandwidth: None,
            ended: Outcomes::default(),
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

/// The rendezvous: this pod's session and the table, or the findings that end
/// the gang here.
fn meet(
    run: &mut GangRun,
    identity: &GangIdentity,
    opts: &GangOpts,
    root: SocketAddr,
    record: &[u8],
    unresolved: &[String],
) -> Result<(Session, Table), Vec<Finding>> {
    let started = Instant::now();
    let meeting = Meeting {
        root,
        job: handle::magic(identity),
        rank: identity.node_rank,
        nodes: identity.nodes,
        record,
        deadline: started + opts.gang_timeout,
        // A joining pod waits that long after it connected.
        table_within: opts.gang_timeout + session::HELLO_WITHIN,
    };
    let (session, table) = Session::meet(&meeting)
        .map_err(|f| findings::no_table(run, &f, opts, unresolved.to_vec()))?;
    run.rendezvous_seconds = Some(started.elapsed().as_secs_f64());
    run.missing = table.missing().into_iter().map(|i| i as u64).collect();
    run.duplicates = table.duplicates.clone();
    run.refused = table.refused.clone();
    run.refused_count = table.refused_count;
    Ok((session, table))
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
    run.rows = verdict::consistency::rows(&run.fingerprints, job_version(&run.fingerprints));
    let names = run.names();
    verdict::consistency::consistency(&verdict::consistency::TableInput {
        rows: &run.rows,
        fps: &run.fingerprints,
        names: &names,
        unreadable: &unreadable,
    })
}

/// The job's NCCL: the version most records carry (what a variable's role depends on).
fn job_version(fps: &[Option<Fingerprint>]) -> Option<crate::nccl::Version> {
    let versions: Vec<_> = fps
        .iter()
        .flatten()
        .filter_map(|f| f.nccl_version.as_deref())
        .filter_map(crate::nccl::Version::parse)
        .collect();
    let count = |v: &crate::nccl::Version| versions.iter().filter(|w| *w == v).count();
    versions.iter().copied().max_by_key(count)
}

/// This pod's NCCL run (NCCL's root at `nccl_root`) while the session follows the
/// others: the run, and how every pod's ended.
fn measure(
    session: &mut Session,
    identity: &GangIdentity,
    settings: &Settings<'_>,
    nccl_root: SocketAddr,
) -> (spawn::Ran, Outcomes) {
    if let Session::Root(root) = session {
        root.release_nccl_port();
    }
    let timeout = settings.opts.gang_timeout;
    let live = Live::default();
    // Every worker ends within its limit of its start; the pods started theirs
    // within moments of each other.
    let deadline = Instant::now() + timeout + worker::GRACE + Duration::from_secs(15);
    let (ran, mut ended) = std::thread::scope(|s| {
        let follow = s.spawn(|| session.follow(&live, session::silence(timeout), deadline));
        let ran = spawn::run(identity, settings, nccl_root, &live);
        (ran, follow.join().unwrap_or_default())
    });
    ended.outcomes.resize(identity.nodes as usize, None);
    ended.outcomes[identity.node_rank as usize] = Some(ran.outcome.clone());
    (ran, ended)
}

/// Runs the gang for this pod, after its local checks (`report`): names,
/// rendezvous, the table judged, NCCL's run, the verdict.
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
    let met = record::own_record(report, identity, settings)
        .and_then(|record| meet(&mut run, identity, opts, root, &record, &unresolved));
    let (mut session, table) = match met {
        Ok(m) => m,
        Err(findings) => {
            run.findings = findings;
            return run;
        }
    };
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
    let (ran, ended) = measure(
        &mut session,
        identity,
        settings,
        SocketAddr::new(root_ip, table.nccl_port),
    );
    run.transports = ran.transports;
    run.ended = ended;
    let (join, bandwidth) = findings::after_nccl(&mut run, &ran.result, join, opts);
    run.bandwidth = Some(ran.result);
    run.findings = vec![join, consistency, bandwidth];
    // NCCL prints the diagnostics' summary on one rank (rank 0 in the 2.32.3 recording):
    // the other pods add the finding only when their log has the lines.
    if settings.ras_diagnostics && (identity.node_rank == 0 || !ran.diagnostics.lines.is_empty()) {
        run.findings.push(ran.diagnostics.finding("gang"));
    }
    run
}
