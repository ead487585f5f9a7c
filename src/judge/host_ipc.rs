//! `host-ipc`: whether the pod shares the host's IPC namespace.
//!
//! NCCL >= 2.19 moves GPU memory handles as cuMem file descriptors over abstract
//! UNIX sockets, so a private IPC namespace does not block P2P: measured, ranks
//! in separate IPC namespaces with one hostname still ran P2P/CUMEM at 295 GB/s
//! (FACTS.md section 1). So this is reported, and fails only under
//! `--require host-ipc`. The initial IPC namespace has inode 4026531839
//! (PROC_IPC_INIT_INO, FACTS.md section 7).

use super::{Finding, undetermined, unmet};
use crate::facts::{Facts, Observed};
use crate::policy::Policy;
use crate::predict::Prediction;
use crate::remediation;

pub const ID: &str = "host-ipc";
const PROC_IPC_INIT_INO: u64 = 4026531839;

pub fn judge(facts: &Facts, _prediction: &Prediction, policy: &Policy) -> Finding {
    let required = policy.require.host_ipc;
    match &facts.namespaces.ipc {
        Observed::Error(e) => Finding::predicts(
            ID,
            undetermined(required, "/proc/self/ns/ipc could not be read"),
            "could not determine the IPC namespace",
            remediation::HOST_IPC,
        )
        .undetermined()
        .evidence(e.to_string()),
        Observed::Value(inode) => {
            let evidence = format!("/proc/self/ns/ipc -> ipc:[{inode}]");
            if *inode == PROC_IPC_INIT_INO {
                Finding::pass(ID, "host IPC namespace").evidence(evidence)
            } else if required {
                Finding::predicts(
                    ID,
                    unmet("--require host-ipc"),
                    "private IPC namespace, but --require host-ipc asks for the host's",
                    remediation::HOST_IPC,
                )
                .evidence(evidence)
            } else {
                Finding::pass(ID,
                    "private IPC namespace (fine for NCCL >= 2.19, which shares GPU memory through cuMem handles, not System V IPC)")
                .evidence(evidence)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::finding::Status;
    use crate::policy;
    use crate::test_facts::healthy;

    /// The judge as the run calls it, with the prediction made from the same facts.
    fn judge(facts: &Facts, policy: &Policy) -> Finding {
        crate::test_facts::judged(super::judge, facts, policy)
    }

    #[test]
    fn private_namespace_fails_only_when_required() {
        let mut f = healthy();
        assert_eq!(judge(&f, &Policy::default()).summary, "host IPC namespace");
        f.namespaces.ipc = Observed::Value(4026532300);
        assert_eq!(judge(&f, &Policy::default()).status(), Status::Pass);
        let req = policy::build(&[], &["host-ipc".into()], None, None).unwrap();
        let finding = judge(&f, &req);
        assert_eq!(finding.status(), Status::Fail);
        assert!(finding.remediation().unwrap().contains("hostIPC: true"));
        f.namespaces.ipc =
            Observed::Error(crate::facts::FactError::new("/proc/self/ns/ipc", "EACCES"));
        assert_eq!(judge(&f, &Policy::default()).status(), Status::Warn);
        assert_eq!(judge(&f, &req).status(), Status::Fail);
    }
}
