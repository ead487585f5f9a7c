//! The gang's three findings in words: gang-join from the names, the
//! rendezvous and NCCL's join; gang-bandwidth from what the worker measured.
//! Every text built from the table is the same on every rank that has it.

use super::GangRun;
use super::Peer;
use super::outcome::Outcome;
use super::session::Failure;
use super::verdict::bandwidth::{BandwidthInput, bandwidth, nonsense_nodes};
use super::verdict::matrix::{matrix, straggler};
use super::verdict::{departures, node_name};
use super::worker::WorkerResult;
use crate::cli::GangOpts;
use crate::finding::{Blame, Finding, Problem, Severity, Status, combine, ids};

/// "node 3 (train-worker-2): no DNS record" for each name that never resolved.
pub fn unresolved(peers: &[Peer]) -> Vec<String> {
    peers
        .iter()
        .filter(|p| p.address.is_none())
        .map(|p| format!("node {} ({}): no DNS record", p.node, p.name))
        .collect()
}

fn skipped(why: &str) -> [Finding; 2] {
    [
        Finding::skip(ids::GANG_CONSISTENCY, why),
        Finding::skip(ids::GANG_BANDWIDTH, why),
    ]
}

/// The root has no address: gang-join fails, the rest skip.
pub fn no_root(
    identity: &crate::layout::GangIdentity,
    opts: &GangOpts,
    unresolved: Vec<String>,
) -> Vec<Finding> {
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
    let mut f = Finding::fail(
        ids::GANG_JOIN,
        why,
        "Check that the rank-0 pod is running and its Service name resolves (kubectl get pods, nslookup), or pass --gang-root",
    );
    f.evidence.extend(unresolved);
    let mut out = vec![f];
    out.extend(skipped("the gang did not meet"));
    out
}

/// "train-master-0 at 10.0.0.1:29501".
fn root_text(run: &GangRun) -> String {
    format!(
        "{} at {}",
        run.identity.root,
        run.root_address.as_deref().unwrap_or("?")
    )
}

/// This pod got no table: gang-join says why, the rest skip.
pub fn no_table(
    run: &GangRun,
    failure: &Failure,
    opts: &GangOpts,
    unresolved: Vec<String>,
) -> Vec<Finding> {
    let port = run.identity.port;
    let (summary, fix) = match failure {
        Failure::Listen(e) => (
            format!("rank 0 could not listen on the gang port {port}: {e}"),
            "Another process holds the port (a gang of an earlier attempt still running, or the trainer): let it end, or give every pod another --gang-port".to_string(),
        ),
        Failure::Unreachable(e) => (
            format!(
                "this pod could not reach rank 0 ({}) within --gang-timeout {:.0} s: {e}",
                root_text(run),
                opts.gang_timeout.as_secs_f64()
            ),
            format!("Check that the rank-0 pod is running the gang (kubectl get pods; its log) and that the pods reach each other on TCP port {port} (NetworkPolicy, security groups)"),
        ),
        Failure::Refused { why, .. } => (
            format!("rank 0 ({}) refused this pod: {why}", root_text(run)),
            "This pod is not one of the attempt rank 0 runs: let a stale pod end, and give every pod of one attempt the same root, port, pod count and --gang-attempt".to_string(),
        ),
        Failure::NoTable(e) => (
            format!("this pod reached rank 0 ({}), but no table came back: {e}", root_text(run)),
            "Rank 0 ended or its network failed mid-way: read the rank-0 pod's log".to_string(),
        ),
    };
    // A port held inside the pod or a pod of another attempt is the job's; a rank 0
    // that cannot be reached or that ended is the node's (the check's default); a
    // refusal carries rank 0's blame, so this pod exits as the pods that went on.
    let blame = match failure {
        Failure::Listen(_) => Some(Blame::Job),
        Failure::Refused { blame, .. } => Some(*blame),
        Failure::Unreachable(_) | Failure::NoTable(_) => None,
    };
    let mut f = Finding::fail(ids::GANG_JOIN, summary, fix);
    if let Some(blame) = blame {
        f = f.blamed(blame);
    }
    f.evidence.extend(unresolved);
    let mut out = vec![f];
    out.extend(skipped("the gang did not meet"));
    out
}

/// gang-join from the table: every rank there, once.
pub fn table_join(run: &GangRun, opts: &GangOpts, unresolved: &[String]) -> Finding {
    let names = run.names();
    let n = run.identity.nodes;
    let mut problems = Vec::new();
    for d in &run.duplicates {
        problems.push(Problem::new(
            Severity::Fail,
            format!(
                "two pods claim {}: {} (kept) and {} (refused)",
                node_name(d.rank as usize, &names),
                d.kept,
                d.refused
            ),
            "Give every pod its own rank (PET_NODE_RANK, RANK or --gang-rank): two pods of one rank is a manifest error, or a pod of an earlier attempt still running",
        ).blamed(Blame::Job));
    }
    let who: Vec<String> = run
        .missing
        .iter()
        .map(|&i| node_name(i as usize, &names))
        .collect();
    if let Some(first) = problems.first_mut()
        && run.missing.len() <= run.duplicates.len()
    {
        // Rank 0 stopped waiting once every pod had reported: a duplicate stands for a missing rank.
        if !who.is_empty() {
            first.evidence.push(format!(
                "no pod reported as {}: its pod claimed another rank",
                who.join(", ")
            ));
        }
    } else if !run.missing.is_empty() {
        let mut p = Problem::new(
            Severity::Fail,
            format!(
                "{} of {n} pod(s) never reached the rendezvous at {} within --gang-timeout {:.0} s: {}",
                run.missing.len(),
                root_text(run),
                opts.gang_timeout.as_secs_f64(),
                who.join(", ")
            ),
            format!(
                "Check that every pod started and runs the gang (kubectl get pods; the missing pod's log), and that the pods reach rank 0 on TCP port {} (NetworkPolicy, security groups)",
                run.identity.port
            ),
        );
        p.evidence.extend(unresolved.iter().cloned());
        problems.insert(0, p);
    }
    let mut evidence = Vec::new();
    if let Some(s) = run.rendezvous_seconds {
        evidence.push(format!(
            "this pod had the table {s:.2} s after it started the rendezvous"
        ));
    }
    if run.refused_count > 0 {
        evidence.push(format!(
            "rank 0 refused {} connection(s) from outside this attempt: {}",
            run.refused_count,
            run.refused.join("; ")
        ));
    }
    combine(
        ids::GANG_JOIN,
        format!("all {n} pod(s) met at the rendezvous"),
        evidence,
        problems,
    )
}

/// The local ephemeral port range NCCL's listeners bind in (port 0).
fn ephemeral_range() -> String {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .map(|t| t.split_whitespace().collect::<Vec<_>>().join("-"))
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| "32768-60999".to_string())
}

/// gang-join once NCCL ran: the table's verdict, or, from every pod's outcome
/// (the same on every pod that has them), which pods NCCL did not join and why,
/// although every pod met at the rendezvous.
fn nccl_join(run: &GangRun, result: &WorkerResult, join: Finding, opts: &GangOpts) -> Finding {
    let names = run.names();
    let outcomes: Vec<(usize, Outcome)> = run
        .ended
        .outcomes
        .iter()
        .enumerate()
        .filter_map(|(i, o)| o.clone().map(|o| (i, o)))
        .collect();
    let failed: Vec<&(usize, Outcome)> = outcomes.iter().filter(|(_, o)| !o.joined).collect();
    let unknown: Vec<usize> = (0..run.ended.outcomes.len())
        .filter(|&i| run.ended.outcomes[i].is_none())
        .collect();
    if failed.is_empty() {
        let mut f = join;
        if let Some(s) = result.join_seconds {
            f.evidence.push(format!("NCCL joined in {s:.2} s here"));
        }
        if !unknown.is_empty() {
            let who: Vec<String> = unknown.iter().map(|&i| node_name(i, &names)).collect();
            f.evidence
                .push(format!("no NCCL outcome came from {}", who.join(", ")));
        }
        return f;
    }
    let who: Vec<String> = failed.iter().map(|(i, _)| node_name(*i, &names)).collect();
    let n = run.identity.nodes;
    let first = &failed[0].1;
    let summary = match (&first.unavailable, failed.iter().any(|(_, o)| o.timed_out)) {
        (Some(why), _) => format!("NCCL cannot run on {}: {why}", who.join(", ")),
        (None, true) => format!(
            "all {n} pod(s) reached {}, but NCCL's join did not complete within --gang-timeout {:.0} s on {}",
            root_text(run),
            opts.gang_timeout.as_secs_f64(),
            who.join(", ")
        ),
        (None, false) => format!(
            "all {n} pod(s) reached {}, but NCCL could not form the gang's communicator on {}: {}",
            root_text(run),
            who.join(", "),
            first.error.as_deref().unwrap_or("no result")
        ),
    };
    let fix = format!(
        "The gang met on port {} but every NCCL listener, its root's included, binds an ephemeral port (port 0: {} here, net.ipv4.ip_local_port_range): allow TCP between the job's pods on {} and on that range (NetworkPolicy ingress and egress, security groups), and check that NCCL_SOCKET_IFNAME picks an interface the pods reach each other on",
        run.identity.port,
        ephemeral_range(),
        run.identity.port
    );
    let mut f = Finding::fail(ids::GANG_JOIN, summary, fix);
    if failed.iter().any(|(_, o)| image_lacks_nccl(o)) {
        f = f.blamed(Blame::Job);
    }
    f.evidence = join.evidence;
    for (i, o) in &failed {
        f.evidence.push(format!(
            "{}: stopped at {}{}",
            node_name(*i, &names),
            o.stage,
            o.error
                .as_deref()
                .map_or(String::new(), |e| format!(": {e}"))
        ));
    }
    f
}

/// A pod whose image has no libnccl or one older than 2.16: the job's, not its node's.
fn image_lacks_nccl(o: &Outcome) -> bool {
    use super::worker::{NCCL_TOO_OLD, NO_LIBNCCL};
    o.unavailable
        .as_deref()
        .is_some_and(|u| u.starts_with(NO_LIBNCCL))
        || o.error.as_deref().is_some_and(|e| e.contains(NCCL_TOO_OLD))
}

/// gang-join after NCCL: the pods that left while it ran (`departures`), else
/// the pods NCCL did not join.
fn join_after(run: &GangRun, result: &WorkerResult, join: Finding, opts: &GangOpts) -> Finding {
    let names = run.names();
    let left = departures::problems(&run.ended, &names, run.identity.node_rank);
    if left.is_empty() {
        return nccl_join(run, result, join, opts);
    }
    let pass = join.summary.clone();
    combine(ids::GANG_JOIN, pass, join.evidence, left)
}

/// gang-join and gang-bandwidth after the worker; what was measured is judged
/// even when the budget, a failure or a pod that left cut the phase short.
pub fn after_nccl(
    run: &mut GangRun,
    result: &WorkerResult,
    join: Finding,
    opts: &GangOpts,
) -> (Finding, Finding) {
    let join = join_after(run, result, join, opts);
    let measured = !result.round_seconds.is_empty() || !result.allreduce.is_empty();
    if join.status() == Status::Fail && !measured {
        let why = format!("not measured: {}", join.summary);
        return (join, Finding::skip(ids::GANG_BANDWIDTH, why));
    }
    run.p2p_bytes = result.p2p_bytes;
    if !result.round_seconds.is_empty() {
        run.matrix = matrix(&result.round_seconds, result.p2p_bytes);
        run.straggler = straggler(&run.matrix);
    }
    if !measured {
        let mut f = Finding::fail(
            ids::GANG_BANDWIDTH,
            format!(
                "the bandwidth phase measured nothing: {}",
                result.error.as_deref().unwrap_or("no result")
            ),
            "Rerun with NCCL_DEBUG=INFO; check the network between the pods and each pod's NCCL variables",
        );
        f.evidence.push(format!("stopped at: {}", result.stage));
        return (join, f);
    }
    let names = run.names();
    // The whole run may not take longer than its timeout and the worker's grace.
    let limit = (opts.gang_timeout + super::worker::GRACE).as_secs_f64();
    let nonsense = nonsense_nodes(&result.round_seconds, &result.allreduce_seconds, limit);
    let mut f = bandwidth(&BandwidthInput {
        sizes: &result.allreduce,
        fps: &run.fingerprints,
        names: &names,
        transports: &run.transports,
        matrix: &run.matrix,
        straggler: run.straggler.as_ref(),
        nonsense: &nonsense,
        skipped: &result.skipped,
    });
    f.evidence.extend(unmeasured_links(&run.matrix, &names));
    if !result.done {
        let why = match join.status() {
            Status::Fail => join.summary.clone(),
            _ => result.error.clone().unwrap_or_else(|| "no result".into()),
        };
        let stop =
            format!("the bandwidth phase stopped early ({why}): what it measured is judged above");
        f = unfinished(f, stop);
    }
    (join, f)
}

/// Links left out of the matrix: every link's outcome is said, measured or not.
fn unmeasured_links(m: &[Vec<Option<f64>>], names: &[String]) -> Option<String> {
    let n = m.len();
    let missing: Vec<String> = (0..n)
        .flat_map(|a| ((a + 1)..n).map(move |b| (a, b)))
        .filter(|&(a, b)| m[a][b].is_none())
        .map(|(a, b)| format!("{}-{}", node_name(a, names), node_name(b, names)))
        .collect();
    if missing.is_empty() {
        return None;
    }
    let total = n * n.saturating_sub(1) / 2;
    let shown: Vec<&str> = missing.iter().take(16).map(String::as_str).collect();
    Some(format!(
        "links measured: {} of {total}; not measured: {}{}",
        total - missing.len(),
        shown.join(", "),
        if missing.len() > 16 { ", ..." } else { "" }
    ))
}

/// A bandwidth finding whose phase did not finish: it fails, keeping its own
/// headline where it already failed.
fn unfinished(f: Finding, stop: String) -> Finding {
    let fix = f
        .remediation()
        .unwrap_or("Check the network between the pods and rerun")
        .to_string();
    let summary = if f.status() == Status::Fail {
        f.summary.clone()
    } else {
        stop.clone()
    };
    let mut out = Finding::fail(ids::GANG_BANDWIDTH, summary, fix);
    out.evidence = f.evidence;
    out.evidence
        .push(crate::render::visible(&stop).into_owned());
    out
}
