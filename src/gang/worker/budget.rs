//! What the measurements cost and what fits (pure): every rank decides from the
//! same all-gathered numbers, so every rank runs the same collectives. A peer's
//! numbers are input: a time that is not a finite, non-negative number is no time.

use crate::gang::verdict::matrix::{links, matrix};

/// Estimates are multiplied by this before they are held against the budget.
pub const SAFETY: f64 = 2.0;

/// A time from the wire as a number a run can give, or None.
pub fn finite(t: f64) -> Option<f64> {
    (t.is_finite() && t >= 0.0).then_some(t)
}

/// A negated time from the wire (the budget exchange's), kept only when its
/// negation is a time.
pub fn finite_neg(t: f64) -> Option<f64> {
    finite(-t).map(|x| -x)
}

pub fn to_bytes(values: &[f64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_ne_bytes()).collect()
}

pub fn from_bytes(bytes: &[u8]) -> Vec<f64> {
    bytes
        .chunks_exact(8)
        .map(|c| f64::from_ne_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
        .collect()
}

/// What the budget left, decided from numbers every rank shares.
#[derive(Debug, Clone, PartialEq)]
pub struct Budget {
    /// Seconds still to spend on measurements.
    pub left: f64,
    /// The slowest link the probe saw, bytes per second.
    pub slowest: f64,
    /// The probe's slowest exchange, seconds: a floor for any exchange's time.
    latency: f64,
}

impl Budget {
    /// The budget after the probe: `per_node` is every node's probe round times
    /// (`bytes` each way), `left` the seconds left on the rank with the least.
    pub fn from_probe(per_node: &[Vec<Option<f64>>], bytes: u64, left: f64) -> Budget {
        let slowest_gbps = links(&matrix(per_node, bytes))
            .into_iter()
            .fold(f64::INFINITY, f64::min);
        let latency = per_node
            .iter()
            .flatten()
            .filter_map(|t| *t)
            .fold(0.0, f64::max);
        Budget {
            left,
            slowest: slowest_gbps * 1e9,
            latency,
        }
    }

    /// Takes `seconds` (times SAFETY) from the budget when they fit.
    pub fn take(&mut self, seconds: f64) -> bool {
        let cost = seconds * SAFETY;
        if cost.is_finite() && cost <= self.left {
            self.left -= cost;
            true
        } else {
            false
        }
    }

    /// One exchange that moves `bytes` through the slowest link, seconds.
    pub fn each(&self, bytes: f64) -> f64 {
        (bytes / self.slowest).max(self.latency)
    }

    /// What a ring all-reduce of `bytes` over `nodes` moves through each rank:
    /// 2(n-1)/n of the buffer (nccl-tests src/all_reduce.cu).
    pub fn moved(nodes: usize, bytes: u64) -> f64 {
        let n = nodes.max(1) as f64;
        2.0 * (n - 1.0) / n * bytes as f64
    }

    /// A faster rate learnt from what an all-reduce moved in `seconds` (the probe's
    /// small exchanges understate a fast link).
    pub fn learn(&mut self, moved: f64, seconds: f64) {
        if seconds > 0.0 && seconds.is_finite() {
            self.slowest = self.slowest.max(moved / seconds);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gang::verdict::schedule::schedule;

    /// Probe times for `n` nodes, every exchange `t` seconds.
    fn probe(n: usize, t: Option<f64>) -> Vec<Vec<Option<f64>>> {
        let rounds = schedule(n).len();
        vec![vec![t; rounds]; n]
    }

    #[test]
    fn the_probe_gives_the_slowest_link_and_a_latency_floor() {
        // 1 MiB each way in 10 ms: about 105 MB/s.
        let b = Budget::from_probe(&probe(4, Some(0.01)), 1 << 20, 20.0);
        assert!(
            (b.slowest - (1u64 << 20) as f64 / 0.01).abs() < 1.0,
            "{b:?}"
        );
        assert_eq!(b.latency, 0.01);
        // A tiny exchange costs at least the latency; a large one its bytes at the rate.
        assert_eq!(b.each(8.0), 0.01);
        assert!((b.each(b.slowest * 3.0) - 3.0).abs() < 1e-9);
        assert!((Budget::moved(4, 1000) - 1500.0).abs() < 1e-9);
    }

    #[test]
    fn take_spends_only_what_fits_and_never_a_non_number() {
        let mut b = Budget {
            left: 10.0,
            slowest: 1e9,
            latency: 0.0,
        };
        assert!(b.take(4.0));
        assert_eq!(b.left, 2.0);
        assert!(!b.take(1.5));
        assert!(!b.take(f64::NAN));
        assert!(!b.take(f64::INFINITY));
        assert_eq!(b.left, 2.0);
        b.learn(4e9, 2.0);
        assert_eq!(b.slowest, 2e9);
        b.learn(1.0, f64::NAN);
        b.learn(1.0, 0.0);
        assert_eq!(b.slowest, 2e9);
    }

    /// Issue 39's re-run, ±inf/NaN from a gang peer: a peer whose probe times are no
    /// numbers (None after the wire) is left out of the estimates; the budget stays
    /// a number and the same on every rank.
    #[test]
    fn regression_a_peers_nonsense_times_leave_the_estimates_numbers() {
        let mut times = probe(4, Some(0.01));
        times[2] = vec![None; times[2].len()];
        let b = Budget::from_probe(&times, 1 << 20, 20.0);
        assert!(b.slowest.is_finite() && b.slowest > 0.0, "{b:?}");
        assert_eq!(b.latency, 0.01);
        for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -1.0] {
            assert_eq!(finite(bad), None, "{bad}");
        }
        assert_eq!(finite(0.0), Some(0.0));
        // The budget exchange all-reduces the negated seconds left (a max): a peer's
        // NaN or infinity, or a negative time left, is no figure (0 s left).
        for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 1.0] {
            assert_eq!(finite_neg(bad), None, "{bad}");
        }
        assert_eq!(finite_neg(-2.5), Some(-2.5));
        assert_eq!(from_bytes(&to_bytes(&[1.5, -2.0])), [1.5, -2.0]);
        // Every time nonsense: no rate is known, so an estimate is the latency floor
        // (none either: 0) and the plan runs under the deadline; still no NaN anywhere.
        let mut none = Budget::from_probe(&probe(4, None), 1 << 20, 20.0);
        assert_eq!(none.each(1e6), 0.0);
        assert!(none.take(none.each(1e6)));
        assert_eq!(none.left, 20.0);
    }
}
