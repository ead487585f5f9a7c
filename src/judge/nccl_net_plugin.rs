//! `nccl-net-plugin`: the net plugin NCCL will load, found the way NCCL looks
//! for it (NCCL_NET_PLUGIN, libnccl-net.so). EFA needs aws-ofi-nccl (NET
//! "Libfabric"); InfiniBand and RoCE work with NCCL's built-in IB transport,
//! so there a plugin is optional. A plugin installed under
//! /opt/amazon/ofi-nccl but not on the library path is invisible to NCCL.

use super::{Finding, Problem};
use crate::facts::gpu::LibraryState;
use crate::facts::{Facts, Observed};
use crate::finding::Severity;
use crate::platform::OFI_NCCL_DIRS;
use crate::policy::Policy;

pub const ID: &str = "nccl-net-plugin";

pub fn judge(facts: &Facts, policy: &Policy) -> Finding {
    let scope = super::rdma_scope::Scope::of(facts);
    if scope.own_image {
        return Finding::skip(
            ID,
            format!(
                "libnccl and its net plugin not probed: {}",
                crate::facts::ImageRole::OWN_REASON
            ),
        );
    }
    let devices = facts.rdma.devices.value().cloned().unwrap_or_default();
    // EFA this container can use (sysfs lists the node's, requested or not).
    let efa = if scope.nodes_unknown.is_some() {
        devices.iter().filter(|d| d.is_efa()).count()
    } else {
        scope.usable_efa()
    };
    let fail = scope.in_use_status(policy.require.efa);
    let nccl = &facts.rdma.nccl;
    let mut evidence = Vec::new();
    match &nccl.library.state {
        LibraryState::Loaded(l) => evidence.push(format!(
            "NCCL {} ({})",
            l.version.value().map_or("?", String::as_str),
            l.path.as_deref().unwrap_or(&nccl.library.library)
        )),
        LibraryState::NotFound { .. } => {
            evidence.push("no libnccl.so.2 in this image (the training image's may differ)".into())
        }
        LibraryState::Failed(e) => evidence.push(format!("libnccl: {e}")),
        LibraryState::Skipped { reason } => evidence.push(format!("libnccl not probed ({reason})")),
    }
    for a in &nccl.net_plugin_attempts {
        evidence.push(match &a.error {
            None => format!("{}: loaded", a.library),
            Some(e) => super::attempt_failure(&a.library, e),
        });
    }
    let needed = efa > 0 || policy.require.efa;
    let plugin = match &nccl.net_plugin {
        Observed::Value(p) => p.clone(),
        Observed::Error(e) => {
            let mut f = Finding::flagged(
                ID,
                if needed { fail } else { Severity::Warn },
                format!("the NCCL net plugin is present but does not load: {e}"),
                "Install what the plugin needs (dlerror names it: usually libfabric from /opt/amazon/efa/lib), e.g. LD_LIBRARY_PATH=/opt/amazon/efa/lib:/opt/amazon/ofi-nccl/lib",
            );
            f.evidence = evidence;
            return f;
        }
    };
    let env_plugin = facts
        .nccl_env
        .get("NCCL_NET_PLUGIN")
        .map(|v| v.value.clone());
    let mut problems = Vec::new();
    let summary = match &plugin {
        Some(p) => {
            let from_ofi_dir = OFI_NCCL_DIRS.iter().any(|d| p.library.starts_with(d));
            if from_ofi_dir && needed {
                problems.push(Problem::new(
                    fail,
                    format!("aws-ofi-nccl is installed ({}) but not on the library search path: NCCL will not load it", p.library),
                    format!("Add its directory to the search path: LD_LIBRARY_PATH={}:$LD_LIBRARY_PATH", p.library.rsplit_once('/').map_or("", |(d, _)| d)),
                ));
            }
            format!(
                "NCCL loads {} ({} {})",
                p.path.as_deref().unwrap_or(&p.library),
                p.name.as_deref().unwrap_or("unnamed"),
                p.api.as_deref().unwrap_or("no ncclNetPlugin symbol")
            )
        }
        None if env_plugin
            .as_deref()
            .is_some_and(|v| v.eq_ignore_ascii_case("none")) =>
        {
            if needed {
                problems.push(Problem::new(
                    fail,
                    "NCCL_NET_PLUGIN=none on an EFA node: NCCL will use TCP".to_string(),
                    "Unset NCCL_NET_PLUGIN.",
                ));
            }
            "NCCL_NET_PLUGIN=none: no plugin".to_string()
        }
        None => {
            if needed {
                problems.push(Problem::new(
                    fail,
                    format!("{efa} EFA device(s) but no NCCL net plugin: NCCL cannot use EFA and falls back to TCP"),
                    // A value no library answers to is a typo in the variable, not a missing install.
                    match env_plugin.as_deref().filter(|v| !v.trim().is_empty()) {
                        Some(v) => super::nccl_env::network::net_plugin_fix(v),
                        None => "Install aws-ofi-nccl in the image (the EFA installer or the aws-ofi-nccl package) and put /opt/amazon/ofi-nccl/lib on LD_LIBRARY_PATH.".to_string(),
                    },
                ));
            }
            if devices.is_empty() && !needed {
                return Finding::skip(ID, "no RDMA devices: no net plugin needed")
                    .evidence(evidence.join("; "));
            }
            "no net plugin: NCCL uses its built-in IB transport".to_string()
        }
    };
    super::combine(ID, summary, evidence, problems)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::rdma::NetPlugin;
    use crate::finding::Status;
    use crate::test_facts::{healthy, with_env, with_ib};

    fn efa() -> Facts {
        crate::test_facts::with_efa(healthy())
    }

    fn plugin(library: &str) -> Observed<Option<NetPlugin>> {
        Observed::Value(Some(NetPlugin {
            library: library.into(),
            path: Some(library.into()),
            api: Some("v9".into()),
            name: Some("Libfabric".into()),
        }))
    }

    #[test]
    fn efa_requires_a_plugin_on_the_search_path() {
        assert_eq!(judge(&healthy(), &Policy::default()).status(), Status::Skip);
        assert_eq!(judge(&efa(), &Policy::default()).status(), Status::Fail);
        let mut ok = efa();
        ok.rdma.nccl.net_plugin = plugin("libnccl-net.so");
        assert_eq!(judge(&ok, &Policy::default()).status(), Status::Pass);
        let mut hidden = efa();
        hidden.rdma.nccl.net_plugin = plugin("/opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so");
        let f = judge(&hidden, &Policy::default());
        assert_eq!(f.status(), Status::Fail);
        assert!(
            f.remediation()
                .unwrap()
                .contains("LD_LIBRARY_PATH=/opt/amazon/ofi-nccl/lib")
        );
        let mut off = with_env(efa(), &[("NCCL_NET_PLUGIN", "none")]);
        off.rdma.nccl.net_plugin = Observed::Value(None);
        assert!(
            judge(&off, &Policy::default())
                .summary
                .contains("NCCL_NET_PLUGIN=none")
        );
        let ib = with_ib(healthy());
        assert_eq!(judge(&ib, &Policy::default()).status(), Status::Pass);
    }
}
