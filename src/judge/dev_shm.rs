//! `dev-shm`: the size of /dev/shm.
//!
//! NCCL < 2.24 (and any NCCL with NCCL_CUMEM_HOST_ENABLE=0 or a driver older than
//! CUDA 12.6) puts SHM transport buffers there and dies with "failed to extend
//! /dev/shm/nccl-XXXX" or SIGBUS when it is full; PyTorch DataLoader workers need
//! it always ("bus error ... insufficient shared memory"). Docker and containerd
//! give containers 64 MiB. (FACTS.md sections 1 and 2.)

use super::{Finding, undetermined};
use crate::facts::{Facts, FsUsage, Observed, ShmFacts};
use crate::policy::Policy;
use crate::remediation;
use crate::units::format_bytes;

pub const ID: &str = "dev-shm";

/// The verdict on a /dev/shm whose size is known.
fn sized(shm: &ShmFacts, usage: FsUsage, min: u64) -> Finding {
    // Only a mount of its own with another filesystem is suspect; a plain directory
    // lives on its parent mount (in containers, /dev is itself a tmpfs).
    let disk_backed = matches!(&shm.mount, Observed::Value(Some(m)) if m.fs_type != "tmpfs");
    if usage.size_bytes < min {
        Finding::fail(
            ID,
            format!(
                "/dev/shm is {}, below the {} minimum: NCCL's SHM transport (NCCL < 2.24) and DataLoader workers crash when it fills",
                format_bytes(usage.size_bytes),
                format_bytes(min)
            ),
            remediation::DEV_SHM,
        )
    } else if usage.free_bytes < min {
        Finding::warn(
            ID,
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
        Finding::warn(
            ID,
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
        Finding::warn(
            ID,
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

pub fn judge(facts: &Facts, policy: &Policy) -> Finding {
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
            sized(shm, *u, min)
        }
        Observed::Value(None) => Finding::fail(ID, "/dev/shm does not exist", remediation::DEV_SHM),
        Observed::Error(e) => {
            evidence.push(format!("statvfs failed: {e}"));
            Finding::flagged(
                ID,
                undetermined(policy.min_shm.explicit),
                "could not determine the size of /dev/shm",
                remediation::DEV_SHM,
            )
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

    fn sized(size: u64, free: u64) -> Facts {
        let mut f = healthy();
        f.dev_shm.usage = Observed::Value(Some(FsUsage {
            size_bytes: size,
            free_bytes: free,
        }));
        f
    }

    #[test]
    fn small_shm_fails_with_emptydir_fix() {
        let f = judge(&sized(64 << 20, 64 << 20), &Policy::default());
        assert_eq!(f.status(), Status::Fail);
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
