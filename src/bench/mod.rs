//! `bench`: measures GPU peer bandwidth (`p2p`) and NCCL all-reduce (`nccl`)
//! and judges both against what the links should give: NVLink count x per-link
//! speed from NVML, or PCIe generation x width. A budget bounds the whole run;
//! every driver call has the usual deadline.

pub mod child;
pub mod command;
pub mod driver;
pub mod expect;
pub mod nccl;
pub mod p2p;
pub mod render;

use crate::facts::FactError;
use crate::facts::gpu::NvmlFacts;
use crate::finding::{Finding, Status, ids};
use serde::Serialize;
use std::time::{Duration, Instant};

pub const SCHEMA: &str = "nccl-preflight/bench/v1";

/// GB/s (10^9 bytes per second, as nccl-tests reports) for `bytes` in `ms`.
pub fn gbps(bytes: f64, ms: f64) -> f64 {
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
pub fn judge(
    measured: Measured,
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
    let p2p = measured.p2p.map(|pairs| {
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
    });
    let gpus_found = measured.gpus.len();
    let unavailable = |id: &str| -> Option<Finding> {
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
        if gpus_found < 2 {
            return Some(Finding::skip(
                id,
                format!("{gpus_found} GPU visible: nothing to measure between GPUs"),
            ));
        }
        None
    };
    if let Some(section) = &p2p {
        findings.push(
            unavailable(ids::GPU_BANDWIDTH)
                .unwrap_or_else(|| judge_p2p(section, settings.min_fraction)),
        );
    }
    if let Some(result) = &measured.nccl {
        let finding = unavailable(ids::NCCL_ALLREDUCE).unwrap_or_else(|| match result {
            None => Finding::skip(ids::NCCL_ALLREDUCE, "no NCCL library found")
                .evidence(format!("tried: {}", settings.nccl_candidates.join(", "))),
            Some(r) => {
                let link = expect::slowest(measured.gpus.len() as u32, expected);
                judge_nccl(r, link.as_ref(), settings.min_fraction)
            }
        });
        findings.push(finding);
    }
    BenchReport {
        schema: SCHEMA,
        // Nothing measured is not a pass: the verdict says skip, and `bench` exits 2.
        verdict: if findings.iter().all(|f| f.status() == Status::Skip) {
            Status::Skip
        } else {
            crate::finding::verdict(&findings)
        },
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

fn judge_nccl(
    r: &nccl::NcclResult,
    link: Option<&expect::LinkFigure>,
    min_fraction: f64,
) -> Finding {
    let id = ids::NCCL_ALLREDUCE;
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
    let fail = |summary: String, evidence: Vec<String>, fix: &str| {
        let mut f = Finding::fail(id, summary, fix);
        f.evidence = evidence;
        f
    };
    if let Some(e) = &r.error {
        evidence.push(e.to_string());
        return fail(
            String::from("NCCL all-reduce did not complete"),
            evidence,
            "NCCL_DEBUG=INFO nccl-preflight bench nccl   # NCCL's own log says why\n\
             nccl-preflight check                     # what the node is missing",
        );
    }
    if r.sizes.iter().any(|s| !s.verified) {
        return fail(
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
    let families: std::collections::BTreeSet<&str> = r
        .transports
        .keys()
        .map(|t| crate::explain::transport::family(t))
        .collect();
    if let Some(link) = link.filter(|l| l.nvlink)
        && !families.is_empty()
        && !families.contains("P2P")
    {
        return fail(
            format!(
                "NCCL used {} between GPUs joined by NVLink",
                families.iter().copied().collect::<Vec<_>>().join(", ")
            ),
            evidence,
            &format!(
                "env | grep -E 'NCCL_(P2P|SHM)_DISABLE|NCCL_P2P_LEVEL'   # unset what turns P2P off\n{LINK_FIX}\n# link: {}",
                link.basis
            ),
        );
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
        return fail(summary, evidence, LINK_FIX);
    }
    let mut f = Finding::pass(id, summary);
    f.evidence = evidence;
    f
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
