//! `nccl-net-plugin`: the net plugin NCCL will load, found the way NCCL looks
//! for it (NCCL_NET_PLUGIN, libnccl-net.so). EFA needs aws-ofi-nccl (NET
//! "Libfabric"); InfiniBand and RoCE work with NCCL's built-in IB transport,
//! so there a plugin is optional. A plugin installed under
//! /opt/amazon/ofi-nccl but not on the library path is invisible to NCCL.

use super::rdma_scope::Scope;
use super::{Finding, Problem};
use crate::facts::gpu::LibraryState;
use crate::facts::rdma::NetPlugin;
use crate::facts::{Facts, Observed};
use crate::finding::Outcome;
use crate::platform::OFI_NCCL_DIRS;
use crate::policy::Policy;
use crate::predict::Prediction;

pub const ID: &str = "nccl-net-plugin";

/// What this image's libnccl and each plugin location said, as evidence.
fn load_evidence(facts: &Facts) -> Vec<String> {
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
    evidence
}

/// A plugin that loads: from where NCCL finds it, with the API this NCCL asks for.
fn loaded_plugin(
    facts: &Facts,
    p: &NetPlugin,
    across: &Outcome,
    evidence: &mut Vec<String>,
    problems: &mut Vec<Problem>,
) -> String {
    let needed = *across != Outcome::Unaffected;
    let from_ofi_dir = OFI_NCCL_DIRS.iter().any(|d| p.library.starts_with(d));
    if from_ofi_dir && needed {
        problems.push(Problem::predicts(
            across.clone(),
            format!("aws-ofi-nccl is installed ({}) but not on the library search path: NCCL will not load it", p.library),
            format!("Add its directory to the search path: LD_LIBRARY_PATH={}:$LD_LIBRARY_PATH", p.library.rsplit_once('/').map_or("", |(d, _)| d)),
        ));
    }
    if let Some(v) = &p.ofi_nccl_version {
        evidence.push(format!("aws-ofi-nccl {v}"));
    }
    if let Some(problem) = api_mismatch(facts, p, evidence, across.clone()) {
        problems.push(problem);
    }
    format!(
        "NCCL loads {} ({} {})",
        p.path.as_deref().unwrap_or(&p.library),
        p.name.as_deref().unwrap_or("unnamed"),
        p.api.as_deref().unwrap_or("no ncclNetPlugin symbol")
    )
}

/// No plugin where EFA needs one: NCCL falls back to TCP.
fn missing_plugin(efa: usize, env_plugin: Option<&str>, across: Outcome) -> Problem {
    Problem::predicts(
        across,
        format!("{efa} EFA device(s) but no NCCL net plugin: NCCL cannot use EFA and falls back to TCP"),
        // A value no library answers to is a typo in the variable, not a missing install;
        // a set but empty one is an empty list (src/plugin/net.cc initPluginLibsOnceFunc,
        // 2.27+: strtok_r finds no entry), which no install changes.
        match env_plugin {
            Some(v) if v.trim().is_empty() => format!(
                "Unset NCCL_NET_PLUGIN: NCCL 2.27 and later read NCCL_NET_PLUGIN={v:?} as a list of no plugin; unset, NCCL loads libnccl-net.so (aws-ofi-nccl)."
            ),
            Some(v) => super::nccl_env::network::net_plugin_fix(v),
            None => "Install aws-ofi-nccl in the image (the EFA installer or the aws-ofi-nccl package) and put /opt/amazon/ofi-nccl/lib on LD_LIBRARY_PATH.".to_string(),
        },
    )
}

/// No plugin loads: where EFA needs one, the problem; a finding of its own where the
/// devices could not be read or there are none.
fn no_plugin(
    facts: &Facts,
    (efa, needed, env_plugin): (usize, bool, Option<&str>),
    across: &Outcome,
    problems: &mut Vec<Problem>,
) -> Result<String, Finding> {
    if needed {
        problems.push(missing_plugin(efa, env_plugin, across.clone()));
    }
    if let Some(e) = facts.rdma.devices.error() {
        // Unreadable is not absent (issue 31 row 8): whether a plugin is needed
        // is unknown.
        return Err(Finding::predicts(
            ID,
            Outcome::undetermined("whether this node's NICs need a net plugin (EFA)"),
            format!(
                "no net plugin, and could not determine whether this node needs one: /sys/class/infiniband could not be read; {}",
                Scope::of(facts).span_words()
            ),
            "Make /sys/class/infiniband readable in the container (sysfs mounted read-only is enough).",
        )
        .evidence(e.to_string()));
    }
    if facts.rdma.devices.value().is_none_or(Vec::is_empty) && !needed {
        return Err(Finding::skip(ID, "no RDMA devices: no net plugin needed"));
    }
    Ok("no net plugin: NCCL uses its built-in IB transport".to_string())
}

pub fn judge(facts: &Facts, _prediction: &Prediction, policy: &Policy) -> Finding {
    let scope = Scope::of(facts);
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
    let mut evidence = load_evidence(facts);
    let needed = efa > 0 || policy.require.efa;
    // What a plugin NCCL cannot use does here: on EFA, TCP (NCCL's IB transport cannot
    // drive EFA); elsewhere NCCL's own IB transport carries the traffic as before.
    let across = if needed {
        scope.unusable_outcome(policy.require.efa, Scope::tcp_instead("EFA"))
    } else {
        Outcome::Unaffected
    };
    let plugin = match &facts.rdma.nccl.net_plugin {
        Observed::Value(p) => p.clone(),
        Observed::Error(e) => {
            let mut f = Finding::predicts(
                ID,
                across,
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
        .map(|v| v.value.as_str());
    let mut problems = Vec::new();
    let summary = match &plugin {
        Some(p) => loaded_plugin(facts, p, &across, &mut evidence, &mut problems),
        None if env_plugin.is_some_and(|v| v.eq_ignore_ascii_case("none")) => {
            if needed {
                problems.push(Problem::predicts(
                    across.clone(),
                    "NCCL_NET_PLUGIN=none on an EFA node: NCCL will use TCP".to_string(),
                    "Unset NCCL_NET_PLUGIN.",
                ));
            }
            "NCCL_NET_PLUGIN=none: no plugin".to_string()
        }
        None => match no_plugin(facts, (efa, needed, env_plugin), &across, &mut problems) {
            Ok(summary) => summary,
            Err(f) => return f.evidence(evidence.join("; ")),
        },
    };
    super::combine(ID, summary, evidence, problems)
}

/// "v4, v5" for the API versions `apis`.
fn api_list(apis: &[u32]) -> String {
    apis.iter()
        .map(|v| format!("v{v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The NCCL releases (2.minor) that look for ncclNet API `api`.
fn nccl_with(api: u32) -> Vec<u32> {
    (12..=30)
        .filter(|minor| {
            crate::nccl::net_plugin::accepted_apis(crate::nccl::Version::new(2, *minor, 0))
                .is_some_and(|(lo, hi)| lo <= api && api <= hi)
        })
        .collect()
}

/// The plugin's ncclNetPlugin_vN symbols against the versions this libnccl looks for: with
/// none in common NCCL drops the plugin with an INFO line and uses its built-in transports
/// (NVIDIA/nccl v2.28.9-1 src/plugin/net.cc, `crate::nccl::net_plugin::accepted_apis`).
fn api_mismatch(
    facts: &Facts,
    p: &crate::facts::rdma::NetPlugin,
    evidence: &mut Vec<String>,
    across: Outcome,
) -> Option<Problem> {
    use crate::nccl::net_plugin::{accepted_apis, newer_than_known};
    let version = crate::nccl::version(facts)?;
    let (lo, hi) = accepted_apis(version)?;
    let apis: Vec<u32> = if p.apis.is_empty() {
        // Facts from older versions recorded only the newest symbol.
        p.api
            .as_deref()?
            .strip_prefix('v')?
            .parse()
            .ok()
            .into_iter()
            .collect()
    } else {
        p.apis.clone()
    };
    let shown = version.to_string();
    let newer = newer_than_known(version);
    let used = crate::nccl::net_plugin::api_in_use(version, &apis);
    evidence.push(format!(
        "NCCL {shown} looks for ncclNetPlugin_v{hi} down to v{lo}{}; the plugin exports {}",
        if newer { " (or newer)" } else { "" },
        api_list(&apis)
    ));
    if let Some(v) = used {
        evidence.push(format!("NCCL uses the plugin's ncclNet v{v}"));
        return None;
    }
    let library = p.path.as_deref().unwrap_or(&p.library);
    let fallback = if facts
        .rdma
        .devices
        .value()
        .is_some_and(|d| d.iter().any(|d| d.is_efa()))
    {
        "TCP sockets"
    } else {
        "its built-in IB or socket transport"
    };
    let oldest = apis.first().copied().unwrap_or(0);
    let newest = apis.last().copied().unwrap_or(0);
    let fix = if newest < lo {
        format!(
            "Install a plugin built for NCCL {shown}: one that exports ncclNetPlugin_v{lo} to v{hi} (aws-ofi-nccl 1.5.0 and later export v2 to v6, \
             and each later release adds NCCL's newer versions), or use an NCCL release that still looks for v{newest}{}.",
            match nccl_with(newest).as_slice() {
                [first, .., last] => format!(" (2.{first} to 2.{last})"),
                [only] => format!(" (2.{only})"),
                [] => String::new(),
            }
        )
    } else {
        format!(
            "The plugin was built for a newer NCCL than {shown}: upgrade libnccl in the image to {} or later, or install a plugin \
             release that still exports ncclNetPlugin_v{hi} or older.",
            nccl_with(oldest)
                .first()
                .map_or_else(|| "a newer release".to_string(), |m| format!("2.{m}"))
        )
    };
    Some(Problem::predicts(
        across,
        format!(
            "NCCL {shown} finds no ncclNet API it knows in {library} (it exports {}, NCCL looks for v{lo} to v{hi}): NCCL silently skips the plugin and uses {fallback}",
            api_list(&apis)
        ),
        fix,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::rdma::NetPlugin;
    use crate::finding::Status;
    use crate::test_facts::{healthy, with_env, with_ib};

    /// The judge as the run calls it, with the prediction made from the same facts.
    fn judge(facts: &Facts, policy: &Policy) -> Finding {
        crate::test_facts::judged(super::judge, facts, policy)
    }

    fn efa() -> Facts {
        crate::test_facts::with_efa(healthy())
    }

    fn plugin(library: &str) -> Observed<Option<NetPlugin>> {
        Observed::Value(Some(NetPlugin {
            library: library.into(),
            path: Some(library.into()),
            api: Some("v9".into()),
            apis: vec![5, 6, 7, 8, 9],
            name: Some("Libfabric".into()),
            ofi_nccl_version: Some("1.14.0".into()),
        }))
    }

    /// Issue 36: without the plugin NCCL's IB transport cannot drive EFA and NCCL runs
    /// over TCP: a degraded run, a warning (a failure under --require efa).
    #[test]
    fn efa_requires_a_plugin_on_the_search_path() {
        assert_eq!(judge(&healthy(), &Policy::default()).status(), Status::Skip);
        assert_eq!(judge(&efa(), &Policy::default()).status(), Status::Warn);
        let strict = crate::policy::build(&[], &["efa".into()], None, None).unwrap();
        assert_eq!(judge(&efa(), &strict).status(), Status::Fail);
        let mut ok = efa();
        ok.rdma.nccl.net_plugin = plugin("libnccl-net.so");
        assert_eq!(judge(&ok, &Policy::default()).status(), Status::Pass);
        let mut hidden = efa();
        hidden.rdma.nccl.net_plugin = plugin("/opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so");
        let f = judge(&hidden, &Policy::default());
        assert_eq!(f.status(), Status::Warn);
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

    fn nccl(mut facts: Facts, version: &str) -> Facts {
        facts.rdma.nccl.library.state = LibraryState::Loaded(crate::facts::rdma::NcclLibrary {
            path: Some("/usr/lib/x86_64-linux-gnu/libnccl.so.2".into()),
            version: Observed::Value(version.into()),
            found_by: None,
        });
        facts
    }

    #[test]
    fn a_plugin_without_an_api_this_nccl_knows_is_skipped_by_nccl() {
        // aws-ofi-nccl up to 1.4 exported one symbol, that of the NCCL headers it was built
        // with: v4 for NCCL 2.9 to 2.11. NCCL 2.19 and later look for v5 and up.
        let mut old = nccl(efa(), "2.23.4");
        old.rdma.nccl.net_plugin = plugin("libnccl-net.so");
        if let Observed::Value(Some(p)) = &mut old.rdma.nccl.net_plugin {
            p.apis = vec![4];
            p.api = Some("v4".into());
        }
        let f = judge(&old, &Policy::default());
        assert_eq!(f.status(), Status::Warn, "{f:?}");
        assert!(
            f.summary
                .contains("silently skips the plugin and uses TCP sockets"),
            "{}",
            f.summary
        );
        let fix = f.remediation().unwrap();
        assert!(fix.contains("exports ncclNetPlugin_v5 to v8"), "{fix}");
        assert!(fix.contains("still looks for v4 (2.12 to 2.18)"), "{fix}");
        // A plugin built only for a newer NCCL: the fix names the first release that takes it.
        let mut new = nccl(with_ib(healthy()), "2.18.5");
        new.rdma.nccl.net_plugin = plugin("libnccl-net.so");
        if let Observed::Value(Some(p)) = &mut new.rdma.nccl.net_plugin {
            p.apis = vec![10, 11];
        }
        // NCCL's own IB transport carries the traffic as before: a note, with the fix.
        let f = judge(&new, &Policy::default());
        assert_eq!(
            f.status(),
            Status::Pass,
            "IB works without the plugin: {f:?}"
        );
        assert!(
            f.evidence
                .iter()
                .any(|e| e.contains("upgrade libnccl in the image to 2.26")),
            "{f:?}"
        );
        // In range: passes and says which version NCCL takes.
        let mut ok = nccl(efa(), "2.28.9");
        ok.rdma.nccl.net_plugin = plugin("libnccl-net.so");
        let f = judge(&ok, &Policy::default());
        assert_eq!(f.status(), Status::Pass);
        assert!(
            f.evidence
                .iter()
                .any(|e| e == "NCCL uses the plugin's ncclNet v9"),
            "{:?}",
            f.evidence
        );
    }
}
