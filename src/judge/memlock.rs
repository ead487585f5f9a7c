//! `memlock`: the locked-memory limit NCCL's RDMA transports will meet.
//!
//! ibv_reg_mr pins every NCCL buffer; above RLIMIT_MEMLOCK it fails with ENOMEM
//! ("Call to ibv_reg_mr failed") or NCCL silently falls back to TCP (FACTS.md
//! section 2). Without an RDMA NIC the limit does not matter to NCCL (measured:
//! 64 KiB changes nothing over NVLink, FACTS.md section 1), so there a low limit
//! only warns unless the user set `--min-memlock`. CAP_IPC_LOCK lifts the limit
//! (the kernel's ib_umem_get checks the capability first).

use super::rdma_scope::Scope;
use super::{Finding, undetermined};
use crate::facts::{Facts, Limit, MemlockFacts, Observed};
use crate::finding::Severity;
use crate::policy::Policy;
use crate::remediation;
use crate::units::{format_bytes, format_limit};

pub const ID: &str = "memlock";

/// The limit really in force, and why.
fn effective(facts: &Facts) -> Option<(Limit, String)> {
    if facts.memlock.cap_ipc_lock.value() == Some(&true) {
        return Some((
            Limit::Unlimited,
            "CAP_IPC_LOCK is held, which lifts RLIMIT_MEMLOCK".into(),
        ));
    }
    let limit = facts.memlock.limit.value()?;
    if let Some(probe) = &facts.memlock.enforcement_probe
        && probe.refused.is_none()
    {
        return Some((
            Limit::Unlimited,
            format!(
                "the kernel let this process lock {} past the soft limit: the limit is not enforced",
                format_bytes(probe.bytes)
            ),
        ));
    }
    Some((limit.soft, "soft RLIMIT_MEMLOCK".into()))
}

/// What RDMA means for the memlock limit here, as one line of evidence and whether a
/// low limit fails: RDMA this container uses (or could not rule out), unless the job
/// stays on one node.
fn rdma_stake(scope: &Scope, required: bool) -> (String, Severity) {
    match scope.devices {
        Err(e) => (
            format!("could not determine whether RDMA devices exist: {e}"),
            scope.in_use_status(required),
        ),
        Ok(d) if scope.in_use() => (
            format!(
                "RDMA devices usable from this container: {} of the node's {}",
                scope.usable.len(),
                d.len()
            ),
            scope.in_use_status(required),
        ),
        Ok([]) => ("RDMA devices: 0".into(), Severity::Warn),
        Ok(d) => (
            format!(
                "RDMA devices: the node has {}, this container can open none, so NCCL registers no memory with them",
                d.len()
            ),
            if required {
                Severity::Fail
            } else {
                Severity::Warn
            },
        ),
    }
}

/// What was read and probed, one line each.
fn evidence(m: &MemlockFacts) -> Vec<String> {
    let mut evidence = Vec::new();
    match &m.limit {
        Observed::Value(l) => evidence.push(format!(
            "RLIMIT_MEMLOCK soft {}, hard {}",
            format_limit(l.soft),
            format_limit(l.hard)
        )),
        Observed::Error(e) => evidence.push(format!("RLIMIT_MEMLOCK unreadable: {e}")),
    }
    match &m.cap_ipc_lock {
        Observed::Value(held) => evidence.push(format!(
            "CAP_IPC_LOCK {}",
            if *held { "held" } else { "not held" }
        )),
        Observed::Error(e) => evidence.push(format!("capabilities unreadable: {e}")),
    }
    for probe in m.probe.iter().chain(&m.enforcement_probe) {
        evidence.push(match &probe.refused {
            None => format!("mlock of {}: locked", format_bytes(probe.bytes)),
            Some(why) => format!("mlock of {}: refused ({why})", format_bytes(probe.bytes)),
        });
    }
    for e in &m.probe_errors {
        evidence.push(format!("mlock probe could not run: {e}"));
    }
    evidence
}

/// The limit covers what is needed: a pass, unless a real mlock was refused anyway.
fn sufficient(m: &MemlockFacts, limit: Limit, why: &str) -> Finding {
    match m
        .probe
        .as_ref()
        .and_then(|p| p.refused.as_ref().map(|why| (p.bytes, why)))
    {
        Some((bytes, why)) if limit.covers(Limit::Bytes(bytes)) => Finding::warn(
            ID,
            format!(
                "memlock {} but a real mlock was refused: {why}",
                format_limit(limit)
            ),
            "A seccomp profile or LSM may block mlock; NCCL's RDMA registration needs it. \
                 Check the pod's seccompProfile and the runtime's default profile.",
        ),
        _ => {
            let soft = m.limit.value().map(|l| l.soft);
            let summary = match soft {
                Some(soft) if soft != limit => format!(
                    "memlock {} in effect (soft limit {}, lifted: {why})",
                    format_limit(limit),
                    format_limit(soft)
                ),
                _ => format!("memlock {}", format_limit(limit)),
            };
            Finding::pass(ID, summary)
        }
    }
}

/// The limit is below what is needed: how much that matters depends on RDMA here.
fn too_low(
    limit: Limit,
    policy: &Policy,
    scope: &Scope,
    rdma_status: Severity,
    fix: String,
) -> Finding {
    let summary = format!(
        "memlock {} is below the required {}",
        format_limit(limit),
        format_limit(policy.min_memlock.value)
    );
    if policy.min_memlock.explicit || rdma_status == Severity::Fail {
        Finding::fail(
            ID,
            format!(
                "{summary}: RDMA memory registration (ibv_reg_mr) will fail or NCCL falls back to TCP"
            ),
            fix,
        )
    } else if scope.in_use() {
        Finding::warn(
            ID,
            format!(
                "{summary}: RDMA registration would fail, but {}",
                scope.span_words()
            ),
            fix,
        )
    } else {
        Finding::warn(
            ID,
            format!(
                "{summary}; no RDMA device this container uses, so NCCL over NVLink, PCIe or sockets is unaffected"
            ),
            fix,
        )
    }
}

pub fn judge(facts: &Facts, policy: &Policy) -> Finding {
    let m = &facts.memlock;
    let scope = Scope::of(facts);
    let (stake, rdma_status) = rdma_stake(&scope, policy.require.any_rdma());
    let fix = remediation::memlock_for(m.euid);
    let mut evidence = evidence(m);
    evidence.push(stake);

    let Some((limit, why)) = effective(facts) else {
        let status = if rdma_status == Severity::Fail {
            Severity::Fail
        } else {
            undetermined(policy.min_memlock.explicit)
        };
        let mut f = Finding::flagged(ID, status, "could not determine the memlock limit", fix)
            .undetermined();
        f.evidence = evidence;
        return f;
    };
    evidence.push(format!("effective limit {} ({why})", format_limit(limit)));
    let mut f = if limit.covers(policy.min_memlock.value) {
        sufficient(m, limit, &why)
    } else {
        too_low(limit, policy, &scope, rdma_status, fix)
    };
    f.evidence = evidence;
    f
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::{MlockProbe, Rlimit};
    use crate::finding::Status;
    use crate::policy;
    use crate::test_facts::healthy;

    fn limited(bytes: u64) -> Facts {
        let mut f = healthy();
        f.memlock.limit = Observed::Value(Rlimit {
            soft: Limit::Bytes(bytes),
            hard: Limit::Bytes(bytes),
        });
        f.memlock.enforcement_probe = Some(MlockProbe {
            bytes: bytes + 4096,
            refused: Some("ENOMEM: Cannot allocate memory".into()),
        });
        f
    }

    #[test]
    fn low_limit_warns_without_rdma_and_fails_with_it() {
        let f = judge(&limited(8 << 20), &Policy::default());
        assert_eq!(f.status(), Status::Warn);
        assert!(f.summary.contains("8 MiB"), "{}", f.summary);
        let rdma = limited(8 << 20);
        let rdma = crate::test_facts::with_efa(rdma);
        assert_eq!(judge(&rdma, &Policy::default()).status(), Status::Fail);
        let explicit = policy::build(&[], &[], None, Some("unlimited")).unwrap();
        let f = judge(&limited(65536), &explicit);
        assert_eq!(f.status(), Status::Fail);
        assert!(f.remediation().unwrap().contains("IPC_LOCK"));
    }

    #[test]
    fn rdma_scope_decides_a_low_limit() {
        use crate::test_facts::{with_efa, with_env};
        // The node's devices without a device node here: a pod without the RDMA resource.
        let mut no_resource = with_efa(limited(8 << 20));
        no_resource.rdma.uverbs = Observed::Value(vec![]);
        let f = judge(&no_resource, &Policy::default());
        assert_eq!(f.status(), Status::Warn, "{f:?}");
        assert!(f.evidence.iter().any(|e| e.contains("can open none")));
        // One node: NCCL never registers memory with the NIC.
        let single = with_env(with_efa(limited(8 << 20)), &[("PET_NNODES", "1")]);
        let f = judge(&single, &Policy::default());
        assert_eq!(f.status(), Status::Warn);
        assert!(f.summary.contains("one node"), "{}", f.summary);
        let multi = with_env(with_efa(limited(8 << 20)), &[("PET_NNODES", "2")]);
        assert_eq!(judge(&multi, &Policy::default()).status(), Status::Fail);
    }

    #[test]
    fn regression_unreadable_infiniband_class_is_not_no_rdma() {
        let mut f = limited(8 << 20);
        f.rdma.devices = Observed::Error(crate::facts::FactError::new(
            "/sys/class/infiniband",
            "Permission denied (os error 13)",
        ));
        let finding = judge(&f, &Policy::default());
        assert_eq!(finding.status(), Status::Fail, "{finding:?}");
        assert!(
            finding
                .evidence
                .iter()
                .any(|e| e.contains("could not determine whether RDMA devices exist"))
        );
    }

    #[test]
    fn non_root_fix_does_not_rely_on_ipc_lock() {
        let mut f = crate::test_facts::with_efa(limited(8 << 20));
        f.memlock.euid = Some(1000);
        let fix = judge(&f, &Policy::default())
            .remediation()
            .unwrap()
            .to_string();
        assert!(fix.contains("user 1000") && fix.contains("56374"), "{fix}");
        assert!(fix.contains("LimitMEMLOCK=infinity"));
        f.memlock.euid = Some(0);
        let fix = judge(&f, &Policy::default())
            .remediation()
            .unwrap()
            .to_string();
        assert!(fix.starts_with("Grant the container CAP_IPC_LOCK"), "{fix}");
    }

    #[test]
    fn threshold_met_passes() {
        let p = policy::build(&[], &[], None, Some("8MiB")).unwrap();
        assert_eq!(judge(&limited(8 << 20), &p).status(), Status::Pass);
        assert_eq!(
            judge(
                &limited(8 << 20),
                &policy::build(&[], &[], None, Some("9MiB")).unwrap()
            )
            .status(),
            Status::Fail
        );
    }

    #[test]
    fn capability_or_unenforced_limit_counts_as_unlimited() {
        let mut f = limited(65536);
        f.memlock.cap_ipc_lock = Observed::Value(true);
        let strict = policy::build(&[], &[], None, Some("unlimited")).unwrap();
        let finding = judge(&f, &strict);
        assert_eq!(finding.status(), Status::Pass);
        assert!(
            finding
                .evidence
                .iter()
                .any(|e| e.contains("CAP_IPC_LOCK is held"))
        );
        let mut f = limited(65536);
        f.memlock.enforcement_probe.as_mut().unwrap().refused = None;
        assert_eq!(judge(&f, &strict).status(), Status::Pass);
    }

    #[test]
    fn unreadable_limit_is_undetermined_not_zero() {
        let mut f = healthy();
        f.memlock.limit = Observed::Error(crate::facts::FactError::new(
            "getrlimit(RLIMIT_MEMLOCK)",
            "EPERM",
        ));
        let finding = judge(&f, &Policy::default());
        assert_eq!(finding.status(), Status::Warn);
        assert!(finding.summary.contains("could not determine"));
        let strict = policy::build(&[], &[], None, Some("1GiB")).unwrap();
        assert_eq!(judge(&f, &strict).status(), Status::Fail);
    }

    #[test]
    fn refused_probe_under_a_generous_limit_warns() {
        let mut f = healthy();
        f.memlock.probe = Some(MlockProbe {
            bytes: 65536,
            refused: Some("EPERM: Operation not permitted".into()),
        });
        assert_eq!(judge(&f, &Policy::default()).status(), Status::Warn);
    }
}
