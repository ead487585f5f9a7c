//! gang-bandwidth (pure): the all-reduce busbw against the slowest node's network
//! figure, the transport NCCL chose, the straggler, and the times a peer sent that
//! no run can give.

use super::matrix::{STRAGGLER_FACTOR, Straggler, median};
use super::{list, node_name};
use crate::finding::{Blame, Finding, Problem, Severity, combine, ids};
use crate::gang::fingerprint::Fingerprint;
use serde::Serialize;

/// All-reduce busbw below this fraction of the slowest node's figure warns (the
/// sysfs figure can be off by 2x on EFA: research notes section 6)...
const WARN_FRACTION: f64 = 0.5;
/// ...and below this one fails (grossly low whatever the sysfs caveat).
const FAIL_FRACTION: f64 = 0.25;

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
        // A peer's rate text is input: "inf Gb/sec" is no figure.
        if gbits > 0.0 && gbits.is_finite() {
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

/// The nodes any of whose times (`[node][...]`, or `[size][node]` for the
/// all-reduce) is not a number a run can give: not finite (a NaN or an infinity comes
/// through JSON as null), negative, or longer than the whole measurement may take
/// (`limit`, seconds). A peer's numbers are input, never trusted.
pub fn nonsense_nodes(
    round_seconds: &[Vec<Option<f64>>],
    allreduce_seconds: &[Vec<Option<f64>>],
    limit: f64,
) -> Vec<usize> {
    let bad = |t: &Option<f64>| t.is_none_or(|t| !t.is_finite() || t < 0.0 || t > limit);
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
                "{} sent times that are not numbers a run can give (NaN, infinite, negative or longer than the gang's timeout); they are left out",
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

    fn fp(rank: u64) -> Option<Fingerprint> {
        Some(Fingerprint {
            node_rank: rank,
            nccl_version: Some("2.28.9".into()),
            gpus: 1,
            ..Fingerprint::default()
        })
    }

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("pod-{i}")).collect()
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
        let mut a = fp(0).unwrap();
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
        let plain = vec![fp(0), fp(1)];
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
                &[vec![Some(0.1)], vec![None]],
                &[vec![Some(0.1), Some(-1.0)]],
                10.0,
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
                .contains("node 1 (pod-1) sent times that are not numbers a run can give"),
            "{zero:?}"
        );
    }
}
