//! `stack-limit`: RLIMIT_STACK as NCCL's threads will inherit it.
//!
//! glibc uses RLIMIT_STACK as the default pthread stack size, but falls back to
//! 2 MiB when it is unlimited; NCCL's threads can overflow that and crash
//! (FACTS.md section 2). NCCL 2.28.3 and later raise their threads' stacks to 8 MiB
//! themselves (src/init.cc setCpuStackSize, NCCL_SET_CPU_STACK_SIZE=1, v2.28.3-1):
//! for them the limit changes nothing, a note; older NCCL can crash, which is not
//! certain, so it warns. The soft limit is the container's to change (lowering it is
//! always allowed, raising it up to the hard limit too): only a hard limit below
//! 8 MiB is the node's.

use super::Finding;
use crate::facts::{Facts, Limit, Observed, Rlimit};
use crate::finding::{Outcome, Owner};
use crate::nccl::version::{OWN_THREAD_STACKS, since};
use crate::policy::Policy;
use crate::predict::Prediction;
use crate::remediation;
use crate::units::format_limit;

pub const ID: &str = "stack-limit";
/// NCCL's SAFE_STACK_SIZE: the Linux default, 8 MiB.
const SAFE_STACK: u64 = 8 << 20;

/// What the NCCL the trainer loads does with threads' stacks below 8 MiB.
fn outcome(facts: &Facts, predicted: &Prediction) -> Outcome {
    let own = since(predicted.nccl_version, OWN_THREAD_STACKS)
        && crate::predict::int_param(facts, "NCCL_SET_CPU_STACK_SIZE") != Some(0);
    if own {
        Outcome::Unaffected
    } else {
        Outcome::undetermined(
            "whether NCCL's threads fit their stacks: NCCL before 2.28.3 (or with NCCL_SET_CPU_STACK_SIZE=0) keeps them and can crash (SIGSEGV) when one overflows",
        )
    }
}

/// Who can make the limit safe: the container itself unless the hard limit is below 8 MiB.
fn owner(l: &Rlimit) -> Owner {
    if l.hard.covers(Limit::Bytes(SAFE_STACK)) {
        Owner::SoftLimit
    } else {
        Owner::HardLimit
    }
}

pub fn judge(facts: &Facts, predicted: &Prediction, _policy: &Policy) -> Finding {
    let l = match &facts.stack_limit {
        Observed::Error(e) => {
            return Finding::predicts(
                ID,
                Outcome::undetermined("RLIMIT_STACK could not be read"),
                "could not determine the stack limit",
                remediation::STACK_LIMIT,
            )
            .evidence(e.to_string());
        }
        Observed::Value(l) => l,
    };
    let evidence = format!(
        "RLIMIT_STACK soft {}, hard {}",
        format_limit(l.soft),
        format_limit(l.hard)
    );
    let what = match l.soft {
        Limit::Unlimited => {
            "stack limit is unlimited: glibc then gives new threads 2 MiB stacks".to_string()
        }
        Limit::Bytes(n) if n < SAFE_STACK => format!(
            "stack limit {} is below the 8 MiB NCCL's threads need",
            format_limit(l.soft)
        ),
        Limit::Bytes(_) => {
            return Finding::pass(ID, format!("stack limit {}", format_limit(l.soft)))
                .evidence(evidence);
        }
    };
    let outcome = outcome(facts, predicted);
    let summary = match (&outcome, predicted.nccl_version) {
        (Outcome::Unaffected, Some(v)) => {
            format!("{what}, which NCCL {v} raises to 8 MiB for its own threads")
        }
        (Outcome::Unaffected, None) => format!(
            "{what}; NCCL 2.28.3 and later raise it to 8 MiB for their own threads (no libnccl found here: the newest assumed)"
        ),
        _ => format!("{what}, which NCCL before 2.28.3 keeps: its threads can crash"),
    };
    Finding::predicts(ID, outcome, summary, remediation::STACK_LIMIT)
        .blamed(owner(l))
        .evidence(evidence)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::Rlimit;
    use crate::finding::Status;
    use crate::test_facts::healthy;

    /// The judge as the run calls it, with the prediction made from the same facts.
    fn judge(facts: &Facts, policy: &Policy) -> Finding {
        crate::test_facts::judged(super::judge, facts, policy)
    }

    fn with_stack(soft: Limit) -> Facts {
        let mut f = healthy();
        f.stack_limit = Observed::Value(Rlimit {
            soft,
            hard: Limit::Unlimited,
        });
        f
    }

    /// Issue 36: NCCL 2.28.3 and later size their own threads' stacks
    /// (src/init.cc setCpuStackSize), so there an unlimited or small stack limit is a note;
    /// older NCCL keeps it and can crash: a warning, the container's to fix unless the
    /// hard limit is below 8 MiB.
    #[test]
    fn unlimited_and_small_stacks_warn_only_where_nccl_keeps_them() {
        let p = Policy::default();
        let old = |soft, hard| {
            let mut f = with_stack(soft);
            f.stack_limit = Observed::Value(Rlimit { soft, hard });
            crate::test_facts::with_nccl_version(f, "2.27.7")
        };
        let f = judge(&old(Limit::Unlimited, Limit::Unlimited), &p);
        assert_eq!(
            (f.status(), f.blame()),
            (Status::Warn, Some(crate::finding::Blame::Job))
        );
        let f = judge(&old(Limit::Bytes(2 << 20), Limit::Bytes(4 << 20)), &p);
        assert_eq!(
            (f.status(), f.blame()),
            (Status::Warn, Some(crate::finding::Blame::Node))
        );
        // The healthy node loads NCCL 2.28.9: a note.
        let f = judge(&with_stack(Limit::Unlimited), &p);
        assert_eq!(f.status(), Status::Pass);
        assert!(
            f.summary.contains("NCCL 2.28.9 raises to 8 MiB"),
            "{}",
            f.summary
        );
        let off = crate::test_facts::with_env(
            with_stack(Limit::Unlimited),
            &[("NCCL_SET_CPU_STACK_SIZE", "0")],
        );
        assert_eq!(judge(&off, &p).status(), Status::Warn);
        assert_eq!(
            judge(&with_stack(Limit::Bytes(8 << 20)), &p).status(),
            Status::Pass
        );
        assert_eq!(
            judge(&with_stack(Limit::Bytes(64 << 20)), &p).status(),
            Status::Pass
        );
    }
}
