//! Namespace identities (/proc/self/ns/*) and NCCL's host identity (hostname, boot_id).

use super::host::Host;
use crate::facts::{FactError, NamespaceFacts, Observed};

/// Parses a namespace link target such as `ipc:[4026531839]` into its inode.
fn parse_ns_link(target: &str, kind: &str) -> Result<u64, String> {
    target
        .strip_prefix(kind)
        .and_then(|r| r.strip_prefix(":["))
        .and_then(|r| r.strip_suffix(']'))
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| format!("unexpected link target {target:?}"))
}

fn ns_inode(host: &Host, kind: &str) -> Observed<u64> {
    let abs = format!("/proc/self/ns/{kind}");
    let source = || host.path(&abs).display().to_string();
    match host.read_link(&abs) {
        Ok(Some(target)) => match parse_ns_link(&target, kind) {
            Ok(inode) => Observed::Value(inode),
            Err(e) => Observed::Error(FactError::new(source(), e)),
        },
        Ok(None) => Observed::Error(FactError::new(source(), "missing")),
        Err(e) => Observed::Error(e),
    }
}

/// A one-line proc file, trimmed; empty or missing is an error.
fn one_line(host: &Host, abs: &str) -> Observed<String> {
    host.parse_required(abs, |text| match text.lines().next().map(str::trim) {
        Some(line) if !line.is_empty() => Ok(line.to_string()),
        _ => Err("empty".to_string()),
    })
}

pub fn gather(host: &Host) -> NamespaceFacts {
    NamespaceFacts {
        ipc: ns_inode(host, "ipc"),
        uts: ns_inode(host, "uts"),
        net: ns_inode(host, "net"),
        hostname: one_line(host, "/proc/sys/kernel/hostname"),
        boot_id: one_line(host, "/proc/sys/kernel/random/boot_id"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_namespace_links() {
        assert_eq!(parse_ns_link("ipc:[4026531839]", "ipc"), Ok(4026531839));
        assert!(parse_ns_link("uts:[4026531838]", "ipc").is_err());
        assert!(parse_ns_link("ipc:[]", "ipc").is_err());
        assert!(parse_ns_link("ipc:[99999999999999999999999]", "ipc").is_err());
    }
}
