//! The measurements under the budget the deadline leaves: a pairwise probe of
//! every node pair at a small size first, then, from what the probe says of the
//! slowest link (`budget`), the all-reduce sizes and a larger pairwise size that fit
//! what is left. What was measured before a stop is kept in the shared result.

use super::budget::{Budget, SAFETY, finite, finite_neg, from_bytes, to_bytes};
use super::comms::{Gang, Pairs, Stop, alloc, gather_per_node, max_over_ranks, timed};
use super::{Plan, Shared};
use crate::gang::verdict::bandwidth::size_row;
use crate::gang::verdict::schedule::{partner, schedule};
use crate::vendor::nccl::{DataType, IN_PROGRESS, RedOp, SUCCESS};
use std::time::Instant;

/// Timed repetitions of the probe, after its warm-up.
const PROBE_ITERATIONS: u32 = 2;

/// Seconds left before the deadline on the rank with the least left (the same on
/// every rank: an all-reduce of the negated figure).
fn least_left(gang: &Gang<'_>) -> Result<f64, Stop> {
    let left = gang
        .deadline
        .saturating_duration_since(Instant::now())
        .as_secs_f64();
    let worst = max_over_ranks(gang, &[-left], "the budget exchange")?;
    Ok(-worst.first().copied().and_then(finite_neg).unwrap_or(0.0))
}

/// The pairwise probe, then the all-reduce sizes and the larger pairwise size
/// that fit the budget; everything measured is kept in `shared` as it comes.
pub(super) fn measure(gang: &Gang<'_>, plan: &Plan, shared: &Shared) -> Result<(), Stop> {
    let largest = plan
        .sizes
        .iter()
        .copied()
        .chain([plan.p2p_bytes, plan.probe_bytes, 4])
        .max()
        .unwrap_or(4) as usize;
    let mut bufs = Vec::new();
    for gpu in gang.gpus {
        bufs.push((alloc(gang, gpu, largest)?, alloc(gang, gpu, largest)?));
    }
    let probe = pairwise_rounds(
        gang,
        plan,
        shared,
        &bufs,
        plan.probe_bytes,
        PROBE_ITERATIONS,
    )?;
    let per_node = share_rounds(gang, plan, &probe, plan.probe_bytes, shared)?;
    // Kept back for the exchanges after the last measurement and the final barrier.
    let reserve = 1.0 + plan.timeout_ms as f64 / 1e3 * 0.1;
    let mut budget = Budget::from_probe(&per_node, plan.probe_bytes, least_left(gang)? - reserve);
    all_reduce_sizes(gang, plan, shared, &bufs, &mut budget)?;
    if plan.p2p_bytes <= plan.probe_bytes {
        return Ok(());
    }
    let rounds = schedule(plan.nodes as usize).len() as f64;
    let each = budget.each(plan.p2p_bytes as f64);
    let reps = f64::from(plan.iterations.max(1) + 1);
    budget.left = least_left(gang)? - reserve;
    if budget.take(rounds * reps * each) {
        let times = pairwise_rounds(gang, plan, shared, &bufs, plan.p2p_bytes, plan.iterations)?;
        share_rounds(gang, plan, &times, plan.p2p_bytes, shared)?;
    } else {
        shared.update(|r| {
            r.skipped.push(format!(
                "pairwise exchanges of {}: about {:.1} s estimated from the probe, {:.1} s left",
                crate::units::format_bytes(plan.p2p_bytes),
                rounds * reps * each * SAFETY,
                budget.left.max(0.0)
            ))
        });
    }
    Ok(())
}

/// Every node's round times to every rank (an all-gather of R doubles per rank),
/// kept in `shared` as the matrix's source for `bytes`; a time that is no number
/// is None from here on.
fn share_rounds(
    gang: &Gang<'_>,
    plan: &Plan,
    rounds: &[f64],
    bytes: u64,
    shared: &Shared,
) -> Result<Vec<Vec<Option<f64>>>, Stop> {
    let per_node: Vec<Vec<Option<f64>>> = gather_per_node(
        gang,
        &to_bytes(rounds),
        plan.nodes as usize,
        "the round-time all-gather",
    )?
    .iter()
    .map(|b| from_bytes(b).into_iter().map(finite).collect())
    .collect();
    shared.snapshot(|r| {
        r.p2p_bytes = bytes;
        r.round_seconds = per_node.clone();
    });
    Ok(per_node)
}

/// The all-reduce at each size the budget allows; every node's time is shared,
/// and the row keeps the slowest node's (nccl-tests averages; a straggler's view is the max).
fn all_reduce_sizes(
    gang: &Gang<'_>,
    plan: &Plan,
    shared: &Shared,
    bufs: &Pairs<'_>,
    budget: &mut Budget,
) -> Result<(), Stop> {
    let nodes = plan.nodes as usize;
    let nranks = (nodes * gang.gpus.len()) as u64;
    let mut sizes = plan.sizes.clone();
    sizes.sort_unstable();
    let reps = f64::from(plan.iterations.max(1) + 1);
    for bytes in sizes {
        // Through the slowest link at worst.
        let moved = Budget::moved(nodes, bytes);
        let each = budget.each(moved);
        if !budget.take(reps * each) {
            shared.update(|r| {
                r.skipped.push(format!(
                    "all-reduce of {}: about {:.1} s estimated from the probe, {:.1} s left",
                    crate::units::format_bytes(bytes),
                    reps * each * SAFETY,
                    budget.left.max(0.0)
                ))
            });
            continue;
        }
        shared.update(|r| r.stage = format!("all-reduce of {bytes} bytes"));
        let count = bytes as usize / 4;
        let op = |g: usize| {
            let (send, recv) = &bufs[g];
            let (comm, gpu) = (&gang.comms[g], &gang.gpus[g]);
            gang.nccl
                .all_reduce(send, recv, count, DataType::F32, RedOp::Sum, comm, gpu)
        };
        let t = timed(
            gang,
            plan.iterations.max(1),
            "a warm-up all-reduce",
            "an all-reduce",
            op,
        )?;
        let per_node =
            gather_per_node(gang, &to_bytes(&[t]), nodes, "the all-reduce time exchange")?;
        let times: Vec<Option<f64>> = per_node
            .iter()
            .map(|b| from_bytes(b).first().copied().and_then(finite))
            .collect();
        let slowest = times.iter().flatten().copied().fold(0.0, f64::max);
        // The probe's small exchanges understate a fast link (latency dominates 1 MiB):
        // what the all-reduce just moved through the slowest rank is a better rate for
        // the next estimates, and every rank computes it from the same gathered times.
        budget.learn(moved, slowest);
        shared.snapshot(|r| {
            r.allreduce.push(size_row(bytes, slowest, nranks));
            r.allreduce_seconds.push(times);
        });
    }
    Ok(())
}

/// Pairwise rounds (`verdict::schedule`): in each round the nodes meet in
/// disjoint pairs and both ends of a pair send to and receive from each other in
/// one group, GPU g to GPU g (rail-aligned), so a round's time is that link's
/// alone. One untimed warm-up per round: NCCL connects p2p peers lazily (since
/// v2.22.3-1), and the warm-up cannot end before the partner has finished its
/// previous round, which lines the pair up before the timed exchanges. A node
/// that sits the round out (odd N) records 0. Returns this node's round times.
fn pairwise_rounds(
    gang: &Gang<'_>,
    plan: &Plan,
    shared: &Shared,
    bufs: &Pairs<'_>,
    bytes: u64,
    iterations: u32,
) -> Result<Vec<f64>, Stop> {
    let local = gang.gpus.len();
    let schedule = schedule(plan.nodes as usize);
    let mut rounds = vec![0f64; schedule.len().max(1)];
    let node = plan.node_rank as usize;
    let p2p = bytes as usize;
    for (r, pairs) in schedule.iter().enumerate() {
        let Some(peer) = partner(pairs, node) else {
            continue;
        };
        shared.update(|res| res.stage = format!("pairwise round {} with node {peer}", r + 1));
        // Send and receive sit in one group, so the two ends of the pair do not deadlock.
        let op = |g: usize| {
            let (send, recv) = &bufs[g];
            let (comm, gpu) = (&gang.comms[g], &gang.gpus[g]);
            let rc = gang.nccl.send(send, p2p, peer * local + g, comm, gpu);
            if rc != SUCCESS && rc != IN_PROGRESS {
                return rc;
            }
            gang.nccl.recv(recv, p2p, peer * local + g, comm, gpu)
        };
        rounds[r] = timed(
            gang,
            iterations.max(1),
            "a warm-up pairwise exchange",
            "a pairwise exchange",
            op,
        )?;
    }
    Ok(rounds)
}
