//! `Policy`: what the user asked the judge to enforce (`--ignore`, `--require`,
//! thresholds), validated from flag text into typed values.

use crate::facts::Limit;
use crate::units;
use std::collections::BTreeSet;

/// A threshold, and whether the user set it (an explicit threshold turns "below" and
/// "could not determine" into failures even where the default policy only warns).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Threshold<T> {
    pub value: T,
    pub explicit: bool,
}

/// `--require` items this version understands.
const REQUIREMENTS: &[&str] = &[
    "host-ipc", "gpus=N", "nvlink", "rdma", "rdma=N", "efa", "efa=N",
];

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Requirements {
    /// The pod must share the host's IPC namespace (`hostIPC: true`).
    pub host_ipc: bool,
    /// At least this many GPUs must be visible.
    pub gpus: Option<u32>,
    /// GPUs must share active NVLinks.
    pub nvlink: bool,
    /// At least one usable RDMA device.
    pub rdma: bool,
    /// `rdma=N`: at least this many RDMA devices usable from this container.
    pub rdma_count: Option<u32>,
    /// Usable EFA devices, with libfabric's efa provider and the NCCL plugin: as many as
    /// the instance type gives the pod's GPUs (p5: 4 a GPU), or at least one off the table.
    pub efa: bool,
    /// `efa=N`: at least this many EFA devices usable from this container.
    pub efa_count: Option<u32>,
}

impl Requirements {
    /// Any RDMA requirement (`rdma`, `efa`, with or without a count).
    pub fn any_rdma(&self) -> bool {
        self.rdma || self.efa
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// Check ids whose failures become warnings.
    pub ignore: BTreeSet<String>,
    /// `--ignore all`.
    pub ignore_all: bool,
    pub require: Requirements,
    /// Minimum /dev/shm size in bytes; default 1 GiB (NCCL docs: `--shm-size=1g`).
    pub min_shm: Threshold<u64>,
    /// Minimum effective memlock; default unlimited (NCCL docs: `--ulimit memlock=-1`).
    pub min_memlock: Threshold<Limit>,
}

const DEFAULT_MIN_SHM: u64 = 1 << 30;

impl Default for Policy {
    fn default() -> Self {
        Policy {
            ignore: BTreeSet::new(),
            ignore_all: false,
            require: Requirements::default(),
            min_shm: Threshold {
                value: DEFAULT_MIN_SHM,
                explicit: false,
            },
            min_memlock: Threshold {
                value: Limit::Unlimited,
                explicit: false,
            },
        }
    }
}

impl Policy {
    fn ignores(&self, id: &str) -> bool {
        self.ignore_all || self.ignore.contains(id)
    }

    /// A finding under `--ignore`: a failure of an ignored check becomes a flagged warning.
    pub fn settle(&self, finding: crate::finding::Finding) -> crate::finding::Finding {
        if self.ignores(&finding.id) {
            finding.ignore()
        } else {
            finding
        }
    }
}

/// Splits comma lists from repeated flags: `--ignore a,b --ignore c`.
fn split_list(values: &[String]) -> Vec<String> {
    values
        .iter()
        .flat_map(|v| v.split(','))
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

/// The number in a `--require NAME=N` item: a whole number above 0.
fn count(item: &str, prefix: &str) -> Result<u32, String> {
    item[prefix.len()..]
        .parse::<u32>()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("--require: {item:?}: {prefix} takes a whole number above 0"))
}

/// Builds a policy from flag text. Errors name the flag and the value.
pub fn build(
    ignore: &[String],
    require: &[String],
    min_shm: Option<&str>,
    min_memlock: Option<&str>,
) -> Result<Policy, String> {
    let mut policy = Policy::default();
    for id in split_list(ignore) {
        if id == "all" {
            policy.ignore_all = true;
        } else {
            policy.ignore.insert(id);
        }
    }
    for item in split_list(require) {
        match item.as_str() {
            "host-ipc" => policy.require.host_ipc = true,
            "nvlink" => policy.require.nvlink = true,
            "rdma" => policy.require.rdma = true,
            "efa" => policy.require.efa = true,
            other if other.starts_with("gpus=") => {
                policy.require.gpus = Some(count(other, "gpus=")?);
            }
            other if other.starts_with("rdma=") => {
                policy.require.rdma = true;
                policy.require.rdma_count = Some(count(other, "rdma=")?);
            }
            other if other.starts_with("efa=") => {
                policy.require.efa = true;
                policy.require.efa_count = Some(count(other, "efa=")?);
            }
            other => {
                return Err(format!(
                    "--require: {other:?} is not a requirement this version knows (known: {})",
                    REQUIREMENTS.join(", ")
                ));
            }
        }
    }
    if let Some(text) = min_shm {
        policy.min_shm = Threshold {
            value: units::parse_bytes(text).map_err(|e| format!("--min-shm: {e}"))?,
            explicit: true,
        };
    }
    if let Some(text) = min_memlock {
        policy.min_memlock = Threshold {
            value: units::parse_limit(text).map_err(|e| format!("--min-memlock: {e}"))?,
            explicit: true,
        };
    }
    Ok(policy)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_and_names_bad_flags() {
        let p = build(
            &["memlock,dev-shm".into(), "host-ipc".into()],
            &["host-ipc".into()],
            Some("2GiB"),
            None,
        )
        .unwrap();
        assert!(p.ignores("dev-shm") && p.ignores("host-ipc") && !p.ignores("nccl-env"));
        assert!(p.require.host_ipc);
        assert_eq!(
            p.min_shm,
            Threshold {
                value: 2 << 30,
                explicit: true
            }
        );
        assert!(!p.min_memlock.explicit);
        let e = build(&[], &[], Some("12XB"), None).unwrap_err();
        assert!(e.starts_with("--min-shm:"), "{e}");
        let e = build(&[], &["gpus=8x".into()], None, None).unwrap_err();
        assert!(e.starts_with("--require:"), "{e}");
        let e = build(&[], &["infiniband".into()], None, None).unwrap_err();
        assert!(
            e.contains("known: host-ipc, gpus=N, nvlink, rdma, rdma=N, efa, efa=N"),
            "{e}"
        );
        let p = build(&[], &["efa=32,rdma=2".into()], None, None).unwrap();
        assert_eq!(
            (p.require.efa, p.require.efa_count, p.require.rdma_count),
            (true, Some(32), Some(2))
        );
        let e = build(&[], &["efa=0".into()], None, None).unwrap_err();
        assert!(e.contains("efa= takes a whole number above 0"), "{e}");
        let p = build(&[], &["gpus=8,nvlink".into()], None, None).unwrap();
        assert_eq!((p.require.gpus, p.require.nvlink), (Some(8), true));
        assert!(
            build(&["all".into()], &[], None, None)
                .unwrap()
                .ignores("anything")
        );
    }
}
