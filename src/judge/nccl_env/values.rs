//! Values against the type NCCL reads them as (src/nccl/variables.tsv):
//! integers (NCCL_PARAM: `strtoll(value, NULL, 0)` in src/misc/param.cc, so
//! `4MB` reads as 4, `abc` as 0, and `010` as octal 8), path levels
//! (ncclGetLevel in src/graph/paths.cc: a name compared with strcmp, or a
//! legacy number), NCCL_BUFFSIZE below its default, NCCL_DEBUG=TRACE, and
//! control characters.

use super::{Problem, get};
use crate::facts::Facts;
use crate::finding::Outcome;
use crate::nccl::Version;
use crate::nccl::catalog::{Catalog, IntRead, Kind, Lookup, strtoll};

pub(super) fn lint_ints(
    facts: &Facts,
    catalog: &Catalog,
    version: Option<Version>,
) -> Vec<Problem> {
    let mut out = Vec::new();
    for (name, v) in &facts.nccl_env {
        let Lookup::Reads(row) = catalog.lookup(name, version) else {
            continue;
        };
        // Empty values are skipped by NCCL (param.cc: strlen > 0).
        if row.kind != Kind::Int || v.value.is_empty() {
            continue;
        }
        let default = if row.default == "-" || row.default.starts_with("-2") {
            "its default".to_string()
        } else {
            format!("its default ({})", row.default)
        };
        // src/misc/param.cc ncclLoadParam: strtoll's number is used, whatever follows it.
        let read = strtoll(&v.value);
        let outcome = match read {
            IntRead::Overflow => Outcome::Unaffected,
            IntRead::Prefix(n) => Outcome::undetermined(format!(
                "what {name} does at {n}, the number NCCL reads, rather than what was written"
            )),
            _ => Outcome::undetermined(format!(
                "what {name} does at 0, the number NCCL reads, rather than what was written"
            )),
        };
        let (summary, fix) = match read {
            IntRead::Whole(_) => continue,
            IntRead::Prefix(n) => (
                format!(
                    "{name}={:?} is not a plain integer: NCCL reads the leading number only, {n}",
                    v.value
                ),
                format!(
                    "Write {name} as a plain integer in bytes or units NCCL expects (no suffix)."
                ),
            ),
            IntRead::NoDigits => (
                format!("{name}={:?} is not an integer: NCCL reads it as 0", v.value),
                format!("Set {name} to an integer, or unset it."),
            ),
            IntRead::Overflow => (
                format!(
                    "{name}={:?} is out of the 64-bit range: NCCL ignores it and uses {default}",
                    v.value
                ),
                format!("Set {name} to an integer that fits, or unset it."),
            ),
        };
        out.push(Problem::predicts(outcome, summary, fix));
    }
    out
}

/// The registry's booleans (2.30 and later): a value its parser refuses leaves the
/// default, with no word in the log (src/include/param/param.h ncclParam::loadValue).
pub(super) fn lint_bools(
    facts: &Facts,
    catalog: &Catalog,
    version: Option<Version>,
) -> Vec<Problem> {
    let accepted = ["1", "T", "TRUE", "0", "F", "FALSE"];
    facts
        .nccl_env
        .iter()
        .filter(|(name, _)| {
            matches!(catalog.lookup(name, version), Lookup::Reads(r) if r.kind == Kind::Bool)
        })
        .filter(|(_, v)| !accepted.iter().any(|a| a.eq_ignore_ascii_case(&v.value)))
        .map(|(name, v)| {
            // NCCL_PARAM's strtoll reads no number: the parameter keeps its default,
            // as if unset (src/misc/param.cc ncclLoadParam).
            Problem::predicts(
                Outcome::Unaffected,
                format!(
                    "{name}={:?} is not a boolean NCCL reads: it keeps its default",
                    v.value
                ),
                format!("Set {name} to 1 or 0 (T/TRUE or F/FALSE also do), or unset it."),
            )
        })
        .collect()
}

/// What a path level allows, from NCCL's topo.h comments and its docs.
fn level_meaning(level: &str) -> &'static str {
    match level {
        "LOC" => "never (turned off)",
        "NVL" => "only over NVLink",
        "NVB" => "over NVLink, also through an intermediate GPU",
        "C2C" => "over the CPU-GPU C2C link",
        "PIX" => "across at most one PCIe switch",
        "PXB" => "across several PCIe switches, without going through the CPU",
        "P2C" => "through the CPU's PCIe root over C2C",
        "PXN" => "through an intermediate GPU's NIC (PXN)",
        "PHB" => "through the PCIe host bridge of one CPU",
        "SYS" => "even across CPU sockets, over the inter-socket link (QPI/UPI/Infinity Fabric)",
        _ => "an unknown level",
    }
}

pub(super) fn lint_levels(
    facts: &Facts,
    catalog: &Catalog,
    version: Option<Version>,
) -> Vec<Problem> {
    let mut out = Vec::new();
    for (name, what) in [
        ("NCCL_P2P_LEVEL", "GPU peer-to-peer"),
        ("NCCL_NET_GDR_LEVEL", "GPUDirect RDMA between GPU and NIC"),
    ] {
        let Some(value) = get(facts, name) else {
            continue;
        };
        if !matches!(catalog.lookup(name, version), Lookup::Reads(r) if r.kind == Kind::Level) {
            continue;
        }
        let (Some(names), Some(old)) = (
            catalog.values("level", version),
            catalog.values("old-level", version),
        ) else {
            continue;
        };
        if names.iter().any(|n| n == value) {
            continue;
        }
        if value.starts_with(|c: char| c.is_ascii_digit()) {
            // paths.cc: strtol, then clamped to the last legacy index.
            let n = match strtoll(value) {
                IntRead::Whole(n) | IntRead::Prefix(n) => n,
                _ => i64::MAX,
            };
            let index = usize::try_from(n)
                .unwrap_or(usize::MAX)
                .min(old.len().saturating_sub(1));
            let Some(level) = old.get(index) else {
                continue;
            };
            // NCCL does what the number says; whether that was meant is the user's.
            out.push(Problem::predicts(
                Outcome::Unaffected,
                format!(
                    "{name}={value} is a legacy number: NCCL {} reads it as {level}, which allows {what} {}; is that what you want?",
                    version.map_or_else(|| "(any version since 2.6)".to_string(), |v| v.to_string()),
                    level_meaning(level)
                ),
                format!(
                    "Write the level by name: {name}={level} if that is the intent, a narrower one (PHB: one CPU; PXB: PCIe switches only; PIX: one switch), or unset it and let NCCL decide from the topology."
                ),
            ));
            continue;
        }
        let hint = names
            .iter()
            .find(|n| n.eq_ignore_ascii_case(value))
            .map(|n| format!(" (names are case-sensitive: {n})"))
            .unwrap_or_default();
        // ncclGetLevel: an unknown name is a WARN, then NCCL decides as if unset.
        out.push(Problem::predicts(
            Outcome::Unaffected,
            format!(
                "{name}={value:?} is not a level NCCL knows{hint}: NCCL ignores it and decides from the topology"
            ),
            format!("Use one of {} for {name}, or unset it.", names.join(", ")),
        ));
    }
    out
}

/// NCCL's default NCCL_BUFFSIZE: 4 MiB (FACTS.md section 3).
const DEFAULT_BUFFSIZE: i64 = 4 << 20;

/// Measured with NCCL 2.28.9 on 2x H200 over NVLink (scripts/bench-nccl-env.sh,
/// 256 MiB all-reduce, busbw; default 4 MiB: 299 GB/s): NCCL_BUFFSIZE of 512
/// bytes or less kills every rank with SIGFPE at the first collective (64, 128,
/// 256, 512 and 4, 8 all did; 1024 ran).
const CRASHES_AT_OR_BELOW: i64 = 512;

/// (buffer size, busbw in GB/s) from the same runs, largest first.
const MEASURED: &[(i64, &str)] = &[
    (1 << 20, "312"),
    (256 << 10, "238"),
    (64 << 10, "104"),
    (4 << 10, "8.3"),
    (2 << 10, "4.2"),
    (1 << 10, "2.1"),
];

pub(super) fn lint_buffsize(facts: &Facts) -> Vec<Problem> {
    let Some(value) = get(facts, "NCCL_BUFFSIZE") else {
        return Vec::new();
    };
    let (IntRead::Whole(n) | IntRead::Prefix(n)) = strtoll(value) else {
        return Vec::new();
    };
    // <= 0 is NCCL's "use the default" (-2) or nonsense param.cc passes on; not judged here.
    if n <= 0 || n >= DEFAULT_BUFFSIZE {
        return Vec::new();
    }
    let reads = crate::units::format_bytes(n.unsigned_abs());
    if n <= CRASHES_AT_OR_BELOW {
        return vec![Problem::predicts(
            Outcome::init_fails(
                "SIGFPE on every rank at the first collective (measured, NCCL 2.28.9)",
            ),
            format!(
                "NCCL_BUFFSIZE={value} makes NCCL's buffers {reads}: measured with NCCL 2.28.9 on 2x H200, 512 bytes or less kills every rank with SIGFPE at the first collective"
            ),
            "Unset NCCL_BUFFSIZE (4 MiB), or give it in bytes without a suffix: NCCL_BUFFSIZE=8388608.",
        )];
    }
    // The nearest measurement at or above this size.
    let (size, busbw) = MEASURED
        .iter()
        .rev()
        .find(|(size, _)| *size >= n)
        .copied()
        .unwrap_or(MEASURED[0]);
    let outcome = if n >= 1 << 20 {
        crate::judge::across_nodes(
            facts,
            Outcome::undetermined(format!(
                "the cost of {reads} buffers between nodes (each network step carries an eighth of it): not measured"
            )),
        )
    } else {
        Outcome::degraded(
            format!("{reads} buffers"),
            format!("a 256 MiB all-reduce at {busbw} GB/s instead of 299 GB/s (2x H200, NVLink)"),
        )
    };
    let cost = if n >= 1 << 20 {
        "on one NVLink node no loss was measured (1 MiB: 312 GB/s against 299 GB/s at the default, 2x H200); across nodes each network step carries an eighth of it (NCCL_STEPS = 8), which was not measured".to_string()
    } else {
        format!(
            "measured on 2x H200 over NVLink, a 256 MiB all-reduce falls from 299 GB/s at the default to {busbw} GB/s with {}",
            crate::units::format_bytes(size.unsigned_abs())
        )
    };
    vec![Problem::predicts(
        outcome,
        format!("NCCL_BUFFSIZE={value} ({reads}) is below NCCL's 4 MiB default: {cost}"),
        "Unset NCCL_BUFFSIZE (4 MiB), or raise it (aws-ofi-nccl's EFA platforms use 8388608).",
    )]
}

pub(super) fn lint_debug_and_text(facts: &Facts) -> Vec<Problem> {
    let mut out = Vec::new();
    if get(facts, "NCCL_DEBUG").is_some_and(|d| d.eq_ignore_ascii_case("TRACE")) {
        out.push(Problem::predicts(
            Outcome::degraded(
                "every NCCL call logged",
                "training slowed by the logging, and logs flooded",
            ),
            "NCCL_DEBUG=TRACE left on: every call is logged, which slows training and floods the logs".to_string(),
            "Use NCCL_DEBUG=INFO (or WARN) outside a debugging session.",
        ));
    }
    for (name, v) in &facts.nccl_env {
        if v.value.chars().any(|c| c.is_control()) {
            out.push(Problem::predicts(
                Outcome::undetermined(format!(
                    "what NCCL makes of {name} with the control character it reads as is"
                )),
                format!("{name} contains a line break or control character: NCCL reads it as is, and no nccl.conf can carry it"),
                format!("Set {name} to a single-line value."),
            ));
        }
    }
    out
}
