//! NCCL_* names against the variables the NCCL version reads
//! (src/nccl/variables.tsv, generated from NVIDIA/nccl's release tags): a name
//! no release reads is most often a typo (`NCCL_IB_HBA` for NCCL_IB_HCA) that
//! NCCL ignores without a word; a name this version does not read yet, or no
//! longer, does nothing either.

use super::Problem;
use crate::facts::Facts;
use crate::finding::Outcome;
use crate::nccl::Version;
use crate::nccl::catalog::{self, Catalog, Lookup};

/// NCCL_* names PyTorch reads, not NCCL: ProcessGroupNCCL.hpp (torch 2.2 and
/// later) reads each as the legacy spelling of its TORCH_NCCL_* variable.
const READ_BY_PYTORCH: &[&str] = &[
    "NCCL_ASYNC_ERROR_HANDLING",
    "NCCL_BLOCKING_WAIT",
    "NCCL_DESYNC_DEBUG",
    "NCCL_ENABLE_TIMING",
];

/// NVIDIA/nccl-tests reads its own settings under this prefix
/// (src/common.cu, src/util.cu, src/alltoallv.cu: NCCL_TESTS_DEVICE,
/// NCCL_TESTS_SPLIT_MASK, NCCL_TESTS_MIN_BW, ...).
const NCCL_TESTS_PREFIX: &str = "NCCL_TESTS_";

fn range(rows: &[&catalog::VarRow]) -> String {
    rows.iter()
        .map(|r| {
            if r.first == r.last {
                r.first.to_string()
            } else {
                format!("{} to {}", r.first, r.last)
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

pub(super) fn lint_names(
    facts: &Facts,
    catalog: &Catalog,
    version: Option<Version>,
) -> Vec<Problem> {
    let mut out = Vec::new();
    let tags = format!(
        "{} to {}",
        catalog.tags.first().copied().unwrap_or_default(),
        catalog.latest()
    );
    for (name, value) in &facts.nccl_env {
        if !name.starts_with("NCCL_")
            || !catalog::is_nccl_setting(catalog, name)
            || READ_BY_PYTORCH.contains(&name.as_str())
            || name.starts_with(NCCL_TESTS_PREFIX)
        {
            continue;
        }
        match catalog.lookup(name, version) {
            Lookup::Reads(_) => {}
            Lookup::OtherVersions(rows) => {
                // OtherVersions only comes with a known version.
                let v = version.map(|v| v.to_string()).unwrap_or_default();
                let when = if rows.iter().all(|r| version.is_some_and(|v| r.last < v)) {
                    "no longer reads it"
                } else if rows.iter().all(|r| version.is_some_and(|v| r.first > v)) {
                    "does not read it yet"
                } else {
                    "does not read it"
                };
                // NCCL runs as without it: a note (issue 36).
                out.push(Problem::predicts(
                    Outcome::Unaffected,
                    format!(
                        "{name} does nothing with NCCL {v}: this version {when} (read by NCCL {})",
                        range(&rows)
                    ),
                    format!("Unset {name}, or use an NCCL that reads it."),
                ));
            }
            Lookup::Unknown => {
                let (summary, fix) = match catalog.nearest(name) {
                    Some(near) => (
                        format!(
                            "{name} is not a variable NCCL reads (no release from {tags} does): a typo for {near}?"
                        ),
                        format!("Rename it: {near}='{}'", value.value),
                    ),
                    None => (
                        format!(
                            "{name} is not a variable NCCL reads (no release from {tags} does), so NCCL ignores it"
                        ),
                        format!(
                            "Unset {name}, or check its spelling in NCCL's environment variable list (a net or tuner plugin may read it: then ignore this)."
                        ),
                    ),
                };
                // NCCL never reads it and runs as without it: a note (issue 36).
                out.push(Problem::predicts(Outcome::Unaffected, summary, fix));
            }
        }
    }
    out
}
