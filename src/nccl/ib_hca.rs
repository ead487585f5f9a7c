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
    /// Parses a value as NCCL does: nothing is trimmed, so a space after a comma is part
    /// of the next name (which then matches no device).
    pub fn parse(value: &str) -> HcaFilter {
        let (exclude, rest) = value
            .strip_prefix('^')
            .map_or((false, value), |r| (true, r));
        let (exact, rest) = rest.strip_prefix('=').map_or((false, rest), |r| (true, r));
        HcaFilter {
            exclude,
            exact,
            entries: parse_string_list(rest),
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

/// At most this many entries are read (src/transport/net_ib.cc `MAX_IB_DEVS`, 32 since 2.12).
const MAX_ENTRIES: usize = 32;

/// src/misc/utils.cc parseStringList: the bytes before ',' or ':' are a name (empty names
/// are skipped); after ':' the port is `atoi` of the rest, and everything up to the next
/// ',' is dropped.
fn parse_string_list(list: &str) -> Vec<(String, Option<u32>)> {
    list.split(',')
        .filter_map(|entry| {
            let (name, port) = match entry.split_once(':') {
                Some((n, p)) => (n, Some(atoi(p))),
                None => (entry, None),
            };
            (!name.is_empty()).then(|| (name.to_string(), port_number(port)))
        })
        .take(MAX_ENTRIES)
        .collect()
}

/// C's atoi: leading whitespace, a sign, digits; anything else ends it (0 when none).
fn atoi(text: &str) -> i64 {
    let t = text.trim_start();
    let (sign, digits) = match t.strip_prefix('-') {
        Some(rest) => (-1, rest),
        None => (1, t.strip_prefix('+').unwrap_or(t)),
    };
    let end = digits
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(digits.len());
    sign * digits[..end]
        .parse::<i64>()
        .unwrap_or(0)
        .min(i64::from(u32::MAX))
}

/// An entry's port as NCCL's matchPort reads it: -1 (or no ':') is any port; a port
/// number no device has (0, negative) matches none, kept as 0.
fn port_number(port: Option<i64>) -> Option<u32> {
    match port {
        None | Some(-1) => None,
        Some(p) => Some(u32::try_from(p).unwrap_or(0)),
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

    #[test]
    fn nothing_is_trimmed_and_ports_are_atoi() {
        let f = HcaFilter::parse("=mlx5_0:1, mlx5_1:1");
        assert_eq!(f.entries[1], (" mlx5_1".to_string(), Some(1)));
        assert!(f.admits("mlx5_0", 1) && !f.admits("mlx5_1", 1));
        // "mlx5_0:" is port atoi("") = 0, which no port is; ":-1" is any port.
        let f = HcaFilter::parse("mlx5_0:,mlx5_1:-1,mlx5_2:x");
        assert!(!f.admits("mlx5_0", 1) && f.admits("mlx5_1", 2) && !f.admits("mlx5_2", 1));
        // "^" alone excludes everything (an empty list matches all, then negated).
        assert!(!HcaFilter::parse("^").admits("mlx5_0", 1));
        assert_eq!(
            HcaFilter::parse(&"d,".repeat(40)).entries.len(),
            MAX_ENTRIES
        );
    }
}
