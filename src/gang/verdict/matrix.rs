//! The node x node matrix from every node's pairwise round times (pure), its
//! median and the straggler it names.

use super::schedule::schedule;
use serde::Serialize;

/// A node is the straggler when every one of its links (pairwise exchanges, both
/// directions at once) runs below this fraction of the median of the links that
/// do not touch it: a healthy fabric's pairs differ by a few percent (rail-aligned rings), a link
/// trained at half rate or a NIC missing from the pod shows as 2x or worse.
pub(crate) const STRAGGLER_FACTOR: f64 = 0.5;

/// The node x node matrix in GB/s from each node's round times: `seconds[i][r]`
/// is node i's time, in round r of `schedule(N)`, to send `bytes` to its partner
/// while receiving as many from it (0 when it sat out, None when it sent no number). Both ends timed the same
/// exchange: the link's time is the slower end's, and the matrix is symmetric.
pub fn matrix(seconds: &[Vec<Option<f64>>], bytes: u64) -> Vec<Vec<Option<f64>>> {
    let n = seconds.len();
    let mut m = vec![vec![None; n]; n];
    let valid = |i: usize, r: usize| {
        seconds[i]
            .get(r)
            .copied()
            .flatten()
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Round times for `n` nodes where every exchange takes `base` seconds, and
    /// `slow(a, b)` seconds where it says so.
    fn times(
        n: usize,
        base: f64,
        slow: impl Fn(usize, usize) -> Option<f64>,
    ) -> Vec<Vec<Option<f64>>> {
        let rounds = schedule(n);
        let mut secs = vec![vec![Some(0.0); rounds.len()]; n];
        for (r, pairs) in rounds.iter().enumerate() {
            for &(a, b) in pairs {
                let t = slow(a, b).unwrap_or(base);
                secs[a][r] = Some(t);
                // The other end saw the same exchange a little faster.
                secs[b][r] = Some(t * 0.99);
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
            row[0] = None;
        }
        let g = matrix(&gap, 1_000_000_000);
        assert_eq!(links(&g).len(), 4);
        assert!(median(&matrix(&[vec![]], 1)).is_none());
    }
}
