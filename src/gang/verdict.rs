//! Judging what the gang brought back (pure): the consistency table across pods,
//! the all-reduce bandwidth against the slowest node's network figure, the
//! node x node matrix and the straggler.

use super::fingerprint::Fingerprint;
use crate::finding::{Blame, Fault, Finding, Problem, Severity, combine, ids};
use serde::Serialize;

/// A node is the straggler when every one of its links (pairwise exchanges, both
/// directions at once) runs below this fraction of the median of the links that
/// do not touch it: a healthy fabric's pairs differ by a few percent (rail-aligned rings), a link
/// trained at half rate or a NIC missing from the pod shows as 2x or worse.
const STRAGGLER_FACTOR: f64 = 0.5;
/// All-reduce busbw below this fraction of the slowest node's figure warns (the
/// sysfs figure can be off by 2x on EFA: research notes section 6)...
const WARN_FRACTION: f64 = 0.5;
/// ...and below this one fails (grossly low whatever the sysfs caveat).
const FAIL_FRACTION: f64 = 0.25;

/// One compared field.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    pub field: String,
    /// Each node's value, in node-rank order ("missing" where a record was unreadable).
    pub values: Vec<String>,
    /// The value most nodes hold.
    majority: String,
    /// Nodes whose value is not the majority's.
    odd: Vec<usize>,
}

impl Row {
    pub fn differs(&self) -> bool {
        !self.odd.is_empty()
    }
}

/// Every field across the nodes' fingerprints; `None` is a node whose record was
/// not readable or never came ("missing", neither odd nor counted in the
/// majority: what is judged is the records that are there). Fields are the
/// union over nodes, in the first record's order.
pub fn rows(fps: &[Option<Fingerprint>]) -> Vec<Row> {
    let per_node: Vec<Vec<(String, String)>> = fps
        .iter()
        .map(|f| f.as_ref().map(Fingerprint::fields).unwrap_or_default())
        .collect();
    let mut names: Vec<String> = Vec::new();
    for fields in &per_node {
        for (k, _) in fields {
            if !names.contains(k) {
                names.push(k.clone());
            }
        }
    }
    names
        .into_iter()
        .map(|field| {
            let values: Vec<String> = per_node
                .iter()
                .zip(fps)
                .map(|(fields, fp)| match fp {
                    None => "missing".to_string(),
                    Some(_) => fields
                        .iter()
                        .find(|(k, _)| *k == field)
                        .map_or("unset".to_string(), |(_, v)| v.clone()),
                })
                .collect();
            let present: Vec<String> = values
                .iter()
                .zip(fps)
                .filter(|(_, f)| f.is_some())
                .map(|(v, _)| v.clone())
                .collect();
            let majority = majority(&present);
            let odd = values
                .iter()
                .zip(fps)
                .enumerate()
                .filter(|(_, (v, f))| f.is_some() && **v != majority)
                .map(|(i, _)| i)
                .collect();
            Row {
                field,
                values,
                majority,
                odd,
            }
        })
        .collect()
}

/// The most common value; ties go to the value node 0 (or the lowest node) holds.
fn majority(values: &[String]) -> String {
    let mut best: Option<(&String, usize)> = None;
    for v in values {
        let n = values.iter().filter(|w| *w == v).count();
        if best.is_none_or(|(_, m)| n > m) {
            best = Some((v, n));
        }
    }
    best.map(|(v, _)| v.clone()).unwrap_or_default()
}

/// "node 2 (job-worker-1)" for reports.
pub fn node_name(i: usize, names: &[String]) -> String {
    match names.get(i).filter(|n| !n.is_empty()) {
        Some(n) => format!("node {i} ({n})"),
        None => format!("node {i}"),
    }
}

fn list(nodes: &[usize], names: &[String]) -> String {
    nodes
        .iter()
        .map(|&i| node_name(i, names))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What gang-consistency judges: the rows, the records they came from, the
/// nodes' names and the records that could not be read (`node i: why`).
pub struct TableInput<'a> {
    pub rows: &'a [Row],
    pub fps: &'a [Option<Fingerprint>],
    pub names: &'a [String],
    pub unreadable: &'a [(usize, String)],
}

/// gang-consistency from the rows: a record that cannot be read, a node whose own
/// checks failed, a differing NCCL version, gang option or NCCL_* value, a node
/// with fewer GPUs or usable RDMA devices than its peers fails, in that order of
/// headline; any other difference warns. Every rank judges the same table, so
/// every rank prints the same text.
pub fn consistency(input: &TableInput<'_>) -> Finding {
    let (rows, names) = (input.rows, input.names);
    let differing: Vec<&Row> = rows.iter().filter(|r| r.differs()).collect();
    let agree = rows.len() - differing.len();
    let nodes = input.fps.iter().filter(|f| f.is_some()).count();
    let counted = format!("{nodes} node(s) agree on {agree} of {} fields", rows.len());
    let evidence = vec![counted.clone()];
    let mut problems: Vec<Problem> = input
        .unreadable
        .iter()
        .map(|(i, why)| {
            Problem::new(
                Severity::Fail,
                format!(
                    "{} sent a record this nccl-preflight cannot read: {why}",
                    node_name(*i, names)
                ),
                "Run the same nccl-preflight (one image or one init container) in every pod",
            )
        })
        .collect();
    problems.extend(failed_own_checks(input));
    problems.extend(differing.iter().filter_map(|r| row_problem(r, input)));
    // A failed check on one pod also shows as "local verdict"; the per-check rows are evidence.
    let checks: Vec<String> = differing
        .iter()
        .filter(|r| r.field.starts_with("check "))
        .map(|r| format!("{}: {}", r.field, r.values.join(" | ")))
        .collect();
    // One count, whatever differs only as evidence (issue 31 row 16).
    let pass = if agree == rows.len() {
        format!("{nodes} node(s) agree on all {} fields", rows.len())
    } else {
        format!("{counted}; the rest differ only in checks that passed or warned")
    };
    let mut f = combine(ids::GANG_CONSISTENCY, pass, evidence, problems);
    f.evidence.extend(checks);
    f
}

/// The nodes whose own checks failed, each with its failed checks' summaries.
fn failed_own_checks(input: &TableInput<'_>) -> Vec<Problem> {
    input
        .fps
        .iter()
        .enumerate()
        .filter_map(|(i, f)| f.as_ref().map(|f| (i, f)))
        .filter(|(_, f)| f.local_verdict == crate::finding::Status::Fail)
        .map(|(i, f)| {
            let failed: Vec<String> = f
                .checks
                .iter()
                .filter(|(_, s)| **s == crate::finding::Status::Fail)
                .map(|(id, _)| match f.summaries.get(id) {
                    Some(text) => format!("{id}: {text}"),
                    None => id.clone(),
                })
                .collect();
            let p = Problem::new(
                Severity::Fail,
                format!("{} failed its own checks: {}", node_name(i, input.names), failed.join("; ")),
                "Fix what that pod's own checks name (its report has each check's fix); the whole job waits for it",
            );
            // That pod's own fault, so every pod of the gang exits as it does; a record
            // of an older version carries none, and the check's default (job) stands.
            match f.local_fault {
                Fault::Node => p.blamed(Blame::Node),
                Fault::Job => p.blamed(Blame::Job),
                Fault::None => p,
            }
        })
        .collect()
}

/// "node 1 (job-worker-0) loads NCCL 2.28.3 (/usr/lib/...), the other 3 pods 2.28.9".
fn version_text(r: &Row, input: &TableInput<'_>) -> String {
    let path = |i: usize| {
        input
            .fps
            .get(i)
            .and_then(|f| f.as_ref())
            .and_then(|f| f.nccl_library.as_deref())
            .map_or(String::new(), |p| format!(" ({p})"))
    };
    let others = input.fps.iter().filter(|f| f.is_some()).count() - r.odd.len();
    let odd: Vec<String> = r
        .odd
        .iter()
        .map(|&i| {
            format!(
                "{} loads NCCL {}{}",
                node_name(i, input.names),
                r.values[i],
                path(i)
            )
        })
        .collect();
    let majority_path = r
        .values
        .iter()
        .enumerate()
        .find(|(i, v)| **v == r.majority && input.fps.get(*i).is_some_and(|f| f.is_some()))
        .map_or(String::new(), |(i, _)| path(i));
    format!(
        "{}, the other {others} pod(s) NCCL {}{majority_path}",
        odd.join(", "),
        r.majority
    )
}

/// The nodes whose value in `r` is not a number or is below the largest one.
fn below_the_most(r: &Row) -> Vec<usize> {
    let nums: Vec<Option<u64>> = r.values.iter().map(|v| v.parse().ok()).collect();
    let max = nums.iter().flatten().max().copied().unwrap_or(0);
    nodes_where(r, |v| {
        v != "missing" && v.parse::<u64>().ok().is_none_or(|n| n < max)
    })
}

/// The nodes whose value in `r` satisfies `keep`.
fn nodes_where(r: &Row, keep: impl Fn(&str) -> bool) -> Vec<usize> {
    r.values
        .iter()
        .enumerate()
        .filter(|(_, v)| keep(v))
        .map(|(i, _)| i)
        .collect()
}

/// What one differing row means: None for rows that are only evidence (a
/// per-check row; a local verdict where no pod failed).
fn row_problem(r: &Row, input: &TableInput<'_>) -> Option<Problem> {
    let names = input.names;
    let shown: Vec<String> = r
        .values
        .iter()
        .enumerate()
        .map(|(i, v)| format!("{}={v}", node_name(i, names)))
        .collect();
    let p = |status, summary: String, fix: &str| {
        let mut pr = Problem::new(status, summary, fix);
        pr.evidence
            .push(format!("{}: {}", r.field, shown.join(", ")));
        Some(pr)
    };
    match r.field.as_str() {
        "nccl version" => p(
            Severity::Fail,
            version_text(r, input),
            "Build every pod from one image (one libnccl for the whole job): ranks with different NCCL versions fail NCCL's init or hang in it",
        ),
        "gang options" => p(
            Severity::Fail,
            format!(
                "the gang's own options differ across pods ({} against {})",
                list(&r.odd, names),
                r.majority
            ),
            "Give every pod the same --gang-sizes, --gang-iterations and --gang-timeout (one pod template): pods that measure differently never line up",
        ),
        "gpus" | "rdma devices" => {
            let fewer = below_the_most(r);
            p(
                Severity::Fail,
                format!(
                    "{} {} fewer {} than its peers",
                    list(&fewer, names),
                    if fewer.len() == 1 { "has" } else { "have" },
                    if r.field == "gpus" {
                        "GPUs"
                    } else {
                        "usable RDMA devices"
                    }
                ),
                "Give every pod the same GPU and RDMA resources (nvidia.com/gpu, vpc.amazonaws.com/efa, rdma/...) and drain the node whose devices are missing or down; the whole job runs at the slowest node's speed",
            )
            // Pods of one template ask for the same devices: one that sees fewer is on a
            // node whose devices are missing or down.
            .map(|p| p.blamed(Blame::Node))
        }
        // Judged with the summaries in failed_own_checks.
        "local verdict" => None,
        f if f.starts_with("env NCCL_") => p(
            Severity::Fail,
            format!(
                "{} differs across pods ({} against {})",
                &f[4..],
                list(&r.odd, names),
                r.majority
            ),
            "Set NCCL variables the same in every pod (one pod template): ranks that choose different algorithms or protocols hang in the first collective",
        ),
        f if f.starts_with("check ") => None,
        _ => p(
            Severity::Warn,
            format!("{} differs across pods ({})", r.field, list(&r.odd, names)),
            "Run every pod from the same image on the same node type",
        ),
    }
}

/// The pairwise exchange schedule: rounds of disjoint node pairs in which every
/// unordered pair meets exactly once (the circle method of a round-robin
/// tournament: node N-1 stays put, the others rotate one place per round). N - 1
/// rounds for even N; N rounds for odd N, one node idle in each (paired with a
/// phantom node N). Pairs are (lower, higher). Disjoint pairs keep each link's
/// time its own: no node waits on a third node's link within a round.
pub fn schedule(n: usize) -> Vec<Vec<(usize, usize)>> {
    if n < 2 {
        return Vec::new();
    }
    let m = if n.is_multiple_of(2) { n } else { n + 1 };
    let ring = m - 1;
    (0..ring)
        .map(|r| {
            let mut pairs = vec![(r, ring)];
            for k in 1..m / 2 {
                pairs.push(((r + k) % ring, (r + ring - k) % ring));
            }
            pairs
                .into_iter()
                .filter(|&(a, b)| a < n && b < n)
                .map(|(a, b)| (a.min(b), a.max(b)))
                .collect()
        })
        .collect()
}

/// Node `node`'s partner in round `round` of `schedule(n)`, None when it sits out.
pub fn partner(n: usize, round: usize, node: usize) -> Option<usize> {
    schedule(n).get(round)?.iter().find_map(|&(a, b)| {
        if a == node {
            Some(b)
        } else if b == node {
            Some(a)
        } else {
            None
        }
    })
}

/// The node x node matrix in GB/s from each node's round times: `seconds[i][r]`
/// is node i's time, in round r of `schedule(N)`, to send `bytes` to its partner
/// while receiving as many from it (0 when it sat out). Both ends timed the same
/// exchange: the link's time is the slower end's, and the matrix is symmetric.
pub fn matrix(seconds: &[Vec<f64>], bytes: u64) -> Vec<Vec<Option<f64>>> {
    let n = seconds.len();
    let mut m = vec![vec![None; n]; n];
    let valid = |i: usize, r: usize| {
        seconds[i]
            .get(r)
            .copied()
            .filter(|t| *t > 0.0 && t.is_finite())
    };
    for (r, pairs) in schedule(n).iter().enumerate() {
        for &(a, b) in pairs {
            let t = match (valid(a, r), valid(b, r)) {
                (Some(x), Some(y)) => x.max(y),
                (Some(x), None) | (None, Some(x)) => x,
                (None, None) => continue,
            };
            let gbps = bytes as f64 / t / 1e9;
            m[a][b] = Some(gbps);
            m[b][a] = Some(gbps);
        }
    }
    m
}

/// The median of a list of link rates.
fn median_of(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    Some(if v.len().is_multiple_of(2) {
        (v[mid - 1] + v[mid]) / 2.0
    } else {
        v[mid]
    })
}

/// The matrix's measured links, each unordered pair once.
pub fn links(m: &[Vec<Option<f64>>]) -> Vec<f64> {
    m.iter()
        .enumerate()
        .flat_map(|(i, row)| row.iter().skip(i + 1).flatten().copied())
        .collect()
}

/// The median of the matrix's measured links.
pub fn median(m: &[Vec<Option<f64>>]) -> Option<f64> {
    median_of(links(m))
}

/// What the matrix says about one slow node.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Straggler {
    pub node: usize,
    /// The median of the links that do not touch it, GB/s.
    pub median_gbps: f64,
    /// Its links' mean, GB/s.
    pub mean_gbps: f64,
}

/// The one node every one of whose links runs below STRAGGLER_FACTOR x the median
/// of the links that do not touch it. The median leaves the node's own links
/// out: with 3 nodes, a slow node holds 2 of the 3 links and would be the whole
/// matrix's median. None when no node, or more than one, qualifies, when a link
/// of the node was not measured, and with 2 nodes (one link: a slow link cannot
/// be pinned on either end).
pub fn straggler(m: &[Vec<Option<f64>>]) -> Option<Straggler> {
    let n = m.len();
    if n < 3 {
        return None;
    }
    let mut found = Vec::new();
    for i in 0..n {
        let own: Vec<f64> = (0..n).filter(|&j| j != i).filter_map(|j| m[i][j]).collect();
        if own.len() != n - 1 {
            continue;
        }
        let rest: Vec<f64> = (0..n)
            .filter(|&a| a != i)
            .flat_map(|a| {
                ((a + 1)..n)
                    .filter(|&b| b != i)
                    .filter_map(move |b| m[a][b])
            })
            .collect();
        let Some(med) = median_of(rest) else {
            continue;
        };
        if own.iter().all(|&v| v < med * STRAGGLER_FACTOR) {
            found.push(Straggler {
                node: i,
                median_gbps: med,
                mean_gbps: own.iter().sum::<f64>() / own.len() as f64,
            });
        }
    }
    if found.len() == 1 { found.pop() } else { None }
}

/// One all-reduce size as the gang measured it.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct SizeRow {
    pub bytes: u64,
    /// The slowest rank's time per all-reduce, seconds (nccl-tests takes the mean).
    pub seconds: f64,
    pub algbw_gbps: f64,
    /// algbw x 2(n-1)/n, n = every rank of the job (nccl-tests src/all_reduce.cu).
    pub busbw_gbps: f64,
}

/// busbw from the slowest rank's time (NVIDIA/nccl-tests src/all_reduce.cu: algBw =
/// bytes / sec, busBw = algBw x 2(n-1)/n).
pub fn size_row(bytes: u64, seconds: f64, nranks: u64) -> SizeRow {
    let algbw = if seconds > 0.0 {
        bytes as f64 / seconds / 1e9
    } else {
        0.0
    };
    let n = nranks.max(1) as f64;
    SizeRow {
        bytes,
        seconds,
        algbw_gbps: algbw,
        busbw_gbps: algbw * 2.0 * (n - 1.0) / n,
    }
}

/// A node's network figure, GB/s, and how it was worked out: the sum of its active
/// RDMA ports' sysfs rates (the NICs NCCL uses: one per rail), else its socket
/// interface speed.
fn node_figure(fp: &Fingerprint) -> Option<(f64, String)> {
    if !fp.rdma_rates.is_empty() {
        let gbits: f64 = fp
            .rdma_rates
            .iter()
            .filter_map(|r| crate::facts::rdma::rate_gbps(r))
            .sum();
        if gbits > 0.0 {
            return Some((
                gbits / 8.0,
                format!("{} RDMA port(s), {gbits} Gb/s in all", fp.rdma_rates.len()),
            ));
        }
    }
    let mbps = fp.socket_speed_mbps.filter(|&s| s > 0)?;
    Some((
        mbps as f64 / 8000.0,
        format!(
            "{} at {mbps} Mb/s",
            fp.socket_interface
                .as_deref()
                .unwrap_or("the socket interface")
        ),
    ))
}

/// Everything gang-bandwidth judges.
pub struct BandwidthInput<'a> {
    pub sizes: &'a [SizeRow],
    pub fps: &'a [Option<Fingerprint>],
    pub names: &'a [String],
    /// Connections per transport NCCL logged on this pod.
    pub transports: &'a std::collections::BTreeMap<String, u64>,
    pub matrix: &'a [Vec<Option<f64>>],
    pub straggler: Option<&'a Straggler>,
    /// Nodes that sent a time that is not a finite, non-negative number.
    pub nonsense: &'a [usize],
    /// Measurements the budget left out, with why.
    pub skipped: &'a [String],
}

/// A busbw under this, GB/s (1 MB/s), fails whatever the network figure: the
/// job's network carries next to nothing (issue 31 row 18).
const NEAR_ZERO_GBPS: f64 = 0.001;

/// The nodes any of whose times (`[node][...]`, or `[size][node]` when
/// `by_size`) is NaN, infinite or negative: a peer's numbers are input, never trusted.
pub fn nonsense_nodes(round_seconds: &[Vec<f64>], allreduce_seconds: &[Vec<f64>]) -> Vec<usize> {
    let bad = |t: &f64| !t.is_finite() || *t < 0.0;
    let mut out: Vec<usize> = round_seconds
        .iter()
        .enumerate()
        .filter(|(_, ts)| ts.iter().any(bad))
        .map(|(i, _)| i)
        .collect();
    for size in allreduce_seconds {
        out.extend(
            size.iter()
                .enumerate()
                .filter(|(_, t)| bad(t))
                .map(|(i, _)| i),
        );
    }
    out.sort_unstable();
    out.dedup();
    out
}

pub fn bandwidth(input: &BandwidthInput<'_>) -> Finding {
    let mut evidence = Vec::new();
    let mut problems = Vec::new();
    if !input.nonsense.is_empty() {
        problems.push(Problem::new(
            Severity::Fail,
            format!(
                "{} sent times that are not finite numbers (NaN, infinite or negative); they are left out",
                list(input.nonsense, input.names)
            ),
            "Run the same nccl-preflight in every pod; a pod that sends nonsense is broken or not one of the job's",
        ).blamed(Blame::Job));
    }
    if let Some(b) = best_busbw(input).filter(|b| *b < NEAR_ZERO_GBPS) {
        problems.push(Problem::new(
            Severity::Fail,
            format!("all-reduce busbw {b:.4} GB/s: the network between the pods carries next to nothing"),
            "Check the network between the pods (rate limits, the interface NCCL picks: NCCL_SOCKET_IFNAME) and rerun",
        ));
    }
    evidence.extend(
        input
            .skipped
            .iter()
            .map(|s| format!("not measured within the budget: {s}")),
    );
    for s in input.sizes {
        evidence.push(format!(
            "all-reduce {}: busbw {:.2} GB/s (slowest rank, {:.3} ms)",
            crate::units::format_bytes(s.bytes),
            s.busbw_gbps,
            s.seconds * 1e3
        ));
    }
    let transports: Vec<String> = input
        .transports
        .iter()
        .map(|(t, n)| format!("{t} x{n}"))
        .collect();
    if !transports.is_empty() {
        evidence.push(format!(
            "transports NCCL chose here: {}",
            transports.join(", ")
        ));
    }
    problems.extend(socket_despite_rdma(input));
    against_network(input, &mut evidence, &mut problems);
    if let Some(s) = input.straggler {
        problems.push(straggler_problem(input, s));
    } else if let Some(m) = median(input.matrix) {
        evidence.push(format!(
            "node x node links: median {m:.2} GB/s, no straggler"
        ));
    }
    combine(
        ids::GANG_BANDWIDTH,
        match best_busbw(input) {
            Some(b) => format!("all-reduce across the job: busbw up to {b:.2} GB/s"),
            None => "nothing measured".to_string(),
        },
        evidence,
        problems,
    )
}

/// The highest busbw over the sizes measured.
fn best_busbw(input: &BandwidthInput<'_>) -> Option<f64> {
    input
        .sizes
        .iter()
        .map(|s| s.busbw_gbps)
        .max_by(f64::total_cmp)
}

/// NCCL fell back to TCP sockets although some node has RDMA devices.
fn socket_despite_rdma(input: &BandwidthInput<'_>) -> Option<Problem> {
    let socket = input.transports.keys().any(|t| t.starts_with("NET/Socket"));
    let rdma_nodes: Vec<usize> = input
        .fps
        .iter()
        .enumerate()
        .filter(|(_, f)| f.as_ref().is_some_and(|f| f.rdma_devices > 0))
        .map(|(i, _)| i)
        .collect();
    (socket && !rdma_nodes.is_empty()).then(|| Problem::new(
        Severity::Fail,
        format!(
            "NCCL sends over NET/Socket (TCP) although {} {} RDMA devices",
            list(&rdma_nodes, input.names),
            if rdma_nodes.len() == 1 { "has" } else { "have" }
        ),
        "Give every pod its RDMA devices and the net plugin (vpc.amazonaws.com/efa or rdma/... resources, aws-ofi-nccl in the image), and check nccl-net-plugin and rdma-devices on each pod",
    ).blamed(Blame::Job))
}

/// The best busbw judged against the slowest node's network figure: the job
/// runs at its speed.
fn against_network(
    input: &BandwidthInput<'_>,
    evidence: &mut Vec<String>,
    problems: &mut Vec<Problem>,
) {
    let figures: Vec<(usize, f64, String)> = input
        .fps
        .iter()
        .enumerate()
        .filter_map(|(i, f)| f.as_ref().and_then(node_figure).map(|(g, b)| (i, g, b)))
        .collect();
    let slowest = figures.iter().min_by(|a, b| a.1.total_cmp(&b.1));
    let (Some((node, gbps, basis)), Some(best)) = (slowest, best_busbw(input)) else {
        if !input.sizes.is_empty() {
            evidence.push("no node's network figure is known (no RDMA rate, no interface speed): busbw not judged against one".to_string());
        }
        return;
    };
    let fraction = best / gbps;
    evidence.push(format!(
        "slowest node's network: {:.2} GB/s ({}: {basis}); best busbw is {:.0}% of it",
        gbps,
        node_name(*node, input.names),
        fraction * 100.0
    ));
    let fix = "Check each node's links (ibstat, the rdma rate files, ethtool), the NICs NCCL picks (NCCL_IB_HCA, NCCL_SOCKET_IFNAME) and the transport above";
    let below = |severity, limit: f64| {
        Problem::new(
            severity,
            format!(
                "all-reduce busbw {best:.2} GB/s is under {:.0}% of the slowest node's network ({gbps:.2} GB/s)",
                limit * 100.0
            ),
            fix,
        )
    };
    if fraction < FAIL_FRACTION {
        problems.push(below(Severity::Fail, FAIL_FRACTION));
    } else if fraction < WARN_FRACTION {
        problems.push(below(Severity::Warn, WARN_FRACTION));
    }
}

/// A rate in GB/s with the digits a slow link needs (0.0025, not 0.00).
fn gbps_text(v: f64) -> String {
    if v >= 10.0 {
        format!("{v:.1}")
    } else if v >= 0.1 {
        format!("{v:.2}")
    } else {
        format!("{v:.4}")
    }
}

/// The straggler node, with its NIC facts as evidence.
fn straggler_problem(input: &BandwidthInput<'_>, s: &Straggler) -> Problem {
    let facts = input
        .fps
        .get(s.node)
        .and_then(|f| f.as_ref())
        .map(|f| {
            format!(
                "{} RDMA device(s) [{}], socket {} {}",
                f.rdma_devices,
                f.rdma_rates.join(", "),
                f.socket_interface.as_deref().unwrap_or("?"),
                f.socket_speed_mbps
                    .map_or("speed unknown".to_string(), |m| format!("{m} Mb/s"))
            )
        })
        .unwrap_or_default();
    let mut p = Problem::new(
        Severity::Fail,
        format!(
            "{} is the straggler: every link it exchanges on runs at {} GB/s on average, under {:.0}% of the other links' median {} GB/s",
            node_name(s.node, input.names),
            gbps_text(s.mean_gbps),
            STRAGGLER_FACTOR * 100.0,
            gbps_text(s.median_gbps)
        ),
        "Drain that node or fix its links (a NIC trained at a lower rate, a missing NIC, a rate limit), then rerun",
    );
    p.evidence.push(format!("its NIC facts: {facts}"));
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::finding::Status;

    fn fp(rank: u64, nccl: &str, gpus: u32, algo: &str) -> Option<Fingerprint> {
        Some(Fingerprint {
            node_rank: rank,
            nccl_version: Some(nccl.into()),
            gpus,
            env: [("NCCL_ALGO".to_string(), algo.to_string())].into(),
            checks: [("memlock".to_string(), Status::Pass)].into(),
            local_verdict: Status::Pass,
            ..Fingerprint::default()
        })
    }

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("pod-{i}")).collect()
    }

    fn judge(fps: &[Option<Fingerprint>]) -> Finding {
        consistency(&TableInput {
            rows: &rows(fps),
            fps,
            names: &names(fps.len()),
            unreadable: &[],
        })
    }

    #[test]
    fn agreeing_pods_pass_with_a_count() {
        let fps = vec![fp(0, "2.28.9", 8, "Ring"), fp(1, "2.28.9", 8, "Ring")];
        let r = rows(&fps);
        assert!(r.iter().all(|r| !r.differs()));
        let f = judge(&fps);
        assert_eq!(f.status(), Status::Pass);
        assert!(
            f.summary
                .contains(&format!("agree on all {} fields", r.len())),
            "{}",
            f.summary
        );
    }

    #[test]
    fn differing_version_algo_and_gpu_count_fail_naming_the_odd_pod() {
        let fps = vec![
            fp(0, "2.28.9", 8, "Ring"),
            fp(1, "2.28.9", 8, "Ring"),
            fp(2, "2.21.5", 4, "Tree"),
        ];
        let r = rows(&fps);
        let v = r.iter().find(|r| r.field == "nccl version").unwrap();
        assert_eq!((v.majority.as_str(), v.odd.clone()), ("2.28.9", vec![2]));
        let f = judge(&fps);
        assert_eq!(f.status(), Status::Fail);
        let text = format!("{} {}", f.summary, f.evidence.join("\n"));
        assert!(text.contains("3 problems"), "{text}");
        assert!(
            text.contains("node 2 (pod-2) loads NCCL 2.21.5, the other 2 pod(s) NCCL 2.28.9"),
            "{text}"
        );
        assert!(text.contains("NCCL_ALGO differs across pods"), "{text}");
        assert!(text.contains("node 2 (pod-2) has fewer GPUs"), "{text}");
    }

    #[test]
    fn other_differences_warn_and_a_missing_record_is_shown() {
        let mut b = fp(1, "2.28.9", 8, "Ring");
        b.as_mut().unwrap().libfabric_version = Some("1.22".into());
        let f = judge(&[fp(0, "2.28.9", 8, "Ring"), b]);
        assert_eq!(f.status(), Status::Warn, "{f:?}");
        let r = rows(&[fp(0, "2.28.9", 8, "Ring"), None]);
        assert_eq!(r[0].values[1], "missing");
        // A missing record is neither odd nor a fewer-GPUs node.
        assert!(r.iter().all(|r| !r.differs()), "{r:?}");
        // A pod whose own checks failed fails the job, named.
        let mut c = fp(1, "2.28.9", 8, "Ring");
        c.as_mut().unwrap().local_verdict = Status::Fail;
        c.as_mut()
            .unwrap()
            .checks
            .insert("memlock".into(), Status::Fail);
        c.as_mut()
            .unwrap()
            .summaries
            .insert("memlock".into(), "RLIMIT_MEMLOCK is 8 MiB".into());
        let f = judge(&[fp(0, "2.28.9", 8, "Ring"), c]);
        assert_eq!(f.status(), Status::Fail);
        assert_eq!(
            f.summary,
            "node 1 (pod-1) failed its own checks: memlock: RLIMIT_MEMLOCK is 8 MiB"
        );
        assert!(
            f.evidence.iter().any(|e| e == "check memlock: pass | fail"),
            "{f:?}"
        );
    }

    #[test]
    fn regression_one_count_and_the_unreadable_record_first() {
        // Issue 31 row 16: "agree on all 28 fields" above "agree on 26 of 28".
        let mut b = fp(1, "2.28.9", 8, "Ring");
        b.as_mut()
            .unwrap()
            .checks
            .insert("memlock".into(), Status::Warn);
        let fps = [fp(0, "2.28.9", 8, "Ring"), b];
        let f = judge(&fps);
        assert_eq!(f.status(), Status::Pass, "{f:?}");
        let total = rows(&fps).len();
        assert_eq!(
            f.summary,
            format!(
                "2 node(s) agree on {} of {total} fields; the rest differ only in checks that passed or warned",
                total - 1
            )
        );
        // Issue 31 row 15: a record that does not decode is the headline, not
        // "different NCCL versions" or "fewer GPUs".
        let fps = [fp(0, "2.28.9", 8, "Ring"), fp(1, "2.28.9", 8, "Ring"), None];
        let f = consistency(&TableInput {
            rows: &rows(&fps),
            fps: &fps,
            names: &names(3),
            unreadable: &[(2, "fingerprint version 1".into())],
        });
        assert_eq!(f.status(), Status::Fail);
        assert_eq!(
            f.summary,
            "node 2 (pod-2) sent a record this nccl-preflight cannot read: fingerprint version 1"
        );
        assert!(f.remediation().unwrap().contains("same nccl-preflight"));
        // Issue 31 row 17: the gang's own options are compared.
        let mut odd = fp(1, "2.28.9", 8, "Ring");
        odd.as_mut().unwrap().gang_options = "sizes 1MiB iterations 5".into();
        let f = judge(&[fp(0, "2.28.9", 8, "Ring"), odd]);
        assert_eq!(f.status(), Status::Fail);
        assert!(f.summary.contains("the gang's own options differ"), "{f:?}");
    }

    #[test]
    fn the_schedule_meets_every_pair_once_and_no_node_twice_a_round() {
        assert!(schedule(0).is_empty());
        assert!(schedule(1).is_empty());
        for n in 2..=33 {
            let rounds = schedule(n);
            assert_eq!(rounds.len(), if n % 2 == 0 { n - 1 } else { n }, "n={n}");
            let mut met = std::collections::BTreeMap::new();
            for (r, pairs) in rounds.iter().enumerate() {
                let mut busy = vec![false; n];
                for &(a, b) in pairs {
                    assert!(a < b && b < n, "n={n} round {r}: {a},{b}");
                    assert!(!busy[a] && !busy[b], "n={n} round {r}: a node twice");
                    busy[a] = true;
                    busy[b] = true;
                    *met.entry((a, b)).or_insert(0) += 1;
                    assert_eq!(partner(n, r, a), Some(b));
                    assert_eq!(partner(n, r, b), Some(a));
                }
                // Even: everyone plays; odd: exactly one node sits out.
                let idle = busy.iter().filter(|b| !**b).count();
                assert_eq!(idle, n % 2, "n={n} round {r}");
                for (i, b) in busy.iter().enumerate() {
                    if !b {
                        assert_eq!(partner(n, r, i), None);
                    }
                }
            }
            assert_eq!(met.len(), n * (n - 1) / 2, "n={n}");
            assert!(met.values().all(|&c| c == 1), "n={n}");
        }
        assert_eq!(partner(4, 3, 0), None);
    }

    /// Round times for `n` nodes where every exchange takes `base` seconds, and
    /// `slow(a, b)` seconds where it says so.
    fn times(n: usize, base: f64, slow: impl Fn(usize, usize) -> Option<f64>) -> Vec<Vec<f64>> {
        let rounds = schedule(n);
        let mut secs = vec![vec![0.0; rounds.len()]; n];
        for (r, pairs) in rounds.iter().enumerate() {
            for &(a, b) in pairs {
                let t = slow(a, b).unwrap_or(base);
                secs[a][r] = t;
                // The other end saw the same exchange a little faster.
                secs[b][r] = t * 0.99;
            }
        }
        secs
    }

    #[test]
    fn matrix_median_and_straggler_maths() {
        // 4 nodes, node 2's links at 1 GB/s, the rest at 10 GB/s; 1e9 bytes per send.
        let slow2 = |a: usize, b: usize| (a == 2 || b == 2).then_some(1.0);
        let m = matrix(&times(4, 0.1, slow2), 1_000_000_000);
        for (i, row) in m.iter().enumerate() {
            assert_eq!(row[i], None);
            for (j, cell) in row.iter().enumerate() {
                assert_eq!(*cell, m[j][i], "symmetric");
            }
        }
        // The slower end's time is the link's.
        assert_eq!(m[0][1], Some(10.0));
        assert_eq!(m[2][0], Some(1.0));
        assert_eq!(links(&m).len(), 6);
        assert_eq!(median(&m), Some(5.5));
        let s = straggler(&m).unwrap();
        assert_eq!(s.node, 2);
        assert!((s.mean_gbps - 1.0).abs() < 1e-9);
        assert!((s.median_gbps - 10.0).abs() < 1e-9);
        // 3 nodes: the slow node holds 2 of the 3 links, and is still named.
        let m3 = matrix(&times(3, 0.1, slow2), 1_000_000_000);
        assert_eq!(straggler(&m3).map(|s| s.node), Some(2));
        // 5 nodes (one idle per round), node 0 slow.
        let slow0 = |a: usize, _| (a == 0).then_some(0.5);
        let m5 = matrix(&times(5, 0.1, slow0), 1_000_000_000);
        assert_eq!(links(&m5).len(), 10);
        assert_eq!(straggler(&m5).map(|s| s.node), Some(0));
        // One slow link between two healthy nodes names neither of them.
        let one = |a: usize, b: usize| (a == 0 && b == 1).then_some(1.0);
        assert!(straggler(&matrix(&times(4, 0.1, one), 1_000_000_000)).is_none());
        // Just above the factor is no straggler: links at 0.6 of the others' median.
        let mild = |a: usize, b: usize| (a == 2 || b == 2).then_some(0.1 / 0.6);
        assert!(straggler(&matrix(&times(4, 0.1, mild), 1_000_000_000)).is_none());
        // A uniform fabric has none; neither has a 2-node gang (either end could be slow).
        assert!(straggler(&matrix(&times(6, 0.1, |_, _| None), 1_000_000_000)).is_none());
        let two = matrix(&times(2, 0.1, |_, _| Some(1.0)), 1_000_000_000);
        assert_eq!(two[0][1], Some(1.0));
        assert!(straggler(&two).is_none());
        // A link nobody timed is unmeasured, and its nodes cannot be named.
        let mut gap = times(4, 0.1, slow2);
        for row in &mut gap {
            row[0] = 0.0;
        }
        let g = matrix(&gap, 1_000_000_000);
        assert_eq!(links(&g).len(), 4);
        assert!(median(&matrix(&[vec![]], 1)).is_none());
    }

    #[test]
    fn busbw_factor_and_bandwidth_verdicts() {
        // A slow link keeps its digits (it printed 0.00 GB/s at 20 Mbit/s).
        assert_eq!(gbps_text(0.0025), "0.0025");
        assert_eq!(gbps_text(0.48), "0.48");
        assert_eq!(gbps_text(295.04), "295.0");
        let row = size_row(1_000_000_000, 0.1, 4);
        assert!((row.algbw_gbps - 10.0).abs() < 1e-9);
        assert!((row.busbw_gbps - 15.0).abs() < 1e-9);
        let mut a = fp(0, "2.28.9", 1, "Ring").unwrap();
        a.rdma_devices = 1;
        a.rdma_rates = vec!["400 Gb/sec (4X NDR)".into()];
        let fps = vec![Some(a.clone()), Some(a)];
        let m = vec![vec![None, Some(40.0)], vec![Some(40.0), None]];
        let sockets = [("NET/Socket".to_string(), 2u64)].into();
        let f = bandwidth(&BandwidthInput {
            sizes: &[size_row(1_000_000_000, 0.1, 2)],
            fps: &fps,
            names: &names(2),
            transports: &sockets,
            matrix: &m,
            straggler: None,
            nonsense: &[],
            skipped: &[],
        });
        assert_eq!(f.status(), Status::Fail);
        assert!(
            f.evidence.iter().any(|e| e
                .contains("NET/Socket (TCP) although node 0 (pod-0), node 1 (pod-1) have RDMA")),
            "{f:?}"
        );
        // 10 GB/s of a 50 GB/s figure: 20 %, grossly low.
        assert!(f.evidence.iter().any(|e| e.contains("under 25%")), "{f:?}");
        let ib = [("NET/IB".to_string(), 2u64)].into();
        let ok = bandwidth(&BandwidthInput {
            sizes: &[size_row(1_000_000_000, 0.025, 2)],
            fps: &fps,
            names: &names(2),
            transports: &ib,
            matrix: &m,
            straggler: None,
            nonsense: &[],
            skipped: &[],
        });
        assert_eq!(ok.status(), Status::Pass, "{ok:?}");
        // No figure: measured, not judged.
        let plain = vec![fp(0, "2.28.9", 1, "Ring"), fp(1, "2.28.9", 1, "Ring")];
        let none = bandwidth(&BandwidthInput {
            sizes: &[size_row(1_000_000, 0.1, 2)],
            fps: &plain,
            names: &names(2),
            transports: &sockets,
            matrix: &m,
            straggler: None,
            nonsense: &[],
            skipped: &[],
        });
        assert_eq!(none.status(), Status::Pass);
        assert!(none.evidence.iter().any(|e| e.contains("not judged")));
        // Issue 31 row 18: zero busbw fails with no figure; a NaN from a peer is named.
        let zero = bandwidth(&BandwidthInput {
            sizes: &[size_row(1000, 1e6, 2)],
            fps: &plain,
            names: &names(2),
            transports: &sockets,
            matrix: &m,
            straggler: None,
            nonsense: &nonsense_nodes(
                &[vec![0.1], vec![f64::NAN]],
                &[vec![0.1, f64::NEG_INFINITY]],
            ),
            skipped: &[],
        });
        assert_eq!(zero.status(), Status::Fail);
        assert!(
            zero.evidence.iter().any(|e| e.contains("next to nothing")),
            "{zero:?}"
        );
        assert!(
            zero.summary
                .contains("node 1 (pod-1) sent times that are not finite"),
            "{zero:?}"
        );
    }
}
