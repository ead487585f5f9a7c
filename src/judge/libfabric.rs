//! `libfabric`: where EFA devices exist (or `--require efa`), libfabric must
//! load and its efa provider must offer RDM endpoints, as aws-ofi-nccl asks.
//! EFA's libfabric lives under /opt/amazon/efa/lib, outside the default search
//! path (FACTS.md section 4); a libfabric whose own dependencies are missing
//! fails to load, and dlerror says which.

use super::rdma_scope::Scope;
use super::{Finding, Problem};
use crate::facts::gpu::LibraryState;
use crate::facts::rdma::FabricFacts;
use crate::facts::{Facts, Observed};
use crate::finding::Outcome;
use crate::policy::Policy;
use crate::predict::Prediction;

pub const ID: &str = "libfabric";

const INSTALL: &str = "\
Use an image with the EFA software: the aws-efa-installer (--skip-kmod) installs libfabric with the efa
provider under /opt/amazon/efa, and aws-ofi-nccl under /opt/amazon/ofi-nccl; or mount them from the node.";

/// A libfabric that loads: its efa provider must offer RDM endpoints, and it must be new
/// enough for the plugin.
fn loaded(
    facts: &Facts,
    f: &FabricFacts,
    needed: bool,
    outcome: &Outcome,
    mut evidence: Vec<String>,
) -> Finding {
    let library = &facts.rdma.libfabric.library;
    evidence.push(format!("providers: {}", f.providers.join(", ")));
    let mut problems = Vec::new();
    let rdm = f.efa_rdm.value().copied();
    evidence.push(match &f.efa_rdm {
        Observed::Value(n) => format!("fi_getinfo(efa, FI_EP_RDM): {n} endpoint(s)"),
        Observed::Error(e) => format!("fi_getinfo(efa, FI_EP_RDM): {e}"),
    });
    let outcome = if needed {
        outcome.clone()
    } else {
        Outcome::Unaffected
    };
    if let Some((summary, fix)) = too_old_for_the_plugin(facts, &f.version) {
        problems.push(Problem::predicts(outcome.clone(), summary, fix));
    }
    if needed && rdm.unwrap_or(0) == 0 {
        problems.push(Problem::predicts(
            outcome,
            format!("libfabric {} from {library} lists no efa RDM endpoint: NCCL falls back to TCP", f.version),
            format!("{INSTALL}\nOne verbs device this container cannot open can also hide the provider: see rdma-devices."),
        ));
    }
    super::combine(
        ID,
        format!(
            "libfabric {} from {library}{}",
            f.version,
            if needed { ", efa provider visible" } else { "" }
        ),
        evidence,
        problems,
    )
}

pub fn judge(facts: &Facts, _prediction: &Prediction, policy: &Policy) -> Finding {
    let scope = Scope::of(facts);
    // EFA this container can use (or could not rule out): sysfs lists the node's devices
    // whether or not the pod asked for them, and a pod without them never loads libfabric.
    let efa = if scope.nodes_unknown.is_some() {
        scope.node_devices().iter().filter(|d| d.is_efa()).count()
    } else {
        scope.usable_efa()
    };
    let needed = efa > 0 || policy.require.efa;
    let outcome = scope.unusable_outcome(policy.require.efa, Scope::tcp_instead("EFA"));
    let attempts: Vec<String> = facts
        .rdma
        .libfabric_attempts
        .iter()
        .map(|a| match &a.error {
            None => format!("{}: loaded", a.library),
            Some(e) => super::attempt_failure(&a.library, e),
        })
        .collect();
    match &facts.rdma.libfabric.state {
        LibraryState::Loaded(f) => loaded(facts, f, needed, &outcome, attempts),
        LibraryState::NotFound { message } => {
            let mut f = if needed {
                Finding::predicts(
                    ID,
                    outcome,
                    format!(
                        "{efa} EFA device(s) but no libfabric in this image: aws-ofi-nccl cannot open EFA"
                    ),
                    INSTALL,
                )
            } else {
                Finding::skip(ID, "no libfabric (not needed without EFA)")
            };
            f.evidence = attempts;
            if f.evidence.is_empty() {
                f.evidence.push(message.clone());
            }
            f
        }
        LibraryState::Failed(e) => {
            let mut f = Finding::predicts(
                ID,
                if needed { outcome } else { Outcome::Unaffected },
                format!("libfabric is present but does not load: {e}"),
                format!(
                    "Install what it needs (dlerror names it), or use the EFA installer's copy.\n{INSTALL}"
                ),
            );
            f.evidence = attempts;
            f
        }
        LibraryState::Skipped { reason } => {
            Finding::skip(ID, format!("libfabric not probed: {reason}"))
        }
    }
}

/// aws-ofi-nccl refuses the efa provider below its minimum libfabric
/// (`crate::nccl::net_plugin::ofi_nccl_min_libfabric`): NCCL then has no EFA transport.
fn too_old_for_the_plugin(facts: &Facts, libfabric: &str) -> Option<(String, String)> {
    use crate::nccl::net_plugin::{libfabric_version, ofi_nccl_min_libfabric};
    let plugin = facts.rdma.nccl.net_plugin.value()?.as_ref()?;
    let ofi = plugin.ofi_nccl_version.as_deref()?;
    let (want_major, want_minor) = ofi_nccl_min_libfabric(ofi)?;
    let have = libfabric_version(libfabric)?;
    if have >= (want_major, want_minor) {
        return None;
    }
    Some((
        format!(
            "aws-ofi-nccl {ofi} needs libfabric {want_major}.{want_minor} or newer for EFA, this is {libfabric}: \
             the plugin refuses the efa provider (\"EFA provider requires at least libfabric version {want_major}.{want_minor}.0\") and NCCL falls back to TCP"
        ),
        format!(
            "Use the libfabric the EFA installer of the same release ships (/opt/amazon/efa/lib, first on LD_LIBRARY_PATH), \
             or an aws-ofi-nccl release that accepts libfabric {libfabric}.\n{INSTALL}"
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::Observed;
    use crate::facts::rdma::FabricFacts;
    use crate::finding::Status;
    use crate::test_facts::healthy;

    /// The judge as the run calls it, with the prediction made from the same facts.
    fn judge(facts: &Facts, policy: &Policy) -> Finding {
        crate::test_facts::judged(super::judge, facts, policy)
    }

    fn efa() -> Facts {
        crate::test_facts::with_efa(healthy())
    }

    /// Issue 36: without libfabric's efa provider aws-ofi-nccl cannot open EFA and NCCL
    /// runs over TCP (src/net.cc ncclNetInit drops a network whose init failed): a
    /// degraded run, a warning, unless --require efa asks for EFA.
    #[test]
    fn efa_needs_the_efa_provider() {
        assert_eq!(judge(&healthy(), &Policy::default()).status(), Status::Pass);
        let f = judge(&efa(), &Policy::default());
        assert_eq!(
            f.status(),
            Status::Warn,
            "Debian's libfabric has no efa endpoint here"
        );
        assert!(
            matches!(f.outcome(), Some(crate::finding::Outcome::Degraded { path, .. }) if path.contains("TCP")),
            "{f:?}"
        );
        let strict = crate::policy::build(&[], &["efa".into()], None, None).unwrap();
        assert_eq!(judge(&efa(), &strict).status(), Status::Fail);
        let mut ok = efa();
        ok.rdma.libfabric.state = LibraryState::Loaded(FabricFacts {
            version: "1.22".into(),
            providers: vec!["efa".into()],
            efa_rdm: Observed::Value(4),
        });
        assert_eq!(judge(&ok, &Policy::default()).status(), Status::Pass);
        let mut broken = efa();
        broken.rdma.libfabric.state = LibraryState::Failed(crate::facts::FactError::new(
            "dlopen(/opt/amazon/efa/lib/libfabric.so.1)",
            "libefa.so.1: cannot open shared object file",
        ));
        let f = judge(&broken, &Policy::default());
        assert_eq!(f.status(), Status::Warn);
        assert!(f.summary.contains("does not load"));
        let mut absent = healthy();
        absent.rdma.libfabric.state = LibraryState::NotFound {
            message: "none".into(),
        };
        assert_eq!(judge(&absent, &Policy::default()).status(), Status::Skip);
    }

    #[test]
    fn a_libfabric_older_than_aws_ofi_nccl_accepts_puts_nccl_on_tcp() {
        let mut f = efa();
        f.rdma.libfabric.state = LibraryState::Loaded(FabricFacts {
            version: "1.21".into(),
            providers: vec!["efa".into()],
            efa_rdm: Observed::Value(4),
        });
        let mut f = crate::test_facts::with_ofi_plugin(f);
        let finding = judge(&f, &Policy::default());
        assert_eq!(finding.status(), Status::Warn, "{finding:?}");
        assert!(
            finding
                .summary
                .contains("aws-ofi-nccl 1.13.2-aws needs libfabric 1.22")
        );
        // The same libfabric suits aws-ofi-nccl 1.12 (1.18 and later).
        if let Observed::Value(Some(p)) = &mut f.rdma.nccl.net_plugin {
            p.ofi_nccl_version = Some("1.12.1-aws".into());
        }
        assert_eq!(judge(&f, &Policy::default()).status(), Status::Pass);
    }

    #[test]
    fn regression_pod_without_efa_resource_or_single_node_does_not_fail() {
        // sysfs shows the node's EFA devices, but the pod has no device node: no EFA here.
        let mut no_resource = efa();
        no_resource.rdma.uverbs = Observed::Value(vec![]);
        assert_eq!(
            judge(&no_resource, &Policy::default()).status(),
            Status::Pass
        );
        // One node: NCCL sends nothing over EFA, a note; across nodes TCP, a warning.
        let single = crate::test_facts::with_env(efa(), &[("PET_NNODES", "1")]);
        assert_eq!(judge(&single, &Policy::default()).status(), Status::Pass);
        let multi = crate::test_facts::with_env(efa(), &[("PET_NNODES", "2")]);
        assert_eq!(judge(&multi, &Policy::default()).status(), Status::Warn);
    }
}
