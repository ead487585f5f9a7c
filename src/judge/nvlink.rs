//! `nvlink`: the NVLinks a GPU has are up. A link NVML lists but reports
//! inactive (a degraded NVLink) cuts a pair's bandwidth or pushes traffic
//! through other GPUs: NCCL runs, slower, so it warns (issue 36: degraded is a
//! warning); `--require nvlink` fails where no NVLink is active.

use super::{Finding, Problem, unmet};
use crate::facts::Facts;
use crate::finding::Outcome;
use crate::policy::Policy;
use crate::predict::Prediction;

pub const ID: &str = "nvlink";

const FIX: &str = "\
Inspect the links on the node: nvidia-smi nvlink -s and nvidia-smi nvlink -e (error counters), and
dmesg | grep -i xid. A link that stays down needs a GPU reset or a repair; on NVSwitch systems check the
fabric manager too.";

/// One GPU's links: a line of evidence (active links, version, speed), and the problem
/// its inactive links make.
fn gpu_links(g: &crate::facts::gpu::NvmlGpu) -> (String, Option<Problem>) {
    let active: Vec<u32> = g
        .nvlinks
        .iter()
        .filter(|l| l.active)
        .map(|l| l.link)
        .collect();
    let inactive: Vec<u32> = g
        .nvlinks
        .iter()
        .filter(|l| !l.active)
        .map(|l| l.link)
        .collect();
    let version = g.nvlinks.iter().find_map(|l| l.version.value().cloned());
    let line = format!(
        "GPU {}: {} active link(s){}{}",
        g.index,
        active.len(),
        version.map_or(String::new(), |v| format!(", NVLink {v}")),
        g.nvlink_speed_mbps
            .value()
            .map_or(String::new(), |s| format!(
                ", {:.3} GB/s per link",
                f64::from(*s) / 1000.0
            ))
    );
    // NCCL's topology counts only active links (src/graph/topo.cc, NVML's link state):
    // the GPU's NVLink bandwidth drops with them, traffic takes the links left.
    let problem = (!inactive.is_empty()).then(|| {
        Problem::predicts(
            Outcome::degraded(
                format!(
                    "GPU {}'s {} remaining NVLink(s), or through other GPUs",
                    g.index,
                    active.len()
                ),
                format!(
                    "{} of {} links' bandwidth lost on every path through GPU {}",
                    inactive.len(),
                    g.nvlinks.len(),
                    g.index
                ),
            ),
            format!(
                "GPU {}: NVLink(s) {inactive:?} down ({} of {} active)",
                g.index,
                active.len(),
                g.nvlinks.len()
            ),
            FIX,
        )
    });
    (line, problem)
}

/// GPUs whose link states could not be read, one evidence line each: they say nothing of
/// their links, not PCIe only, not down (issue 39 row 2). Where no GPU's links were read
/// (`none_read`), the finding: not checked, or could not be verified under
/// `--require nvlink`.
fn unread_links(
    nvml: &crate::facts::gpu::NvmlFacts,
    none_read: bool,
    policy: &Policy,
) -> Result<Vec<String>, Finding> {
    let unread: Vec<String> = nvml
        .gpus
        .iter()
        .filter(|g| g.nvlinks_unread.is_some())
        .map(|g| {
            format!(
                "GPU {}: NVLink state not read (gpu-devices says why)",
                g.index
            )
        })
        .collect();
    if !none_read || unread.is_empty() {
        return Ok(unread);
    }
    let summary = "could not read the NVLink state (gpu-devices says why): NVLink not checked";
    // Unread for want of a function in the container's NVML: the image's library.
    let absent = nvml.gpus.iter().any(|g| {
        g.nvlinks_unread
            .as_ref()
            .is_some_and(|e| e.kind == Some(crate::facts::FailureKind::NotInLibrary))
    });
    let f = if policy.require.nvlink {
        let f = Finding::predicts(
            ID,
            super::undetermined(true, "whether the NVLinks --require nvlink asks for are up"),
            summary,
            FIX,
        )
        .undetermined();
        if absent {
            f.blamed(crate::finding::Owner::Image)
        } else {
            f
        }
    } else {
        Finding::skip(ID, summary)
    };
    Err(unread.into_iter().fold(f, Finding::evidence))
}

pub fn judge(facts: &Facts, _prediction: &Prediction, policy: &Policy) -> Finding {
    let Some(nvml) = facts.gpus.nvml.loaded() else {
        return if policy.require.nvlink {
            Finding::predicts(
                ID,
                unmet("--require nvlink"),
                "no NVML: NVLink not checked",
                FIX,
            )
        } else {
            Finding::skip(ID, "no NVML: NVLink not checked")
        };
    };
    let with_links: Vec<_> = nvml.gpus.iter().filter(|g| !g.nvlinks.is_empty()).collect();
    let unread = match unread_links(nvml, with_links.is_empty(), policy) {
        Ok(unread) => unread,
        Err(f) => return f,
    };
    let active_total: usize = with_links
        .iter()
        .map(|g| g.nvlinks.iter().filter(|l| l.active).count())
        .sum();
    if with_links.is_empty()
        || (active_total == 0
            && !policy.require.nvlink
            && unread.is_empty()
            && with_links.len() < nvml.gpus.len())
    {
        return if policy.require.nvlink {
            Finding::predicts(
                ID,
                unmet("--require nvlink"),
                "no NVLink on these GPUs (PCIe only)",
                "--require nvlink asks for NVLink-connected GPUs: schedule the pod on an NVLink node (e.g. an HGX/SXM instance type).",
            )
        } else {
            Finding::skip(ID, "no NVLink on these GPUs (PCIe only)")
        };
    }
    let mut problems = Vec::new();
    let mut evidence = unread;
    for g in &nvml.gpus {
        let (line, problem) = gpu_links(g);
        evidence.push(line);
        problems.extend(problem);
    }
    if policy.require.nvlink && active_total == 0 {
        problems.push(Problem::predicts(
            unmet("--require nvlink"),
            "--require nvlink: no NVLink is active".to_string(),
            FIX,
        ));
    }
    let per_gpu: std::collections::BTreeSet<usize> = nvml
        .gpus
        .iter()
        .filter(|g| g.nvlinks_unread.is_none())
        .map(|g| g.nvlinks.iter().filter(|l| l.active).count())
        .collect();
    let summary = format!(
        "{} GPU(s), {} active NVLink(s) each",
        nvml.gpus.len(),
        per_gpu
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join("/")
    );
    super::combine(ID, summary, evidence, problems)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::gpu::LibraryState;
    use crate::finding::Status;
    use crate::policy;
    use crate::test_facts::{healthy, no_gpus};

    /// The judge as the run calls it, with the prediction made from the same facts.
    fn judge(facts: &Facts, policy: &Policy) -> Finding {
        crate::test_facts::judged(super::judge, facts, policy)
    }

    #[test]
    fn down_links_warn_and_pcie_nodes_skip() {
        let f = judge(&healthy(), &Policy::default());
        assert_eq!(
            (f.status(), f.summary.as_str()),
            (Status::Pass, "2 GPU(s), 18 active NVLink(s) each")
        );
        let mut h = healthy();
        if let LibraryState::Loaded(n) = &mut h.gpus.nvml.state {
            n.gpus[1].nvlinks[7].active = false;
        }
        // Issue 36: NCCL runs over the links left: degraded, a warning.
        let f = judge(&h, &Policy::default());
        assert_eq!(f.status(), Status::Warn);
        assert!(
            f.summary
                .contains("GPU 1: NVLink(s) [7] down (17 of 18 active)"),
            "{}",
            f.summary
        );
        let mut pcie = healthy();
        if let LibraryState::Loaded(n) = &mut pcie.gpus.nvml.state {
            n.gpus.iter_mut().for_each(|g| g.nvlinks.clear());
        }
        assert_eq!(judge(&pcie, &Policy::default()).status(), Status::Skip);
        let need = policy::build(&[], &["nvlink".into()], None, None).unwrap();
        assert_eq!(judge(&pcie, &need).status(), Status::Fail);
        let mut cpu = healthy();
        cpu.gpus = no_gpus();
        assert_eq!(judge(&cpu, &need).status(), Status::Fail);
    }
}
