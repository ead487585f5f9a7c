//! RDMA asked for (issue 13) where this container has no usable device (RDMA
//! turned off or mis-chosen where usable devices exist is judged from the
//! prediction, in `prediction.rs`). NCCL does not fail in that case: without an openable device
//! its IB transport and aws-ofi-nccl find nothing and NCCL falls back to TCP
//! sockets silently (FACTS.md section 2), the most common silent slowdown.

use super::{Problem, get};
use crate::facts::Facts;
use crate::finding::Outcome;
use crate::judge::rdma_scope::Scope;

/// RDMA devices this container can open, split into (EFA, IB/RoCE).
fn usable_rdma(facts: &Facts) -> (Vec<String>, Vec<&crate::facts::rdma::RdmaDevice>) {
    let open: Vec<String> = facts
        .rdma
        .uverbs
        .value()
        .map(|u| {
            u.iter()
                .filter(|n| n.open.as_ref().is_some_and(|o| o.refused.is_none()))
                .filter_map(|n| n.ibdev.clone())
                .collect()
        })
        .unwrap_or_default();
    let devices = facts.rdma.devices.value().map(Vec::as_slice).unwrap_or(&[]);
    let usable = devices.iter().filter(|d| open.contains(&d.name));
    let (efa, ib): (Vec<_>, Vec<_>) = usable.partition(|d| d.is_efa());
    (efa.into_iter().map(|d| d.name.clone()).collect(), ib)
}

/// The user's variables that only make sense with RDMA, as `NAME=value`.
fn rdma_requests(facts: &Facts) -> Vec<String> {
    facts
        .nccl_env
        .iter()
        .filter(|(name, v)| {
            let value = v.value.trim();
            match name.as_str() {
                // An exclusion list (^mlx5_0) asks for no device in particular. NCCL_NET is
                // the prediction's: a name no network here answers to fails init
                // (prediction.rs), whatever it names.
                "NCCL_IB_HCA" => !value.is_empty() && !value.starts_with('^'),
                "NCCL_NET_PLUGIN" => !value.is_empty() && !value.eq_ignore_ascii_case("none"),
                "FI_PROVIDER" => value.split(',').any(|p| p.trim() == "efa"),
                n => n.starts_with("OFI_NCCL_") || n.starts_with("FI_EFA_"),
            }
        })
        .map(|(name, v)| format!("{name}={}", v.value))
        .collect()
}

const RDMA_RESOURCES: &str = "\
Give the pod its RDMA devices: on OpenShift or with SR-IOV, request the network's resource \
(openshift.io/<resource> or rdma/<resource>: 1) and attach the network with the annotation \
k8s.v1.cni.cncf.io/networks: <NetworkAttachmentDefinition>; with the NVIDIA network operator's \
RDMA shared device plugin, request rdma/rdma_shared_device_a: 1. Add IPC_LOCK to the container's capabilities.";

/// Variables asking for RDMA in a container with no usable RDMA device: warn on
/// one node (NCCL needs no network there), fail when the job spans nodes.
pub(super) fn lint_rdma_requested(facts: &Facts) -> Vec<Problem> {
    let asked = rdma_requests(facts);
    if asked.is_empty() {
        return Vec::new();
    }
    // Without both lists there is no telling what the container can use.
    let (Some(devices), Some(_)) = (facts.rdma.devices.value(), facts.rdma.uverbs.value()) else {
        return Vec::new();
    };
    let (efa, ib) = usable_rdma(facts);
    if !efa.is_empty() || !ib.is_empty() {
        return Vec::new();
    }
    let multi_node = crate::layout::is_multi_node(facts);
    let reach = if multi_node {
        "the job spans nodes, so NCCL will send its traffic over TCP sockets"
    } else {
        "on one node NCCL does not need it, but across nodes NCCL would fall back to TCP sockets"
    };
    let status = crate::judge::across_nodes(facts, Scope::tcp_instead("RDMA"));
    let what = if devices.is_empty() {
        "this container has no RDMA device".to_string()
    } else {
        format!(
            "{} RDMA device(s) are in /sys/class/infiniband, yet none has a /dev/infiniband/uverbs node this container can open",
            devices.len()
        )
    };
    let platform = crate::platform::of(facts);
    let efa_node = devices.iter().any(|d| d.is_efa())
        || platform.is_some_and(|p| p.efa_devices.is_some())
        || asked
            .iter()
            .any(|a| a.starts_with("FI_") || a.starts_with("OFI_NCCL_"));
    let mut fix = match platform.and_then(|p| Some((*p.names.first()?, p.efa_devices?))) {
        Some((instance, n)) => format!(
            "Request the instance's EFA devices (EKS, EFA device plugin): resources.limits: vpc.amazonaws.com/efa: {n} ({instance} has {n}), and add IPC_LOCK to the container's capabilities."
        ),
        None if efa_node => "Request the EFA devices (EKS, EFA device plugin): resources.limits: vpc.amazonaws.com/efa: <the instance's EFA count: p4d 4, p5 32, p5en 16>, and add IPC_LOCK to the container's capabilities.".to_string(),
        None => RDMA_RESOURCES.to_string(),
    };
    if !devices.is_empty() {
        fix.push_str(" The device plugin's resource is what mounts /dev/infiniband into the container; a hostPath or privileged pod must mount it itself.");
    }
    let mut p = Problem::predicts(
        status,
        format!("{} ask(s) for RDMA, but {what}: {reach}", asked.join(", ")),
        fix,
    );
    p.evidence
        .push(format!("variables asking for RDMA: {}", asked.join(", ")));
    vec![p]
}

/// The fix for an NCCL_NET_PLUGIN value no library answers to: name the
/// variable and the names NCCL tried, not the plugin's installation.
pub(crate) fn net_plugin_fix(value: &str) -> String {
    format!(
        "Fix NCCL_NET_PLUGIN={value:?}: its value is the part after libnccl-net- (NCCL_NET_PLUGIN=ofi loads libnccl-net-ofi.so), \
or, with NCCL >= 2.21, a library name or absolute path; unset it to let NCCL load libnccl-net.so."
    )
}

/// NCCL_NET_PLUGIN set to a name no library in this image answers to.
/// NCCL does not fail: it logs "NET/Plugin: Could not find" and goes on with
/// its built-in transports (src/plugin/plugin_open.cc, 2.28).
pub(super) fn lint_net_plugin_name(facts: &Facts) -> Vec<Problem> {
    let Some(value) = get(facts, "NCCL_NET_PLUGIN") else {
        return Vec::new();
    };
    let nccl = &facts.rdma.nccl;
    if value.trim().is_empty()
        || value.trim().eq_ignore_ascii_case("none")
        || nccl.net_plugin_skipped.is_some()
        || nccl.net_plugin_attempts.is_empty()
        || !matches!(nccl.net_plugin, crate::facts::Observed::Value(None))
    {
        return Vec::new();
    }
    let version = crate::nccl::version(facts);
    let names = crate::nccl::net_plugin::library_names(value, version);
    // Without a plugin NCCL's own IB transport drives IB and RoCE; EFA it cannot.
    let efa = facts
        .rdma
        .devices
        .value()
        .is_some_and(|d| d.iter().any(|d| d.is_efa()));
    let outcome = if efa {
        crate::judge::across_nodes(facts, Scope::tcp_instead("EFA"))
    } else {
        Outcome::Unaffected
    };
    vec![Problem::predicts(
        outcome,
        format!(
            "NCCL_NET_PLUGIN={value:?} names no library this image has: NCCL tries {} and, finding none, goes on without a net plugin",
            names.join(" then ")
        ),
        net_plugin_fix(value),
    )]
}

/// aws-ofi-nccl's typed variables with a value its parser refuses (`crate::nccl::ofi_params`):
/// the plugin's initialization fails, so NCCL goes on without it: over its own transports
/// (TCP between EFA nodes), or, where NCCL_NET names the plugin, not at all.
pub(super) fn lint_ofi_values(facts: &Facts) -> Vec<Problem> {
    use crate::nccl::ofi_params;
    let forced = get(facts, "NCCL_NET").is_some_and(|n| {
        n.to_ascii_lowercase().contains("libfabric") || n.eq_ignore_ascii_case("ofi")
    });
    facts
        .nccl_env
        .iter()
        .filter_map(|(name, v)| {
            let kind = ofi_params::kind(name)?;
            if ofi_params::accepts(kind, &v.value) {
                return None;
            }
            // src/net.cc: a plugin whose init fails is skipped; NCCL_NET naming it is
            // an init error ("NET/... not found"), else NCCL's own socket transport.
            let (outcome, then) = if forced {
                (
                    Outcome::init_fails("NCCL_NET names a plugin that did not initialize"),
                    "NCCL_NET names it, so NCCL fails at init",
                )
            } else if crate::layout::is_multi_node(facts) {
                (
                    Outcome::degraded("NET/Socket (TCP) between the nodes", "a fraction of the EFA bandwidth"),
                    "NCCL goes on without it, over TCP between the nodes",
                )
            } else {
                (
                    Outcome::Unaffected,
                    "NCCL goes on without it (over TCP between nodes; this job has one node)",
                )
            };
            Some(Problem::predicts(
                outcome,
                format!("{name}={:?} is a value aws-ofi-nccl refuses (\"WARNING: {name} set to invalid value\"): the plugin does not initialize, and {then}", v.value),
                match kind {
                    ofi_params::OfiKind::OneOf(names) => format!("Set {name} to one of {}, or unset it.", names.join(", ")),
                    _ => format!("Set {name} to a plain number (booleans: 0, 1, true or false), or unset it."),
                },
            ))
        })
        .collect()
}
