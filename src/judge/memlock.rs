//! `memlock`: the locked-memory limit NCCL's RDMA transports will meet.
//!
//! ibv_reg_mr pins every NCCL buffer; above RLIMIT_MEMLOCK it fails with ENOMEM
//! ("Call to ibv_reg_mr failed") or NCCL silently falls back to TCP (FACTS.md
//! section 2). Without an RDMA NIC the limit does not matter to NCCL (measured:
//! 64 KiB changes nothing over NVLink, FACTS.md section 1), so there a low limit
//! only warns unless the user set `--min-memlock`. CAP_IPC_LOCK lifts the limit
//! (the kernel's ib_umem_get checks the capability first).

use super::rdma_scope::Scope;
use super::{Finding, undetermined, unmet};
use crate::facts::{Facts, Limit, MemlockFacts, Observed};
use crate::finding::{Outcome, Owner};
use crate::policy::Policy;
use crate::predict::Prediction;
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

/// What RDMA means for the memlock limit here: one line of evidence, and what a limit
/// too low for registration does (`fails`: what ibv_reg_mr's ENOMEM does to NCCL).
fn rdma_stake(scope: &Scope, required: bool, fails: Outcome) -> (String, Outcome) {
    match scope.devices {
        Err(e) => (
            format!("could not determine whether RDMA devices exist: {e}"),
            undetermined(
                required,
                format!("whether NCCL registers memory with an RDMA device ({e})"),
            ),
        ),
        Ok(d) if scope.in_use() => (
            format!(
                "RDMA devices usable from this container: {} of the node's {}",
                scope.usable.len(),
                d.len()
            ),
            scope.in_use_outcome(required, fails),
        ),
        Ok(d) => (
            if d.is_empty() {
                "RDMA devices: 0".into()
            } else {
                format!(
                    "RDMA devices: the node has {}, this container can open none, so NCCL registers no memory with them",
                    d.len()
                )
            },
            // rdma-devices judges a requirement of RDMA; here NCCL registers nothing.
            Outcome::Unaffected,
        ),
    }
}

/// What ibv_reg_mr refused above the limit does to NCCL: the IB transport's
/// registration of its buffers fails at connection setup, in the first collective
/// (src/transport/net_ib.cc ncclIbRegMrDmaBufInternal: "Call to ibv_reg_mr failed with
/// error Cannot allocate memory", ncclSystemError; aws-ofi-nccl: fi_mr_regattr -12).
pub(super) fn registration_fails() -> Outcome {
    Outcome::init_fails(
        "\"Call to ibv_reg_mr failed with error Cannot allocate memory\" (ncclSystemError) when NCCL registers its buffers in the first collective",
    )
}

/// Who can raise the memlock limit to `needed`: the container itself where its hard
/// limit allows it (setrlimit raises a soft limit up to the hard one without privilege),
/// else the node's container runtime, whose hard limit it is.
pub(super) fn owner(m: &MemlockFacts, needed: Limit) -> Owner {
    match m.limit.value() {
        Some(l) if l.hard.covers(needed) && !l.soft.covers(needed) => Owner::SoftLimit,
        _ => Owner::HardLimit,
    }
}

/// The fix where the soft limit alone is low: the container raises it itself.
fn soft_fix(m: &MemlockFacts, fix: &str) -> String {
    let hard = m
        .limit
        .value()
        .map_or_else(|| "its hard limit".to_string(), |l| format_limit(l.hard));
    format!(
        "Raise the soft limit in the container itself, up to the hard limit ({hard}), before the launcher:\n  command: [\"sh\", \"-c\", \"ulimit -l {} && exec torchrun ...\"]\nor, for every container of the node:\n{fix}",
        m.limit
            .value()
            .map_or("unlimited".to_string(), |l| match l.hard {
                Limit::Unlimited => "unlimited".to_string(),
                Limit::Bytes(b) => (b / 1024).to_string(),
            })
    )
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

/// The limit covers what is needed: a pass, unless a real mlock was refused anyway,
/// which registration meets too (`stake`: what that does here).
fn sufficient(m: &MemlockFacts, limit: Limit, why: &str, stake: Outcome) -> Finding {
    match m
        .probe
        .as_ref()
        .and_then(|p| p.refused.as_ref().map(|why| (p.bytes, why)))
    {
        Some((bytes, why)) if limit.covers(Limit::Bytes(bytes)) => Finding::predicts(
            ID,
            stake,
            format!(
                "memlock {} but a real mlock was refused: {why}",
                format_limit(limit)
            ),
            "A seccomp profile or LSM may block mlock; NCCL's RDMA registration needs it. \
                 Check the pod's seccompProfile and the runtime's default profile.",
        )
        .blamed(Owner::PodSpec),
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

/// The limit is below what is needed: what that does depends on RDMA here (`stake`).
fn too_low(
    m: &MemlockFacts,
    limit: Limit,
    policy: &Policy,
    stake: Outcome,
    fix: String,
) -> Finding {
    let needed = policy.min_memlock.value;
    let summary = format!(
        "memlock {} is below the required {}",
        format_limit(limit),
        format_limit(needed)
    );
    let outcome = if policy.min_memlock.explicit {
        unmet("--min-memlock")
    } else {
        stake
    };
    let summary = match &outcome {
        Outcome::Unaffected => format!(
            "{summary}; no RDMA device this container uses carries NCCL's traffic (or the job stays on one node), so NCCL over NVLink, PCIe or sockets is unaffected"
        ),
        _ => format!("{summary}: RDMA memory registration (ibv_reg_mr) of NCCL's buffers fails"),
    };
    let owner = owner(m, needed);
    let fix = if owner == Owner::SoftLimit {
        soft_fix(m, &fix)
    } else {
        fix
    };
    Finding::predicts(ID, outcome, summary, fix).blamed(owner)
}

pub fn judge(facts: &Facts, _prediction: &Prediction, policy: &Policy) -> Finding {
    let m = &facts.memlock;
    let scope = Scope::of(facts);
    let required = policy.require.any_rdma();
    let (stake, outcome) = rdma_stake(&scope, required, registration_fails());
    let fix = remediation::memlock_for(m.euid);
    let mut evidence = evidence(m);
    evidence.push(stake);

    let Some((limit, why)) = effective(facts) else {
        // Unknown is not low: where the limit matters, what NCCL does is undetermined;
        // where NCCL registers no memory, nothing was judged (not a pass: `probe --npd`
        // answers Unknown where nothing could be read, issue 39 row 4).
        let outcome = match outcome {
            Outcome::Unaffected if !policy.min_memlock.explicit => {
                let f = Finding::skip(
                    ID,
                    "could not determine the memlock limit, and NCCL registers no memory with an RDMA device here: not judged",
                );
                return evidence.into_iter().fold(f, Finding::evidence);
            }
            _ => undetermined(
                policy.min_memlock.explicit || required,
                "RLIMIT_MEMLOCK could not be read: whether NCCL's RDMA registration fits under it",
            ),
        };
        let mut f = Finding::predicts(ID, outcome, "could not determine the memlock limit", fix);
        f.evidence = evidence;
        return f;
    };
    evidence.push(format!("effective limit {} ({why})", format_limit(limit)));
    let mut f = if limit.covers(policy.min_memlock.value) {
        sufficient(m, limit, &why, outcome)
    } else {
        too_low(m, limit, policy, outcome, fix)
    };
    f.evidence.extend(evidence);
    f
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::{MlockProbe, Rlimit};
    use crate::finding::Status;
    use crate::policy;
    use crate::test_facts::healthy;

    /// The judge as the run calls it, with the prediction made from the same facts.
    fn judge(facts: &Facts, policy: &Policy) -> Finding {
        crate::test_facts::judged(super::judge, facts, policy)
    }

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

    /// Issue 36: without an RDMA device NCCL registers nothing, so a low limit changes
    /// nothing NCCL does (measured: 64 KiB over NVLink): a note, not a warning.
    #[test]
    fn low_limit_is_a_note_without_rdma_and_fails_with_it() {
        let f = judge(&limited(8 << 20), &Policy::default());
        assert_eq!(f.status(), Status::Pass);
        assert!(f.summary.contains("8 MiB"), "{}", f.summary);
        let rdma = limited(8 << 20);
        let rdma = crate::test_facts::with_efa(rdma);
        let f = judge(&rdma, &Policy::default());
        assert_eq!(f.status(), Status::Fail);
        assert!(
            matches!(f.outcome(), Some(Outcome::InitFails { error }) if error.contains("ibv_reg_mr"))
        );
        // soft = hard = 8 MiB: only the node's runtime can raise it.
        assert_eq!(f.blame(), Some(crate::finding::Blame::Node));
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
        assert_eq!(f.status(), Status::Pass, "{f:?}");
        assert!(f.evidence.iter().any(|e| e.contains("can open none")));
        // One node: NCCL never registers memory with the NIC.
        let single = with_env(with_efa(limited(8 << 20)), &[("PET_NNODES", "1")]);
        let f = judge(&single, &Policy::default());
        assert_eq!(f.status(), Status::Pass);
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
        // Unreadable is not "no RDMA": what NCCL does is undetermined, a warning.
        let finding = judge(&f, &Policy::default());
        assert_eq!(finding.status(), Status::Warn, "{finding:?}");
        assert!(
            finding
                .evidence
                .iter()
                .any(|e| e.contains("could not determine whether RDMA devices exist"))
        );
    }

    /// Issue 36: a soft limit below the hard one is the container's to raise (setrlimit
    /// needs no privilege up to the hard limit): the job's, with that fix first.
    #[test]
    fn a_soft_limit_below_the_hard_one_is_the_jobs() {
        let mut f = crate::test_facts::with_env(
            crate::test_facts::with_efa(limited(8 << 20)),
            &[("PET_NNODES", "2")],
        );
        f.memlock.limit = Observed::Value(Rlimit {
            soft: Limit::Bytes(8 << 20),
            hard: Limit::Unlimited,
        });
        let finding = judge(&f, &Policy::default());
        assert_eq!(finding.status(), Status::Fail);
        assert_eq!(finding.blame(), Some(crate::finding::Blame::Job));
        assert!(
            finding
                .remediation()
                .unwrap()
                .contains("ulimit -l unlimited"),
            "{finding:?}"
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
        // No RDMA here: whatever the limit, NCCL registers nothing; not judged (a skip,
        // so probe --npd does not count it as something read).
        let finding = judge(&f, &Policy::default());
        assert_eq!(finding.status(), Status::Skip);
        assert!(finding.summary.contains("could not determine"));
        let rdma = crate::test_facts::with_efa(f.clone());
        assert_eq!(judge(&rdma, &Policy::default()).status(), Status::Warn);
        let strict = policy::build(&[], &[], None, Some("1GiB")).unwrap();
        assert_eq!(judge(&f, &strict).status(), Status::Fail);
    }

    #[test]
    fn refused_probe_under_a_generous_limit_fails_registration_where_rdma_is_used() {
        let mut f = healthy();
        f.memlock.probe = Some(MlockProbe {
            bytes: 65536,
            refused: Some("EPERM: Operation not permitted".into()),
        });
        assert_eq!(judge(&f, &Policy::default()).status(), Status::Pass);
        let rdma = judge(&crate::test_facts::with_efa(f), &Policy::default());
        assert_eq!(rdma.status(), Status::Fail);
        // The pod's seccomp profile: the job's.
        assert_eq!(rdma.blame(), Some(crate::finding::Blame::Job));
    }
}
