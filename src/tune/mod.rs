//! tune: `&Facts -> Vec<Setting>`, pure.
//!
//! Each rule proposes a value with its reason. A variable the user already set
//! is kept and reported with source `user`, never overridden: the env file and
//! nccl.conf only ever carry `tuned` values (and nccl.conf is applied by NCCL
//! with setenv(..., overwrite=0) anyway, FACTS.md section 3).

pub mod socket_ifname;

use crate::facts::Facts;
use serde::{Deserialize, Serialize};

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

/// Every rule, in order. Each returns at most one setting per variable.
const RULES: &[fn(&Facts) -> Option<Setting>] = &[socket_ifname::rule];

/// Runs every rule; the result is sorted by name.
pub fn tune(facts: &Facts) -> Vec<Setting> {
    let mut settings: Vec<Setting> = RULES.iter().filter_map(|rule| rule(facts)).collect();
    settings.sort_by(|a, b| a.name.cmp(&b.name));
    settings
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
