//! `stack-limit`: RLIMIT_STACK as NCCL's threads will inherit it.
//!
//! glibc uses RLIMIT_STACK as the default pthread stack size, but falls back to
//! 2 MiB when it is unlimited; NCCL's threads can overflow that and crash
//! (FACTS.md section 2). NCCL 2.28.3 and later raise their threads' stacks to 8 MiB
//! themselves (src/os/linux.cc setCpuStackSize, NCCL_SET_CPU_STACK_SIZE=1), so this
//! warns rather than fails: older NCCL in the image is at risk, newer is not.

use super::Finding;
use crate::facts::{Facts, Limit, Observed};
use crate::policy::Policy;
use crate::remediation;
use crate::units::format_limit;

pub const ID: &str = "stack-limit";
/// NCCL's SAFE_STACK_SIZE: the Linux default, 8 MiB.
const SAFE_STACK: u64 = 8 << 20;

pub fn judge(facts: &Facts, _policy: &Policy) -> Finding {
    match &facts.stack_limit {
        Observed::Error(e) => Finding::warn(
            ID,
            "could not determine the stack limit",
            remediation::STACK_LIMIT,
        )
        .undetermined()
        .evidence(e.to_string()),
        Observed::Value(l) => {
            let evidence = format!(
                "RLIMIT_STACK soft {}, hard {}",
                format_limit(l.soft),
                format_limit(l.hard)
            );
            match l.soft {
                Limit::Unlimited => Finding::warn(ID,
                    "stack limit is unlimited: glibc then gives new threads 2 MiB stacks, which crashes NCCL < 2.28.3", remediation::STACK_LIMIT)
                .evidence(evidence),
                Limit::Bytes(n) if n < SAFE_STACK => Finding::warn(ID,
                    format!(
                        "stack limit {} is below the 8 MiB NCCL's threads need (NCCL < 2.28.3 does not raise it)",
                        format_limit(l.soft)
                    ), remediation::STACK_LIMIT)
                .evidence(evidence),
                Limit::Bytes(_) => {
                    Finding::pass(ID, format!("stack limit {}", format_limit(l.soft)))
                        .evidence(evidence)
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::Rlimit;
    use crate::finding::Status;
    use crate::test_facts::healthy;

    fn with_stack(soft: Limit) -> Facts {
        let mut f = healthy();
        f.stack_limit = Observed::Value(Rlimit {
            soft,
            hard: Limit::Unlimited,
        });
        f
    }

    #[test]
    fn unlimited_and_small_stacks_warn() {
        let p = Policy::default();
        assert_eq!(
            judge(&with_stack(Limit::Unlimited), &p).status(),
            Status::Warn
        );
        assert_eq!(
            judge(&with_stack(Limit::Bytes(2 << 20)), &p).status(),
            Status::Warn
        );
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
