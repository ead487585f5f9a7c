//! `rdma-devices`: the RDMA devices NCCL will use exist, are up, and can be
//! opened from this container. One unopenable verbs device can make
//! libfabric's EFA provider vanish so NCCL falls back to TCP (FACTS.md section
//! 2, ofiwg/libfabric#12708): every device is opened, not just listed.

use super::rdma_scope::{self, NicNeed, Scope};
use super::{Finding, Problem, undetermined, unmet};
use crate::facts::gpu::LibraryState;
use crate::facts::rdma::{RdmaDevice, UverbsNode};
use crate::facts::{Facts, Observed};
use crate::finding::{Outcome, Owner};
use crate::policy::Policy;
use crate::predict::Prediction;

pub const ID: &str = "rdma-devices";

/// The fix for a pod that lacks RDMA devices: the resource to request leads, since
/// the image cannot fix what the pod spec did not ask for.
fn request_fix(efa: bool, count: Option<u32>) -> String {
    if efa {
        let n = count.map_or_else(
            || format!("N   # {} (all the node's for its GPUs)", efa_counts()),
            |n| n.to_string(),
        );
        format!(
            "Request the EFA devices in the pod spec (EKS, with the aws-efa-k8s-device-plugin), in the
training container and in the initContainer that checks it:
  resources:
    limits:
      vpc.amazonaws.com/efa: {n}
The plugin then adds the /dev/infiniband/uverbs* nodes to the container."
        )
    } else {
        let n = count.map_or("1".into(), |n| n.to_string());
        format!(
            "Request the RDMA devices in the pod spec, in the training container and in the
initContainer that checks it:
  NVIDIA network operator, RDMA shared device plugin:  rdma/rdma_shared_device_a: {n}
  SR-IOV (OpenShift: openshift.io/<resourceName>): the VF resource, plus the pod annotation
    k8s.v1.cni.cncf.io/networks: <the SriovNetwork's name>
The device plugin then adds the /dev/infiniband/uverbs* nodes to the container."
        )
    }
}

/// Each known instance family's EFA devices (`p4d: 4, p5: 32, ...`), from the one
/// platform table.
fn efa_counts() -> String {
    crate::platform::PLATFORMS
        .iter()
        .filter_map(|p| {
            let family = p.names.first()?.split('.').next()?;
            Some(format!("{family}: {}", p.efa_devices?))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

const PORT_FIX: &str = "\
Check the link on the node: ibstat / ibv_devinfo -v (physical state, rate), the cable or switch port,
and for InfiniBand that a subnet manager is running (a port stuck in INIT has none).";

const OWN_IMAGE_NOTE: &str = "libibverbs not judged here: this is nccl-preflight's own image; run `nccl-preflight exec` in the training container, or the installed binary as an initContainer of the training image, to judge the trainer's libibverbs";

/// Links that trained below what they can do: a port slower than its peers of the same
/// link layer (an NDR HCA at HDR after a bad cable: NCCL's rings and trees run at the
/// slowest NIC), or a PCIe link below its width or speed (x8 of x16 halves what the NIC can
/// move to the GPU).
fn link_problems(devices: &[&RdmaDevice], scope: &Scope, required: bool) -> Vec<Problem> {
    let slow = |cost: &str| {
        scope.in_use_outcome(
            required,
            Outcome::degraded(
                "the job's slowest NIC sets its rings' pace",
                cost.to_string(),
            ),
        )
    };
    /// An ACTIVE port with a rate sysfs could parse.
    struct Active<'a> {
        device: &'a str,
        port: u32,
        layer: &'a str,
        gbps: f64,
        rate: &'a str,
    }
    let mut problems = Vec::new();
    let ports: Vec<Active> = devices
        .iter()
        .flat_map(|d| {
            d.ports
                .iter()
                .filter(|p| p.state.as_deref() == Some("ACTIVE"))
                .filter_map(|p| {
                    let rate = p.rate.as_deref()?;
                    Some(Active {
                        device: &d.name,
                        port: p.port,
                        layer: p.link_layer.as_deref().unwrap_or(""),
                        gbps: crate::facts::rdma::rate_gbps(rate)?,
                        rate,
                    })
                })
        })
        .collect();
    for p in &ports {
        let best = ports
            .iter()
            .filter(|o| o.layer == p.layer)
            .map(|o| o.gbps)
            .fold(0.0_f64, f64::max);
        if p.gbps < best {
            problems.push(Problem::predicts(
                slow("every ring through this NIC at its lower rate"),
                format!(
                    "{} port {} runs at {}, its peers at {best} Gb/sec: NCCL's rings run at the slowest NIC's speed",
                    p.device, p.port, p.rate
                ),
                "Check the link on the node: ibstat / ibv_devinfo -v (active width and speed), mlxlink for the cable, the switch port; reseat or replace the cable, or drain the node.",
            ));
        }
    }
    for d in devices {
        if let Some(degraded) = d.pcie.as_ref().and_then(|l| l.degraded()) {
            problems.push(Problem::predicts(
                slow("the NIC's traffic to and from the GPUs at its narrower PCIe link's rate"),
                format!(
                    "{}: PCIe link trained at {degraded}: the NIC moves proportionally less to and from the GPUs",
                    d.name
                ),
                "Check the NIC's slot, riser and PCIe settings on the node (lspci -vv: LnkSta against LnkCap); reseat the card, or drain the node.",
            ));
        }
    }
    problems
}

/// libibverbs' port states for a device, where sysfs gave no port.
fn verbs_ports(facts: &Facts, dev: &str) -> Vec<(u32, String)> {
    match &facts.rdma.verbs.state {
        LibraryState::Loaded(v) => v
            .devices
            .value()
            .and_then(|list| list.iter().find(|d| d.name == dev))
            .map(|d| {
                d.ports
                    .iter()
                    .filter_map(|p| p.state.clone().map(|s| (p.port, s)))
                    .collect()
            })
            .unwrap_or_default(),
        _ => Vec::new(),
    }
}

/// /sys/class/infiniband could not be read: could not determine, never absent.
fn unreadable_class(scope: &Scope, policy: &Policy, expected_efa: Option<u32>) -> Option<Finding> {
    let e = scope.devices.err()?;
    let required = policy.require.any_rdma();
    Some(
        Finding::predicts(
            ID,
            undetermined(required, "the node's RDMA devices: /sys/class/infiniband could not be read"),
            "could not determine the RDMA devices: /sys/class/infiniband could not be read",
            format!(
                "Make /sys/class/infiniband readable in the container (sysfs mounted read-only is enough).\n{}",
                request_fix(expected_efa.is_some() || policy.require.efa, None)
            ),
        )
        .undetermined()
        .evidence(e.to_string()),
    )
}

/// No RDMA device on the node: a skip, unless the policy or the instance type expects some.
fn no_devices(
    scope: &Scope,
    policy: &Policy,
    expected_efa: Option<u32>,
    need: Option<&NicNeed>,
) -> Finding {
    let required = policy.require.any_rdma();
    if !required && expected_efa.is_none() {
        return Finding::skip(ID, "no RDMA devices on this node");
    }
    let outcome = scope.missing_outcome(required, Scope::tcp_instead("RDMA"));
    let why = match expected_efa {
        Some(n) => format!(" (this instance type has {n} EFA devices)"),
        None => String::new(),
    };
    Finding::predicts(
        ID,
        outcome,
        format!(
            "no RDMA devices{why}: NCCL between nodes will use TCP sockets; {}",
            scope.span_words()
        ),
        request_fix(
            policy.require.efa || expected_efa.is_some(),
            need.map(|n| n.count),
        ),
    )
}

/// One line of evidence per device: driver, PCI place, ports, and its device node here.
fn device_line(d: &RdmaDevice, node: Option<&UverbsNode>, nodes_unknown: bool) -> String {
    let ports: Vec<String> = d
        .ports
        .iter()
        .map(|p| {
            format!(
                "port {} {} {}",
                p.port,
                p.state.as_deref().unwrap_or("?"),
                p.link_layer.as_deref().unwrap_or("?")
            )
        })
        .collect();
    format!(
        "{} ({}, {}): {}{}",
        d.name,
        d.driver.as_deref().unwrap_or("?"),
        d.pci_bus_id.as_deref().unwrap_or("?"),
        if ports.is_empty() {
            "no port read".to_string()
        } else {
            ports.join(", ")
        },
        match node.and_then(|n| n.open.as_ref()) {
            Some(o) if o.refused.is_none() => format!(
                "; /dev/infiniband/{} opens",
                node.map_or("?", |n| n.name.as_str())
            ),
            Some(o) => format!(
                "; /dev/infiniband/{} refused: {}",
                node.map_or("?", |n| n.name.as_str()),
                o.refused.as_deref().unwrap_or("")
            ),
            None if nodes_unknown => "; device node unknown".into(),
            None => "; no device node in this container".into(),
        }
    )
}

/// A device sysfs lists no port for: libibverbs' answer stands in; neither is "could not determine".
fn unlisted_ports(facts: &Facts, scope: &Scope, d: &RdmaDevice, required: bool) -> Option<Problem> {
    let from_verbs = verbs_ports(facts, &d.name);
    let down: Vec<String> = from_verbs
        .iter()
        .filter(|(_, s)| s != "ACTIVE")
        .map(|(p, s)| format!("port {p} {s} (libibverbs)"))
        .collect();
    if !down.is_empty() {
        Some(Problem::predicts(
            scope.in_use_outcome(required, port_down()),
            format!("{}: {}", d.name, down.join(", ")),
            PORT_FIX,
        ))
    } else if from_verbs.is_empty() {
        Some(Problem::predicts(
            undetermined(required, format!("the state of {}'s ports", d.name)),
            format!(
                "{}: could not determine the port state (/sys/class/infiniband/{}/ports could not be read, and libibverbs did not say)",
                d.name, d.name
            ),
            "Make /sys/class/infiniband readable in the container, or check the ports on the node: ibstat / ibv_devinfo.",
        ).undetermined())
    } else {
        None
    }
}

/// A port that is not ACTIVE but that NCCL would not use anyway (src/transport/net_ib.cc
/// ncclIbInitDevices): one the user's NCCL_IB_HCA leaves out, or the idle port of a
/// multi-port HCA whose other port NCCL uses. A port NCCL will not use does not fail
/// the pod.
fn nccl_ignores(facts: &Facts, d: &RdmaDevice, port: u32) -> bool {
    if d.is_efa() {
        return false;
    }
    let filter = facts
        .nccl_env
        .get("NCCL_IB_HCA")
        .map(|v| crate::nccl::ib_hca::HcaFilter::parse(&v.value));
    let admitted = |p: u32| filter.as_ref().is_none_or(|f| f.admits(&d.name, p));
    !admitted(port)
        || d.ports
            .iter()
            .any(|p| p.port != port && p.state.as_deref() == Some("ACTIVE") && admitted(p.port))
}

/// What a port NCCL would use that is not ACTIVE does: ncclIbInitDevices skips it
/// (src/transport/net_ib.cc, IBV_PORT_ACTIVE), so its share of the traffic takes the
/// other NICs, or TCP where none is left.
fn port_down() -> Outcome {
    Outcome::degraded(
        "the other NICs, or NET/Socket (TCP) where none is left: NCCL skips a port that is not ACTIVE",
        "that NIC's share of the node's network bandwidth",
    )
}

/// Ports of a device this container uses (or could not tell) that are not ACTIVE and
/// that NCCL would use.
fn port_problems(facts: &Facts, scope: &Scope, d: &RdmaDevice, required: bool) -> Option<Problem> {
    if d.ports.is_empty() {
        return unlisted_ports(facts, scope, d, required);
    }
    let down: Vec<String> = d
        .ports
        .iter()
        .filter(|p| !nccl_ignores(facts, d, p.port))
        .filter_map(|p| {
            let state = p.state.as_deref()?;
            (state != "ACTIVE").then(|| match p.phys_state.as_deref() {
                Some(phys) => format!("port {} {state} ({phys})", p.port),
                None => format!("port {} {state}", p.port),
            })
        })
        .collect();
    if !down.is_empty() {
        return Some(Problem::predicts(
            scope.in_use_outcome(required, port_down()),
            format!("{}: {}", d.name, down.join(", ")),
            PORT_FIX,
        ));
    }
    unknown_ports(d, required)
}

/// /sys/class/infiniband_verbs unreadable: which devices this pod can open is unknown.
/// Unreadable is not absent (issue 31 row 8): "8 RDMA device(s), 0 usable" passed a
/// 16-node job. Could not determine: a failure when the job spans nodes.
fn unknown_usable(scope: &Scope, devices: usize, required: bool) -> Option<Problem> {
    scope.nodes_unknown?;
    (devices > 0).then(|| {
        Problem::predicts(
            undetermined(required, "which RDMA devices this container can use"),
            format!(
                "could not determine which of the {devices} RDMA device(s) this container can use: /sys/class/infiniband_verbs could not be read; {}",
                scope.span_words()
            ),
            "Make /sys/class/infiniband_verbs readable in the container (sysfs mounted read-only is enough).",
        )
        .undetermined()
    })
}

/// Ports whose state could not be read: "could not determine", never "port 1 ? (?)"
/// (issue 31 row 8); failing when the job spans nodes.
fn unknown_ports(d: &RdmaDevice, required: bool) -> Option<Problem> {
    let unknown: Vec<String> = d
        .ports
        .iter()
        .filter(|p| p.state.is_none())
        .map(|p| {
            let path = format!("/ports/{}/state", p.port);
            match d.unreadable.iter().find(|e| e.source.ends_with(&path)) {
                Some(e) => format!("port {} ({})", p.port, e.message),
                None => format!("port {} (no state in sysfs)", p.port),
            }
        })
        .collect();
    (!unknown.is_empty()).then(|| {
        Problem::predicts(
            undetermined(required, format!("the state of {}'s ports", d.name)),
            format!(
                "{}: could not determine the state of {}",
                d.name,
                unknown.join(", ")
            ),
            "Make /sys/class/infiniband readable in the container, or check the ports on the node: ibstat / ibv_devinfo.",
        )
        .undetermined()
    })
}

/// The fix for a device node that does not open: a permission refusal is the user's
/// privileges over a node that is there (the resource was granted), not a missing resource.
fn refused_fix(refused: &str) -> String {
    let denied = [
        "EACCES",
        "EPERM",
        "Permission denied",
        "Operation not permitted",
    ]
    .iter()
    .any(|e| refused.contains(e));
    if denied {
        "The device node is in the container but this process's user has no permission to open it: the node is root-only (a hostPath or privileged pod keeps the host's mode) or the device cgroup refuses it. Run the trainer as root or with a group that may open /dev/infiniband/uverbs*, or get the device through the RDMA device plugin's resource, which grants it to the container.".to_string()
    } else {
        "Give the container access to the device (the device plugin's resource, or a device cgroup rule) or remove the node from /dev/infiniband in the pod.".to_string()
    }
}

/// One device: its evidence, a device node that cannot be opened, ports not ACTIVE.
fn device_problems(
    facts: &Facts,
    scope: &Scope,
    d: &RdmaDevice,
    required: bool,
    evidence: &mut Vec<String>,
) -> Vec<Problem> {
    let uverbs = facts.rdma.uverbs.value().map_or(&[][..], Vec::as_slice);
    let node = uverbs.iter().find(|u| u.ibdev.as_deref() == Some(&d.name));
    evidence.push(device_line(d, node, scope.nodes_unknown.is_some()));
    for e in &d.unreadable {
        evidence.push(format!("unreadable: {e}"));
    }
    let mut problems = Vec::new();
    if let Some(o) = node.and_then(|n| n.open.as_ref())
        && let Some(refused) = &o.refused
    {
        // One device that does not open can make libfabric's EFA provider drop every
        // device (ofiwg/libfabric#12708): TCP.
        problems.push(Problem::predicts(
            scope.in_use_outcome(required, Scope::tcp_instead("RDMA: the provider gives up on every device over one it cannot open")),
            format!(
                "{}: /dev/infiniband/{} exists but cannot be opened ({refused}): libfabric's EFA provider and NCCL can lose every device over one",
                d.name,
                node.map_or("?", |n| n.name.as_str()),
            ),
            refused_fix(refused),
        )
        // The node is in the container without the device plugin's grant (a hostPath,
        // a privileged pod, another user): the pod spec's to fix.
        .blamed(Owner::PodSpec));
    }
    // Ports matter where this container can use the device (or could not tell).
    if node.is_some() || scope.nodes_unknown.is_some() {
        problems.extend(port_problems(facts, scope, d, required));
    }
    problems
}

/// The devices this pod got against the ones its GPUs need.
fn allocation_problem(
    scope: &Scope,
    policy: &Policy,
    devices: &[RdmaDevice],
    any_efa: bool,
    need: Option<&NicNeed>,
) -> Option<Problem> {
    let usable = scope.usable.len();
    let required = policy.require.any_rdma();
    if usable == 0 && scope.nodes_unknown.is_none() && scope.refused_nodes == 0 {
        // The pod did not get the devices: its spec, not its image, is what to fix.
        return Some(Problem::predicts(
            scope.missing_outcome(required, Scope::tcp_instead("RDMA")),
            format!(
                "this pod can use none of the node's {} RDMA device(s) (no /dev/infiniband node): NCCL between nodes would use TCP sockets; {}",
                devices.len(),
                scope.span_words()
            ),
            request_fix(any_efa, need.map(|n| n.count)),
        ).blamed(Owner::PodSpec));
    }
    let need = need?;
    let have = if need.efa { scope.usable_efa() } else { usable } as u32;
    if have >= need.count || scope.nodes_unknown.is_some() {
        return None;
    }
    let efa_required = policy.require.efa && policy.require.efa_count.is_none() && need.efa;
    let share = u64::from(have) * 100 / u64::from(need.count);
    let mut p = Problem::predicts(
        scope.missing_outcome(
            efa_required,
            Outcome::degraded(
                format!("{have} of the {} NICs the pod's GPUs need", need.count),
                format!("about {share}% of the node's network bandwidth"),
            ),
        ),
        format!(
            "this pod can use {have} of the {} {} its GPUs need: NCCL between nodes gets about {share}% of the node's network bandwidth; {}",
            need.count,
            if need.efa { "EFA devices" } else { "RDMA NICs" },
            scope.span_words()
        ),
        request_fix(need.efa, Some(need.count)),
    )
    // The node has the devices; the pod spec did not ask for them all.
    .blamed(Owner::PodSpec);
    p.evidence.push(need.basis.clone());
    Some(p)
}

/// `--require efa`, `efa=N`, `rdma=N` and `rdma` against the devices usable here.
fn requirement_problems(
    scope: &Scope,
    policy: &Policy,
    any_efa: bool,
    need: Option<&NicNeed>,
) -> Vec<Problem> {
    let usable = scope.usable.len();
    let usable_efa = scope.usable_efa();
    let mut problems = Vec::new();
    if policy.require.efa && usable_efa == 0 && scope.nodes_unknown.is_none() {
        problems.push(Problem::predicts(
            unmet("--require efa"),
            "--require efa: no EFA device usable from this container".to_string(),
            request_fix(true, need.map(|n| n.count)),
        ));
    }
    if let Some(n) = policy.require.efa_count
        && (usable_efa as u32) < n
    {
        problems.push(Problem::predicts(
            unmet(&format!("--require efa={n}")),
            format!("--require efa={n}: {usable_efa} EFA device(s) usable from this container"),
            request_fix(true, Some(n)),
        ));
    }
    if let Some(n) = policy.require.rdma_count
        && (usable as u32) < n
    {
        problems.push(Problem::predicts(
            unmet(&format!("--require rdma={n}")),
            format!("--require rdma={n}: {usable} RDMA device(s) usable from this container"),
            request_fix(any_efa, Some(n)),
        ));
    } else if policy.require.rdma
        && usable == 0
        && scope.nodes_unknown.is_none()
        && scope.refused_nodes > 0
    {
        problems.push(Problem::predicts(
            unmet("--require rdma"),
            "no RDMA device can be opened from this container".to_string(),
            request_fix(any_efa, None),
        ));
    }
    problems
}

/// A verbs call that does not return is the NIC's driver or firmware, not the image.
const HUNG_FIX: &str = "A verbs call that does not return is the NIC's kernel driver or firmware on the node: \
check dmesg for the device, reset or reload its driver, or drain the node.";

/// What a verbs call that failed with `e` does to NCCL: one that did not return here does
/// not return in NCCL's IB init either (src/transport/net_ib.cc ncclIbInitDevices lists
/// and opens every device), so NCCL hangs there; any other failure is `otherwise`.
fn hang_or(e: &crate::facts::FactError, otherwise: Outcome) -> Outcome {
    if e.kind == Some(crate::facts::FailureKind::Timeout) {
        Outcome::hangs(format!(
            "NCCL's IB init, in {}, where this probe's call did not return",
            e.source
        ))
    } else {
        otherwise
    }
}

/// The trainer's libibverbs: present, and able to list and open the devices.
fn verbs_problems(facts: &Facts, scope: &Scope, required: bool) -> Vec<Problem> {
    // The devices this container can use, or, where that could not be told, the node's.
    let usable = match scope.usable.len() {
        0 => scope.devices.map_or(0, <[_]>::len),
        n => n,
    };
    // Without libibverbs (or its devices) NCCL's IB transport and aws-ofi-nccl have no
    // device: TCP (src/transport/net_ib.cc ncclIbInit: "Failed to open libibverbs").
    let status = scope.unusable_outcome(required, Scope::tcp_instead("RDMA"));
    match &facts.rdma.verbs.state {
        LibraryState::NotFound { message } => {
            let mut p = Problem::predicts(
                status,
                format!("{usable} RDMA device(s) but no libibverbs in this image: NCCL cannot use them"),
                "Install rdma-core's libibverbs1 and the providers (ibverbs-providers; on EFA the EFA installer) in the image.",
            )
            // The devices are there; the image lacks the library.
            .blamed(Owner::Image);
            p.evidence.push(message.clone());
            vec![p]
        }
        LibraryState::Failed(e) if e.kind == Some(crate::facts::FailureKind::Timeout) => {
            vec![Problem::predicts(hang_or(e, status), format!("libibverbs failed: {e}"), HUNG_FIX)
                .blamed(Owner::Driver)]
        }
        LibraryState::Failed(e) => vec![Problem::predicts(
            status,
            format!("libibverbs failed: {e}"),
            "Reinstall rdma-core in the image; its providers must match the library.",
        )],
        LibraryState::Loaded(v) => match &v.devices {
            Observed::Error(e) => vec![Problem::predicts(
                status,
                format!("libibverbs lists no device: {e}"),
                "The container needs the uverbs device nodes and sysfs entries; check the device plugin.",
            )],
            Observed::Value(list) => list
                .iter()
                .filter_map(|d| {
                    d.open.error().map(|e| {
                        let hung = e.kind == Some(crate::facts::FailureKind::Timeout);
                        Problem::predicts(
                            hang_or(e, status.clone()),
                            format!("{}: {e}", d.name),
                            if hung {
                                HUNG_FIX
                            } else {
                                "Check the device's permissions and the provider library for its driver (ibverbs-providers)."
                            },
                        )
                    })
                })
                .collect(),
        },
        LibraryState::Skipped { .. } => Vec::new(),
    }
}

pub fn judge(facts: &Facts, _prediction: &Prediction, policy: &Policy) -> Finding {
    let scope = Scope::of(facts);
    let required = policy.require.any_rdma();
    let expected_efa = crate::platform::of(facts).and_then(|p| p.efa_devices);
    if let Some(f) = unreadable_class(&scope, policy, expected_efa) {
        return f;
    }
    let devices = scope.devices.unwrap_or(&[]);
    let need = rdma_scope::nic_need(facts);
    if devices.is_empty() {
        return no_devices(&scope, policy, expected_efa, need.as_ref());
    }
    let efa: Vec<&RdmaDevice> = devices.iter().filter(|d| d.is_efa()).collect();
    let mut problems = Vec::new();
    let mut evidence = Vec::new();
    if let Some(n) = expected_efa
        && (efa.len() as u32) < n
    {
        // sysfs lists the node's devices whatever the pod asked for: fewer is the node's fault.
        problems.push(Problem::predicts(
            scope.missing_outcome(
                false,
                Outcome::degraded(
                    format!("{} of the instance type's {n} EFA devices", efa.len()),
                    "the lost devices' share of the node's network bandwidth",
                ),
            ),
            format!("{} EFA device(s) on a node that has {n}", efa.len()),
            "The node lost EFA devices: check the EFA driver (dmesg | grep efa, lsmod | grep efa) and the instance's network cards; drain it if they do not come back.",
        ));
    }
    if let Some(e) = scope.nodes_unknown {
        evidence.push(format!(
            "could not tell which devices this container can open: {e}"
        ));
    }
    let uverbs = facts.rdma.uverbs.value().map_or(&[][..], Vec::as_slice);
    for e in uverbs.iter().filter_map(|n| n.ibdev_error.as_ref()) {
        evidence.push(format!("unreadable: {e}"));
    }
    for d in devices {
        problems.extend(device_problems(facts, &scope, d, required, &mut evidence));
    }
    let judged: Vec<&RdmaDevice> = if scope.nodes_unknown.is_some() {
        devices.iter().collect()
    } else {
        scope.usable.clone()
    };
    problems.extend(link_problems(&judged, &scope, required));
    problems.extend(allocation_problem(
        &scope,
        policy,
        devices,
        !efa.is_empty(),
        need.as_ref(),
    ));
    problems.extend(requirement_problems(
        &scope,
        policy,
        !efa.is_empty(),
        need.as_ref(),
    ));
    problems.extend(unknown_usable(&scope, devices.len(), required));
    if scope.own_image {
        evidence.push(OWN_IMAGE_NOTE.to_string());
    } else if scope.in_use() {
        problems.extend(verbs_problems(facts, &scope, required));
    }
    super::combine(
        ID,
        summary(&scope, devices.len(), efa.len()),
        evidence,
        problems,
    )
}

/// "8 RDMA device(s) (8 EFA), 8 usable from this container, ports up"; how many are
/// usable is "unknown" where the device nodes could not be matched, never 0.
fn summary(scope: &Scope, devices: usize, efa: usize) -> String {
    let usable = match scope.nodes_unknown {
        Some(_) => "usable from this container unknown".to_string(),
        None => format!("{} usable from this container", scope.usable.len()),
    };
    format!(
        "{devices} RDMA device(s){}, {usable}{}",
        if efa == 0 {
            String::new()
        } else {
            format!(" ({efa} EFA)")
        },
        if scope.usable.is_empty() {
            ""
        } else {
            ", ports up"
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::Observed;
    use crate::facts::rdma::Openable;
    use crate::finding::Status;
    use crate::policy;
    use crate::test_facts::{healthy, rdma_device, with_rdma};

    /// The judge as the run calls it, with the prediction made from the same facts.
    fn judge(facts: &Facts, policy: &Policy) -> Finding {
        crate::test_facts::judged(super::judge, facts, policy)
    }

    fn efa_node(n: usize) -> Facts {
        let mut f = crate::test_facts::with_env(healthy(), &[("PET_NNODES", "4")]);
        f = with_rdma(
            f,
            (0..n)
                .map(|i| {
                    rdma_device(
                        &format!("rdmap{i}s27"),
                        "efa",
                        "0000:10:1b.0",
                        "/sys/devices/x",
                        "ACTIVE",
                        "Unspecified",
                    )
                })
                .collect(),
        );
        f.platform.product_name = Observed::Value(Some("p4d.24xlarge".into()));
        f
    }

    #[test]
    fn platform_count_ports_and_device_nodes() {
        assert_eq!(
            judge(&efa_node(4), &Policy::default()).status(),
            Status::Pass
        );
        // Issue 36: fewer NICs is a degraded run across nodes; the launcher does not say
        // how many nodes here, so what it costs is undetermined: a warning.
        let f = judge(&efa_node(3), &Policy::default());
        assert_eq!(f.status(), Status::Warn);
        assert!(
            f.summary.contains("3 EFA device(s) on a node that has 4"),
            "{}",
            f.summary
        );
        let mut down = efa_node(4);
        if let Observed::Value(d) = &mut down.rdma.devices {
            d[2].ports[0].state = Some("DOWN".into());
        }
        assert!(
            judge(&down, &Policy::default())
                .summary
                .contains("rdmap2s27: port 1 DOWN")
        );
        let mut locked = efa_node(4);
        if let Observed::Value(u) = &mut locked.rdma.uverbs {
            u[1].open = Some(Openable {
                refused: Some("Permission denied (os error 13)".into()),
            });
        }
        // The provider can drop every device over one it cannot open: TCP, degraded.
        let f = judge(&locked, &Policy::default());
        assert_eq!(f.status(), Status::Warn);
        assert!(f.summary.contains("cannot be opened"), "{}", f.summary);
        assert_eq!(f.blame(), Some(crate::finding::Blame::Job));
    }

    #[test]
    fn requirements_and_missing_library() {
        let none = healthy();
        assert_eq!(judge(&none, &Policy::default()).status(), Status::Skip);
        let need = policy::build(&[], &["rdma".into()], None, None).unwrap();
        assert_eq!(judge(&none, &need).status(), Status::Fail);
        let mut p4d = healthy();
        p4d.platform.product_name = Observed::Value(Some("p4d.24xlarge".into()));
        let f = judge(&p4d, &Policy::default());
        assert!(
            f.summary.contains("this instance type has 4 EFA devices"),
            "{}",
            f.summary
        );
        let mut nolib = efa_node(4);
        nolib.rdma.verbs.state = LibraryState::NotFound {
            message: "libibverbs.so.1: cannot open".into(),
        };
        assert!(
            judge(&nolib, &Policy::default())
                .summary
                .contains("no libibverbs")
        );
    }

    /// `n` EFA devices on the node (sysfs) of which the first `usable` have a device node here.
    fn p5(n: usize, usable: usize, nodes: &str) -> Facts {
        let mut f = efa_node(n);
        f.platform.product_name = Observed::Value(Some("p5.48xlarge".into()));
        f.nodes = nodes.parse().ok();
        if let Observed::Value(u) = &mut f.rdma.uverbs {
            u.truncate(usable);
        }
        f
    }

    #[test]
    fn regression_pod_without_the_rdma_resource_is_a_note_on_one_node_a_warning_across_nodes() {
        // A p5 pod that asked for no vpc.amazonaws.com/efa: sysfs shows all 32, no device node.
        // One node: NCCL needs no NIC, so nothing changes (issue 36); across nodes: TCP.
        let single = judge(&p5(32, 0, "1"), &Policy::default());
        assert_eq!(single.status(), Status::Pass, "{single:?}");
        assert!(
            single.summary.contains("can use none of the node's 32"),
            "{}",
            single.summary
        );
        let multi = judge(&p5(32, 0, "4"), &Policy::default());
        assert_eq!(multi.status(), Status::Warn);
        assert_eq!(multi.blame(), Some(crate::finding::Blame::Job));
        let fix = multi.remediation().unwrap();
        assert!(fix.starts_with("Request the EFA devices"), "{fix}");
        assert!(
            fix.contains("vpc.amazonaws.com/efa: 8"),
            "2 of 8 GPUs: 8 of 32 EFA\n{fix}"
        );
    }

    #[test]
    fn regression_partial_efa_allocation_is_named_with_the_count_to_request() {
        // 2 GPUs of a p5 need 8 of its 32 EFA devices; the pod got 2.
        let f = judge(&p5(32, 2, "16"), &Policy::default());
        assert_eq!(f.status(), Status::Warn, "{f:?}");
        assert!(
            matches!(f.outcome(), Some(crate::finding::Outcome::Degraded { cost, .. }) if cost.contains("25%")),
            "{f:?}"
        );
        assert!(
            f.summary.contains("2 of the 8 EFA devices"),
            "{}",
            f.summary
        );
        assert!(
            f.remediation()
                .unwrap()
                .contains("vpc.amazonaws.com/efa: 8")
        );
        assert_eq!(
            judge(&p5(32, 2, "1"), &Policy::default()).status(),
            Status::Pass
        );
        assert_eq!(
            judge(&p5(32, 8, "16"), &Policy::default()).status(),
            Status::Pass
        );
        // p4d: 4 EFA for 8 GPUs, so 1 for these 2 GPUs.
        let mut p4d = p5(4, 1, "2");
        p4d.platform.product_name = Observed::Value(Some("p4d.24xlarge".into()));
        assert_eq!(judge(&p4d, &Policy::default()).status(), Status::Pass);
    }

    #[test]
    fn require_efa_means_enough_for_these_gpus_and_efa_n_a_number() {
        let efa = policy::build(&[], &["efa".into()], None, None).unwrap();
        let f = judge(&p5(32, 2, "1"), &efa);
        assert_eq!(
            f.status(),
            Status::Fail,
            "one node, but --require efa asks for 8"
        );
        let four = policy::build(&[], &["efa=4".into()], None, None).unwrap();
        let f = judge(&p5(32, 2, "1"), &four);
        assert_eq!(f.status(), Status::Fail);
        assert!(f.summary.contains("efa=4"), "{}", f.summary);
        let two = policy::build(&[], &["efa=2".into()], None, None).unwrap();
        assert_eq!(judge(&p5(32, 2, "1"), &two).status(), Status::Pass);
    }

    /// An InfiniBand node off the instance table: GPU 0 and GPU 1 each share a PCIe switch
    /// with one HCA (mlx5_0, mlx5_1); mlx5_2 hangs off another root port.
    fn ib_switches(usable: usize) -> Facts {
        let mut f = healthy();
        let root = "/sys/devices/pci0000:00/0000:00:01.0";
        if let Observed::Value(g) = &mut f.gpus.pci_gpus {
            for (i, gpu) in g.iter_mut().enumerate() {
                gpu.sysfs_path = Some(format!(
                    "{root}/0000:0{i}:00.0/0000:1{i}:00.0/{}",
                    gpu.bus_id
                ));
            }
        }
        let nic = |i: usize, path: String| {
            rdma_device(
                &format!("mlx5_{i}"),
                "mlx5_core",
                "0000:99:00.0",
                &path,
                "ACTIVE",
                "InfiniBand",
            )
        };
        let mut f = with_rdma(
            f,
            vec![
                nic(0, format!("{root}/0000:00:00.0/0000:10:00.0/0000:20:00.0")),
                nic(1, format!("{root}/0000:01:00.0/0000:11:00.0/0000:21:00.0")),
                nic(
                    2,
                    "/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0".into(),
                ),
            ],
        );
        if let Observed::Value(u) = &mut f.rdma.uverbs {
            u.truncate(usable);
        }
        crate::test_facts::with_env(f, &[("PET_NNODES", "2")])
    }

    #[test]
    fn regression_one_of_the_hcas_near_the_pods_gpus() {
        let f = judge(&ib_switches(1), &Policy::default());
        assert_eq!(f.status(), Status::Warn, "{f:?}");
        assert!(f.summary.contains("1 of the 2 RDMA NICs"), "{}", f.summary);
        assert!(
            f.evidence.iter().any(|e| e.contains("mlx5_0, mlx5_1")),
            "{:?}",
            f.evidence
        );
        assert_eq!(
            judge(&ib_switches(2), &Policy::default()).status(),
            Status::Pass
        );
    }

    #[test]
    fn regression_unreadable_uverbs_class_is_not_a_pass() {
        let mut f = efa_node(4);
        if let Observed::Value(d) = &mut f.rdma.devices {
            d[1].ports[0].state = Some("DOWN".into());
        }
        f.rdma.uverbs = Observed::Error(crate::facts::FactError::new(
            "/sys/class/infiniband_verbs",
            "Permission denied (os error 13)",
        ));
        let finding = judge(&f, &Policy::default());
        assert_eq!(finding.status(), Status::Warn, "{finding:?}");
        assert!(finding.summary.contains("DOWN"), "{}", finding.summary);
        assert!(
            finding
                .evidence
                .iter()
                .any(|e| e.contains("could not tell which devices"))
        );
        // Issue 31 row 8: with every port up, the unknown count is "could not determine"
        // (a warning, issue 36), never "0 usable" and never a pass.
        if let Observed::Value(d) = &mut f.rdma.devices {
            d[1].ports[0].state = Some("ACTIVE".into());
        }
        let finding = judge(&f, &Policy::default());
        assert_eq!(finding.status(), Status::Warn, "{finding:?}");
        assert!(
            finding
                .summary
                .contains("could not determine which of the 4"),
            "{}",
            finding.summary
        );
    }

    #[test]
    fn regression_unreadable_ports_use_libibverbs_state() {
        let mut f = efa_node(4);
        if let Observed::Value(d) = &mut f.rdma.devices {
            d[0].ports.clear();
            d[0].unreadable.push(crate::facts::FactError::new(
                "/sys/class/infiniband/rdmap0s27/ports",
                "Permission denied (os error 13)",
            ));
        }
        if let LibraryState::Loaded(v) = &mut f.rdma.verbs.state
            && let Observed::Value(list) = &mut v.devices
        {
            list[0].ports[0].state = Some("DOWN".into());
        }
        let finding = judge(&f, &Policy::default());
        assert_eq!(finding.status(), Status::Warn, "{finding:?}");
        assert!(
            finding.summary.contains("port 1 DOWN (libibverbs)"),
            "{}",
            finding.summary
        );
        // Neither source: could not determine, not "ports up".
        if let LibraryState::Loaded(v) = &mut f.rdma.verbs.state
            && let Observed::Value(list) = &mut v.devices
        {
            list[0].ports.clear();
        }
        let finding = judge(&f, &Policy::default());
        assert_eq!(finding.status(), Status::Warn, "{finding:?}");
        assert!(
            finding
                .summary
                .contains("could not determine the port state")
        );
    }

    #[test]
    fn a_port_slower_than_its_peers_or_a_narrow_pcie_link_is_named() {
        let mut f = efa_node(4);
        if let Observed::Value(d) = &mut f.rdma.devices {
            d[2].ports[0].rate = Some("50 Gb/sec".into());
        }
        let finding = judge(&f, &Policy::default());
        assert_eq!(finding.status(), Status::Warn, "{finding:?}");
        assert!(
            finding
                .summary
                .contains("rdmap2s27 port 1 runs at 50 Gb/sec, its peers at 100"),
            "{}",
            finding.summary
        );
        let mut f = efa_node(4);
        if let Observed::Value(d) = &mut f.rdma.devices {
            d[1].pcie = Some(crate::facts::rdma::PcieLink {
                current_speed: Some("32.0 GT/s PCIe".into()),
                max_speed: Some("32.0 GT/s PCIe".into()),
                current_width: Some(8),
                max_width: Some(16),
            });
        }
        let finding = judge(&f, &Policy::default());
        assert!(
            finding.summary.contains("PCIe link trained at x8 of x16"),
            "{}",
            finding.summary
        );
        // One node: the NICs carry no NCCL traffic, so nothing changes: a note.
        f.launcher
            .insert("PET_NNODES".into(), crate::facts::EnvValue::text("1"));
        assert_eq!(judge(&f, &Policy::default()).status(), Status::Pass);
    }

    #[test]
    fn regression_own_image_does_not_judge_libibverbs() {
        let mut f = efa_node(4);
        f.image = crate::facts::ImageRole::Own;
        f.rdma.verbs.state = LibraryState::Skipped {
            reason: crate::facts::ImageRole::OWN_REASON.into(),
        };
        let finding = judge(&f, &Policy::default());
        assert_eq!(finding.status(), Status::Pass, "{finding:?}");
        assert!(
            finding
                .evidence
                .iter()
                .any(|e| e.contains("libibverbs not judged here"))
        );
        // The same pod with no libibverbs in the trainer's image: NCCL has no device, TCP.
        f.image = crate::facts::ImageRole::Trainer;
        f.rdma.verbs.state = LibraryState::NotFound {
            message: "libibverbs.so.1: cannot open shared object file".into(),
        };
        let finding = judge(&f, &Policy::default());
        assert_eq!(finding.status(), Status::Warn);
        assert_eq!(finding.blame(), Some(crate::finding::Blame::Job));
    }
}
