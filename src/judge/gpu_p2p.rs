//! `gpu-p2p`: every pair of GPUs that the topology says can do peer-to-peer
//! (NVLink, or one or more PCIe switches: PIX/PXB) really can, for reads and
//! writes, in NVML and in the CUDA driver. Without it NCCL falls back to SHM
//! through host memory: measured 27 GB/s instead of ~295 GB/s on 2x H200
//! (FACTS.md section 1). NCCL's own rule (src/graph/paths.cc ncclTopoCheckP2p, every
//! release 2.13-2.30) asks NVML for read AND write: an NVLink pair without both fails
//! NCCL's init (the prediction's "init fails"), a PCIe pair without both goes to SHM
//! from 2.19 (before, NCCL only logged it). NCCL_IGNORE_DISABLED_P2P=1 turns the
//! init failure into SHM.

use super::{Finding, Problem};
use crate::facts::Facts;
use crate::facts::gpu::{CudaFacts, LibraryState, NvmlFacts, P2pStatus};
use crate::finding::Outcome;
use crate::policy::Policy;
use crate::predict::Prediction;
use crate::topology::matrix;

pub const ID: &str = "gpu-p2p";

const FIX: &str = "\
Compare with `nvidia-smi topo -p2p rw` on the node. On bare metal, PCIe ACS or the IOMMU can route or block
peer traffic: disable ACS on the GPUs' switches (or boot with iommu=pt); in a VM the hypervisor must allow P2P.
A GPU whose P2P is DISABLED has it turned off by a driver registry key (NVreg_RegistryDwords).";

/// With MIG on, CUDA gives no peer access between MIG instances or their GPUs at all
/// (NVIDIA MIG user guide, "CUDA device enumeration": P2P is not supported with MIG), so the
/// fix is MIG's, not ACS's or the IOMMU's.
const MIG_FIX: &str = "\
MIG is enabled on these GPUs, and CUDA peer-to-peer does not work between MIG devices: NCCL goes through
host memory. For multi-GPU training give the pod whole GPUs: disable MIG on the node (GPU operator:
label the node nvidia.com/mig.config=all-disabled; by hand: nvidia-smi -mig 0 with the GPUs idle, then
reset them), or run one rank per MIG device and expect SHM/network speeds.";

/// What a pair that should do P2P but cannot does: SHM through host memory, measured 27
/// GB/s against ~295 GB/s over NVLink on 2x H200 (FACTS.md section 1).
fn shm_instead() -> Outcome {
    Outcome::degraded(
        "SHM through host memory instead of P2P",
        "measured 27 GB/s against ~295 GB/s over NVLink on 2x H200 (about 10x slower)",
    )
}

/// CUDA ordinal of an NVML GPU, matched by PCI bus id (CUDA_VISIBLE_DEVICES reorders ordinals).
fn cuda_ordinal(nvml: &NvmlFacts, cuda: &CudaFacts, index: u32) -> Option<u32> {
    let bus = matrix::gpu(nvml, index)?.pci_bus_id.value()?;
    cuda.devices
        .iter()
        .find(|d| d.pci_bus_id.value() == Some(bus))
        .map(|d| d.ordinal)
}

/// Every pair's line, and the pairs that should do P2P (NVLink, PIX, PXB) sorted by what is
/// wrong with them.
#[derive(Default)]
struct Pairs {
    /// One line per ordered pair.
    lines: Vec<String>,
    /// Pairs that should do P2P.
    expected: usize,
    /// Their link labels (`NV18`, `PIX`).
    labels: std::collections::BTreeSet<String>,
    no_read: Vec<String>,
    /// NVLink-connected pairs without P2P read or write in NVML.
    nvlink_no_p2p: Vec<String>,
    read_only: Vec<String>,
    /// NVML says read OK, the CUDA driver refuses peer access.
    refused: Vec<String>,
    /// Pairs not judged: their link (a GPU whose NVLink state could not be read) or their
    /// P2P status could not be read (issue 39 row 2: unread is not "no P2P").
    unknown: usize,
}

/// CUDA's peer access for an NVML pair, by bus id.
fn cuda_peer(nvml: &NvmlFacts, cuda: Option<&CudaFacts>, a: u32, b: u32) -> Option<bool> {
    let c = cuda?;
    let (ca, cb) = (cuda_ordinal(nvml, c, a)?, cuda_ordinal(nvml, c, b)?);
    c.peer_access
        .iter()
        .find(|x| x.a == ca && x.b == cb)?
        .can_access
        .value()
        .copied()
}

fn sort_pairs(nvml: &NvmlFacts, cuda: Option<&CudaFacts>) -> Pairs {
    let mut out = Pairs::default();
    for p in &nvml.pairs {
        let label = matrix::link_label(nvml, p.a, p.b);
        let (read, write) = (p.p2p_read.value().copied(), p.p2p_write.value().copied());
        let text = |s: Option<P2pStatus>| s.map_or("?", P2pStatus::label);
        let cuda_peer = cuda_peer(nvml, cuda, p.a, p.b);
        let line = format!(
            "GPU {} -> GPU {}: {label}, read {}, write {}{}",
            p.a,
            p.b,
            text(read),
            text(write),
            cuda_peer.map_or(String::new(), |c| format!(
                ", CUDA peer access {}",
                if c { "yes" } else { "no" }
            ))
        );
        let unread = [&p.p2p_read, &p.p2p_write]
            .into_iter()
            .any(|s| s.error().is_some_and(crate::facts::FactError::is_unread));
        let should = label.starts_with("NV") || label == "PIX" || label == "PXB";
        if unread || label == "?" {
            out.unknown += 1;
        } else if should {
            out.expected += 1;
            out.labels.insert(label.clone());
            let read_ok = read == Some(P2pStatus::Ok);
            if label.starts_with("NV") && !(read_ok && write == Some(P2pStatus::Ok)) {
                out.nvlink_no_p2p.push(line.clone());
            }
            if !read_ok {
                out.no_read.push(line.clone());
            } else if write != Some(P2pStatus::Ok) {
                out.read_only.push(line.clone());
            }
            if read_ok && cuda_peer == Some(false) {
                out.refused.push(line.clone());
            }
        }
        out.lines.push(line);
    }
    out
}

/// ACS redirection on a switch port above these GPUs (NVML and CUDA still say OK), and
/// the ports whose ACS could not be read (evidence).
fn acs_redirection(facts: &Facts, nvml: &NvmlFacts, evidence: &mut Vec<String>) -> Option<Problem> {
    let buses: Vec<String> = nvml
        .gpus
        .iter()
        .filter_map(|g| g.pci_bus_id.value())
        .map(|b| crate::facts::gpu::normalize_bus_id(b))
        .collect();
    let acs = crate::topology::acs::above(facts, &buses);
    if let Some(first) = acs.unreadable.first() {
        evidence.push(format!(
            "ACS of {} switch port(s) not read (first: {first})",
            acs.unreadable.len()
        ));
    }
    (!acs.redirecting.is_empty()).then(|| {
        let mut p = Problem::predicts(
            Outcome::degraded(
                "P2P up through the root complex (ACS redirection)",
                "lower peer bandwidth, shared by every redirected pair; NCCL's troubleshooting guide also reports hangs",
            ),
            format!(
                "ACS redirects peer traffic on {} PCIe switch port(s) above the GPUs: P2P is reported as supported but goes up through the root complex (lower bandwidth, or hangs)",
                acs.ports.len()
            ),
            crate::topology::acs::fix(&acs.ports),
        );
        p.evidence = acs.redirecting.clone();
        p
    })
}

/// NVLink-connected pairs NVML gives no P2P: where the prediction says NCCL's init fails
/// there (src/graph/paths.cc ncclTopoCheckP2p, every release from 2.13: "P2P is disabled
/// between NVLINK connected GPUs", ncclUnhandledCudaError, unless
/// NCCL_IGNORE_DISABLED_P2P=1), the failure names that, not a slow fallback.
fn nvlink_init_failure(predicted: &Prediction, pairs: &[String], mig: bool) -> Option<Problem> {
    let first = pairs.first()?;
    if !predicted
        .intra_node
        .iter()
        .any(|p| p.transport == "init fails")
    {
        return None;
    }
    let version = predicted
        .nccl_version
        .map_or("NCCL".to_string(), |v| format!("NCCL {v}"));
    let mut p = Problem::predicts(
        Outcome::init_fails(
            "\"P2P is disabled between NVLINK connected GPUs\" (ncclUnhandledCudaError, src/graph/paths.cc ncclTopoCheckP2p)",
        ),
        format!(
            "{} NVLink-connected pair(s) without P2P in NVML: {version} fails at init (\"P2P is disabled between NVLINK connected GPUs ... probably due to a hardware issue\") (first: {first})",
            pairs.len()
        ),
        format!(
            "{}\nNCCL_IGNORE_DISABLED_P2P=1 lets NCCL start, through host memory (SHM) between those GPUs: a workaround, not a fix.",
            if mig { MIG_FIX } else { FIX }
        ),
    );
    p.evidence = pairs.iter().take(8).cloned().collect();
    Some(p)
}

/// The no-read and read-only pairs left once NVLink pairs whose init failure is reported
/// are taken out (they are not also a slow fallback), and how read-only pairs are judged:
/// ncclTopoCheckP2p needs NVML's read AND write status OK. From v2.19.1-1 a PCIe pair
/// without both gets p2p = 0: SHM, as without read. Before, NCCL only logged it and still
/// tried P2P where CUDA allowed peer access (src/graph/paths.cc at v2.18.6-1).
fn without_init_failures(
    version: Option<crate::nccl::Version>,
    init_fails: bool,
    nvlink_no_p2p: &[String],
    no_read: Vec<String>,
    read_only: Vec<String>,
) -> (Vec<String>, Vec<String>, Outcome, &'static str) {
    let other = |v: Vec<String>| -> Vec<String> {
        if init_fails {
            v.into_iter()
                .filter(|l| !nvlink_no_p2p.contains(l))
                .collect()
        } else {
            v
        }
    };
    let (status, what) = if crate::nccl::version::since(version, crate::nccl::version::CUMEM) {
        (
            shm_instead(),
            "P2P write unsupported (read OK): NCCL needs both, so it falls back to SHM through host memory",
        )
    } else {
        (
            Outcome::undetermined(
                "whether P2P writes work where NVML says they are unsupported: NCCL before 2.19 tries them",
            ),
            "P2P write unsupported (read OK): this NCCL (< 2.19) still tries P2P where CUDA allows peer access",
        )
    };
    (other(no_read), other(read_only), status, what)
}

/// The kinds of pair that cannot do P2P, each with what NCCL does instead.
fn pair_kinds(
    no_read: Vec<String>,
    read_only: (Vec<String>, Outcome, &'static str),
    refused: Vec<String>,
) -> [(Vec<String>, Outcome, &'static str); 3] {
    [
        (
            no_read,
            shm_instead(),
            "P2P read unsupported, so NCCL falls back to SHM through host memory",
        ),
        read_only,
        // p2pCanConnect (src/transport/p2p.cc) asks cudaDeviceCanAccessPeer: refused, SHM.
        (
            refused,
            shm_instead(),
            "NVML reports P2P but the CUDA driver refuses peer access, so NCCL falls back to SHM",
        ),
    ]
}

/// One problem per kind of pair that cannot do P2P, listing the first pairs.
fn pair_problems(
    kinds: [(Vec<String>, Outcome, &'static str); 3],
    expected: usize,
    mig: bool,
) -> Vec<Problem> {
    let mut problems = Vec::new();
    for (pairs, status, what) in kinds {
        if let Some(first) = pairs.first() {
            let mut p = Problem::predicts(
                status,
                format!(
                    "{} of {expected} pair(s): {what} (first: {first})",
                    pairs.len()
                ),
                if mig { MIG_FIX } else { FIX },
            );
            p.evidence = pairs.iter().take(8).cloned().collect();
            problems.push(p);
        }
    }
    problems
}

pub fn judge(facts: &Facts, prediction: &Prediction, _policy: &Policy) -> Finding {
    let Some(nvml) = facts.gpus.nvml.loaded() else {
        return Finding::skip(ID, "no NVML: peer access not checked");
    };
    let n = nvml.gpus.len();
    if n < 2 {
        return Finding::skip(ID, format!("{n} GPU(s) visible: no pair to check"));
    }
    let mig = nvml.gpus.iter().any(|g| g.mig_mode.value() == Some(&true));
    let cuda = match &facts.gpus.cuda.state {
        LibraryState::Loaded(c) if c.init_result == 0 => Some(c),
        _ => None,
    };
    let Pairs {
        lines: mut evidence,
        expected,
        labels,
        no_read,
        nvlink_no_p2p,
        read_only,
        refused,
        unknown,
    } = sort_pairs(nvml, cuda);
    let init_fails = nvlink_init_failure(prediction, &nvlink_no_p2p, mig);
    let fails = init_fails.is_some();
    let (no_read, read_only, ro_status, ro_what) = without_init_failures(
        prediction.nccl_version,
        fails,
        &nvlink_no_p2p,
        no_read,
        read_only,
    );
    let kinds = pair_kinds(no_read, (read_only, ro_status, ro_what), refused);
    let mut problems: Vec<Problem> = acs_redirection(facts, nvml, &mut evidence)
        .into_iter()
        .chain(init_fails)
        .collect();
    problems.extend(pair_problems(kinds, expected, mig));
    if evidence.len() > 8 && !problems.is_empty() {
        // The problem pairs are listed; the full matrix is in `nccl-preflight doctor`.
        evidence.clear();
    }
    if expected == 0 && problems.is_empty() && unknown == nvml.pairs.len() {
        let f = Finding::skip(
            ID,
            format!(
                "P2P not checked: the link or P2P status of the GPU pairs ({unknown}) could not be read (gpu-devices says why)"
            ),
        );
        return evidence.into_iter().take(8).fold(f, Finding::evidence);
    }
    let summary = summary(expected, unknown, labels, cuda.is_some());
    super::combine(ID, summary, evidence, problems)
}

/// The summary of a judgement: the pairs checked and how (`unknown`: pairs whose link or
/// P2P status could not be read).
fn summary(
    expected: usize,
    unknown: usize,
    labels: std::collections::BTreeSet<String>,
    cuda: bool,
) -> String {
    let not_judged = match unknown {
        0 => String::new(),
        n => format!(
            "; {n} pair(s) not judged: their link or P2P status could not be read (gpu-devices says why)"
        ),
    };
    if expected == 0 {
        format!(
            "no {}GPU pair shares NVLink or a PCIe switch: NCCL uses SHM between them, as expected{not_judged}",
            if unknown > 0 { "judged " } else { "" }
        )
    } else {
        format!(
            "{expected} ordered pair(s) over {}: P2P read and write OK{}",
            labels.into_iter().collect::<Vec<_>>().join("/"),
            if cuda {
                ", CUDA peer access granted"
            } else {
                ""
            }
        ) + &not_judged
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::Observed;
    use crate::finding::Status;
    use crate::test_facts::healthy;

    /// The judge as the run calls it, with the prediction made from the same facts.
    fn judge(facts: &Facts, policy: &Policy) -> Finding {
        crate::test_facts::judged(super::judge, facts, policy)
    }

    /// Puts both GPUs of `healthy()` below switch port 0000:e0:00.0 with ACS `control`.
    fn behind_switch(f: &mut Facts, control: Observed<Option<u16>>) {
        use crate::facts::gpu::BridgeAcs;
        if let Observed::Value(pci) = &mut f.gpus.pci_gpus {
            for g in pci.iter_mut() {
                g.upstream_acs = vec![
                    BridgeAcs {
                        bus_id: "0000:00:01.0".into(),
                        root_port: true,
                        control: Observed::Value(Some(0x1d)),
                    },
                    BridgeAcs {
                        bus_id: "0000:e0:00.0".into(),
                        root_port: false,
                        control: control.clone(),
                    },
                ];
            }
        }
    }

    #[test]
    fn acs_redirection_on_a_switch_port_warns_and_on_a_root_port_does_not() {
        let mut f = healthy();
        // Root ports redirect (as Linux sets them); the switch port does not.
        behind_switch(&mut f, Observed::Value(Some(0)));
        assert_eq!(judge(&f, &Policy::default()).status(), Status::Pass);
        behind_switch(&mut f, Observed::Value(Some(0x0d)));
        let j = judge(&f, &Policy::default());
        assert_eq!(j.status(), Status::Warn, "{j:?}");
        assert!(j.summary.contains("ACS redirects"), "{}", j.summary);
        assert!(
            j.remediation()
                .unwrap()
                .contains("setpci -s 0000:e0:00.0 ECAP_ACS+0x6.w=0000")
        );
        // Unreadable (not root): said in the evidence, no verdict from it.
        let e = crate::facts::FactError::new(
            "/sys/devices/pci0000:00/0000:00:01.0/0000:e0:00.0/config",
            "64 bytes of config space",
        );
        behind_switch(&mut f, Observed::Error(e));
        let j = judge(&f, &Policy::default());
        assert_eq!(j.status(), Status::Pass, "{j:?}");
        assert!(
            j.evidence
                .iter()
                .any(|l| l.starts_with("ACS of 1 switch port(s) not read")),
            "{j:?}"
        );
    }

    fn nvml(f: &mut Facts) -> &mut NvmlFacts {
        match &mut f.gpus.nvml.state {
            LibraryState::Loaded(n) => n,
            _ => unreachable!("healthy() loads NVML"),
        }
    }

    #[test]
    fn nvlink_pairs_must_read_and_write() {
        assert_eq!(judge(&healthy(), &Policy::default()).status(), Status::Pass);
        let mut f = healthy();
        // ncclTopoCheckP2p wants NVML read and write: an NVLink pair without write fails
        // NCCL's init, not a slower read mode.
        nvml(&mut f).pairs[0].p2p_write = Observed::Value(P2pStatus::NotSupported);
        let finding = judge(&f, &Policy::default());
        assert_eq!(finding.status(), Status::Fail);
        assert!(finding.summary.contains("fails at init"), "{finding:?}");
        assert!(
            finding
                .remediation()
                .unwrap()
                .contains("NCCL_IGNORE_DISABLED_P2P=1")
        );
        // With NCCL_IGNORE_DISABLED_P2P=1 NCCL starts and goes through SHM.
        let ignored = crate::test_facts::with_env(f.clone(), &[("NCCL_IGNORE_DISABLED_P2P", "1")]);
        // SHM runs, slower: degraded, a warning (issue 36).
        let finding = judge(&ignored, &Policy::default());
        assert_eq!(finding.status(), Status::Warn);
        assert!(finding.summary.contains("falls back to SHM"), "{finding:?}");
        assert!(!finding.summary.contains("fails at init"), "{finding:?}");
        nvml(&mut f).pairs[1].p2p_read = Observed::Value(P2pStatus::ChipsetNotSupported);
        let finding = judge(&f, &Policy::default());
        assert_eq!(finding.status(), Status::Fail);
        assert!(
            finding.summary.contains("2 NVLink-connected pair(s)"),
            "{finding:?}"
        );
    }

    #[test]
    fn regression_mig_without_p2p_says_mig_not_acs() {
        let mut f = healthy();
        for g in &mut nvml(&mut f).gpus {
            g.mig_mode = Observed::Value(true);
        }
        for p in &mut nvml(&mut f).pairs {
            p.p2p_read = Observed::Value(P2pStatus::NotSupported);
            p.p2p_write = Observed::Value(P2pStatus::NotSupported);
        }
        let finding = judge(&f, &Policy::default());
        assert_eq!(finding.status(), Status::Fail);
        let fix = finding.remediation().unwrap();
        assert!(fix.starts_with("MIG is enabled"), "{fix}");
        assert!(!fix.contains("ACS"), "{fix}");
    }

    #[test]
    fn cuda_refusal_fails_and_sys_pairs_are_expected_to_lack_p2p() {
        let mut f = healthy();
        if let LibraryState::Loaded(c) = &mut f.gpus.cuda.state {
            c.peer_access[0].can_access = Observed::Value(false);
        }
        assert!(
            judge(&f, &Policy::default())
                .summary
                .contains("CUDA driver refuses")
        );
        let mut f = healthy();
        for g in &mut nvml(&mut f).gpus {
            g.nvlinks.clear();
        }
        for p in &mut nvml(&mut f).pairs {
            p.common_ancestor = Some(Observed::Value("SYSTEM".into()));
            p.p2p_read = Observed::Value(P2pStatus::TopologyNotSupported);
        }
        let finding = judge(&f, &Policy::default());
        assert_eq!(finding.status(), Status::Pass);
        assert!(finding.summary.contains("SHM"));
    }
}
