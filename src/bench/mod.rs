//! `bench`: measures GPU peer bandwidth (`p2p`) and NCCL all-reduce (`nccl`)
//! and judges both against what the links should give: NVLink count x per-link
//! speed from NVML, or PCIe generation x width. A budget bounds the whole run;
//! every driver call has the usual deadline.

pub(crate) mod child;
pub mod command;
pub(crate) mod expect;
pub(crate) mod nccl;
pub(crate) mod p2p;
pub(crate) mod render;

use crate::facts::FactError;
use crate::facts::gpu::NvmlFacts;
use crate::finding::{Finding, Status, ids};
use serde::Serialize;
use std::time::{Duration, Instant};

pub(crate) const SCHEMA: &str = "nccl-preflight/bench/v1";

/// GB/s (10^9 bytes per second, as nccl-tests reports) for `bytes` in `ms`.
pub(crate) fn gbps(bytes: f64, ms: f64) -> f64 {
    if ms <= 0.0 { 0.0 } else { bytes / (ms * 1e6) }
}

/// The time the whole bench may take.
pub struct Budget {
    started: Instant,
    limit: Duration,
}

impl Budget {
    pub fn new(limit: Duration) -> Budget {
        Budget {
            started: Instant::now(),
            limit,
        }
    }

    /// An error once the budget is spent, so the next measurement is not started.
    pub fn check(&self) -> Result<(), FactError> {
        let spent = self.started.elapsed();
        if spent > self.limit {
            return Err(FactError::new(
                "--bench-seconds",
                format!(
                    "the {:.1} s budget ran out after {:.1} s; raise --bench-seconds or measure fewer sizes",
                    self.limit.as_secs_f64(),
                    spent.as_secs_f64()
                ),
            ));
        }
        Ok(())
    }
}

/// What the worker thread brings back.
#[derive(Debug, Default)]
pub struct Measured {
    /// None when libcuda is not installed; the reason.
    pub no_driver: Option<String>,
    pub driver_error: Option<FactError>,
    pub gpus: Vec<(u32, String)>,
    pub p2p: Option<Vec<p2p::PairResult>>,
    /// Outer None: not asked; inner None: no NCCL library found.
    pub nccl: Option<Option<nccl::NcclResult>>,
}

/// The bench report (`--format json`).
#[derive(Debug, Serialize)]
pub struct BenchReport {
    pub schema: &'static str,
    pub verdict: Status,
    /// Where the failures lie (`none`, `job`, `node`): `bench` exits 0, 1 or 3 by it.
    pub fault: crate::finding::Fault,
    pub wall_seconds: f64,
    pub budget_seconds: f64,
    pub min_bandwidth_fraction: f64,
    /// CUDA ordinal and PCI bus id of each GPU measured.
    pub gpus: Vec<GpuRow>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p2p: Option<P2pSection>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nccl: Option<nccl::NcclResult>,
    pub findings: Vec<Finding>,
}

#[derive(Debug, Serialize)]
pub struct GpuRow {
    pub ordinal: u32,
    pub pci_bus_id: String,
}

#[derive(Debug, Serialize)]
pub struct P2pSection {
    pub buffer_bytes: u64,
    pub iterations: u32,
    pub pairs: Vec<PairRow>,
}

/// A measured pair with what its link should give.
#[derive(Debug, Serialize)]
pub struct PairRow {
    #[serde(flatten)]
    pub measured: p2p::PairResult,
    /// What the link should give one way, GB/s, and how that was worked out.
    pub expected_gbps: Option<f64>,
    pub expected_basis: Option<String>,
    pub unidirectional_fraction: Option<f64>,
    pub bidirectional_fraction: Option<f64>,
}

/// Turns what was measured into the report and its two findings.
pub(crate) fn judge(
    mut measured: Measured,
    nvml: Option<&NvmlFacts>,
    settings: (&Settings, Duration),
) -> BenchReport {
    let (settings, wall) = settings;
    let bus: Vec<&str> = measured.gpus.iter().map(|(_, b)| b.as_str()).collect();
    let expected = |a: u32, b: u32| -> Option<expect::LinkFigure> {
        let (a, b) = (bus.get(a as usize)?, bus.get(b as usize)?);
        expect::link(nvml?, a, b)
    };
    let mut findings = Vec::new();
    let p2p = measured
        .p2p
        .take()
        .map(|pairs| p2p_section(pairs, &expected, settings));
    if let Some(section) = &p2p {
        findings.push(
            unavailable(&measured, ids::GPU_BANDWIDTH)
                .unwrap_or_else(|| judge_p2p(section, settings.min_fraction)),
        );
    }
    if let Some(result) = &measured.nccl {
        let finding = unavailable(&measured, ids::NCCL_ALLREDUCE).unwrap_or_else(|| match result {
            None => Finding::skip(ids::NCCL_ALLREDUCE, "no NCCL library found")
                .evidence(format!("tried: {}", settings.nccl_candidates.join(", "))),
            Some(r) => {
                let link = expect::slowest(measured.gpus.len() as u32, expected);
                judge_nccl(r, link.as_ref(), settings.min_fraction)
            }
        });
        findings.push(finding);
    }
    let findings: Vec<Finding> = findings.into_iter().map(crate::judge::blame).collect();
    BenchReport {
        schema: SCHEMA,
        // Nothing measured is not a pass: the verdict says skip, and `bench` exits 2.
        verdict: if findings.iter().all(|f| f.status() == Status::Skip) {
            Status::Skip
        } else {
            crate::finding::verdict(&findings)
        },
        fault: crate::finding::fault(&findings),
        wall_seconds: wall.as_secs_f64(),
        budget_seconds: settings.budget.as_secs_f64(),
        min_bandwidth_fraction: settings.min_fraction,
        gpus: measured
            .gpus
            .into_iter()
            .map(|(ordinal, pci_bus_id)| GpuRow {
                ordinal,
                pci_bus_id,
            })
            .collect(),
        p2p,
        nccl: measured.nccl.flatten(),
        findings,
    }
}

/// Each measured pair beside what its link should give (`expected(src, dst)`).
fn p2p_section(
    pairs: Vec<p2p::PairResult>,
    expected: &dyn Fn(u32, u32) -> Option<expect::LinkFigure>,
    settings: &Settings,
) -> P2pSection {
    let rows: Vec<PairRow> = pairs
        .into_iter()
        .map(|m| {
            let figure = expected(m.src, m.dst);
            let fraction = |v: Option<f64>, k: f64| Some(v? / (figure.as_ref()?.gbps * k));
            PairRow {
                unidirectional_fraction: fraction(m.unidirectional_gbps, 1.0),
                bidirectional_fraction: fraction(m.bidirectional_gbps, 2.0),
                expected_gbps: figure.as_ref().map(|f| f.gbps),
                expected_basis: figure.map(|f| f.basis),
                measured: m,
            }
        })
        .collect();
    P2pSection {
        buffer_bytes: settings.p2p_bytes as u64,
        iterations: settings.iterations,
        pairs: rows,
    }
}

/// Check `id`'s finding when nothing between GPUs could be measured: no driver,
/// a driver that failed, fewer than two GPUs.
fn unavailable(measured: &Measured, id: &str) -> Option<Finding> {
    if let Some(why) = &measured.no_driver {
        return Some(Finding::skip(id, "no CUDA driver on this machine").evidence(why.clone()));
    }
    if let Some(e) = &measured.driver_error {
        return Some(
            Finding::fail(
                id,
                "the CUDA driver could not be used",
                "nvidia-smi   # is the driver loaded and every GPU listed?\n\
                     nccl-preflight check   # gpu-devices names what CUDA refuses",
            )
            .evidence(e.to_string()),
        );
    }
    let gpus_found = measured.gpus.len();
    if gpus_found < 2 {
        return Some(Finding::skip(
            id,
            format!("{gpus_found} GPU visible: nothing to measure between GPUs"),
        ));
    }
    None
}

const LINK_FIX: &str = "nvidia-smi nvlink -s          # every link up, at full speed?\n\
nvidia-smi nvlink -e          # error counters\n\
nvidia-smi topo -p2p rw       # P2P read/write allowed? (OK)\n\
lspci -vvv | grep -i acsctl   # ACS on a PCIe switch sends P2P through the CPU";

fn percent(f: Option<f64>) -> String {
    f.map(|f| format!(" ({:.0}%)", f * 100.0))
        .unwrap_or_default()
}

fn judge_p2p(section: &P2pSection, min_fraction: f64) -> Finding {
    let mut status = Status::Pass;
    // Evidence names what went wrong; when nothing did, the slowest direction.
    let mut problems = Vec::new();
    let mut slowest: Option<(f64, String)> = None;
    let mut measured = 0;
    let mut unknown_link = false;
    for row in &section.pairs {
        let m = &row.measured;
        let name = format!("GPU{} -> GPU{}", m.src, m.dst);
        if let Some(e) = &m.error {
            status = Status::Fail;
            problems.push(format!("{name}: {e}"));
            continue;
        }
        if !m.peer_access {
            status = status.max(Status::Warn);
            problems.push(format!(
                "{name}: no peer access (NCCL goes through host memory between these two)"
            ));
            continue;
        }
        measured += 1;
        if let Some(mismatch) = &m.mismatch {
            status = Status::Fail;
            problems.push(format!("{name}: data did not arrive intact: {mismatch}"));
        }
        let (Some(one), Some(both)) = (m.unidirectional_gbps, m.bidirectional_gbps) else {
            continue;
        };
        unknown_link |= row.expected_gbps.is_none();
        let basis = match (&row.expected_basis, row.expected_gbps) {
            (Some(b), Some(g)) => format!("; link {b} = {g:.1} GB/s"),
            _ => String::from("; link speed unknown (NVML gave no figure)"),
        };
        let line = format!(
            "{name}: {one:.1} GB/s one way{}, {both:.1} GB/s both ways{}{basis}",
            percent(row.unidirectional_fraction),
            percent(row.bidirectional_fraction),
        );
        let low = [row.unidirectional_fraction, row.bidirectional_fraction]
            .iter()
            .flatten()
            .any(|f| *f < min_fraction);
        if low {
            status = Status::Fail;
            problems.push(line);
        } else {
            let worst = row.unidirectional_fraction.unwrap_or(one);
            if slowest.as_ref().is_none_or(|(w, _)| worst < *w) {
                slowest = Some((worst, format!("slowest: {line}")));
            }
        }
    }
    let summary = match status {
        Status::Fail => format!(
            "peer copies below {:.0}% of the link, failed or corrupted",
            min_fraction * 100.0
        ),
        Status::Warn => String::from("some GPU pairs have no peer access"),
        _ if measured == 0 => String::from("no GPU pair measured"),
        _ if unknown_link => {
            format!("{measured} peer directions measured and verified; link speed unknown")
        }
        _ => format!(
            "{measured} peer directions at {:.0}% of their links or better, data verified",
            min_fraction * 100.0
        ),
    };
    let mut finding = match status {
        Status::Fail => Finding::fail(ids::GPU_BANDWIDTH, summary, LINK_FIX),
        Status::Warn => Finding::warn(ids::GPU_BANDWIDTH, summary, LINK_FIX),
        Status::Pass | Status::Skip => Finding::pass(ids::GPU_BANDWIDTH, summary),
    };
    finding.evidence = problems;
    finding.evidence.extend(slowest.map(|(_, line)| line));
    finding
}

/// The NCCL run's library, transports and one line per size, as evidence.
fn nccl_evidence(r: &nccl::NcclResult) -> Vec<String> {
    let version = r.version.as_deref().unwrap_or("version unknown");
    let mut evidence = vec![format!("{} ({version}), {} GPUs", r.library, r.gpus)];
    if !r.transports.is_empty() {
        let list: Vec<String> = r
            .transports
            .iter()
            .map(|(t, n)| format!("{t} x{n}"))
            .collect();
        evidence.push(format!("transports NCCL logged: {}", list.join(", ")));
    }
    for s in &r.sizes {
        evidence.push(format!(
            "{:>10}: {:.1} us, algbw {:.1} GB/s, busbw {:.1} GB/s{}",
            crate::units::format_bytes(s.bytes),
            s.time_us,
            s.algbw_gbps,
            s.busbw_gbps,
            if s.verified { "" } else { ", RESULT WRONG" }
        ));
    }
    evidence
}

/// A failing nccl-allreduce finding.
fn nccl_fail(summary: String, evidence: Vec<String>, fix: &str) -> Finding {
    let mut f = Finding::fail(ids::NCCL_ALLREDUCE, summary, fix);
    f.evidence = evidence;
    f
}

fn judge_nccl(
    r: &nccl::NcclResult,
    link: Option<&expect::LinkFigure>,
    min_fraction: f64,
) -> Finding {
    let id = ids::NCCL_ALLREDUCE;
    let mut evidence = nccl_evidence(r);
    if let Some(e) = &r.error {
        evidence.push(e.to_string());
        return nccl_fail(
            String::from("NCCL all-reduce did not complete"),
            evidence,
            "NCCL_DEBUG=INFO nccl-preflight bench nccl   # NCCL's own log says why\n\
             nccl-preflight check                     # what the node is missing",
        );
    }
    if r.sizes.iter().any(|s| !s.verified) {
        return nccl_fail(
            String::from("NCCL all-reduce returned wrong sums"),
            evidence,
            LINK_FIX,
        );
    }
    let Some(largest) = r.sizes.iter().max_by_key(|s| s.bytes) else {
        let mut f = Finding::skip(id, "no all-reduce size measured");
        f.evidence = evidence;
        return f;
    };
    if let Some(f) = off_nvlink(r, link, &evidence) {
        return f;
    }
    let Some(link) = link else {
        let mut f = Finding::pass(
            id,
            format!(
                "busbw {:.1} GB/s at {}; link speed unknown",
                largest.busbw_gbps,
                crate::units::format_bytes(largest.bytes)
            ),
        );
        f.evidence = evidence;
        return f;
    };
    let fraction = largest.busbw_gbps / link.gbps;
    evidence.push(format!(
        "slowest link between GPUs: {} = {:.1} GB/s; busbw is {:.0}% of it",
        link.basis,
        link.gbps,
        fraction * 100.0
    ));
    let summary = format!(
        "busbw {:.1} GB/s at {}, {:.0}% of the slowest link",
        largest.busbw_gbps,
        crate::units::format_bytes(largest.bytes),
        fraction * 100.0
    );
    if fraction < min_fraction {
        return nccl_fail(summary, evidence, LINK_FIX);
    }
    let mut f = Finding::pass(id, summary);
    f.evidence = evidence;
    f
}

/// NCCL logged transports, none of them P2P, between GPUs joined by NVLink.
fn off_nvlink(
    r: &nccl::NcclResult,
    link: Option<&expect::LinkFigure>,
    evidence: &[String],
) -> Option<Finding> {
    let families: std::collections::BTreeSet<&str> = r
        .transports
        .keys()
        .map(|t| crate::explain::transport::family(t))
        .collect();
    let link = link.filter(|l| l.nvlink)?;
    if families.is_empty() || families.contains("P2P") {
        return None;
    }
    Some(nccl_fail(
        format!(
            "NCCL used {} between GPUs joined by NVLink",
            families.iter().copied().collect::<Vec<_>>().join(", ")
        ),
        evidence.to_vec(),
        &format!(
            "env | grep -E 'NCCL_(P2P|SHM)_DISABLE|NCCL_P2P_LEVEL'   # unset what turns P2P off\n{LINK_FIX}\n# link: {}",
            link.basis
        ),
    ))
}

/// The knobs of one bench run.
#[derive(Debug, Clone)]
pub struct Settings {
    pub p2p_bytes: usize,
    pub nccl_sizes: Vec<u64>,
    pub iterations: u32,
    pub min_fraction: f64,
    pub budget: Duration,
    pub nccl_candidates: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gigabytes_per_second_are_decimal_and_zero_time_gives_zero() {
        // 1 GiB in 10 ms: 107.37 GB/s, as nccl-tests counts (10^9 bytes).
        assert!((gbps(1_073_741_824.0, 10.0) - 107.374_182_4).abs() < 1e-9);
        assert_eq!(gbps(1e9, 1000.0), 1.0);
        assert_eq!(gbps(1e9, 0.0), 0.0);
        assert_eq!(gbps(1e9, -1.0), 0.0);
    }

    fn pair(src: u32, dst: u32, one: f64, both: f64) -> p2p::PairResult {
        p2p::PairResult {
            src,
            dst,
            peer_access: true,
            unidirectional_gbps: Some(one),
            bidirectional_gbps: Some(both),
            verified: Some(true),
            mismatch: None,
            error: None,
        }
    }

    fn row(measured: p2p::PairResult, link_gbps: Option<f64>) -> PairRow {
        let fraction = |v: Option<f64>, k: f64| Some(v? / (link_gbps? * k));
        PairRow {
            unidirectional_fraction: fraction(measured.unidirectional_gbps, 1.0),
            bidirectional_fraction: fraction(measured.bidirectional_gbps, 2.0),
            measured,
            expected_gbps: link_gbps,
            expected_basis: link_gbps.map(|_| "18 NVLinks x 26.562 GB/s".to_string()),
        }
    }

    fn section(pairs: Vec<PairRow>) -> P2pSection {
        P2pSection {
            buffer_bytes: 256 << 20,
            iterations: 20,
            pairs,
        }
    }

    #[test]
    fn peer_copies_pass_at_the_fraction_and_fail_below_it_or_corrupted() {
        let link = Some(478.1);
        let good = section(vec![
            row(pair(0, 1, 390.0, 740.0), link),
            row(pair(1, 0, 380.0, 740.0), link),
        ]);
        let f = judge_p2p(&good, 0.7);
        assert_eq!(f.status(), Status::Pass);
        assert_eq!(
            f.summary,
            "2 peer directions at 70% of their links or better, data verified"
        );
        assert_eq!(
            f.evidence,
            [
                "slowest: GPU1 -> GPU0: 380.0 GB/s one way (79%), 740.0 GB/s both ways (77%); link 18 NVLinks x 26.562 GB/s = 478.1 GB/s"
            ]
        );
        assert!(f.remediation().is_none());

        let mut corrupt = pair(1, 0, 380.0, 740.0);
        corrupt.mismatch = Some("chunk 3 word 0: 0x0 instead of 0x5a5a".into());
        let bad = section(vec![row(pair(0, 1, 20.0, 740.0), link), row(corrupt, link)]);
        let f = judge_p2p(&bad, 0.7);
        assert_eq!(f.status(), Status::Fail);
        assert_eq!(
            f.summary,
            "peer copies below 70% of the link, failed or corrupted"
        );
        assert!(f.evidence[0].starts_with("GPU0 -> GPU1: 20.0 GB/s one way (4%)"));
        assert_eq!(
            f.evidence[1],
            "GPU1 -> GPU0: data did not arrive intact: chunk 3 word 0: 0x0 instead of 0x5a5a"
        );
        assert_eq!(f.remediation(), Some(LINK_FIX));

        let mut no_peer = pair(0, 1, 0.0, 0.0);
        no_peer.peer_access = false;
        let f = judge_p2p(&section(vec![row(no_peer, None)]), 0.7);
        assert_eq!(
            (f.status(), f.summary.as_str()),
            (Status::Warn, "some GPU pairs have no peer access")
        );
        let f = judge_p2p(&section(vec![row(pair(0, 1, 50.0, 90.0), None)]), 0.7);
        assert_eq!(
            f.summary,
            "1 peer directions measured and verified; link speed unknown"
        );
    }

    fn size(bytes: u64, busbw: f64, verified: bool) -> nccl::SizeResult {
        nccl::SizeResult {
            bytes,
            iterations: 20,
            time_us: 1.0,
            algbw_gbps: busbw,
            busbw_gbps: busbw,
            verified,
        }
    }

    #[test]
    fn all_reduce_is_judged_on_the_largest_size_against_the_slowest_link() {
        let link = expect::LinkFigure {
            gbps: 478.1,
            basis: "18 NVLinks x 26.562 GB/s".into(),
            nvlink: true,
        };
        let result = |sizes, transports: &[(&str, u64)]| nccl::NcclResult {
            library: "libnccl.so.2".into(),
            version: Some("2.27.3".into()),
            gpus: 2,
            sizes,
            transports: transports
                .iter()
                .map(|(t, n)| (t.to_string(), *n))
                .collect(),
            error: None,
        };
        let fast = result(
            vec![size(1 << 20, 40.0, true), size(1 << 30, 360.0, true)],
            &[("P2P/CUMEM", 4)],
        );
        let f = judge_nccl(&fast, Some(&link), 0.7);
        assert_eq!(f.status(), Status::Pass);
        assert_eq!(
            f.summary,
            "busbw 360.0 GB/s at 1 GiB, 75% of the slowest link"
        );
        let slow = result(vec![size(1 << 30, 100.0, true)], &[("P2P/CUMEM", 4)]);
        let f = judge_nccl(&slow, Some(&link), 0.7);
        assert_eq!(f.status(), Status::Fail);
        assert_eq!(
            f.summary,
            "busbw 100.0 GB/s at 1 GiB, 21% of the slowest link"
        );
        let wrong = result(vec![size(1 << 30, 360.0, false)], &[]);
        assert_eq!(
            judge_nccl(&wrong, Some(&link), 0.7).summary,
            "NCCL all-reduce returned wrong sums"
        );
        let unknown = judge_nccl(&fast, None, 0.7);
        assert_eq!(
            (unknown.status(), unknown.summary.as_str()),
            (
                Status::Pass,
                "busbw 360.0 GB/s at 1 GiB; link speed unknown"
            )
        );
        let empty = judge_nccl(&result(vec![], &[]), Some(&link), 0.7);
        assert_eq!(empty.status(), Status::Skip);
    }

    fn settings() -> Settings {
        Settings {
            p2p_bytes: 1 << 20,
            nccl_sizes: vec![1 << 20],
            iterations: 5,
            min_fraction: 0.7,
            budget: Duration::from_secs(60),
            nccl_candidates: vec!["libnccl.so.2".into()],
        }
    }

    fn measured(gpus: usize) -> Measured {
        Measured {
            no_driver: None,
            driver_error: None,
            gpus: (0..gpus as u32)
                .map(|i| (i, format!("0000:{:02x}:00.0", 0x18 + i)))
                .collect(),
            p2p: Some(Vec::new()),
            nccl: Some(None),
        }
    }

    #[test]
    fn nothing_to_measure_skips_both_checks_and_the_verdict_says_skip() {
        let s = settings();
        let mut none = measured(0);
        none.no_driver = Some("libcuda.so.1: cannot open shared object file".into());
        let r = judge(none, None, (&s, Duration::ZERO));
        assert_eq!(r.verdict, Status::Skip);
        assert_eq!(
            r.findings
                .iter()
                .map(|f| (f.id.as_str(), f.status()))
                .collect::<Vec<_>>(),
            [
                (ids::GPU_BANDWIDTH, Status::Skip),
                (ids::NCCL_ALLREDUCE, Status::Skip)
            ]
        );
        assert_eq!(
            r.findings[0].evidence,
            ["libcuda.so.1: cannot open shared object file"]
        );
        let r = judge(measured(1), None, (&s, Duration::ZERO));
        assert_eq!(r.verdict, Status::Skip);
        assert_eq!(
            r.findings[0].summary,
            "1 GPU visible: nothing to measure between GPUs"
        );
    }

    #[test]
    fn a_broken_driver_fails_with_a_fix_and_a_missing_nccl_names_what_was_tried() {
        let s = settings();
        let mut broken = measured(2);
        broken.driver_error = Some(FactError::new("cuInit", "CUDA_ERROR_NO_DEVICE (100)"));
        broken.nccl = None;
        let r = judge(broken, None, (&s, Duration::ZERO));
        assert_eq!(r.verdict, Status::Fail);
        assert_eq!(r.findings.len(), 1, "nccl was not asked for");
        let f = &r.findings[0];
        assert_eq!(f.summary, "the CUDA driver could not be used");
        assert!(f.remediation().is_some_and(|r| r.starts_with("nvidia-smi")));
        assert!(
            f.evidence[0].contains("CUDA_ERROR_NO_DEVICE"),
            "{:?}",
            f.evidence
        );
        let r = judge(measured(2), None, (&s, Duration::ZERO));
        let nccl = r
            .findings
            .iter()
            .find(|f| f.id == ids::NCCL_ALLREDUCE)
            .unwrap();
        assert_eq!(
            (nccl.status(), nccl.summary.as_str()),
            (Status::Skip, "no NCCL library found")
        );
        assert_eq!(nccl.evidence, ["tried: libnccl.so.2"]);
        assert_eq!(r.gpus.len(), 2);
    }

    #[test]
    fn the_human_view_shows_each_pair_each_size_and_the_verdict() {
        let s = settings();
        let mut m = measured(2);
        let mut corrupt = pair(1, 0, 380.0, 740.0);
        corrupt.verified = Some(false);
        m.p2p = Some(vec![pair(0, 1, 390.0, 740.0), corrupt]);
        m.nccl = Some(Some(nccl::NcclResult {
            library: "libnccl.so.2".into(),
            version: Some("2.27.3".into()),
            gpus: 2,
            sizes: vec![size(1 << 20, 120.0, true)],
            transports: [("P2P/CUMEM".to_string(), 4)].into_iter().collect(),
            error: None,
        }));
        let text = render::human(&judge(m, None, (&s, Duration::from_millis(1500))), false);
        assert!(
            text.starts_with(
                "nccl-preflight bench: 2 GPU(s): GPU0 0000:18:00.0, GPU1 0000:19:00.0\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("  GPU0 -> GPU1     390.0     -    740.0     -  verified  unknown\n"),
            "{text}"
        );
        assert!(
            text.contains("  GPU1 -> GPU0     380.0     -    740.0     -  CORRUPT   unknown\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "NCCL all-reduce (libnccl.so.2, 2.27.3, 2 GPUs, float32 sum, 20 iterations):"
            ),
            "{text}"
        );
        assert!(
            text.contains("       1 MiB         1.0     120.0     120.0  verified\n"),
            "{text}"
        );
        assert!(
            text.contains("  transports (NCCL's log): P2P/CUMEM x4\n"),
            "{text}"
        );
        assert!(
            text.contains(" in 1.50 s (budget 60 s, threshold 70% of the link)\n"),
            "{text}"
        );
        let skipped = render::human(&judge(measured(1), None, (&s, Duration::ZERO)), false);
        assert!(
            skipped.contains("\nNOTHING MEASURED: gpu-bandwidth: 1 GPU visible"),
            "{skipped}"
        );
    }
}
