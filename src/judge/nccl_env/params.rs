//! What the trainer's NCCL itself says of the variables, through its parameter API
//! (2.30 and later, `facts.nccl_files.params`): a value its parser refused (the parameter
//! stays at its default: NCCL says nothing else of it), a parameter NCCL marks unused or
//! deprecated that is set, and a value NCCL holds that neither the environment nor a
//! settings file gave (an env plugin, NCCL_ENV_PLUGIN, supplies it).

use super::Problem;
use crate::facts::{Facts, NcclParam};
use crate::finding::Outcome;

/// The parameter the tool itself sets in the child that asks NCCL.
const OWN: &str = "NCCL_PARAM_DUMP_ALL";

pub(super) fn lint_params(facts: &Facts) -> Vec<Problem> {
    let Some(params) = facts.nccl_files.params.as_ref().and_then(|p| p.value()) else {
        return Vec::new();
    };
    let version = crate::nccl::version(facts).map_or_else(String::new, |v| format!(" {v}"));
    params
        .iter()
        .filter(|p| p.key != OWN)
        .filter_map(|p| lint_param(facts, p, &version))
        .collect()
}

fn lint_param(facts: &Facts, p: &NcclParam, version: &str) -> Option<Problem> {
    let set = facts.nccl_env.get(&p.key);
    let from_nccl = p.set_by.as_deref() == Some("EnvPlugin");
    let held = p.value.as_deref().unwrap_or("");
    // A value the parser refused or a parameter NCCL no longer uses: NCCL runs as if it
    // were unset. A value only an env plugin supplies: what it does is not judged here.
    let (outcome, summary, fix) = match set {
        Some(v) if !v.value.is_empty() && p.set_by.as_deref() == Some("Default") => (
            Outcome::Unaffected,
            format!(
                "NCCL{version} keeps {} at its default ({held:?}): its parser refused {:?} (from {}), as its parameter API reports",
                p.key,
                v.value,
                v.source()
            ),
            format!(
                "Give {} a value NCCL accepts (`NCCL_PARAM_DUMP_ALL=1` and ncclParamDumpAll list them), or unset it.",
                p.key
            ),
        ),
        Some(_) if from_nccl && p.flags.iter().any(|f| f == "Unused" || f == "Deprecated") => (
            Outcome::Unaffected,
            format!(
                "NCCL{version} marks {} {}: setting it has no effect, or soon will not",
                p.key,
                p.flags.join(", ")
            ),
            format!("Unset {}.", p.key),
        ),
        None if from_nccl => (
            Outcome::undetermined("what the env plugin's value makes NCCL do"),
            format!(
                "NCCL{version} holds {}={held:?}, which neither the environment nor a settings file gives: an env plugin (NCCL_ENV_PLUGIN, libnccl-env.so) supplies it",
                p.key
            ),
            "Check the env plugin the image ships (NCCL_ENV_PLUGIN=none turns it off).".to_string(),
        ),
        _ => return None,
    };
    Some(Problem::predicts(outcome, summary, fix))
}

/// The evidence line: how many parameters NCCL knows and which are set.
pub(super) fn evidence(facts: &Facts) -> Option<String> {
    let version = crate::nccl::version(facts)?;
    Some(match facts.nccl_files.params.as_ref()? {
        crate::facts::Observed::Value(params) => {
            let set: Vec<&str> = params
                .iter()
                .filter(|p| p.key != OWN && p.set_by.as_deref() == Some("EnvPlugin"))
                .map(|p| p.key.as_str())
                .collect();
            format!(
                "NCCL {version}'s parameter API: {} parameters, set: {}",
                params.len(),
                if set.is_empty() {
                    "none".to_string()
                } else {
                    set.join(", ")
                }
            )
        }
        crate::facts::Observed::Error(e) => {
            format!("NCCL {version}'s parameter API could not be asked: {e}")
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::Observed;
    use crate::test_facts::{healthy, with_env};

    fn param(key: &str, value: &str, set_by: &str, flags: &[&str]) -> NcclParam {
        NcclParam {
            key: key.into(),
            value: Some(value.into()),
            type_name: Some("bool".into()),
            set_by: Some(set_by.into()),
            flags: flags.iter().map(|f| f.to_string()).collect(),
        }
    }

    #[test]
    fn what_nccl_refused_ignores_or_got_elsewhere() {
        // NCCL_SET_THREAD_NAME=yes on the 2.30.7 wheel: set_by=Default (measured here).
        let mut f = with_env(
            healthy(),
            &[("NCCL_SET_THREAD_NAME", "yes"), ("NCCL_OLD", "1")],
        );
        f.nccl_files.params = Some(Observed::Value(vec![
            param("NCCL_PARAM_DUMP_ALL", "TRUE", "EnvPlugin", &[]),
            param("NCCL_SET_THREAD_NAME", "FALSE", "Default", &["Cached"]),
            param("NCCL_OLD", "1", "EnvPlugin", &["Deprecated"]),
            param("NCCL_FROM_PLUGIN", "x", "EnvPlugin", &[]),
            param("NCCL_QUIET", "FALSE", "Default", &[]),
        ]));
        let p = lint_params(&f);
        assert_eq!(p.len(), 3, "{p:?}");
        assert!(
            p[0].summary.contains("its parser refused \"yes\""),
            "{}",
            p[0].summary
        );
        assert!(p[1].summary.contains("Deprecated"), "{}", p[1].summary);
        assert!(p[2].summary.contains("env plugin"), "{}", p[2].summary);
        let e = evidence(&f).unwrap();
        assert!(
            e.contains("5 parameters, set: NCCL_OLD, NCCL_FROM_PLUGIN"),
            "{e}"
        );
    }
}
