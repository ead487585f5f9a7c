//! The pairwise exchange schedule (pure): which node pairs meet in which round,
//! so that the node x node matrix takes N - 1 rounds (N for odd N) and no node
//! waits on a third node's link within a round.

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

/// Node `node`'s partner among one round's `pairs`, None when it sits out.
pub fn partner(pairs: &[(usize, usize)], node: usize) -> Option<usize> {
    pairs.iter().find_map(|&(a, b)| {
        if a == node {
            Some(b)
        } else if b == node {
            Some(a)
        } else {
            None
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
                    assert_eq!(partner(pairs, a), Some(b));
                    assert_eq!(partner(pairs, b), Some(a));
                }
                // Even: everyone plays; odd: exactly one node sits out.
                let idle = busy.iter().filter(|b| !**b).count();
                assert_eq!(idle, n % 2, "n={n} round {r}");
                for (i, b) in busy.iter().enumerate() {
                    if !b {
                        assert_eq!(partner(pairs, i), None);
                    }
                }
            }
            assert_eq!(met.len(), n * (n - 1) / 2, "n={n}");
            assert!(met.values().all(|&c| c == 1), "n={n}");
        }
        assert!(schedule(4).get(3).is_none());
    }
}
