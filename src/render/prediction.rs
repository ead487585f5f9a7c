//! The prediction in `doctor`: what NCCL will do on this node, one line per decision
//! with why, and the NCCL source each follows. Every string from the host is shown
//! through `visible` (interface and device names, GIDs, variable values).

use super::visible;
use crate::predict::{Decision, Prediction};
use std::fmt::Write;

fn line(out: &mut String, label: &str, value: &str, why: &str) {
    let _ = writeln!(out, "  {label}: {}", visible(value));
    if !why.is_empty() {
        let _ = writeln!(out, "    why: {}", visible(why));
    }
}

fn decision<T>(out: &mut String, label: &str, d: &Decision<T>, value: String) {
    line(out, label, &value, &d.why);
    let _ = writeln!(out, "    source: {}", visible(&d.source));
}

fn network(out: &mut String, p: &Prediction) {
    let s = &p.sockets.value;
    let bootstrap = match &s.bootstrap {
        Some(b) => format!("{} ({})", b.interface, b.address),
        None if s.comm_id => "the interface in NCCL_COMM_ID's subnet".to_string(),
        None => "none: init fails".to_string(),
    };
    decision(out, "bootstrap interface", &p.sockets, bootstrap);
    let socket: Vec<String> = s.interfaces.iter().map(|e| e.interface.clone()).collect();
    line(out, "NET/Socket interfaces", &socket.join(", "), "");
    let ports: Vec<String> =
        p.ib.value
            .used
            .iter()
            .map(|u| {
                format!(
                    "{}:{}/{} GID {}",
                    u.device, u.port, u.link_layer, u.gid_index
                )
            })
            .collect();
    let ib = if ports.is_empty() {
        "none".to_string()
    } else {
        ports.join(", ")
    };
    decision(out, "IB/RoCE ports", &p.ib, ib);
    for s in &p.ib.value.skipped {
        let port = s.port.map_or(String::new(), |p| format!(":{p}"));
        line(out, "  skipped", &format!("{}{port}", s.device), &s.why);
    }
    let plugin = p.net_plugin.value.clone().unwrap_or_else(|| "none".into());
    decision(out, "net plugin", &p.net_plugin, plugin);
    let net = &p.inter_node.value;
    let name = if net.tcp {
        format!("{} (TCP)", net.name)
    } else {
        net.name.clone()
    };
    decision(out, "between nodes", &p.inter_node, name);
}

/// Lines per list in the text: the JSON report keeps them all.
const MAX_LINES: usize = 64;

fn left_out(out: &mut String, what: &str, total: usize) {
    if total > MAX_LINES {
        let _ = writeln!(
            out,
            "  ({} more {what} in the JSON report)",
            total - MAX_LINES
        );
    }
}

fn node(out: &mut String, p: &Prediction) {
    left_out(out, "GPU-NIC lines", p.gdr.len());
    for g in p.gdr.iter().take(MAX_LINES) {
        let via = g
            .via
            .as_ref()
            .map_or(String::new(), |v| format!(" via {v} (PXN)"));
        let used = if g.used {
            "GPUDirect RDMA"
        } else {
            "no GPUDirect RDMA"
        };
        let what = format!("GPU {} - {} {}{via}: {used}", g.gpu, g.nic, g.distance);
        line(out, "GDR", &what, &g.why);
    }
    left_out(out, "GPU pairs", p.intra_node.len());
    for t in p.intra_node.iter().take(MAX_LINES) {
        let what = format!("GPU {} - GPU {} ({}): {}", t.a, t.b, t.path, t.transport);
        line(out, "pair", &what, &t.why);
    }
    let shm = &p.shm.value;
    let need = if shm.in_dev_shm {
        format!(
            "{} bytes of /dev/shm per SHM connection",
            shm.bytes_per_connection
        )
    } else {
        "no /dev/shm for NCCL's transports".to_string()
    };
    decision(out, "SHM", &p.shm, need);
    decision(out, "NVLS", &p.nvls, format!("{:?}", p.nvls.value));
    decision(
        out,
        "multi-node NVLink",
        &p.mnnvl,
        format!("{:?}", p.mnnvl.value),
    );
}

/// The section, after the RDMA devices and before the checks.
pub fn section(out: &mut String, p: &Prediction) {
    let version = p.nccl_version.map_or(
        "no libnccl found: the newest NCCL's behaviour".to_string(),
        |v| format!("NCCL {v}"),
    );
    let _ = writeln!(out, "What NCCL will do ({}):", visible(&version));
    network(out, p);
    node(out, p);
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_facts;

    #[test]
    fn shows_each_decision_and_escapes_names() {
        let mut f = test_facts::healthy();
        f.nccl_env.insert(
            "NCCL_SOCKET_IFNAME".into(),
            crate::facts::EnvValue::text("eth0\x1b[2J"),
        );
        let mut out = String::new();
        section(&mut out, &crate::predict::predict(&f));
        for label in [
            "bootstrap interface",
            "between nodes",
            "pair: GPU 0 - GPU 1 (NVL)",
            "NVLS",
            "source: src/",
        ] {
            assert!(out.contains(label), "{label}: {out}");
        }
        assert!(!out.contains('\x1b') && out.contains("[2J"), "{out}");
    }
}
