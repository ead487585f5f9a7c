//! This pod's record for the rendezvous, built from its report: the trainer's
//! libnccl, driver, GPUs, NICs and the interface NCCL's sockets use with its
//! speed, the effective NCCL/FI environment, the gang's own options and every
//! local check (`fingerprint` says how it travels).

use super::Settings;
use super::fingerprint::{Fingerprint, SUMMARY_CHARS};
use crate::cli::GangOpts;
use crate::finding::{Finding, Status, ids};
use crate::layout::GangIdentity;
use crate::report::Report;
use crate::tune::Source;
use std::collections::BTreeMap;
use std::path::Path;

/// The effective NCCL_*, FI_*, OFI_NCCL_* environment the trainer gets: the user's
/// values and every tuned setting the user did not set (user values win, as `exec`
/// and NCCL's conf file apply them).
fn effective_env(report: &Report) -> BTreeMap<String, String> {
    let mut env: BTreeMap<String, String> = report
        .facts
        .nccl_env
        .iter()
        .map(|(k, v)| (k.clone(), v.value.clone()))
        .collect();
    for s in report.settings.iter().filter(|s| s.source == Source::Tuned) {
        env.entry(s.name.clone()).or_insert_with(|| s.value.clone());
    }
    env
}

/// RDMA devices with an ACTIVE port, and those ports' rates, sorted.
fn active_rdma(facts: &crate::facts::Facts) -> (u32, Vec<String>) {
    let mut devices = 0;
    let mut rates = Vec::new();
    for d in facts.rdma.devices.value().into_iter().flatten() {
        let active: Vec<_> = d
            .ports
            .iter()
            .filter(|p| p.state.as_deref() == Some("ACTIVE"))
            .collect();
        if !active.is_empty() {
            devices += 1;
        }
        rates.extend(active.iter().filter_map(|p| p.rate.clone()));
    }
    rates.sort();
    (devices, rates)
}

/// The fingerprint of this pod from its local report. `gpus` is what the CUDA driver
/// showed the gang; `socket` the interface NCCL's sockets use and its speed;
/// `gang_options` the gang's own options as text.
fn from_report(
    report: &Report,
    node_rank: u64,
    gpus: u32,
    socket: (Option<String>, Option<u64>),
    gang_options: String,
) -> Fingerprint {
    let facts = &report.facts;
    let nvml = facts.gpus.nvml.loaded();
    let cuda_driver_version = facts
        .gpus
        .cuda
        .loaded()
        .and_then(|c| c.driver_version.value().copied())
        .or_else(|| nvml.and_then(|n| n.cuda_driver_version.value().copied()))
        .map(|v| format!("{}.{}", v / 1000, v % 1000 / 10));
    let gpu_model = nvml
        .and_then(|n| n.gpus.first())
        .and_then(|g| g.name.value().cloned());
    let net_plugin = facts
        .rdma
        .nccl
        .net_plugin
        .value()
        .and_then(|p| p.as_ref())
        .map(|p| {
            let name = p.name.clone().unwrap_or_else(|| p.library.clone());
            match &p.api {
                Some(api) => format!("{name} ({api})"),
                None => name,
            }
        });
    let (rdma_devices, rdma_rates) = active_rdma(facts);
    let nccl = facts.rdma.nccl.library.loaded();
    Fingerprint {
        node_rank,
        host: facts
            .namespaces
            .hostname
            .value()
            .cloned()
            .unwrap_or_default(),
        nccl_version: nccl.and_then(|l| l.version.value().cloned()),
        nccl_library: nccl.and_then(|l| l.path.clone()),
        cuda_driver_version,
        gpu_model,
        gpus,
        net_plugin,
        libfabric_version: facts.rdma.libfabric.loaded().map(|f| f.version.clone()),
        rdma_devices,
        rdma_rates,
        socket_interface: socket.0,
        socket_speed_mbps: socket.1,
        env: effective_env(report),
        checks: report
            .checks
            .iter()
            .map(|c| (c.id.clone(), c.status()))
            .collect(),
        local_verdict: report.verdict,
        local_fault: report.fault,
        summaries: report
            .checks
            .iter()
            .filter(|c| matches!(c.status(), Status::Fail | Status::Warn))
            .map(|c| {
                (
                    c.id.clone(),
                    c.summary.chars().take(SUMMARY_CHARS).collect(),
                )
            })
            .collect(),
        gang_options,
    }
}

/// Link kinds (rtnetlink) whose sysfs speed is not a wire's.
const VIRTUAL_KINDS: &[&str] = &[
    "veth",
    "bridge",
    "dummy",
    "tun",
    "vxlan",
    "geneve",
    "wireguard",
    "ipip",
    "gre",
];

/// The interface NCCL's sockets will use: the first that the user's
/// NCCL_SOCKET_IFNAME admits, else the tuned NCCL_SOCKET_IFNAME's, else the
/// tuning's own choice (`nccl::interface::choose_interface`).
fn socket_interface(report: &Report) -> Option<String> {
    use crate::nccl::bootstrap::{SocketEnv, find_interfaces};
    let net = &report.facts.network;
    let version = crate::nccl::version(&report.facts);
    let first = |value: &str| {
        // A value NCCL ignores (one character or less) is no interface of the user's.
        if value.len() <= 1 {
            return None;
        }
        let (links, addrs) = (net.interfaces.value()?, net.addresses.value()?);
        let env = SocketEnv {
            ifname: Some(value),
            ..SocketEnv::default()
        };
        find_interfaces(version, env, links, addrs, 1)
            .pop()
            .map(|e| e.interface)
    };
    let user = report
        .facts
        .nccl_env
        .get("NCCL_SOCKET_IFNAME")
        .map(|v| v.value.clone());
    let tuned = report
        .settings
        .iter()
        .find(|s| s.name == "NCCL_SOCKET_IFNAME")
        .map(|s| s.value.clone());
    match user.or(tuned) {
        Some(value) => first(&value),
        None => crate::nccl::interface::choose_interface(&report.facts).map(|c| c.name),
    }
}

/// The interface NCCL's sockets use and its link speed in Mb/s (read by gather).
fn socket_speed(report: &Report, host_root: &Path) -> (Option<String>, Option<u64>) {
    let Some(name) = socket_interface(report) else {
        return (None, None);
    };
    // A virtual link's speed is made up (veth reports 10000 whatever carries it), so
    // it gives no figure: a pod's eth0 on most CNIs is one end of a veth pair.
    let kind = report
        .facts
        .network
        .interfaces
        .value()
        .and_then(|l| l.iter().find(|i| i.name == name))
        .and_then(|i| i.kind.clone());
    if kind.as_deref().is_some_and(|k| VIRTUAL_KINDS.contains(&k)) {
        return (Some(name), None);
    }
    let host = crate::gather::host::Host::new(host_root);
    let speed = crate::gather::network::link_speed_mbps(&host, &name);
    (Some(name), speed)
}

/// The gang's own options as text, compared across pods.
fn options_text(opts: &GangOpts) -> String {
    let sizes: Vec<String> = opts
        .gang_sizes
        .iter()
        .map(|b| crate::units::format_bytes(*b))
        .collect();
    format!(
        "sizes {} iterations {} timeout {:.1} s",
        sizes.join(","),
        opts.gang_iterations,
        opts.gang_timeout.as_secs_f64()
    )
}

/// This pod's encoded fingerprint, or the findings that end the gang when it
/// cannot be encoded.
pub(crate) fn own_record(
    report: &Report,
    identity: &GangIdentity,
    settings: &Settings<'_>,
) -> Result<Vec<u8>, Vec<Finding>> {
    let gpus = report
        .facts
        .gpus
        .cuda
        .loaded()
        .map_or(0, |c| c.devices.len() as u32);
    let mine = from_report(
        report,
        identity.node_rank,
        gpus,
        socket_speed(report, &settings.host_root),
        options_text(settings.opts),
    );
    mine.encode().map_err(|e| {
        vec![
            Finding::skip(ids::GANG_JOIN, "the gang did not start"),
            Finding::fail(
                ids::GANG_CONSISTENCY,
                e,
                "Unset NCCL/FI variables the job does not need",
            ),
            Finding::skip(ids::GANG_BANDWIDTH, "the gang did not start"),
        ]
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn effective_env_is_user_plus_tuned_and_keeps_every_variable() {
        let facts = crate::test_facts::with_env(
            crate::test_facts::healthy(),
            &[("NCCL_ALGO", "Ring"), ("NCCL_DEBUG_FILE", "/tmp/x.%h")],
        );
        let settings = vec![
            crate::tune::Setting {
                name: "NCCL_ALGO".into(),
                value: "Tree".into(),
                reason: String::new(),
                source: Source::Tuned,
            },
            crate::tune::Setting {
                name: "NCCL_BUFFSIZE".into(),
                value: "8388608".into(),
                reason: String::new(),
                source: Source::Tuned,
            },
        ];
        let prediction = crate::predict::predict(&facts);
        let report = Report::new(facts, prediction, vec![], settings);
        let env = effective_env(&report);
        assert_eq!(env.get("NCCL_ALGO").map(String::as_str), Some("Ring"));
        assert_eq!(
            env.get("NCCL_BUFFSIZE").map(String::as_str),
            Some("8388608")
        );
        // What a variable does is judged where the records meet (nccl::roles), not here.
        assert!(env.contains_key("NCCL_DEBUG_FILE"));
    }
}
