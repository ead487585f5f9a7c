//! `gpu-health`: what makes a GPU unfit for a new job, and what warns of it.
//! The driver's own verdict comes first: NVML's GPU recovery action (field 230),
//! which NVIDIA documents as the action an uncorrectable error requires (none, GPU
//! reset, node reboot, drain P2P, drain and reset). Then the memory state: failed
//! row remapping fails; a pending remap or page retirement warns (NVIDIA: unaffected
//! work continues and new work can start; the remap applies at the next reset);
//! uncorrectable ECC errors warn when the driver says no recovery is needed, and
//! fail where the driver cannot say. NVLink error counters are shown, not judged
//! (healthy links count a few). `serve` re-reads everything every interval and
//! on every XID event, so /readyz turns on them.

use super::{Finding, Problem};
use crate::facts::Facts;
use crate::facts::gpu::{GpuHealth, NvmlFacts, NvmlGpu};
use crate::finding::Outcome;
use crate::policy::Policy;
use crate::predict::Prediction;

pub const ID: &str = "gpu-health";

const RESET: &str = "\
Drain the node and reset the GPU (nvidia-smi -r -i N with no process on it, or reboot); see
nvidia-smi -q -d ECC,ROW_REMAPPER,PAGE_RETIREMENT and dmesg | grep -i xid. A GPU whose remapping
failed, or whose uncorrectable errors come back after a reset, needs replacing.";

const AT_NEXT_RESET: &str = "\
Nothing is needed now: running and new work are unaffected. Reset the GPU at the next drain
(nvidia-smi -r -i N with no process on it, or reboot) so the remapping takes effect.";

/// NVIDIA's meaning of each `nvmlDeviceGpuRecoveryAction_t` value, and what to do.
fn recovery(action: u32) -> (&'static str, &'static str) {
    match action {
        1 => (
            "GPU_RESET: a fault that needs a GPU reset",
            "Stop every process on the GPU, then reset it: nvidia-smi -r -i N (or reboot the node).",
        ),
        2 => (
            "NODE_REBOOT: a fault that may have left the OS inconsistent",
            "Drain the node and reboot it: a GPU reset is not enough.",
        ),
        3 => (
            "DRAIN_P2P: all peer-to-peer traffic must stop",
            "Stop every process doing peer-to-peer traffic (NCCL jobs), turn UVM persistence off,\n\
             then check again: the driver then names the action that follows.",
        ),
        4 => (
            "DRAIN_AND_RESET: the GPU runs at reduced capacity",
            "Schedule no new work here; let running work reach a checkpoint, then reset the GPU:\n\
             nvidia-smi -r -i N.",
        ),
        _ => (
            "an action this version does not know",
            "See nvidia-smi -q (Recovery Action) and NVIDIA's Xid catalog for this driver.",
        ),
    }
}

/// Memory health of one GPU: uncorrectable ECC errors (judged by the driver's recovery
/// action `action`), failed or pending row remaps, pages waiting for retirement.
fn memory(
    g: &NvmlGpu,
    h: &GpuHealth,
    action: Option<u32>,
    evidence: &mut Vec<String>,
    problems: &mut Vec<Problem>,
) {
    if let Some(&n) = h.ecc_uncorrected_volatile.value()
        && n > 0
    {
        let summary = format!(
            "GPU {}: {n} uncorrectable ECC error(s) since the driver loaded",
            g.index
        );
        match action {
            Some(0) => problems.push(Problem::predicts(
                Outcome::Unaffected,
                format!("{summary}; the driver says no recovery is needed (contained)"),
                "Nothing is needed now. A GPU whose uncorrectable errors recur needs replacing: \
                 watch nccl_preflight_gpu_ecc_uncorrected_total.",
            )),
            Some(_) => evidence.push(summary),
            None => problems.push(Problem::predicts(
                Outcome::cannot_start(
                    "a GPU with uncorrectable ECC errors and a driver that names no recovery action: NVIDIA asks for a reset before new work",
                ),
                summary,
                RESET,
            )),
        }
    }
    if let Some(r) = h.remapped_rows.value() {
        if r.failure {
            problems.push(Problem::predicts(
                Outcome::cannot_start("a GPU whose row remapping failed: its memory cannot be trusted (NVIDIA: replace it)"),
                format!("GPU {}: a row remapping failed", g.index),
                RESET,
            ));
        } else if r.pending {
            // NVIDIA: running and new work are unaffected until the next reset applies it.
            problems.push(Problem::predicts(
                Outcome::Unaffected,
                format!(
                    "GPU {}: a row remapping waits for the next GPU reset",
                    g.index
                ),
                AT_NEXT_RESET,
            ));
        }
        if r.correctable + r.uncorrectable > 0 {
            evidence.push(format!(
                "GPU {}: {} row(s) remapped for correctable, {} for uncorrectable errors",
                g.index, r.correctable, r.uncorrectable
            ));
        }
    }
    if h.retired_pages_pending.value() == Some(&true) {
        problems.push(Problem::predicts(
            Outcome::Unaffected,
            format!("GPU {}: retired pages wait for the next GPU reset", g.index),
            AT_NEXT_RESET,
        ));
    }
}

/// One GPU's health: the driver's recovery action, its memory, its NVLink error counts.
fn one_gpu(g: &NvmlGpu, h: &GpuHealth, evidence: &mut Vec<String>, problems: &mut Vec<Problem>) {
    let action = h.recovery_action.value().copied();
    if let Some(a) = action.filter(|&a| a != 0) {
        let (meaning, fix) = recovery(a);
        // Every action NVIDIA defines asks that no new work start on the GPU until it is
        // taken (DRAIN_AND_RESET included: "schedule no new work"): a gate does not start
        // the job there.
        problems.push(Problem::predicts(
            Outcome::cannot_start(format!("GPU {} needs {meaning}", g.index)),
            format!(
                "GPU {}: the driver's recovery action is {a}, {meaning}",
                g.index
            ),
            fix,
        ));
    }
    memory(g, h, action, evidence, problems);
    // Cumulative NVLink CRC counts are not judged: healthy links count a few
    // (2x H200 here: 1 to 18 crc_data per link since the driver loaded, at full
    // bandwidth). Their rate is what matters: serve exports them for alerting.
    let total: u64 = g
        .nvlinks
        .iter()
        .flat_map(|l| l.error_counters.values())
        .sum();
    if total > 0 {
        evidence.push(format!(
            "GPU {}: {total} NVLink error count(s) since the driver loaded (alert on their rate: nccl_preflight_nvlink_errors)",
            g.index
        ));
    }
}

/// Evidence for GPUs whose `what` could not be read, grouped by why (one line for 8
/// GPUs); true when every GPU's was read, so the summary may say what it was.
fn all_read(
    nvml: &NvmlFacts,
    what: &str,
    get: impl Fn(&GpuHealth) -> Option<&crate::facts::FactError>,
    evidence: &mut Vec<String>,
) -> bool {
    let mut unread: std::collections::BTreeMap<&str, Vec<String>> = Default::default();
    for g in &nvml.gpus {
        if let Some(e) = g.health.as_ref().and_then(&get) {
            // A call that could not be made is named once, by gpu-devices.
            let why = if e.is_unread() {
                "gpu-devices says why"
            } else {
                e.message.as_str()
            };
            unread.entry(why).or_default().push(g.index.to_string());
        }
    }
    let all_read = unread.is_empty();
    for (why, gpus) in unread {
        evidence.push(format!(
            "{what} could not be read on GPU {}: {why}",
            gpus.join(", ")
        ));
    }
    all_read
}

pub fn judge(facts: &Facts, _prediction: &Prediction, _policy: &Policy) -> Finding {
    let Some(nvml) = facts.gpus.nvml.loaded() else {
        return Finding::skip(ID, "no NVML: GPU health not read");
    };
    if nvml.gpus.iter().all(|g| g.health.is_none()) {
        return Finding::skip(ID, "no GPU health read");
    }
    let mut problems = Vec::new();
    let mut evidence = Vec::new();
    for g in &nvml.gpus {
        if let Some(h) = &g.health {
            one_gpu(g, h, &mut evidence, &mut problems);
        }
    }
    // The summary says only what was read on every GPU (issue 39 row 2: "no
    // uncorrectable ECC errors" was said where NVML could not be asked).
    let read: Vec<&str> = [
        (
            "the driver's recovery action (NVML field 230)",
            "no recovery action asked",
            (|h| h.recovery_action.error()) as fn(&GpuHealth) -> Option<&crate::facts::FactError>,
        ),
        (
            "uncorrectable ECC errors",
            "no uncorrectable ECC errors that need action",
            |h| h.ecc_uncorrected_volatile.error(),
        ),
        ("row remapping", "no failed remaps", |h| {
            h.remapped_rows.error()
        }),
    ]
    .into_iter()
    .filter(|&(what, _, get)| all_read(nvml, what, get, &mut evidence))
    .map(|(_, said, _)| said)
    .collect();
    if read.is_empty() && problems.is_empty() {
        let f = Finding::skip(ID, "GPU health could not be read (gpu-devices says why)");
        return evidence.into_iter().fold(f, Finding::evidence);
    }
    let summary = format!("{} GPU(s): {}", nvml.gpus.len(), read.join(", "));
    super::combine(ID, summary, evidence, problems)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::gpu::{GpuHealth, LibraryState};
    use crate::facts::{FactError, Observed};
    use crate::finding::Status;
    use crate::test_facts::healthy;

    /// The judge as the run calls it, with the prediction made from the same facts.
    fn judge(facts: &Facts, policy: &Policy) -> Finding {
        crate::test_facts::judged(super::judge, facts, policy)
    }

    /// A healthy node whose GPU 1 health is changed by `f`.
    fn gpu1(f: impl FnOnce(&mut GpuHealth)) -> Finding {
        let mut facts = healthy();
        if let LibraryState::Loaded(n) = &mut facts.gpus.nvml.state {
            f(n.gpus[1]
                .health
                .as_mut()
                .expect("healthy GPUs carry health"));
        }
        judge(&facts, &Policy::default())
    }

    #[test]
    fn every_recovery_action_but_none_fails_with_nvidias_remedy() {
        assert_eq!(gpu1(|_| {}).status(), Status::Pass);
        for (action, words, fix) in [
            (1, "GPU_RESET", "nvidia-smi -r -i N"),
            (2, "NODE_REBOOT", "reboot it"),
            (3, "DRAIN_P2P", "UVM persistence off"),
            (4, "DRAIN_AND_RESET", "no new work"),
            (9, "does not know", "Recovery Action"),
        ] {
            let f = gpu1(|h| h.recovery_action = Observed::Value(action));
            assert_eq!(f.status(), Status::Fail, "{action}");
            assert!(
                f.summary
                    .starts_with(&format!("GPU 1: the driver's recovery action is {action}"))
                    && f.summary.contains(words),
                "{}",
                f.summary
            );
            assert!(f.remediation().unwrap().contains(fix), "{f:?}");
        }
    }

    #[test]
    fn uncorrectable_ecc_warns_when_the_driver_contained_it_and_fails_when_it_cannot_say() {
        // Issue 36: contained, NCCL and new work are unaffected: a note on a pass.
        let contained = gpu1(|h| h.ecc_uncorrected_volatile = Observed::Value(2));
        assert_eq!(contained.status(), Status::Pass);
        assert!(contained.summary.contains("2 uncorrectable ECC error(s)"));
        assert!(contained.summary.contains("no recovery is needed"));
        let unknown = gpu1(|h| {
            h.ecc_uncorrected_volatile = Observed::Value(2);
            h.recovery_action = Observed::Error(FactError::new("field 230", "Not Supported"));
        });
        assert_eq!(unknown.status(), Status::Fail);
        assert!(unknown.remediation().unwrap().contains("reset the GPU"));
        assert!(
            unknown
                .evidence
                .iter()
                .any(|e| e.contains("could not be read on GPU 1: Not Supported")),
            "{:?}",
            unknown.evidence
        );
        // With a recovery action asked, the ECC count is evidence behind that failure.
        let reset = gpu1(|h| {
            h.ecc_uncorrected_volatile = Observed::Value(2);
            h.recovery_action = Observed::Value(1);
        });
        assert_eq!(reset.status(), Status::Fail);
        assert!(reset.evidence.iter().any(|e| e.contains("2 uncorrectable")));
    }

    #[test]
    fn a_pending_remap_warns_and_a_failed_one_fails() {
        let pending = gpu1(|h| {
            if let Observed::Value(r) = &mut h.remapped_rows {
                r.pending = true;
                r.uncorrectable = 1;
            }
        });
        // NVIDIA: running and new work are unaffected until the next reset: a note.
        assert_eq!(pending.status(), Status::Pass);
        assert!(pending.summary.contains("waits for the next GPU reset"));
        assert!(
            pending
                .evidence
                .iter()
                .any(|e| e.contains("1 for uncorrectable")),
            "{:?}",
            pending.evidence
        );
        let failed = gpu1(|h| {
            if let Observed::Value(r) = &mut h.remapped_rows {
                r.pending = true;
                r.failure = true;
            }
        });
        assert_eq!(failed.status(), Status::Fail);
        assert!(failed.summary.contains("a row remapping failed"));
        let retired = gpu1(|h| h.retired_pages_pending = Observed::Value(true));
        assert_eq!(retired.status(), Status::Pass);
    }
}
