//! The user's variables judged by what NCCL will do with them (crate::predict), not by
//! their text: inter-node traffic a variable sends over TCP on a node with RDMA, a
//! RoCE GID a variable makes NCCL pick that does not route, GPUDirect RDMA or P2P that
//! a level variable turns off where NCCL would use it.
//!
//! Only the job's span decides how bad it is: on one node nothing crosses the network;
//! across nodes TCP instead of RDMA fails the pod (issue 25: whatever the cause);
//! when the launcher does not say, it warns.

use super::{Problem, get};
use crate::facts::Facts;
use crate::finding::Outcome;
use crate::judge::rdma_scope::Scope;
use crate::layout;
use crate::predict::{NetKind, Prediction, path_rank};

/// Every lint that reads the prediction, NCCL_IB_HCA's included.
pub(super) fn lints(facts: &Facts, predicted: &Prediction) -> Vec<Problem> {
    [
        lint_inter_node,
        lint_gid,
        lint_gdr_level,
        lint_p2p_level,
        super::ib_hca::lint_ib_hca,
    ]
    .iter()
    .flat_map(|lint| lint(facts, predicted))
    .collect()
}

/// What a network problem does to this job (`across`: what it does between nodes);
/// `None` on one node, where NCCL sends nothing over the network.
fn for_span(facts: &Facts, across: Outcome) -> Option<Outcome> {
    match crate::judge::across_nodes(facts, across) {
        Outcome::Unaffected => None,
        o => Some(o),
    }
}

/// Whether the node has an RDMA device with an ACTIVE port, which NCCL could have used.
fn rdma_present(facts: &Facts) -> bool {
    facts.rdma.devices.value().is_some_and(|d| {
        d.iter()
            .any(|d| d.ports.iter().any(|p| p.state.as_deref() == Some("ACTIVE")))
    })
}

/// Inter-node traffic over TCP (or no network at all) because of a variable.
pub(super) fn lint_inter_node(facts: &Facts, p: &Prediction) -> Vec<Problem> {
    let net = &p.inter_node.value;
    let Some(cause) = &net.cause else {
        return Vec::new();
    };
    let Some(variable) = &cause.variable else {
        // A missing device, plugin or permission: rdma-devices and nccl-net-plugin judge those.
        return Vec::new();
    };
    let (status, effect) = if net.kind == NetKind::None {
        // Every communicator's init, one node included (src/init.cc commAlloc calls
        // ncclNetInit): no network NCCL may use.
        let name = get(facts, "NCCL_NET").unwrap_or_default();
        (
            Outcome::init_fails(crate::predict::no_network_error(p.nccl_version, name)),
            String::new(),
        )
    } else if !rdma_present(facts) {
        return Vec::new();
    } else {
        let Some(status) = for_span(facts, Scope::tcp_instead("RDMA")) else {
            return Vec::new();
        };
        let reach = if layout::is_multi_node(facts) {
            "this job's inter-node traffic runs over TCP"
        } else {
            "inter-node traffic would run over TCP (the launcher does not say how many nodes the job spans)"
        };
        (status, format!(": {reach} on a node with RDMA devices"))
    };
    let mut problem = Problem::predicts(
        status,
        format!("{variable}: {}{effect}", cause.text),
        cause.fix.clone(),
    );
    problem.evidence.push(format!(
        "predicted inter-node network: {} ({})",
        if net.name.is_empty() {
            "none"
        } else {
            &net.name
        },
        p.inter_node.source
    ));
    vec![problem]
}

/// A RoCE port whose GID, chosen under the user's GID variables, is link-local or unset.
pub(super) fn lint_gid(facts: &Facts, p: &Prediction) -> Vec<Problem> {
    let vars: Vec<String> = [
        "NCCL_IB_GID_INDEX",
        "NCCL_IB_ADDR_FAMILY",
        "NCCL_IB_ROCE_VERSION_NUM",
    ]
    .iter()
    .filter_map(|n| get(facts, n).map(|v| format!("{n}={v}")))
    .collect();
    let bad: Vec<String> =
        p.ib.value
            .used
            .iter()
            .filter(|port| port.link_layer == "RoCE" && !port.routable)
            .map(|port| {
                format!(
                    "{}:{} GID {} ({})",
                    port.device,
                    port.port,
                    port.gid_index,
                    port.gid.as_deref().unwrap_or("not configured")
                )
            })
            .collect();
    let fails = Outcome::init_fails(
        "RoCE queue pairs to other nodes do not connect over a link-local or unconfigured GID (\"Call to ibv_modify_qp failed with error Invalid argument\", or completion timeouts)",
    );
    let (Some(status), false, false) = (for_span(facts, fails), vars.is_empty(), bad.is_empty())
    else {
        return Vec::new();
    };
    let mut problem = Problem::predicts(
        status,
        format!(
            "{} make NCCL use {}: a link-local or unconfigured GID, which RoCE traffic between nodes cannot use (ibv_modify_qp or completion timeouts)",
            vars.join(", "),
            bad.join(", ")
        ),
        format!(
            "Unset {} (NCCL >= 2.21 picks the RoCE v2 GID of the port's IPv4 address itself; before 2.21 set NCCL_IB_GID_INDEX to that GID's index, see show_gids).",
            vars.iter()
                .map(|v| v.split('=').next().unwrap_or(v))
                .collect::<Vec<_>>()
                .join(" and ")
        ),
    );
    problem.evidence.push(
        p.ib.value
            .used
            .iter()
            .map(|u| format!("{}:{}: {}", u.device, u.port, u.gid_why))
            .collect::<Vec<_>>()
            .join("; "),
    );
    vec![problem]
}

/// NCCL_NET_GDR_LEVEL turning GPUDirect RDMA off where the default (PXB) would use it.
pub(super) fn lint_gdr_level(facts: &Facts, p: &Prediction) -> Vec<Problem> {
    let Some(level) = get(facts, "NCCL_NET_GDR_LEVEL") else {
        return Vec::new();
    };
    let lost: Vec<String> = p
        .gdr
        .iter()
        .filter(|g| !g.used && g.supported && path_rank(&g.distance) <= path_rank("PXB"))
        .map(|g| format!("GPU {} - {} ({})", g.gpu, g.nic, g.distance))
        .collect();
    let staged = Outcome::degraded(
        "NET with buffers staged through host memory instead of GPUDirect RDMA",
        "a copy through host memory on each send and receive: lower inter-node bandwidth, higher latency",
    );
    let Some(status) = for_span(facts, staged).filter(|_| !lost.is_empty()) else {
        return Vec::new();
    };
    let mut problem = Problem::predicts(
        status,
        format!(
            "NCCL_NET_GDR_LEVEL={level:?} turns GPUDirect RDMA off for {} GPU(s) whose NIC NCCL would reach directly at its default level (PXB): their inter-node traffic is staged through host memory",
            lost.len()
        ),
        "Unset NCCL_NET_GDR_LEVEL.",
    );
    problem.evidence = lost;
    vec![problem]
}

/// NCCL_P2P_LEVEL turning P2P off between GPUs the default level (PXB) would pair.
pub(super) fn lint_p2p_level(facts: &Facts, p: &Prediction) -> Vec<Problem> {
    let Some(level) = get(facts, "NCCL_P2P_LEVEL") else {
        return Vec::new();
    };
    if get(facts, "NCCL_P2P_DISABLE").is_some_and(|v| v.trim() == "1") {
        return Vec::new();
    }
    let lost: Vec<String> = p
        .intra_node
        .iter()
        .filter(|t| {
            !t.transport.starts_with("P2P")
                && t.why.contains("beyond")
                && path_rank(&t.path) <= path_rank("PXB")
        })
        .map(|t| format!("GPU {} - GPU {} ({}): {}", t.a, t.b, t.path, t.transport))
        .collect();
    if lost.is_empty() {
        return Vec::new();
    }
    let mut problem = Problem::predicts(
        Outcome::degraded(
            "SHM through host memory instead of P2P",
            "measured 27 GB/s against ~295 GB/s over NVLink on 2x H200",
        ),
        format!(
            "NCCL_P2P_LEVEL={level:?} turns P2P off between {} GPU pair(s) NCCL would otherwise connect directly: they go through host memory (SHM, measured 27 GB/s instead of ~295 GB/s over NVLink on 2x H200)",
            lost.len()
        ),
        "Unset NCCL_P2P_LEVEL.",
    );
    problem.evidence = lost;
    vec![problem]
}
