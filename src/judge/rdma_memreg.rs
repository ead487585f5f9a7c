//! `rdma-memreg`: a real ibv_reg_mr of `--memreg-size` on every device this
//! container can open, as NCCL registers its buffers. ENOMEM here is "Call to
//! ibv_reg_mr failed" (or a silent TCP fallback) hours into a job (FACTS.md
//! section 2).

use super::{Finding, Problem};
use crate::facts::gpu::LibraryState;
use crate::facts::{Facts, Limit, Observed};
use crate::finding::Owner;
use crate::policy::Policy;
use crate::predict::Prediction;
use crate::remediation;
use crate::units::format_bytes;

pub const ID: &str = "rdma-memreg";

pub fn judge(facts: &Facts, _prediction: &Prediction, policy: &Policy) -> Finding {
    let verbs = match &facts.rdma.verbs.state {
        LibraryState::Loaded(v) => v,
        // In nccl-preflight's own image the registration needs the trainer's libibverbs:
        // `exec`, or the installed binary in the training image, covers it.
        LibraryState::Skipped { reason } => {
            return Finding::skip(ID, format!("no registration tried: {reason}"));
        }
        _ => {
            return Finding::skip(ID, "libibverbs not loaded: no registration tried");
        }
    };
    let scope = super::rdma_scope::Scope::of(facts);
    let required = policy.require.any_rdma();
    let Observed::Value(devices) = &verbs.devices else {
        return Finding::skip(ID, "no RDMA device to register memory on");
    };
    let tried: Vec<_> = devices
        .iter()
        .filter_map(|d| d.memreg.as_ref().map(|m| (d, m)))
        .collect();
    if tried.is_empty() {
        return Finding::skip(ID, "no RDMA device to register memory on");
    }
    let size = format_bytes(verbs.memreg_bytes);
    let mut problems = Vec::new();
    let mut evidence = Vec::new();
    for (d, m) in &tried {
        match m {
            Observed::Value(()) => evidence.push(format!("{}: registered {size}", d.name)),
            Observed::Error(e) => {
                evidence.push(format!("{}: {e}", d.name));
                // ibv_reg_mr pins the buffer: the kernel refuses above RLIMIT_MEMLOCK
                // without CAP_IPC_LOCK with ENOMEM (EAGAIN or EPERM from some providers).
                let memlock = matches!(e.errno, Some(libc::ENOMEM | libc::EAGAIN | libc::EPERM));
                // NCCL registers its buffers the same way in its first collective.
                let outcome = scope.in_use_outcome(required, super::memlock::registration_fails());
                let owner = if memlock {
                    super::memlock::owner(&facts.memlock, Limit::Bytes(verbs.memreg_bytes))
                } else {
                    Owner::Driver
                };
                problems.push(Problem::predicts(
                    outcome,
                    format!("{}: registering {size} failed ({}){}", d.name, e.message, if memlock { ": the memlock limit is too low" } else { "" }),
                    if memlock { remediation::MEMLOCK } else { "Check the device with ibv_devinfo and the kernel log (dmesg) for the provider's error." },
                ).blamed(owner));
            }
        }
    }
    super::combine(
        ID,
        format!("registered {size} on {} device(s)", tried.len()),
        evidence,
        problems,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::FactError;
    use crate::finding::Status;
    use crate::test_facts::{healthy, with_ib};

    /// The judge as the run calls it, with the prediction made from the same facts.
    fn judge(facts: &Facts, policy: &Policy) -> Finding {
        crate::test_facts::judged(super::judge, facts, policy)
    }

    #[test]
    fn enomem_is_the_memlock_failure() {
        assert_eq!(judge(&healthy(), &Policy::default()).status(), Status::Skip);
        let mut f = with_ib(healthy());
        assert_eq!(
            judge(&f, &Policy::default()).summary,
            "registered 128 MiB on 1 device(s)"
        );
        if let LibraryState::Loaded(v) = &mut f.rdma.verbs.state
            && let Observed::Value(d) = &mut v.devices
        {
            d[0].memreg = Some(Observed::Error(
                FactError::new(
                    "ibv_reg_mr(mlx5_0, 134217728 bytes)",
                    "ENOMEM: Cannot allocate memory",
                )
                .with_errno(libc::ENOMEM),
            ));
        }
        let finding = judge(&f, &Policy::default());
        assert_eq!(finding.status(), Status::Fail);
        assert!(finding.summary.contains("memlock limit is too low"));
        assert!(finding.remediation().unwrap().contains("IPC_LOCK"));
        // The errno decides, not the text: an I/O error whose message happens to start
        // like ENOMEM's is the device's problem, not the memlock limit.
        if let LibraryState::Loaded(v) = &mut f.rdma.verbs.state
            && let Observed::Value(d) = &mut v.devices
        {
            d[0].memreg = Some(Observed::Error(
                FactError::new("ibv_reg_mr(mlx5_0, 134217728 bytes)", "ENOMEM-like text")
                    .with_errno(libc::EIO),
            ));
        }
        let finding = judge(&f, &Policy::default());
        assert_eq!(finding.status(), Status::Fail);
        assert!(!finding.summary.contains("memlock"), "{}", finding.summary);
        assert!(finding.remediation().unwrap().contains("ibv_devinfo"));
    }
}
