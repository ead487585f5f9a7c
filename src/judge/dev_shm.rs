//! `dev-shm`: the size of /dev/shm.
//!
//! NCCL < 2.24 (and any NCCL with NCCL_CUMEM_HOST_ENABLE=0 or a driver older than
//! CUDA 12.6) puts SHM transport buffers there and dies with "failed to extend
//! /dev/shm/nccl-XXXX" or SIGBUS when it is full; PyTorch DataLoader workers need
//! it always ("bus error ... insufficient shared memory"). Docker and containerd
//! give containers 64 MiB. (FACTS.md sections 1 and 2.)

use super::{Finding, undetermined, unmet};
use crate::facts::{Facts, FsUsage, Observed, ShmFacts};
use crate::finding::Outcome;
use crate::policy::Policy;
use crate::predict::Prediction;
use crate::remediation;
use crate::units::format_bytes;

pub const ID: &str = "dev-shm";

/// What a /dev/shm below `--min-shm` does when NCCL itself does not need it: PyTorch's
/// DataLoader workers pass every batch through it and die with "bus error ...
/// insufficient shared memory" when it fills, which depends on the job's batches; an
/// explicit `--min-shm` is a requirement the gate holds.
fn dataloader(explicit: bool, size: &str) -> Outcome {
    if explicit {
        unmet("--min-shm")
    } else {
        Outcome::undetermined(format!(
            "whether the job's DataLoader workers fit their batches in {size} of shared memory: PyTorch's die with \"bus error ... insufficient shared memory (shm)\" when it fills"
        ))
    }
}

/// The verdict on a /dev/shm whose size is known.
fn sized(shm: &ShmFacts, usage: FsUsage, min: u64, explicit: bool) -> Finding {
    // Only a mount of its own with another filesystem is suspect; a plain directory
    // lives on its parent mount (in containers, /dev is itself a tmpfs).
    let disk_backed = matches!(&shm.mount, Observed::Value(Some(m)) if m.fs_type != "tmpfs");
    if usage.size_bytes < min {
        Finding::predicts(
            ID,
            dataloader(explicit, &format_bytes(usage.size_bytes)),
            format!(
                "/dev/shm is {}, below the {} minimum: NCCL's SHM transport (NCCL < 2.24) and DataLoader workers crash when it fills",
                format_bytes(usage.size_bytes),
                format_bytes(min)
            ),
            remediation::DEV_SHM,
        )
    } else if usage.free_bytes < min {
        Finding::predicts(
            ID,
            dataloader(explicit, &format_bytes(usage.free_bytes)),
            format!(
                "/dev/shm is {} but only {} is free",
                format_bytes(usage.size_bytes),
                format_bytes(usage.free_bytes)
            ),
            "Find what holds /dev/shm (ls -la /dev/shm) and remove stale segments, or enlarge it:\n"
                .to_string() + remediation::DEV_SHM,
        )
    } else if let Observed::Error(_) = &shm.mount {
        // Unreadable is not absent: whether /dev/shm is a tmpfs is unknown (issue 31
        // row 9), so this is "could not determine", not a pass.
        Finding::predicts(
            ID,
            Outcome::undetermined("whether /dev/shm is memory (a tmpfs) or the container's disk"),
            format!(
                "/dev/shm is {}, but could not determine whether it is a tmpfs (mountinfo unreadable)",
                format_bytes(usage.size_bytes)
            ),
            "Let the tool read /proc/self/mountinfo (it is readable in every container unless a \
security profile hides it), or check by hand that /dev/shm is a tmpfs: grep /dev/shm /proc/self/mountinfo\n"
                .to_string()
                + remediation::DEV_SHM,
        )
    } else if disk_backed {
        Finding::predicts(
            ID,
            Outcome::degraded(
                "shared memory (NCCL's SHM before 2.24, DataLoader batches) on the container's disk",
                "disk instead of memory bandwidth for everything passed through /dev/shm",
            ),
            format!(
                "/dev/shm has {} but is not a tmpfs mount: shared memory lands on the container's disk",
                format_bytes(usage.size_bytes)
            ),
            remediation::DEV_SHM,
        )
    } else {
        Finding::pass(
            ID,
            format!("/dev/shm is {}", format_bytes(usage.size_bytes)),
        )
    }
}

/// What the NCCL this image loads puts in /dev/shm (crate::predict: the SHM transport's
/// buffers are /dev/shm files before 2.24, with NCCL_CUMEM_HOST_ENABLE=0, or on drivers
/// before CUDA 12.6; src/transport/shm.cc, src/misc/cudawrap.cc ncclCuMemHostEnable).
/// Each SHM connection keeps its buffers (LL + LL128 + Simple) in one /dev/shm segment
/// (shm.cc shmSendSetup/shmRecvSetup, ncclShmOpen of sizeof(ncclSendMem/ncclRecvMem) plus
/// comm->buffSizes on one side). A ring through every GPU crosses SHM at least once per
/// group of GPUs that P2P joins (when there are two or more), on each of at least two
/// channels. Matches nccl#1518 (64 MB /dev/shm: 2 GPUs work, 4 fail) and nccl#525. When even that lower bound exceeds the free space, NCCL
/// fails ("failed to extend /dev/shm/nccl-XXXX"), whatever --min-shm allows.
fn nccl_need(
    (facts, predicted): (&Facts, &Prediction),
    usage: FsUsage,
    f: Finding,
    evidence: &mut Vec<String>,
) -> Finding {
    let need = &predicted.shm;
    let version = predicted
        .nccl_version
        .map_or("NCCL (version unknown)".to_string(), |v| {
            format!("NCCL {v}")
        });
    evidence.push(format!("{version}: {}", need.why));
    if !need.value.in_dev_shm {
        return f;
    }
    let rings = ring_crossings(&predicted.intra_node);
    // src/graph/connect.cc ncclTopoPostset (2.9-2.30) duplicates the ring channels
    // ("nChannels*2"): two at least, unless NCCL_MAX_NCHANNELS caps them at one.
    let channels: u64 = match crate::predict::int_param(facts, "NCCL_MAX_NCHANNELS") {
        Some(1) => 1,
        _ => 2,
    };
    let connections = rings as u64 * channels;
    let at_least = need.value.bytes_per_connection * connections;
    evidence.push(format!(
        "a ring crosses SHM at least {rings} time(s), on {channels} channel(s), {} per connection: at least {} in /dev/shm",
        format_bytes(need.value.bytes_per_connection),
        format_bytes(at_least)
    ));
    if usage.free_bytes >= at_least || f.status() == crate::finding::Status::Fail {
        return f;
    }
    Finding::predicts(
        ID,
        Outcome::init_fails(
            "\"failed to extend /dev/shm/nccl-XXXX\" (ncclSystemError) when the SHM transport connects, or SIGBUS",
        ),
        format!(
            "/dev/shm has {} free, and {version} puts its SHM transport's buffers there: at least {} ({connections} SHM connection(s) of 9.6 MB or so), so NCCL fails with \"failed to extend /dev/shm\"",
            format_bytes(usage.free_bytes),
            format_bytes(at_least),
        ),
        remediation::DEV_SHM,
    )
}

/// How many times a ring through every GPU must take SHM: the number of groups P2P joins
/// (union of P2P pairs), when there are two or more, else 0.
fn ring_crossings(pairs: &[crate::predict::PairTransport]) -> usize {
    let mut gpus: Vec<u32> = pairs.iter().flat_map(|p| [p.a, p.b]).collect();
    gpus.sort_unstable();
    gpus.dedup();
    let mut group: Vec<usize> = (0..gpus.len()).collect();
    let at = |g: u32| gpus.binary_search(&g).unwrap_or(0);
    fn root(group: &mut [usize], mut i: usize) -> usize {
        while group[i] != i {
            group[i] = group[group[i]];
            i = group[i];
        }
        i
    }
    for p in pairs.iter().filter(|p| p.transport.starts_with("P2P")) {
        let (a, b) = (root(&mut group, at(p.a)), root(&mut group, at(p.b)));
        group[a] = b;
    }
    let groups = (0..gpus.len())
        .filter(|&i| root(&mut group, i) == i)
        .count();
    if groups >= 2 { groups } else { 0 }
}

pub fn judge(facts: &Facts, prediction: &Prediction, policy: &Policy) -> Finding {
    let shm = &facts.dev_shm;
    let min = policy.min_shm.value;
    let mut evidence = Vec::new();
    match &shm.mount {
        Observed::Value(Some(m)) => evidence.push(format!(
            "mounted: {} {} ({})",
            m.fs_type,
            m.source,
            m.super_options.join(",")
        )),
        Observed::Value(None) => evidence.push("not a mount point of its own".to_string()),
        Observed::Error(e) => evidence.push(format!("mountinfo unreadable: {e}")),
    }
    let mut f = match &shm.usage {
        Observed::Value(Some(u)) => {
            evidence.push(format!(
                "size {}, free {}, required {}",
                format_bytes(u.size_bytes),
                format_bytes(u.free_bytes),
                format_bytes(min)
            ));
            let f = sized(shm, *u, min, policy.min_shm.explicit);
            nccl_need((facts, prediction), *u, f, &mut evidence)
        }
        Observed::Value(None) => Finding::predicts(
            ID,
            Outcome::cannot_start(
                "shm_open fails: Python's multiprocessing locks, PyTorch's DataLoader workers and NCCL's SHM transport (before 2.24) need /dev/shm",
            ),
            "/dev/shm does not exist",
            remediation::DEV_SHM,
        ),
        Observed::Error(e) => {
            evidence.push(format!("statvfs failed: {e}"));
            Finding::predicts(
                ID,
                undetermined(
                    policy.min_shm.explicit,
                    "the size of /dev/shm (statvfs failed)",
                ),
                "could not determine the size of /dev/shm",
                remediation::DEV_SHM,
            )
            .undetermined()
        }
    };
    f.evidence = evidence;
    f
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::FsUsage;
    use crate::finding::Status;
    use crate::policy;
    use crate::test_facts::healthy;

    /// The judge as the run calls it, with the prediction made from the same facts.
    fn judge(facts: &Facts, policy: &Policy) -> Finding {
        crate::test_facts::judged(super::judge, facts, policy)
    }

    fn sized(size: u64, free: u64) -> Facts {
        let mut f = healthy();
        f.dev_shm.usage = Observed::Value(Some(FsUsage {
            size_bytes: size,
            free_bytes: free,
        }));
        f
    }

    #[test]
    fn nccl_before_2_24_needs_dev_shm_for_shm_connections() {
        use crate::test_facts::with_env;
        let set_version = |mut f: Facts, v: &str| {
            if let crate::facts::gpu::LibraryState::Loaded(l) = &mut f.rdma.nccl.library.state {
                l.version = Observed::Value(v.into());
            }
            f
        };
        // P2P off on the 2x H200: one ring crosses SHM twice on two channels (9.6 MB
        // per connection): 38.5 MB.
        let p2p_off = |size: u64, v: &str| {
            set_version(with_env(sized(size, size), &[("NCCL_P2P_DISABLE", "1")]), v)
        };
        let p = policy::Policy {
            min_shm: policy::Threshold {
                value: 1 << 20,
                explicit: true,
            },
            ..policy::Policy::default()
        };
        let old = judge(&p2p_off(16 << 20, "2.21.5"), &p);
        assert_eq!(old.status(), Status::Fail, "{old:?}");
        assert!(old.summary.contains("failed to extend /dev/shm"), "{old:?}");
        // 2.24+ keeps them in cuMem host memory on this CUDA 13 driver.
        let new = judge(&p2p_off(16 << 20, "2.28.9"), &p);
        assert_eq!(new.status(), Status::Pass, "{new:?}");
        // Enough room for both connections.
        assert_eq!(
            judge(&p2p_off(48 << 20, "2.21.5"), &p).status(),
            Status::Pass
        );
        assert_eq!(
            judge(&p2p_off(32 << 20, "2.21.5"), &p).status(),
            Status::Fail
        );
        let one = with_env(p2p_off(32 << 20, "2.21.5"), &[("NCCL_MAX_NCHANNELS", "1")]);
        assert_eq!(judge(&one, &p).status(), Status::Pass);
        // P2P on: no SHM connection at all.
        let p2p = set_version(sized(16 << 20, 16 << 20), "2.21.5");
        assert_eq!(judge(&p2p, &p).status(), Status::Pass);
    }

    /// Issue 36: NCCL 2.28.9 keeps its SHM buffers in cuMem host memory, so a 64 MiB
    /// /dev/shm leaves NCCL unaffected; what it risks is the job's DataLoader workers,
    /// which depends on their batches: a warning, and a failure only under an explicit
    /// --min-shm.
    #[test]
    fn small_shm_warns_with_emptydir_fix_and_fails_under_min_shm() {
        let f = judge(&sized(64 << 20, 64 << 20), &Policy::default());
        assert_eq!(f.status(), Status::Warn);
        assert!(
            matches!(f.outcome(), Some(crate::finding::Outcome::Undetermined { unknown }) if unknown.contains("DataLoader")),
            "{f:?}"
        );
        let strict = policy::build(&[], &[], Some("1GiB"), None).unwrap();
        assert_eq!(
            judge(&sized(64 << 20, 64 << 20), &strict).status(),
            Status::Fail
        );
        assert!(
            f.summary
                .starts_with("/dev/shm is 64 MiB, below the 1 GiB minimum")
        );
        assert!(f.remediation().unwrap().contains("medium: Memory"));
        let low = policy::build(&[], &[], Some("64MiB"), None).unwrap();
        assert_eq!(
            judge(&sized(64 << 20, 64 << 20), &low).status(),
            Status::Pass
        );
    }

    #[test]
    fn full_shm_or_disk_backed_warns() {
        assert_eq!(
            judge(&sized(2 << 30, 1 << 20), &Policy::default()).status(),
            Status::Warn
        );
        let mut f = sized(100 << 30, 50 << 30);
        f.dev_shm.mount = Observed::Value(None);
        // Not its own mount: a directory on the root filesystem, still usable.
        assert_eq!(judge(&f, &Policy::default()).status(), Status::Pass);
        let mut f = sized(100 << 30, 50 << 30);
        if let Observed::Value(Some(m)) = &mut f.dev_shm.mount {
            m.fs_type = "overlay".into();
        }
        assert_eq!(judge(&f, &Policy::default()).status(), Status::Warn);
    }

    #[test]
    fn missing_or_unreadable() {
        let mut f = healthy();
        f.dev_shm.usage = Observed::Value(None);
        assert_eq!(judge(&f, &Policy::default()).status(), Status::Fail);
        f.dev_shm.usage =
            Observed::Error(crate::facts::FactError::new("statvfs(/dev/shm)", "EACCES"));
        assert_eq!(judge(&f, &Policy::default()).status(), Status::Warn);
        let explicit = policy::build(&[], &[], Some("1GiB"), None).unwrap();
        assert_eq!(judge(&f, &explicit).status(), Status::Fail);
        // Issue 31 row 9: mountinfo unreadable is "could not determine", not a pass.
        let mut f = sized(100 << 30, 50 << 30);
        f.dev_shm.mount = Observed::Error(crate::facts::FactError::new(
            "/proc/self/mountinfo",
            "Permission denied",
        ));
        let j = judge(&f, &Policy::default());
        assert_eq!(j.status(), Status::Warn);
        assert!(j.summary.contains("could not determine"), "{}", j.summary);
    }
}
