//! `doctor`: the whole picture for a person debugging a node. GPU topology and
//! P2P matrices in nvidia-smi's notation, CPU and NUMA affinity per GPU, the
//! CUDA view, then the report `check` prints.

use crate::facts::gpu::LibraryState;
use crate::report::Report;
use crate::topology::matrix::{self, Matrices};
use serde::Serialize;
use std::fmt::Write;

/// The JSON form: the report plus the matrices.
#[derive(Debug, Serialize)]
pub struct Doctor<'a> {
    #[serde(flatten)]
    pub report: &'a Report,
    pub gpu_matrices: Option<Matrices>,
}

pub fn doctor(report: &Report) -> Doctor<'_> {
    Doctor {
        report,
        gpu_matrices: report.facts.gpus.nvml.loaded().map(matrix::matrices),
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
    let widths: Vec<usize> = (0..grid[0].len())
        .map(|c| grid.iter().map(|r| r[c].len()).max().unwrap_or(0))
        .collect();
    for r in &grid {
        let line: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        let _ = writeln!(out, "  {}", line.join("  ").trim_end());
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
                    col(&|g| val(g.cpu_affinity.value().cloned())),
                ),
                (
                    "NUMA",
                    col(&|g| val(g.numa_node.value().map(u32::to_string))),
                ),
                ("Bus", col(&|g| val(g.pci_bus_id.value().cloned()))),
                ("Name", col(&|g| val(g.name.value().cloned()))),
            ];
            let _ = writeln!(
                out,
                "GPUs: {} (driver {}, CUDA {})\n",
                nvml.gpus.len(),
                val(nvml.driver_version.value().cloned()),
                val(nvml.cuda_driver_version.value().map(|v| format!(
                    "{}.{}",
                    v / 1000,
                    (v % 1000) / 10
                )))
            );
            table(
                &mut out,
                "Topology (nvidia-smi topo -m)",
                &m,
                &m.topology,
                &extra,
            );
            out.push_str(TOPOLOGY_LEGEND);
            table(
                &mut out,
                "P2P read and write (nvidia-smi topo -p2p rw)",
                &m,
                &m.p2p_read_write,
                &[],
            );
            table(&mut out, "P2P read (-p2p r)", &m, &m.p2p_read, &[]);
            table(&mut out, "P2P write (-p2p w)", &m, &m.p2p_write, &[]);
            table(&mut out, "P2P over NVLink (-p2p n)", &m, &m.p2p_nvlink, &[]);
            table(&mut out, "P2P atomics (-p2p a)", &m, &m.p2p_atomics, &[]);
            out.push_str(P2P_LEGEND);
        }
        LibraryState::Loaded(_) => out.push_str("GPUs: NVML lists none\n\n"),
        LibraryState::NotFound { message } => {
            let _ = writeln!(out, "GPUs: no NVML ({message})\n");
        }
        LibraryState::Failed(e) => {
            let _ = writeln!(out, "GPUs: NVML failed: {e}\n");
        }
        LibraryState::Skipped { reason } => {
            let _ = writeln!(out, "GPUs: NVML not probed ({reason})\n");
        }
    }
    match &gpus.cuda.state {
        LibraryState::Loaded(c) => {
            let _ = writeln!(
                out,
                "CUDA driver: cuInit {} ({}), {} device(s)",
                c.init_result_name,
                c.init_result,
                c.devices.len()
            );
            for d in &c.devices {
                let _ = writeln!(
                    out,
                    "  CUDA {} -> {}",
                    d.ordinal,
                    d.pci_bus_id.value().map_or("?", String::as_str)
                );
            }
            out.push('\n');
        }
        LibraryState::NotFound { message } => {
            let _ = writeln!(out, "CUDA driver: not found ({message})\n");
        }
        LibraryState::Failed(e) => {
            let _ = writeln!(out, "CUDA driver: failed: {e}\n");
        }
        LibraryState::Skipped { reason } => {
            let _ = writeln!(out, "CUDA driver: not probed ({reason})\n");
        }
    }
    if let Some(pci) = gpus.pci_gpus.value()
        && !pci.is_empty()
    {
        let _ = writeln!(
            out,
            "NVIDIA GPUs on the PCI bus (the whole node): {}",
            pci.len()
        );
        for g in pci {
            let _ = writeln!(
                out,
                "  {} {} NUMA {} {}",
                g.bus_id,
                g.device_id,
                g.numa_node.map_or("?".into(), |n| n.to_string()),
                g.sysfs_path.as_deref().unwrap_or("?")
            );
        }
        out.push('\n');
    }
    out.push_str(&super::human::render(report, color));
    out
}
