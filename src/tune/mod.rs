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
pub fn user_setting(facts: &Facts, name: &str) -> Option<Setting> {
    facts.nccl_env.get(name).map(|v| Setting {
        name: name.to_string(),
        value: v.value.clone(),
        reason: if v.not_utf8 {
            "set by the user (not valid UTF-8; shown with replacement characters); kept".into()
        } else {
            "set by the user; kept as is and checked by nccl-env".into()
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
}
