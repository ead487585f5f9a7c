//! tune: `&Facts -> Vec<Setting>`, pure.
//!
//! The rules are a table (`RULES`): each looks at the facts and proposes
//! variables with a reason that names its source. Rules propose only what an
//! expert would defend for this node: nothing where NCCL's own detection is
//! right. Then every variable the user already set wins: it is kept and
//! reported with source `user`, never overridden (the env file and nccl.conf
//! carry only `tuned` values; NCCL applies nccl.conf with setenv(...,
//! overwrite=0) anyway, FACTS.md section 3). No two rules set one variable.

pub mod efa;
pub mod flight_recorder;
pub mod ib;
pub mod socket_ifname;

use crate::facts::Facts;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Where a setting's value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// Already in the environment; kept.
    User,
    /// Proposed by nccl-preflight.
    Tuned,
}

/// One NCCL (or libfabric) variable with its value and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Setting {
    pub name: String,
    pub value: String,
    pub reason: String,
    pub source: Source,
}

impl Setting {
    pub fn tuned(name: &str, value: impl Into<String>, reason: impl Into<String>) -> Setting {
        Setting {
            name: name.to_string(),
            value: value.into(),
            reason: reason.into(),
            source: Source::Tuned,
        }
    }
}

/// One tuning rule: what it is about, and the settings it proposes.
pub struct Rule {
    /// What the rule tunes; the test that gives each variable one rule names it.
    #[cfg_attr(
        not(test),
        expect(
            dead_code,
            reason = "read by the test that gives each variable one rule"
        )
    )]
    pub about: &'static str,
    pub propose: fn(&Facts) -> Vec<Setting>,
}

/// Every rule. Each variable belongs to exactly one rule.
pub const RULES: &[Rule] = &[
    Rule {
        about: "socket interface for bootstrap and the socket transport",
        propose: socket_ifname::rule,
    },
    Rule {
        about: "aws-ofi-nccl's platform table on EFA instances, and what old libfabric needs",
        propose: efa::rule,
    },
    Rule {
        about: "InfiniBand and RoCE HCAs, ports and GID index",
        propose: ib::rule,
    },
];

/// Runs every rule, then lets the user's own variables win; sorted by name.
pub fn tune(facts: &Facts) -> Vec<Setting> {
    let mut settings: BTreeMap<String, Setting> = BTreeMap::new();
    for rule in RULES {
        for s in (rule.propose)(facts) {
            settings.insert(s.name.clone(), s);
        }
    }
    // Image metadata such as NCCL_VERSION is not a setting the user made.
    for name in facts
        .nccl_env
        .keys()
        .filter(|n| crate::nccl::catalog::is_setting(n))
    {
        if let Some(user) = user_setting(facts, name) {
            let reason = match settings.get(name) {
                Some(t) if t.value != user.value => format!(
                    "{}; nccl-preflight would set {:?}: {}",
                    user.reason, t.value, t.reason
                ),
                _ => user.reason.clone(),
            };
            settings.insert(name.clone(), Setting { reason, ..user });
        }
    }
    settings.into_values().collect()
}

/// The setting for `name` when the user already set it: kept, reported as `user`.
fn user_setting(facts: &Facts, name: &str) -> Option<Setting> {
    facts.nccl_env.get(name).map(|v| Setting {
        name: name.to_string(),
        value: v.value.clone(),
        reason: match &v.from {
            _ if v.not_utf8 => {
                "set by the user (not valid UTF-8; shown with replacement characters); kept".into()
            }
            // NCCL applies the files without overwriting: a tuned value in the environment
            // or in NCCL_CONF_FILE would replace the file's.
            Some(from) => format!("set in {from}; kept as is and checked by nccl-env"),
            None => "set by the user; kept as is and checked by nccl-env".into(),
        },
        source: Source::User,
    })
}

#[cfg(test)]
mod tests {
    use crate::test_facts::{healthy, with_env};

    #[test]
    fn nccl_version_from_cuda_images_is_not_a_setting() {
        let tuned = super::tune(&with_env(healthy(), &[("NCCL_VERSION", "2.21.5-1")]));
        assert!(tuned.iter().all(|s| s.name != "NCCL_VERSION"));
    }

    use super::{RULES, Source, tune};
    use crate::facts::Facts;
    use crate::facts::Observed;
    use crate::test_facts::{roce_two_nics, with_efa};

    /// Nodes on which the rules propose something: a pod network, EFA, RoCE with
    /// a port down under an old NCCL (HCA and GID index).
    fn tuned_nodes() -> Vec<Facts> {
        let mut roce = roce_two_nics("DOWN");
        if let Observed::Value(d) = &mut roce.rdma.devices {
            d[0].ports[0].gids = vec![crate::facts::rdma::Gid {
                index: 3,
                gid: "::ffff:10.1.0.5".into(),
                kind: Some("RoCE v2".into()),
                netdev: None,
            }];
        }
        if let crate::facts::gpu::LibraryState::Loaded(l) = &mut roce.rdma.nccl.library.state {
            l.version = Observed::Value("2.18.5".into());
        }
        vec![healthy(), with_efa(healthy()), roce]
    }

    #[test]
    fn no_two_rules_propose_one_variable() {
        for (n, facts) in tuned_nodes().iter().enumerate() {
            let mut seen = std::collections::BTreeMap::new();
            for rule in RULES {
                for s in (rule.propose)(facts) {
                    assert_eq!(s.source, Source::Tuned, "{}", s.name);
                    assert!(!s.reason.is_empty(), "{} has no reason", s.name);
                    if let Some(other) = seen.insert(s.name.clone(), rule.about) {
                        panic!(
                            "node {n}: {} proposed by {other:?} and {:?}",
                            s.name, rule.about
                        );
                    }
                }
            }
            assert!(
                !seen.is_empty(),
                "node {n} tunes nothing: the test proves nothing"
            );
        }
    }

    #[test]
    fn every_variable_any_rule_tunes_is_left_to_a_user_who_set_it() {
        for facts in tuned_nodes() {
            let tuned = tune(&facts);
            let names: Vec<&str> = tuned
                .iter()
                .map(|s| s.name.as_str())
                .filter(|n| crate::nccl::catalog::is_setting(n))
                .collect();
            assert!(!names.is_empty());
            for name in names {
                let theirs = tune(&with_env(facts.clone(), &[(name, "users-own")]));
                let s = theirs.iter().find(|s| s.name == name).unwrap();
                assert_eq!(
                    (s.value.as_str(), s.source),
                    ("users-own", Source::User),
                    "{name}"
                );
                assert!(s.reason.starts_with("set by the user"), "{}", s.reason);
                assert!(
                    s.reason.contains("nccl-preflight would set"),
                    "{}",
                    s.reason
                );
                // The other variables are still tuned as before.
                assert_eq!(
                    theirs.iter().filter(|t| t.name != name).collect::<Vec<_>>(),
                    tuned.iter().filter(|t| t.name != name).collect::<Vec<_>>()
                );
            }
        }
    }

    #[test]
    fn a_user_value_equal_to_ours_is_reported_as_theirs_without_a_counter_proposal() {
        let facts = with_env(healthy(), &[("NCCL_SOCKET_IFNAME", "=eth0")]);
        let s = tune(&facts)
            .into_iter()
            .find(|s| s.name == "NCCL_SOCKET_IFNAME")
            .unwrap();
        assert_eq!(s.source, Source::User);
        assert_eq!(
            s.reason,
            "set by the user; kept as is and checked by nccl-env"
        );
    }

    #[test]
    fn a_value_a_settings_file_gives_is_kept_and_named() {
        // NCCL applies /etc/nccl.conf without overwriting (src/misc/param.cc setEnvFile):
        // a tuned value in the environment would replace the file's.
        for facts in tuned_nodes() {
            let Some(name) = tune(&facts)
                .into_iter()
                .map(|s| s.name)
                .find(|n| crate::nccl::catalog::is_setting(n))
            else {
                continue;
            };
            let mut f = facts.clone();
            f.nccl_env.insert(
                name.clone(),
                crate::facts::EnvValue {
                    from: Some(crate::facts::FileLine {
                        path: "/etc/nccl.conf".into(),
                        line: 4,
                    }),
                    ..crate::facts::EnvValue::text("from-file")
                },
            );
            let s = tune(&f).into_iter().find(|s| s.name == name).unwrap();
            assert_eq!((s.value.as_str(), s.source), ("from-file", Source::User));
            assert!(
                s.reason.starts_with("set in /etc/nccl.conf line 4; kept"),
                "{}",
                s.reason
            );
        }
    }

    #[test]
    fn settings_come_sorted_by_name() {
        for facts in tuned_nodes() {
            let names: Vec<String> = tune(&facts).into_iter().map(|s| s.name).collect();
            let mut sorted = names.clone();
            sorted.sort();
            assert_eq!(names, sorted);
        }
    }
}
