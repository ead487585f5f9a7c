//! NCCL_IB_HCA as NCCL reads it (src/transport/net_ib.cc with the list parser in
//! src/misc/utils.cc): a leading `^` excludes, then `=` asks for exact names;
//! entries are `device[:port]`; without `=` each name is a prefix, so `mlx5_1`
//! also matches mlx5_10..19 (FACTS.md section 3).

/// A parsed NCCL_IB_HCA value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HcaFilter {
    pub exclude: bool,
    pub exact: bool,
    /// (name or prefix, port) pairs.
    pub entries: Vec<(String, Option<u32>)>,
}

impl HcaFilter {
    pub fn parse(value: &str) -> HcaFilter {
        let (exclude, rest) = value
            .strip_prefix('^')
            .map_or((false, value), |r| (true, r));
        let (exact, rest) = rest.strip_prefix('=').map_or((false, rest), |r| (true, r));
        let entries = rest
            .split(',')
            .filter_map(|e| {
                let mut parts = e.split(':');
                let name = parts.next()?.trim();
                (!name.is_empty()).then(|| {
                    (
                        name.to_string(),
                        parts.next().and_then(|p| p.trim().parse().ok()),
                    )
                })
            })
            .collect();
        HcaFilter {
            exclude,
            exact,
            entries,
        }
    }

    /// Whether `entry` matches device `name` (ports aside).
    pub fn entry_matches(&self, entry: &str, name: &str) -> bool {
        if self.exact {
            name == entry
        } else {
            name.starts_with(entry)
        }
    }

    /// Whether NCCL uses `port` of device `name` under this filter.
    pub fn admits(&self, name: &str, port: u32) -> bool {
        let listed = self.entries.is_empty()
            || self
                .entries
                .iter()
                .any(|(e, p)| self.entry_matches(e, name) && p.is_none_or(|p| p == port));
        listed != self.exclude
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_exact_names_and_ports() {
        let f = HcaFilter::parse("mlx5_1");
        assert!(f.admits("mlx5_1", 1) && f.admits("mlx5_10", 1) && !f.admits("mlx5_2", 1));
        let f = HcaFilter::parse("=mlx5_1:1,mlx5_3");
        assert!(
            f.admits("mlx5_1", 1)
                && !f.admits("mlx5_1", 2)
                && !f.admits("mlx5_10", 1)
                && f.admits("mlx5_3", 2)
        );
        let f = HcaFilter::parse("^mlx5_0");
        assert!(!f.admits("mlx5_0", 1) && !f.admits("mlx5_01", 1) && f.admits("mlx5_1", 1));
        assert_eq!(HcaFilter::parse("").entries, vec![]);
    }
}
