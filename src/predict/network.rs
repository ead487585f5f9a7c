//! The network NCCL uses between nodes: a net plugin, its IB transport, or NET/Socket
//! (TCP), and when it is TCP on a node with RDMA devices, the cause.
//!
//! src/net.cc ncclNetInit (src/plugin/net.cc from 2.26): the plugin first (when it loads
//! and its init succeeds), then IB, then Socket; NCCL_NET names the only one allowed
//! (compared without case).

use super::ib::IbPrediction;
use super::{Decision, env};
use crate::facts::Facts;
use serde::{Deserialize, Serialize};

const SOURCE: &str = "src/net.cc ncclNetInit (v2.18-v2.25), src/plugin/net.cc (v2.26+): plugin, then IB, then Socket; NCCL_NET restricts by name";

/// The kind of network between nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NetKind {
    /// A net plugin (aws-ofi-nccl's Libfabric, the SHARP plugin's IBext).
    Plugin,
    /// NCCL's IB transport (InfiniBand and RoCE).
    Ib,
    /// NET/Socket: TCP.
    Socket,
    /// NCCL fails at init (NCCL_NET names no network).
    None,
}

/// Why inter-node traffic is TCP: the variable that causes it (`NAME=value`), or
/// none for a missing resource or permission; and the fix.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cause {
    pub variable: Option<String>,
    pub text: String,
    pub fix: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InterNode {
    pub kind: NetKind,
    /// The network's name as NCCL logs "Using network X".
    pub name: String,
    /// True when the bytes travel over TCP (NET/Socket, or a plugin over libfabric's tcp).
    pub tcp: bool,
    /// When the network is TCP or missing: why.
    pub cause: Option<Cause>,
}

/// The plugin NCCL loads and its API, from the gathered probe.
pub(super) fn plugin(facts: &Facts) -> Decision<Option<String>> {
    const PLUGIN_SOURCE: &str = "src/net.cc / src/plugin/plugin_open.cc (NCCL_NET_PLUGIN, libnccl-net.so), ncclNetPlugin_vN symbols";
    let nccl = &facts.rdma.nccl;
    match nccl.net_plugin.value() {
        Some(Some(p)) => {
            let name = p.name.as_deref().unwrap_or("unnamed");
            let api = p.api.as_deref().unwrap_or("no known API");
            Decision::new(
                Some(format!("{} ({name}, {api})", p.library)),
                "the probe loaded it as NCCL would",
                PLUGIN_SOURCE,
            )
        }
        Some(None) => match &nccl.net_plugin_skipped {
            Some(reason) => Decision::new(None, format!("not looked for: {reason}"), PLUGIN_SOURCE),
            None => Decision::new(None, "no plugin library answers", PLUGIN_SOURCE),
        },
        None => Decision::new(None, "the plugin probe failed", PLUGIN_SOURCE),
    }
}

/// The variable as the user set it, `NAME=value`: quoted where the value is empty or has
/// a space or a quote, so an empty one shows (`NCCL_NET_PLUGIN=""`).
fn set(facts: &Facts, name: &str) -> Option<String> {
    env(facts, name).map(|v| {
        if v.is_empty() || v.contains(|c: char| c.is_whitespace() || c == '"' || c == '\'') {
            format!("{name}={v:?}")
        } else {
            format!("{name}={v}")
        }
    })
}

fn cause(variable: Option<String>, text: impl Into<String>, fix: impl Into<String>) -> Cause {
    Cause {
        variable,
        text: text.into(),
        fix: fix.into(),
    }
}

/// What the loaded plugin gives NCCL: the names it answers to for NCCL_NET (the first is
/// the one it logs by default), whether its provider is TCP, and why; `None` where NCCL
/// takes no plugin: none loads, or it exports no ncclNet API this release looks for (NCCL
/// skips it with an INFO line, `crate::nccl::net_plugin::api_in_use`).
fn plugin_network(facts: &Facts) -> Option<(Vec<String>, bool, Option<Cause>)> {
    let p = facts.rdma.nccl.net_plugin.value()?.as_ref()?;
    let apis: Vec<u32> = if p.apis.is_empty() {
        // Facts from older versions recorded only the newest symbol.
        p.api
            .as_deref()
            .and_then(|a| a.strip_prefix('v')?.parse().ok())
            .into_iter()
            .collect()
    } else {
        p.apis.clone()
    };
    let api = match crate::nccl::version(facts) {
        Some(v) => Some(crate::nccl::net_plugin::api_in_use(v, &apis)?),
        None => apis.last().copied(),
    };
    let name = p.name.clone().unwrap_or_else(|| "plugin".into());
    let names = crate::nccl::net_plugin::answers_to(&name, p.ofi_nccl_version.as_deref(), api);
    if !names.iter().any(|n| n.contains("Libfabric")) {
        return Some((names, false, None));
    }
    // aws-ofi-nccl: the provider libfabric gives it. FI_PROVIDER without efa keeps EFA
    // out (libfabric's provider filter), so the plugin runs over tcp or sockets.
    let efa = facts.rdma.devices.value()?.iter().any(|d| d.is_efa());
    match env(facts, "FI_PROVIDER") {
        Some(p) if efa && !p.split(',').any(|x| x.trim() == "efa") => Some((
            names,
            true,
            Some(cause(
                set(facts, "FI_PROVIDER"),
                format!(
                    "FI_PROVIDER={p:?} keeps libfabric off the EFA devices: aws-ofi-nccl runs over {p}"
                ),
                "Unset FI_PROVIDER (aws-ofi-nccl >= 1.6 selects efa itself).",
            )),
        )),
        _ => Some((names, false, None)),
    }
}

/// Why NCCL ends on NET/Socket, most specific first.
fn socket_cause(facts: &Facts, ib: &IbPrediction) -> Cause {
    let devices = facts.rdma.devices.value().map_or(&[][..], Vec::as_slice);
    let efa = devices.iter().any(|d| d.is_efa());
    if let (true, Some(value)) = (efa, env(facts, "NCCL_NET_PLUGIN")) {
        return plugin_variable_cause(facts, value);
    }
    if let Some(off) = &ib.off
        && off.starts_with("NCCL_IB_DISABLE")
    {
        return cause(
            set(facts, "NCCL_IB_DISABLE"),
            off.clone(),
            "Unset NCCL_IB_DISABLE.",
        );
    }
    if ib.skipped.iter().any(|s| s.by_filter) {
        let value = env(facts, "NCCL_IB_HCA").unwrap_or("");
        let filter = crate::nccl::ib_hca::HcaFilter::parse(value);
        // Ports the value names that are not ACTIVE: ncclIbInitDevices skips them first.
        let down: Vec<String> = ib
            .skipped
            .iter()
            .filter(|s| !s.by_filter && s.why.contains("not ACTIVE"))
            .filter_map(|s| Some((s, s.port?)))
            .filter(|(s, p)| filter.admits(&s.device, *p))
            .map(|(s, p)| {
                format!(
                    "{}:{p}, which is {}",
                    s.device,
                    s.why
                        .trim_start_matches("port ")
                        .trim_end_matches(", not ACTIVE")
                )
            })
            .collect();
        let named = if down.is_empty() {
            String::new()
        } else {
            format!(" (it names {})", down.join("; "))
        };
        return cause(
            set(facts, "NCCL_IB_HCA"),
            format!("NCCL_IB_HCA={value:?} leaves no ACTIVE IB or RoCE port{named}"),
            ib_hca_fix(ib),
        );
    }
    if efa {
        return cause(
            None,
            "no NCCL net plugin loads, and NCCL's IB transport cannot drive EFA",
            "Install aws-ofi-nccl in the image (nccl-net-plugin says how).",
        );
    }
    let text = match (&ib.off, ib.skipped.first()) {
        (Some(off), _) => off.clone(),
        (None, Some(s)) => format!("{}: {}", s.device, s.why),
        (None, None) => "this node has no RDMA device NCCL can use".to_string(),
    };
    cause(
        None,
        text,
        "Give the pod its RDMA devices (rdma-devices says how).",
    )
}

/// NCCL_NET_PLUGIN=`value` leaving an EFA node without aws-ofi-nccl, in the words of
/// the release's own rule (`crate::nccl::net_plugin::net_plugin_entries`): `none` turns
/// plugins off from 2.28 (before, it names libnccl-net-none.so), an empty value is an
/// empty list from 2.27 (before, the default libnccl-net.so), any other value names the
/// libraries NCCL tries. The variable is quoted as set, an empty one included.
fn plugin_variable_cause(facts: &Facts, value: &str) -> Cause {
    let version = crate::nccl::version(facts);
    let tried: Vec<String> = crate::nccl::net_plugin::net_plugin_entries(Some(value), version)
        .into_iter()
        .flatten()
        .collect();
    let what = if tried.is_empty() && value.is_empty() {
        "is set but empty, which NCCL 2.27 and later read as an empty list: no external plugin"
            .to_string()
    } else if tried.is_empty() {
        format!("={value:?} turns net plugins off (NCCL 2.28 and later)")
    } else {
        format!(
            "={value:?} loads no plugin here: NCCL tries {}, and none is in this image",
            tried.join(", ")
        )
    };
    cause(
        set(facts, "NCCL_NET_PLUGIN"),
        format!("NCCL_NET_PLUGIN{what}, and NCCL's IB transport cannot drive EFA"),
        format!(
            "Unset NCCL_NET_PLUGIN (set to {value:?}) so NCCL loads libnccl-net.so (aws-ofi-nccl), or name the installed plugin: {}.",
            if crate::nccl::version::since(version, crate::nccl::version::PLUGIN_BARE_NAME) {
                "its library name or path (NCCL_NET_PLUGIN=libnccl-net-ofi.so), or the part after libnccl-net- (ofi)"
            } else {
                "the part after libnccl-net- only (NCCL_NET_PLUGIN=ofi loads libnccl-net-ofi.so; this NCCL, before 2.21, adds the prefix to any value)"
            }
        ),
    )
}

/// An NCCL_IB_HCA that names the ACTIVE ports the filter dropped.
fn ib_hca_fix(ib: &IbPrediction) -> String {
    let active: Vec<String> = ib
        .skipped
        .iter()
        .filter(|s| s.by_filter)
        .filter_map(|s| Some(format!("{}:{}", s.device, s.port?)))
        .collect();
    if active.is_empty() {
        "Unset NCCL_IB_HCA.".into()
    } else {
        format!(
            "Name ACTIVE ports, exactly: NCCL_IB_HCA='={}', or unset NCCL_IB_HCA.",
            active.join(",")
        )
    }
}

/// What NCCL prints, and returns, when NCCL_NET=`name` leaves it no network: every
/// communicator's init fails (src/init.cc commAlloc -> ncclNetInit).
pub fn no_network_error(version: Option<crate::nccl::Version>, name: &str) -> String {
    let warn = if crate::nccl::version::since(version, crate::nccl::version::NET_INIT_MESSAGE) {
        "Failed to initialize any NET plugin".to_string()
    } else {
        format!("Error: network {name} not found.")
    };
    format!("\"{warn}\" (ncclInvalidUsage, src/plugin/net.cc ncclNetInit)")
}

pub(super) fn inter_node(facts: &Facts, ib: &IbPrediction, _plugin: bool) -> Decision<InterNode> {
    let wanted = env(facts, "NCCL_NET").map(str::to_ascii_lowercase);
    let allowed = |name: &str| {
        wanted
            .as_deref()
            .is_none_or(|w| w == name.to_ascii_lowercase())
    };
    let net = |kind, name: &str, tcp, cause| InterNode {
        kind,
        name: name.to_string(),
        tcp,
        cause,
    };
    let plugin = plugin_network(facts);
    let plugin_name = plugin.as_ref().and_then(|(names, ..)| match &wanted {
        // aws-ofi-nccl renames itself to the NCCL_NET it answers to; NCCL logs that.
        Some(w) => names.iter().find(|n| n.to_ascii_lowercase() == *w).cloned(),
        None => names.first().cloned(),
    });
    let chosen = if let (Some((_, tcp, c)), Some(name)) = (plugin.clone(), plugin_name) {
        net(NetKind::Plugin, &name, tcp, c)
    } else if !ib.used.is_empty() && allowed("IB") {
        net(NetKind::Ib, "IB", false, None)
    } else if allowed("Socket") {
        let c = match wanted.as_deref() {
            Some("socket") => cause(
                set(facts, "NCCL_NET"),
                "NCCL_NET=Socket allows only NCCL's TCP transport",
                "Unset NCCL_NET.",
            ),
            _ => socket_cause(facts, ib),
        };
        net(NetKind::Socket, "Socket", true, Some(c))
    } else {
        let offered = offered_names(plugin.as_ref().map(|(n, ..)| n.as_slice()), ib);
        let value = env(facts, "NCCL_NET").unwrap_or_default();
        let c = cause(
            set(facts, "NCCL_NET"),
            format!(
                "NCCL_NET={value:?} names no network this node offers (NCCL compares it without case to {}): NCCL fails at init",
                offered.join(", ")
            ),
            format!(
                "Unset NCCL_NET={value:?} (NCCL then takes the first of {} that works), or set it to one of those names.",
                offered.join(", ")
            ),
        );
        net(NetKind::None, "", false, Some(c))
    };
    let why = match &chosen.cause {
        Some(c) => c.text.clone(),
        None => format!("Using network {}", chosen.name),
    };
    Decision::new(chosen, why, SOURCE)
}

/// The names of the networks NCCL has here, in its order: the plugin's, IB where a port
/// is usable, Socket.
fn offered_names(plugin: Option<&[String]>, ib: &IbPrediction) -> Vec<String> {
    let mut names: Vec<String> = plugin.map(<[String]>::to_vec).unwrap_or_default();
    if !ib.used.is_empty() {
        names.push("IB".into());
    }
    names.push("Socket".into());
    names
}

/// The NICs inter-node traffic uses (for GPUDirect RDMA): the IB ports' devices, or the
/// EFA devices under aws-ofi-nccl. In nccl-preflight's own image the trainer's libraries
/// (verbs, the net plugin) are not here to say which transport it takes: every RDMA
/// device counts, so GPUDirect RDMA, the node's part, is still judged.
pub(super) fn nics_in_use(facts: &Facts, net: &InterNode, ib: &IbPrediction) -> Vec<String> {
    let all = || {
        facts
            .rdma
            .devices
            .value()
            .map(|d| d.iter().map(|d| d.name.clone()).collect())
            .unwrap_or_default()
    };
    if facts.image == crate::facts::ImageRole::Own {
        return all();
    }
    match net.kind {
        NetKind::Ib => {
            let mut names: Vec<String> = ib.used.iter().map(|p| p.device.clone()).collect();
            names.dedup();
            names
        }
        NetKind::Plugin if !net.tcp => all(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_facts;

    fn predict(f: &Facts) -> InterNode {
        let p = super::super::predict(f);
        p.inter_node.value
    }

    #[test]
    fn ib_socket_and_causes() {
        let ib = test_facts::with_ib(test_facts::healthy());
        assert_eq!(predict(&ib).kind, NetKind::Ib);
        let off = test_facts::with_env(ib.clone(), &[("NCCL_IB_DISABLE", "1")]);
        let n = predict(&off);
        assert_eq!((n.kind, n.tcp), (NetKind::Socket, true));
        assert_eq!(
            n.cause.unwrap().variable.as_deref(),
            Some("NCCL_IB_DISABLE=1")
        );
        let socket = test_facts::with_env(ib.clone(), &[("NCCL_NET", "socket")]);
        assert_eq!(
            predict(&socket).cause.unwrap().variable.as_deref(),
            Some("NCCL_NET=socket")
        );
        let hca = test_facts::with_env(ib.clone(), &[("NCCL_IB_HCA", "=mlx5_1")]);
        let c = predict(&hca).cause.unwrap();
        assert!(c.fix.contains("=mlx5_0:1"), "{c:?}");
        let nothing = test_facts::with_env(ib, &[("NCCL_NET", "Libfabric")]);
        assert_eq!(predict(&nothing).kind, NetKind::None);
        assert_eq!(
            predict(&test_facts::healthy()).cause.unwrap().variable,
            None
        );
    }
}
