//! `doctor`: the whole picture for a person debugging a node. GPU topology and
//! P2P matrices in nvidia-smi's notation, CPU and NUMA affinity per GPU, the
//! CUDA view, the RDMA devices, what NCCL will do (the prediction), then the
//! report `check` prints.

use super::{human, visible};
use crate::facts::gpu::{GpuFacts, LibraryState};
use crate::facts::rdma::{RdmaDevice, RdmaFacts, RdmaPort, UverbsNode};
use crate::report::Report;
use crate::topology::affinity;
use crate::topology::matrix::{self, Matrices};
use serde::Serialize;
use std::borrow::Cow;
use std::fmt::Write;

/// The JSON form: the report plus the matrices.
#[derive(Debug, Serialize)]
pub struct Doctor<'a> {
    #[serde(flatten)]
    pub report: &'a Report,
    gpu_matrices: Option<Matrices>,
    gpu_nic_affinity: Option<affinity::AffinityMatrix>,
}

pub fn doctor(report: &Report) -> Doctor<'_> {
    Doctor {
        report,
        gpu_matrices: report.facts.gpus.nvml.loaded().map(matrix::matrices),
        gpu_nic_affinity: affinity::matrix(&report.facts),
    }
}

fn library_line<T>(
    name: &str,
    lib: &crate::facts::gpu::Library<T>,
    loaded: impl Fn(&T) -> String,
) -> String {
    match &lib.state {
        LibraryState::Loaded(t) => format!("{name}: {} ({})", loaded(t), lib.library),
        LibraryState::NotFound { .. } => format!("{name}: not found ({})", lib.library),
        LibraryState::Failed(e) => format!("{name}: failed: {e}"),
        LibraryState::Skipped { reason } => format!("{name}: not probed ({reason})"),
    }
}

/// One line of text from the host, control characters shown (see `visible`).
fn host_line(out: &mut String, text: &str) {
    out.push_str(&visible(text));
    out.push('\n');
}

fn rdma_section(out: &mut String, report: &Report) {
    let r = &report.facts.rdma;
    let devices = r.devices.value().cloned().unwrap_or_default();
    let uverbs = r.uverbs.value().cloned().unwrap_or_default();
    if devices.is_empty() {
        out.push_str("RDMA devices: none\n");
    } else {
        let _ = writeln!(out, "RDMA devices: {}", devices.len());
        for d in &devices {
            rdma_device(out, d, &uverbs);
            for p in &d.ports {
                rdma_port(out, p);
            }
        }
    }
    rdma_libraries(out, r);
    out.push('\n');
    affinity_grid(out, report);
}

/// One RDMA device: driver, PCI address, NUMA node, its /dev/infiniband node, netdevs.
fn rdma_device(out: &mut String, d: &RdmaDevice, uverbs: &[UverbsNode]) {
    let node = uverbs.iter().find(|u| u.ibdev.as_deref() == Some(&d.name));
    let access = match node.and_then(|n| n.open.as_ref()) {
        Some(o) if o.refused.is_none() => format!(
            "/dev/infiniband/{} opens",
            node.map_or("?", |n| n.name.as_str())
        ),
        Some(o) => format!(
            "/dev/infiniband/{} refused ({})",
            node.map_or("?", |n| n.name.as_str()),
            o.refused.as_deref().unwrap_or("")
        ),
        None => "not in this container".into(),
    };
    let device = format!(
        "  {:<12} {:<10} {:<13} NUMA {:<2} {}; netdevs {}",
        d.name,
        d.driver.as_deref().unwrap_or("?"),
        d.pci_bus_id.as_deref().unwrap_or("?"),
        d.numa_node.map_or("?".into(), |n| n.to_string()),
        access,
        if d.netdevs.is_empty() {
            "none".into()
        } else {
            d.netdevs.join(",")
        }
    );
    host_line(out, &device);
}

/// One port of an RDMA device: state, link layer, rate, RoCE v2 GID indexes.
fn rdma_port(out: &mut String, p: &RdmaPort) {
    let v2: Vec<String> = p
        .gids
        .iter()
        .filter(|g| g.kind.as_deref() == Some("RoCE v2"))
        .map(|g| g.index.to_string())
        .collect();
    let port = format!(
        "    port {}: {} ({}), {}, {}{}",
        p.port,
        p.state.as_deref().unwrap_or("?"),
        p.phys_state.as_deref().unwrap_or("?"),
        p.link_layer.as_deref().unwrap_or("?"),
        p.rate.as_deref().unwrap_or("?"),
        if v2.is_empty() {
            String::new()
        } else {
            format!(", RoCE v2 GID index {}", v2.join(","))
        }
    );
    host_line(out, &port);
}

/// libibverbs, libfabric, NCCL and its net plugin, one line each.
fn rdma_libraries(out: &mut String, r: &RdmaFacts) {
    host_line(
        out,
        &library_line("libibverbs", &r.verbs, |v| match &v.devices {
            crate::facts::Observed::Value(d) => format!("{} device(s)", d.len()),
            crate::facts::Observed::Error(e) => e.message.clone(),
        }),
    );
    host_line(
        out,
        &library_line("libfabric", &r.libfabric, |f| {
            format!("{} with {}", f.version, f.providers.join(", "))
        }),
    );
    host_line(
        out,
        &library_line("NCCL", &r.nccl.library, |n| {
            n.version.value().cloned().unwrap_or_else(|| "?".into())
        }),
    );
    host_line(
        out,
        &format!(
            "NCCL net plugin: {}",
            match &r.nccl.net_plugin {
                crate::facts::Observed::Value(Some(p)) => format!(
                    "{} ({} {})",
                    p.path.as_deref().unwrap_or(&p.library),
                    p.name.as_deref().unwrap_or("?"),
                    p.api.as_deref().unwrap_or("?")
                ),
                crate::facts::Observed::Value(None) =>
                    "none (NCCL's built-in IB and socket transports)".into(),
                crate::facts::Observed::Error(e) => format!("broken: {e}"),
            }
        ),
    );
}

/// The GPU-NIC affinity grid, when there are GPUs and NICs to relate.
fn affinity_grid(out: &mut String, report: &Report) {
    if let Some(m) = affinity::matrix(&report.facts) {
        out.push_str("GPU-NIC affinity (PIX/PXB: GPUDirect RDMA distance)\n");
        let mut grid = vec![
            std::iter::once(String::new())
                .chain(m.nics.iter().cloned())
                .collect::<Vec<_>>(),
        ];
        for (i, g) in m.gpus.iter().enumerate() {
            grid.push(
                std::iter::once(g.clone())
                    .chain(m.levels[i].iter().cloned())
                    .collect(),
            );
        }
        grid_lines(out, &grid);
    }
}

fn table(
    out: &mut String,
    title: &str,
    m: &Matrices,
    rows: &[Vec<String>],
    extra: &[(&str, Vec<String>)],
) {
    let _ = writeln!(out, "{title}");
    if m.gpus_left_out > 0 {
        let _ = writeln!(
            out,
            "  (the first {} GPUs; {} more left out of the matrices)",
            m.gpus.len(),
            m.gpus_left_out
        );
    }
    let mut header = vec![String::new()];
    header.extend(m.gpus.iter().map(|g| format!("GPU{g}")));
    header.extend(extra.iter().map(|(h, _)| h.to_string()));
    let mut grid = vec![header];
    for (i, row) in rows.iter().enumerate() {
        let mut r = vec![format!("GPU{}", m.gpus[i])];
        r.extend(row.iter().cloned());
        r.extend(extra.iter().map(|(_, col)| col[i].clone()));
        grid.push(r);
    }
    grid_lines(out, &grid);
}

/// Prints rows of cells in left-aligned columns, indented, then a blank line.
/// Cells come from the host (GPU names, bus ids), so they are shown through
/// `visible` and padded by `human::pad`, which has no width limit.
fn grid_lines(out: &mut String, grid: &[Vec<String>]) {
    let grid: Vec<Vec<Cow<'_, str>>> = grid
        .iter()
        .map(|r| r.iter().map(|c| visible(c)).collect())
        .collect();
    let columns = grid.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            grid.iter()
                .map(|r| r.get(c).map_or(0, |cell| human::width(cell)))
                .max()
                .unwrap_or(0)
        })
        .collect();
    for r in &grid {
        let mut line = String::from("  ");
        for (i, (cell, w)) in r.iter().zip(&widths).enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            human::pad(&mut line, cell, *w);
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out.push('\n');
}

const TOPOLOGY_LEGEND: &str =
    "  X = self, NV# = # bonded NVLinks, PIX = one PCIe switch, PXB = several PCIe switches,
  PHB = a PCIe host bridge, NODE = host bridges within a NUMA node, SYS = across NUMA nodes\n\n";
const P2P_LEGEND: &str = "  OK = supported, CNS = chipset not supported, GNS = GPU not supported, TNS = topology not supported,
  NS = not supported, DISABLED = disabled by a driver key, U = unknown\n\n";

pub fn render(report: &Report, color: bool) -> String {
    let mut out = String::new();
    let gpus = &report.facts.gpus;
    nvml_section(&mut out, gpus);
    cuda_section(&mut out, gpus);
    pci_section(&mut out, gpus);
    rdma_section(&mut out, report);
    if let Some(p) = &report.nccl {
        super::prediction::section(&mut out, p);
    }
    out.push_str(&super::human::render(report, color));
    out
}

/// NVML's view: the GPU count and driver, then the topology and P2P matrices.
fn nvml_section(out: &mut String, gpus: &GpuFacts) {
    match &gpus.nvml.state {
        LibraryState::Loaded(nvml) if !nvml.gpus.is_empty() => {
            let m = matrix::matrices(nvml);
            let col = |f: &dyn Fn(&crate::facts::gpu::NvmlGpu) -> String| {
                nvml.gpus.iter().map(f).collect::<Vec<_>>()
            };
            let val = |o: Option<String>| o.unwrap_or_else(|| "?".into());
            let extra = [
                (
                    "CPU Affinity",
                    col(&|g| val(g.cpu_affinity.as_ref().and_then(|o| o.value()).cloned())),
                ),
                (
                    "NUMA Affinity",
                    col(&|g| {
                        val(g
                            .numa_affinity
                            .as_ref()
                            .and_then(|o| o.value())
                            .filter(|s| !s.is_empty())
                            .cloned())
                    }),
                ),
                ("Bus", col(&|g| val(g.pci_bus_id.value().cloned()))),
                ("Name", col(&|g| val(g.name.value().cloned()))),
            ];
            host_line(
                out,
                &format!(
                    "GPUs: {} (driver {}, CUDA {})",
                    nvml.gpus.len(),
                    val(nvml.driver_version.value().cloned()),
                    val(nvml.cuda_driver_version.value().map(|v| format!(
                        "{}.{}",
                        v / 1000,
                        (v % 1000) / 10
                    )))
                ),
            );
            out.push('\n');
            table(
                out,
                "Topology (nvidia-smi topo -m)",
                &m,
                &m.topology,
                &extra,
            );
            out.push_str(TOPOLOGY_LEGEND);
            table(
                out,
                "P2P read and write (nvidia-smi topo -p2p rw)",
                &m,
                &m.p2p_read_write,
                &[],
            );
            table(out, "P2P read (-p2p r)", &m, &m.p2p_read, &[]);
            table(out, "P2P write (-p2p w)", &m, &m.p2p_write, &[]);
            table(out, "P2P over NVLink (-p2p n)", &m, &m.p2p_nvlink, &[]);
            table(out, "P2P atomics (-p2p a)", &m, &m.p2p_atomics, &[]);
            out.push_str(P2P_LEGEND);
        }
        LibraryState::Loaded(_) => out.push_str("GPUs: NVML lists none\n\n"),
        LibraryState::NotFound { message } => {
            host_line(out, &format!("GPUs: no NVML ({message})"));
            out.push('\n');
        }
        LibraryState::Failed(e) => {
            host_line(out, &format!("GPUs: NVML failed: {e}"));
            out.push('\n');
        }
        LibraryState::Skipped { reason } => {
            host_line(out, &format!("GPUs: NVML not probed ({reason})"));
            out.push('\n');
        }
    }
}

/// The CUDA driver's view: cuInit's result and each device's bus id.
fn cuda_section(out: &mut String, gpus: &GpuFacts) {
    match &gpus.cuda.state {
        LibraryState::Loaded(c) => {
            host_line(
                out,
                &format!(
                    "CUDA driver: cuInit {} ({}), {} device(s)",
                    c.init_result_name,
                    c.init_result,
                    c.devices.len()
                ),
            );
            for d in &c.devices {
                host_line(
                    out,
                    &format!(
                        "  CUDA {} -> {}",
                        d.ordinal,
                        d.pci_bus_id.value().map_or("?", String::as_str)
                    ),
                );
            }
            out.push('\n');
        }
        LibraryState::NotFound { message } => {
            host_line(out, &format!("CUDA driver: not found ({message})"));
            out.push('\n');
        }
        LibraryState::Failed(e) => {
            host_line(out, &format!("CUDA driver: failed: {e}"));
            out.push('\n');
        }
        LibraryState::Skipped { reason } => {
            host_line(out, &format!("CUDA driver: not probed ({reason})"));
            out.push('\n');
        }
    }
}

/// The NVIDIA GPUs on the PCI bus, whether or not this container sees them.
fn pci_section(out: &mut String, gpus: &GpuFacts) {
    if let Some(pci) = gpus.pci_gpus.value()
        && !pci.is_empty()
    {
        host_line(
            out,
            &format!("NVIDIA GPUs on the PCI bus (the whole node): {}", pci.len()),
        );
        for g in pci {
            host_line(
                out,
                &format!(
                    "  {} {} NUMA {} {}",
                    g.bus_id,
                    g.device_id,
                    g.numa_node.map_or("?".into(), |n| n.to_string()),
                    g.sysfs_path.as_deref().unwrap_or("?")
                ),
            );
        }
        out.push('\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::Observed;
    use crate::facts::gpu::LibraryState;
    use crate::test_facts;

    fn h200_report() -> Report {
        let mut facts = test_facts::healthy();
        facts.gpus = test_facts::h200x2_gpus();
        let prediction = crate::predict::predict(&facts);
        Report::new(facts, prediction, Vec::new(), Vec::new())
    }

    #[test]
    fn gpu_name_of_65535_characters_does_not_panic() {
        // Issue 18: `doctor --facts` with a 65,535-character GPU name panicked.
        let mut r = h200_report();
        let LibraryState::Loaded(nvml) = &mut r.facts.gpus.nvml.state else {
            panic!("h200x2_gpus loads NVML");
        };
        nvml.gpus[0].name = Observed::Value("H".repeat(65_535));
        nvml.gpus[1].name = Observed::Value("GPU\x1b[2J".into());
        let text = render(&r, false);
        assert!(text.contains(&"H".repeat(65_535)));
        assert!(
            text.contains("GPU\\x1b[2J") && !text.contains('\x1b'),
            "escaped"
        );
        // The short name's row still lines up under the long one: the Name column
        // is last, so both rows are as long up to it.
        let rows: Vec<&str> = text
            .lines()
            .skip_while(|l| !l.starts_with("Topology"))
            .skip(2)
            .take(2)
            .collect();
        let at = |row: &str, what: &str| row.find(what).unwrap();
        assert_eq!(at(rows[0], "HHHH"), at(rows[1], "GPU\\x1b"), "{rows:?}");
    }
}
