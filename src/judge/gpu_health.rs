//! `gpu-health`: memory and link errors that corrupt or slow a job while it
//! runs: uncorrectable ECC errors since the driver loaded, row remapping that
//! failed or waits for a reset, pages waiting for retirement. NVLink error
//! counters are shown, not judged (healthy links count a few). `serve` re-reads
//! everything every interval, so /readyz turns on them.

use super::{Finding, Problem, Status};
use crate::facts::Facts;
use crate::policy::Policy;

pub const ID: &str = "gpu-health";

const RESET: &str = "\
Drain the node and reset the GPU (nvidia-smi -r -i N with no process on it, or reboot); see
nvidia-smi -q -d ECC,ROW_REMAPPER,PAGE_RETIREMENT and dmesg | grep -i xid. A GPU whose remapping
failed, or whose uncorrectable errors come back after a reset, needs replacing.";

pub fn judge(facts: &Facts, _policy: &Policy) -> Finding {
    let Some(nvml) = facts.gpus.nvml.loaded() else {
        return Finding::new(ID, Status::Skip, "no NVML: GPU health not read");
    };
    if nvml.gpus.iter().all(|g| g.health.is_none()) {
        return Finding::new(ID, Status::Skip, "no GPU health read");
    }
    let mut problems = Vec::new();
    let mut evidence = Vec::new();
    for g in &nvml.gpus {
        let Some(h) = &g.health else { continue };
        if let Some(&n) = h.ecc_uncorrected_volatile.value()
            && n > 0
        {
            problems.push(Problem::new(
                Status::Fail,
                format!(
                    "GPU {}: {n} uncorrectable ECC error(s) since the driver loaded",
                    g.index
                ),
                RESET,
            ));
        }
        if let Some(r) = h.remapped_rows.value() {
            if r.failure {
                problems.push(Problem::new(
                    Status::Fail,
                    format!("GPU {}: a row remapping failed", g.index),
                    RESET,
                ));
            } else if r.pending {
                problems.push(Problem::new(
                    Status::Fail,
                    format!("GPU {}: a row remapping waits for a GPU reset", g.index),
                    RESET,
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
            problems.push(Problem::new(
                Status::Fail,
                format!("GPU {}: retired pages wait for a GPU reset", g.index),
                RESET,
            ));
        }
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
    let summary = format!(
        "{} GPU(s): no uncorrectable ECC errors, no failed or pending remaps",
        nvml.gpus.len()
    );
    super::combine(ID, summary, evidence, problems)
}
