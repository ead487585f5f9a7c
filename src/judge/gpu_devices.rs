//! `gpu-devices`: NVML and the CUDA driver load, initialise and see the GPUs
//! this pod should have. CUDA catches what NVML misses: cuInit returns
//! CUDA_ERROR_SYSTEM_NOT_READY (802) on an NVSwitch system whose fabric manager
//! is not running, though NVML lists every GPU.

use super::{Finding, Problem, undetermined, unmet};
use crate::facts::Facts;
use crate::facts::FailureKind;
use crate::facts::gpu::{FabricState, LibraryState, NvmlFacts};
use crate::finding::{Outcome, Owner};
use crate::policy::Policy;
use crate::predict::Prediction;
use crate::topology::visible;
use crate::units::format_bytes;

pub const ID: &str = "gpu-devices";

const REQUEST_GPUS: &str = "\
Request the GPUs in the pod spec and run it with the NVIDIA runtime:
  spec:
    runtimeClassName: nvidia        # where the GPU operator installs one
    containers:
      - resources:
          limits:
            nvidia.com/gpu: 8";

const FABRIC_MANAGER_FIX: &str = "Start the fabric manager on the node: systemctl enable --now nvidia-fabricmanager (GPU operator: check the driver pod's fabric manager), and match its version to the driver's.";

fn gpu_line(facts: &NvmlFacts, i: usize) -> String {
    let g = &facts.gpus[i];
    let v = |o: Option<&String>| o.cloned().unwrap_or_else(|| "?".to_string());
    format!(
        "GPU {} {} {} cc {} {} persistence {}",
        g.index,
        v(g.name.value()),
        v(g.pci_bus_id.value()),
        v(g.compute_capability.value()),
        g.memory_bytes
            .value()
            .map_or("?".to_string(), |b| format_bytes(*b)),
        match g.persistence_mode.value() {
            Some(true) => "on",
            Some(false) => "off",
            None => "?",
        }
    )
}

const UNREGISTERED_GPU_FIX: &str = "\
A GPU with no active NVLink on an NVSwitch system did not register with the fabric: read the fabric
manager's log (/var/log/fabricmanager.log) and nvidia-smi nvlink -s on the node, then drain it and reset
the GPU (or reboot); a link that stays down needs a repair.";

/// The fabric manager seen without CUDA on a pre-Hopper NVSwitch system (DGX/HGX A100,
/// p4d: NVSwitch gen 2), for `probe`, `serve` and `--cuda off`, which skip cuInit.
/// NVML has no fabric state there (nvmlDeviceGetGpuFabricInfo is Hopper and later), but
/// the fabric manager is what trains each GPU's NVLinks to the NVSwitches: until it has
/// initialised the system, CUDA init fails with cudaErrorSystemNotReady and the links
/// stay inactive (NVIDIA Fabric Manager user guide, "NVSwitch and NVLink Initialization";
/// `nvidia-smi nvlink -s` shows them `<inactive>`). So: NVSwitches on the PCI bus or
/// links that end at one, no GPU with a fabric state, and GPUs whose every NVLink is
/// down. Where cuInit ran it has the last word: 802 is reported on its own, and success
/// means the fabric manager is up (the `nvlink` check then reports the links).
fn dark_nvswitch_links(facts: &Facts, nvml: &NvmlFacts) -> Option<Problem> {
    if let LibraryState::Loaded(_) = facts.gpus.cuda.state {
        return None;
    }
    let fabric_state = nvml.gpus.iter().any(|g| {
        g.fabric_state
            .value()
            .is_some_and(|s| *s != FabricState::NotSupported)
    });
    let switches = facts.gpus.pci_nvswitches.value().map_or(0, Vec::len);
    let switch_links = nvml
        .gpus
        .iter()
        .flat_map(|g| &g.nvlinks)
        .any(|l| l.remote_type.value().is_some_and(|t| t == "switch"));
    if fabric_state || (switches == 0 && !switch_links) {
        return None;
    }
    let dark: Vec<u32> = nvml
        .gpus
        .iter()
        .filter(|g| {
            g.nvlinks_unread.is_none()
                && !g.nvlinks.is_empty()
                && g.nvlinks.iter().all(|l| !l.active)
        })
        .map(|g| g.index)
        .collect();
    let on = if switches > 0 {
        format!("{switches} NVSwitch(es) on the PCI bus")
    } else {
        "links that end at an NVSwitch".to_string()
    };
    if dark.is_empty() {
        None
    } else if dark.len() == nvml.gpus.len() {
        Some(Problem::predicts(
            Outcome::cannot_start(
                "cuInit fails with CUDA_ERROR_SYSTEM_NOT_READY (802) until the fabric manager initialises the fabric",
            ),
            format!(
                "every NVLink of the {} GPU(s) is down on an NVSwitch system ({on}): the fabric manager is not running or has not initialised the fabric, so NVLink peer traffic cannot run and cuInit fails with CUDA_ERROR_SYSTEM_NOT_READY (802)",
                dark.len()
            ),
            FABRIC_MANAGER_FIX,
        ))
    } else {
        Some(Problem::predicts(
            Outcome::degraded(
                format!(
                    "PCIe or host memory between GPU(s) {dark:?} and the others, instead of NVLink"
                ),
                "NVLink's bandwidth lost on every pair with those GPUs",
            ),
            format!(
                "GPU(s) {dark:?} have no active NVLink on an NVSwitch system ({on}) where the other GPUs do: not registered with the fabric, so they lose NVLink peer access"
            ),
            UNREGISTERED_GPU_FIX,
        ))
    }
}

const NARROW_PCIE_FIX: &str = "\
A GPU's PCIe link trained with fewer lanes than it has: host<->GPU copies, and GPUDirect RDMA to a NIC, run at
that fraction of the bus. Compare LnkSta with LnkCap in `lspci -vv -s <bus id>` on the node; reseat the GPU or
its riser/cable, check the slot's BIOS lane setting, and drain the node if it persists after a reboot.";

/// Bandwidth of one PCIe lane per direction in GB/s at a generation's rate (GT/s), as
/// PCI-SIG quotes it per generation: 2.5 GT/s 0.25, 5 GT/s 0.5 (8b/10b encoding), 8 GT/s
/// 1, 16 GT/s 2, 32 GT/s 4, 64 GT/s 8 (128b/130b and FLIT encoding, rounded), which
/// gives FACTS.md's x16 figures (section 6: Gen4 32 GB/s, Gen5 64 GB/s per direction).
/// With the generation number; `None` for a rate that is no PCIe generation.
fn pcie_lane(gts: f64) -> Option<(u32, f64)> {
    [
        (2.5, 1, 0.25),
        (5.0, 2, 0.5),
        (8.0, 3, 1.0),
        (16.0, 4, 2.0),
        (32.0, 5, 4.0),
        (64.0, 6, 8.0),
    ]
    .into_iter()
    .find(|(rate, _, _)| (gts - rate).abs() < 0.01)
    .map(|(_, generation, gbytes)| (generation, gbytes))
}

/// A GPU whose PCIe link trained with fewer lanes than it has.
struct NarrowLink {
    line: String,
    /// `x8 Gen5 = 32 GB/s`, and the GB/s, where the maximum speed is a known generation.
    bandwidth: Option<(String, f64)>,
}

/// The fastest ACTIVE port of the RDMA devices this container can use (the first such
/// device in sysfs order): the device's name and the port's rate in Gb/s.
fn fastest_nic(scope: &super::rdma_scope::Scope<'_>) -> Option<(String, f64)> {
    scope
        .usable
        .iter()
        .flat_map(|d| d.ports.iter().map(move |p| (d, p)))
        .filter(|(_, p)| p.state.as_deref() == Some("ACTIVE"))
        .filter_map(|(d, p)| {
            let gbps = crate::facts::rdma::rate_gbps(p.rate.as_deref()?)?;
            Some((d.name.clone(), gbps))
        })
        // The first of the fastest: min_by keeps the first of equals.
        .min_by(|a, b| b.1.total_cmp(&a.1))
}

/// The problem narrow links make. GPUDirect RDMA moves a multi-node job's traffic
/// between the NIC and GPU memory over the GPU's own PCIe link (NCCL's NET transport
/// with /GDRDMA), so a link whose lanes at full speed carry less than the fastest NIC
/// port caps that GPU's inter-node bandwidth: a failure where the launcher says the job
/// spans nodes and this container has an RDMA NIC. The link's speed is taken at its
/// maximum, which it trains up to under load. Elsewhere (one node, no NIC, a link still
/// faster than the NIC) a narrow link is a warning.
fn narrow_links_problem(facts: &Facts, narrow: Vec<NarrowLink>) -> Option<Problem> {
    if narrow.is_empty() {
        return None;
    }
    let scope = super::rdma_scope::Scope::of(facts);
    let multi = matches!(scope.span, crate::layout::Span::Multi(_));
    if let Some((nic, gbps)) = fastest_nic(&scope).filter(|_| multi) {
        let nic_gbytes = gbps / 8.0;
        let capped: Vec<String> = narrow
            .iter()
            .filter_map(|n| {
                let (text, gbytes) = n.bandwidth.as_ref()?;
                (*gbytes < nic_gbytes).then(|| {
                    format!(
                        "{}: {text} under {nic}'s {gbps:.0} Gb/s = {nic_gbytes:.0} GB/s",
                        n.line
                    )
                })
            })
            .collect();
        if !capped.is_empty() {
            return Some(Problem::predicts(
                Outcome::degraded(
                    "GPUDirect RDMA over a narrow PCIe link",
                    "the GPU's inter-node bandwidth capped below its NIC's",
                ),
                format!(
                    "PCIe link trained narrower than the GPU's caps its inter-node bandwidth: {} ({}, and GPUDirect RDMA moves that traffic over the GPU's link)",
                    capped.join(", "),
                    scope.span_words()
                ),
                NARROW_PCIE_FIX,
            ));
        }
    }
    Some(Problem::predicts(
        Outcome::degraded(
            "a PCIe link narrower than the GPU's",
            "host<->GPU copies and GPUDirect RDMA at that fraction of the bus",
        ),
        format!(
            "PCIe link narrower than the GPU's: {} (LnkSta below LnkCap)",
            narrow
                .iter()
                .map(|n| n.line.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        NARROW_PCIE_FIX,
    ))
}

/// This container's GPUs whose PCIe link runs narrower than its maximum (see
/// `narrow_links_problem`), those below their maximum speed (evidence only), and those
/// whose PCI attributes could not be read (evidence). The speed is not judged: NVIDIA GPUs
/// train their link down to 2.5 GT/s when idle to save power (`nvidia-smi
/// --help-query-gpu`, pcie.link.gen.current: "may be reduced when the GPU is not in
/// use"), and this check runs before the job loads them, so a low speed at idle is the
/// normal state. The width stays at its trained value at idle: fewer lanes is a fault.
fn pcie_links(facts: &Facts, nvml: &NvmlFacts) -> (Option<Problem>, Vec<String>) {
    let Some(pci) = facts.gpus.pci_gpus.value() else {
        return (None, Vec::new());
    };
    let mut narrow = Vec::new();
    let mut slow = Vec::new();
    let mut unreadable = Vec::new();
    for g in &nvml.gpus {
        let Some(bus) = g.pci_bus_id.value() else {
            continue;
        };
        let bus = crate::facts::gpu::normalize_bus_id(bus);
        let Some(p) = pci.iter().find(|p| p.bus_id == bus) else {
            continue;
        };
        if !p.unreadable.is_empty() {
            unreadable.push(pci_unreadable(g.index, p));
        }
        let max_gts = p
            .max_link_speed
            .as_deref()
            .and_then(crate::facts::rdma::PcieLink::gts);
        if let (Some(c), Some(m)) = (p.current_link_width, p.max_link_width)
            && c > 0
            && c < m
        {
            narrow.push(NarrowLink {
                line: format!("GPU {} ({bus}) x{c} of x{m}", g.index),
                bandwidth: max_gts.and_then(pcie_lane).map(|(generation, lane)| {
                    let gbytes = f64::from(c) * lane;
                    (format!("x{c} Gen{generation} = {gbytes:.0} GB/s"), gbytes)
                }),
            });
        }
        if let (Some(c), Some(m)) = (&p.current_link_speed, &p.max_link_speed)
            && let (Some(cg), Some(mg)) = (crate::facts::rdma::PcieLink::gts(c), max_gts)
            && cg < mg
        {
            slow.push(format!("GPU {} at {c} of {m}", g.index));
        }
    }
    let slow = (!slow.is_empty())
        .then(|| {
            format!(
                "PCIe link speed below its maximum now: {} (idle GPUs train down to save power; not judged)",
                slow.join(", ")
            )
        })
        .into_iter()
        .chain(unreadable)
        .collect();
    (narrow_links_problem(facts, narrow), slow)
}

/// Evidence line for a GPU whose PCI attributes (link width and speed, NUMA node) could
/// not all be read: what the link rules above could not see, and why.
fn pci_unreadable(index: u32, p: &crate::facts::gpu::PciGpu) -> String {
    format!(
        "GPU {index} ({}): PCI attributes not read: {}",
        p.bus_id,
        p.unreadable
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ")
    )
}

const OWN_RESOURCES_FIX: &str = "\
Run nccl-preflight with room to load the NVIDIA libraries and start its threads: a larger address-space
limit (ulimit -v; NVML and libcuda map hundreds of MiB) and thread limit (ulimit -u, the pod's pids limit).";

/// The fix for a vendor library (`library`) that failed, by what gather recorded the
/// failure as.
fn library_failure_fix(kind: Option<FailureKind>, library: &str) -> String {
    match kind {
        Some(FailureKind::Timeout) => "A GPU or the driver is hung: look for Xid errors (dmesg | grep -i xid) and drain the node; a reboot usually clears it.".into(),
        Some(FailureKind::DriverNotLoaded) => "The NVIDIA kernel module is not loaded on the node: check the GPU operator's driver pod (or `nvidia-smi` on the node).".into(),
        Some(FailureKind::Unloadable) => format!("{library} is present but cannot be loaded (see the message): the image's driver libraries do not match the node's driver, or one of their dependencies is missing."),
        Some(FailureKind::OwnResources) => OWN_RESOURCES_FIX.into(),
        Some(FailureKind::NotInLibrary) => not_in_library_fix(library),
        Some(FailureKind::GpuLost) => LOST_GPU_FIX.into(),
        Some(FailureKind::CallFailed) | None => "Run `nvidia-smi` in the container: NVML must initialise for NCCL to see the GPUs.".into(),
    }
}

const LOST_GPU_FIX: &str = "A GPU NVML cannot query is lost to the driver: drain the node and check `dmesg | grep -i xid`.";

fn not_in_library_fix(library: &str) -> String {
    format!(
        "The NVML this container loads ({library}) lacks functions the checks call: an image that ships its own \
libnvidia-ml (remove it: the NVIDIA container runtime mounts the driver's, with NVIDIA_DRIVER_CAPABILITIES \
including utility), or a driver older than these calls. `nvidia-smi` in the container names the driver."
    )
}

/// The NVML calls that could not be made or failed without an answer, as one problem
/// that names each function once (issue 39 row 2): "could not read: F is not in this
/// NVML (PATH)", with the library's driver version, and no claim about the links or GPUs
/// those calls would have read (the other checks leave them unjudged).
fn unread_calls(nvml: &NvmlFacts, library: &str) -> Option<Problem> {
    let unread = nvml.unread();
    unread.first()?;
    // One line per function: an absent one names itself ("F is not in this NVML (PATH)",
    // whichever call asked), a failed one by the call's function and its error.
    let what = |e: &crate::facts::FactError| match e.kind {
        Some(FailureKind::NotInLibrary) => e.message.clone(),
        _ => format!(
            "{}: {}",
            e.source.split('(').next().unwrap_or(&e.source),
            e.message
        ),
    };
    let mut by_function: Vec<(String, &crate::facts::FactError, usize)> = Vec::new();
    for e in &unread {
        let line = what(e);
        match by_function.iter_mut().find(|(l, _, _)| *l == line) {
            Some((_, _, n)) => *n += 1,
            None => by_function.push((line, e, 1)),
        }
    }
    let absent = unread
        .iter()
        .any(|e| e.kind == Some(FailureKind::NotInLibrary));
    let version = match nvml.driver_version.value() {
        Some(v) => format!("NVML of driver {v}"),
        None => "its driver version could not be read either".to_string(),
    };
    let more = match by_function.len() {
        1 => String::new(),
        n => format!(" (and {} more function(s), below)", n - 1),
    };
    let mut p = Problem::predicts(
        Outcome::undetermined(
            "what those NVML calls would have read (links, health, fabric state) and so what NCCL will find",
        ),
        format!("could not read: {}{more}; {version}", by_function[0].0),
        if absent {
            not_in_library_fix(library)
        } else {
            "Run `nvidia-smi -q` in the container and on the node: NVML refuses these calls; nothing is known of what they read.".to_string()
        },
    );
    p.evidence = by_function
        .iter()
        .map(|(line, e, n)| format!("could not read: {line} ({n} call(s), first: {})", e.source))
        .collect();
    // A function the container's NVML lacks is the image's library (or a mismatch with
    // the driver the NVIDIA runtime mounts); a refused call stays the check's default.
    Some(if absent { p.blamed(Owner::Image) } else { p })
}

/// NVML's facts, or the finding when NVML did not load: absent (no NVIDIA runtime, or not a
/// GPU node), not probed, failed for this process's own limits, or failed.
fn loaded_nvml<'a>(facts: &'a Facts, policy: &Policy) -> Result<&'a NvmlFacts, Finding> {
    let gpus = &facts.gpus;
    let node_gpus = gpus.pci_gpus.value().map(Vec::len);
    match &gpus.nvml.state {
        LibraryState::NotFound { message } => {
            let fail = policy.require.gpus.is_some() || node_gpus.unwrap_or(0) > 0;
            let summary = match node_gpus {
                Some(n) if n > 0 => format!(
                    "the node has {n} NVIDIA GPU(s) on its PCI bus, but this container has no NVML ({}): it was started without the NVIDIA runtime or requested no GPUs",
                    gpus.nvml.library
                ),
                _ => format!(
                    "no NVIDIA driver library ({}): not a GPU node, or no GPU was requested",
                    gpus.nvml.library
                ),
            };
            let f = if fail {
                // The node has GPUs; the pod did not get them: its spec's fault.
                Finding::predicts(
                    ID,
                    Outcome::cannot_start(
                        "this container has no GPU: nothing for CUDA or NCCL to run on",
                    ),
                    summary,
                    REQUEST_GPUS,
                )
                .blamed(Owner::PodSpec)
            } else {
                Finding::skip(ID, summary)
            };
            Err(f.evidence(message.clone()))
        }
        LibraryState::Skipped { reason } => {
            Err(Finding::skip(ID, format!("NVML not probed ({reason})")))
        }
        LibraryState::Failed(e) if e.is_own_resources() => {
            // Not the node's fault: never ask to drain it for this process's limits.
            Err(Finding::predicts(
                ID,
                undetermined(
                    policy.require.gpus.is_some(),
                    "the GPUs: this process's own limits stopped NVML",
                ),
                format!("could not determine the GPUs: {e}"),
                OWN_RESOURCES_FIX,
            )
            .blamed(Owner::PodSpec)
            .undetermined()
            .evidence(format!("library {}", gpus.nvml.library)))
        }
        // A function NVML cannot start without is not in it: the image's library, not a
        // driver fault; NCCL's topology detection, which reads NVML, fails too.
        LibraryState::Failed(e) if e.kind == Some(FailureKind::NotInLibrary) => Err(Finding::predicts(
            ID,
            Outcome::cannot_start(format!(
                "NVML cannot start without a function it lacks ({}), and NCCL's topology detection reads NVML",
                e.message
            )),
            format!("could not read: {}", e.message),
            library_failure_fix(e.kind, &gpus.nvml.library),
        )
        .blamed(Owner::Image)
        .undetermined()
        .evidence(format!("library {}", gpus.nvml.library))),
        LibraryState::Failed(e) => Err(Finding::predicts(
            ID,
            Outcome::cannot_start(
                "NVML fails, and so does NCCL's topology detection (ncclTopoGetSystem reads NVML)",
            ),
            format!("NVML failed: {e}"),
            library_failure_fix(e.kind, &gpus.nvml.library),
        )
        .evidence(format!("library {}", gpus.nvml.library))),
        LibraryState::Loaded(n) => Ok(n),
    }
}

/// GPUs missing: fewer than `--require gpus=N`, fewer on the PCI bus than the instance
/// type has, or one NVML cannot query.
fn missing_gpus(facts: &Facts, policy: &Policy, nvml: &NvmlFacts) -> Vec<Problem> {
    let mut problems = Vec::new();
    let count = nvml.gpus.len();
    if let Some(need) = policy.require.gpus
        && (count as u32) < need
    {
        problems.push(
            Problem::predicts(
                unmet(&format!("--require gpus={need}")),
                format!("{count} GPU(s) visible, {need} required"),
                REQUEST_GPUS,
            )
            .blamed(Owner::PodSpec),
        );
    }
    let product = facts
        .platform
        .product_name
        .value()
        .and_then(|p| p.as_deref());
    let platform = product.and_then(crate::platform::lookup);
    let node_gpus = facts.gpus.pci_gpus.value().map(Vec::len);
    if let (Some(p), Some(n)) = (platform, node_gpus)
        && (n as u32) < p.gpus
    {
        problems.push(Problem::predicts(
            Outcome::cannot_start("a GPU the node should have is gone (Xid 79): a pod asking for all of them gets fewer"),
            format!("{} has {} GPUs but the PCI bus lists {n}: a GPU has fallen off the bus", product.unwrap_or("?"), p.gpus),
            "Drain the node and check `dmesg | grep -i xid` (Xid 79: GPU fallen off the bus); it needs a reboot or repair.",
        ));
    }
    // Lost only where the driver says so (NVML_ERROR_GPU_IS_LOST): a query this NVML
    // cannot make, or one that failed otherwise, is no state of the GPU (`unread_calls`).
    for g in &nvml.gpus {
        if let Some(e) = g.pci_bus_id.error()
            && e.kind == Some(FailureKind::GpuLost)
        {
            problems.push(Problem::predicts(
                Outcome::cannot_start(format!(
                    "GPU {} is lost to the driver: CUDA work on it fails",
                    g.index
                )),
                format!("GPU {} cannot be read: {e}", g.index),
                LOST_GPU_FIX,
            ));
        }
    }
    problems
}

/// GPUs whose NVSwitch fabric registration has not finished or finished with an error.
fn unregistered_fabric(nvml: &NvmlFacts) -> Option<Problem> {
    let unregistered: Vec<String> = nvml
        .gpus
        .iter()
        .filter_map(|g| {
            let state = g.fabric_state.value()?;
            state
                .incomplete()
                .then(|| format!("GPU {} {state}", g.index))
        })
        .collect();
    (!unregistered.is_empty()).then(|| {
        Problem::predicts(
            Outcome::cannot_start(
                "cuInit returns CUDA_ERROR_SYSTEM_NOT_READY (802) on an NVSwitch system until the fabric manager has taken every GPU in",
            ),
            format!(
                "NVSwitch fabric registration incomplete ({}): the fabric manager has not taken these GPUs in, so NVLink peer traffic cannot run",
                unregistered.join(", ")
            ),
            FABRIC_MANAGER_FIX,
        )
    })
}

/// What the CUDA driver says: missing, not probed, failed, cuInit's error, or the devices
/// it sees against NVML's GPUs.
fn cuda_driver(
    facts: &Facts,
    policy: &Policy,
    nvml: &NvmlFacts,
    evidence: &mut Vec<String>,
    problems: &mut Vec<Problem>,
) {
    let gpus = &facts.gpus;
    match &gpus.cuda.state {
        LibraryState::NotFound { message } => {
            evidence.push(message.clone());
            problems.push(Problem::predicts(
                Outcome::cannot_start("no libcuda in the container: no CUDA context, so no NCCL"),
                format!("NVML works but the CUDA driver ({}) is missing: NCCL cannot run in this container", gpus.cuda.library),
                "Set NVIDIA_DRIVER_CAPABILITIES to include compute (e.g. compute,utility) so the runtime mounts libcuda.",
            ).blamed(Owner::Environment));
        }
        LibraryState::Skipped { reason } => evidence.push(format!("CUDA driver not probed ({reason})")),
        // This process's own limits (no thread for the CUDA probe, dlopen's ENOMEM) are not
        // the driver's fault: the same typed kind as NVML's decides, not the text.
        LibraryState::Failed(e) if e.is_own_resources() => problems.push(Problem::predicts(
            undetermined(policy.require.gpus.is_some(), "the CUDA driver: this process's own limits stopped the probe"),
            format!("could not probe the CUDA driver: {e}"),
            OWN_RESOURCES_FIX,
        )
        .blamed(Owner::PodSpec)),
        LibraryState::Failed(e) => problems.push(Problem::predicts(
            Outcome::cannot_start("the CUDA driver library does not load: no CUDA context"),
            format!("CUDA driver failed: {e}"),
            library_failure_fix(e.kind, &gpus.cuda.library),
        )),
        LibraryState::Loaded(c) if c.init_result == 802 => problems.push(Problem::predicts(
            Outcome::cannot_start("cuInit fails: CUDA_ERROR_SYSTEM_NOT_READY (802)"),
            "cuInit failed with CUDA_ERROR_SYSTEM_NOT_READY (802): the NVSwitch fabric manager is not running",
            FABRIC_MANAGER_FIX,
        ).blamed(Owner::FabricManager)),
        LibraryState::Loaded(c) if c.init_result != 0 => problems.push(Problem::predicts(
            Outcome::cannot_start(format!("cuInit fails: {} ({})", c.init_result_name, c.init_result)),
            format!("cuInit failed with {} ({})", c.init_result_name, c.init_result),
            if c.init_result == 100 {
                "CUDA sees no device: check CUDA_VISIBLE_DEVICES and NVIDIA_VISIBLE_DEVICES."
            } else {
                "Run a CUDA sample (deviceQuery) in the container; the driver and the image's CUDA must match."
            },
        )
        // CUDA_ERROR_NO_DEVICE with GPUs in NVML: the job's variables hide them.
        .blamed(if c.init_result == 100 { Owner::Environment } else { Owner::Driver })),
        LibraryState::Loaded(c) => cuda_devices(facts, nvml, c, evidence, problems),
    }
}

/// CUDA's devices against NVML's GPUs: a bus id NVML does not list, or another count
/// where no CUDA_VISIBLE_DEVICES explains it.
fn cuda_devices(
    facts: &Facts,
    nvml: &NvmlFacts,
    c: &crate::facts::gpu::CudaFacts,
    evidence: &mut Vec<String>,
    problems: &mut Vec<Problem>,
) {
    evidence.push(format!(
        "CUDA driver {}: {} device(s)",
        c.driver_version
            .value()
            .map_or("?".to_string(), |v| format!(
                "{}.{}",
                v / 1000,
                (v % 1000) / 10
            )),
        c.devices.len()
    ));
    let nvml_buses: Vec<&String> = nvml
        .gpus
        .iter()
        .filter_map(|g| g.pci_bus_id.value())
        .collect();
    for d in &c.devices {
        if let Some(bus) = d.pci_bus_id.value()
            && !nvml_buses.contains(&bus)
        {
            problems.push(Problem::predicts(
                Outcome::undetermined("which GPU NCCL's topology (read from NVML) takes CUDA's device to be"),
                format!("CUDA device {} ({bus}) is not among NVML's GPUs", d.ordinal),
                "NVML and CUDA disagree: check that the image's libnvidia-ml and libcuda come from the node's driver.",
            ).blamed(Owner::Image));
        }
    }
    let visible_var = facts.launcher.get("CUDA_VISIBLE_DEVICES");
    let count = nvml.gpus.len();
    if visible_var.is_none() && c.devices.len() != count {
        problems.push(Problem::predicts(
            Outcome::undetermined(
                "which GPUs the job's ranks get: CUDA and NVML list different ones",
            ),
            format!("CUDA sees {} device(s), NVML {count}", c.devices.len()),
            "Check NVIDIA_VISIBLE_DEVICES and the device nodes mounted into the container.",
        ));
    }
}

/// The GPUs CUDA_VISIBLE_DEVICES selects, and an entry CUDA would stop at.
fn visible_devices(
    facts: &Facts,
    nvml: &NvmlFacts,
    evidence: &mut Vec<String>,
    problems: &mut Vec<Problem>,
) {
    let Some(v) = facts.launcher.get("CUDA_VISIBLE_DEVICES") else {
        return;
    };
    let uuids: Vec<(u32, String)> = nvml
        .gpus
        .iter()
        .map(|g| (g.index, g.uuid.value().cloned().unwrap_or_default()))
        .collect();
    let sel = visible::select(&v.value, &uuids);
    evidence.push(format!(
        "CUDA_VISIBLE_DEVICES={:?} selects NVML GPU(s) {:?}",
        v.value, sel.gpus
    ));
    if let Some((entry, why)) = sel.stopped_at
        && !sel.mig
    {
        problems.push(Problem::predicts(
            Outcome::degraded(
                format!("the GPUs before CUDA_VISIBLE_DEVICES entry {entry:?} only"),
                "fewer GPUs than the variable names",
            ),
            format!("CUDA_VISIBLE_DEVICES entry {entry:?}: {why}; CUDA ignores it and every entry after it"),
            "Fix CUDA_VISIBLE_DEVICES, or unset it and let the device plugin choose.",
        ).blamed(Owner::Environment));
    }
}

pub fn judge(facts: &Facts, _prediction: &Prediction, policy: &Policy) -> Finding {
    let nvml = match loaded_nvml(facts, policy) {
        Ok(n) => n,
        Err(finding) => return finding,
    };
    let count = nvml.gpus.len();
    let mut evidence: Vec<String> = (0..count).map(|i| gpu_line(nvml, i)).collect();
    let mut problems = missing_gpus(facts, policy, nvml);
    problems.extend(unregistered_fabric(nvml));
    problems.extend(dark_nvswitch_links(facts, nvml));
    let (narrow, slow) = pcie_links(facts, nvml);
    evidence.extend(slow);
    problems.extend(narrow);
    cuda_driver(facts, policy, nvml, &mut evidence, &mut problems);
    visible_devices(facts, nvml, &mut evidence, &mut problems);
    problems.extend(unread_calls(nvml, &facts.gpus.nvml.library));
    let names: std::collections::BTreeSet<&str> = nvml
        .gpus
        .iter()
        .filter_map(|g| g.name.value().map(String::as_str))
        .collect();
    let summary = format!(
        "{count} GPU(s) ({}), driver {}",
        names.into_iter().collect::<Vec<_>>().join(", "),
        nvml.driver_version.value().map_or("?", String::as_str)
    );
    if count == 0 && problems.is_empty() {
        return if policy.require.gpus.is_some() {
            Finding::predicts(
                ID,
                unmet("--require gpus"),
                "NVML loaded but lists no GPU",
                REQUEST_GPUS,
            )
            .blamed(Owner::PodSpec)
        } else {
            Finding::skip(ID, "NVML loaded but lists no GPU")
        };
    }
    super::combine(ID, summary, evidence, problems)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::Observed;
    use crate::facts::gpu::{CudaFacts, LibraryState};
    use crate::finding::Status;
    use crate::policy;
    use crate::test_facts::{healthy, no_gpus, with_env};

    /// The judge as the run calls it, with the prediction made from the same facts.
    fn judge(facts: &Facts, policy: &Policy) -> Finding {
        crate::test_facts::judged(super::judge, facts, policy)
    }

    fn cuda(f: &mut Facts) -> &mut CudaFacts {
        match &mut f.gpus.cuda.state {
            LibraryState::Loaded(c) => c,
            _ => unreachable!("healthy() loads CUDA"),
        }
    }

    #[test]
    fn passes_on_a_healthy_node_and_skips_without_gpus() {
        let f = judge(&healthy(), &Policy::default());
        assert_eq!(f.status(), Status::Pass, "{f:?}");
        assert_eq!(f.summary, "2 GPU(s) (NVIDIA H200), driver 580.159.04");
        let mut cpu = healthy();
        cpu.gpus = no_gpus();
        assert_eq!(judge(&cpu, &Policy::default()).status(), Status::Skip);
        let need = policy::build(&[], &["gpus=1".into()], None, None).unwrap();
        assert_eq!(judge(&cpu, &need).status(), Status::Fail);
    }

    fn set_link(f: &mut Facts, gpu: usize, speed: &str, width: u32) {
        if let Observed::Value(pci) = &mut f.gpus.pci_gpus {
            pci[gpu].current_link_speed = Some(speed.into());
            pci[gpu].current_link_width = Some(width);
        }
    }

    #[test]
    fn a_narrow_pcie_link_warns_and_an_idle_downtrained_speed_does_not() {
        // Idle: 2.5 of 32 GT/s at full width is power saving, said in the evidence only.
        let mut f = healthy();
        set_link(&mut f, 0, "2.5 GT/s PCIe", 16);
        let j = judge(&f, &Policy::default());
        assert_eq!(j.status(), Status::Pass, "{j:?}");
        assert!(
            j.evidence
                .iter()
                .any(|e| e.contains("2.5 GT/s PCIe of 32.0 GT/s PCIe")),
            "{j:?}"
        );
        // Eight lanes of sixteen: a warning naming the GPU.
        set_link(&mut f, 1, "32.0 GT/s PCIe", 8);
        let j = judge(&f, &Policy::default());
        assert_eq!(j.status(), Status::Warn, "{j:?}");
        assert!(j.summary.contains("x8 of x16"), "{}", j.summary);
        assert!(j.remediation().unwrap().contains("LnkSta"));
        // Attributes that could not be read are said, with their path.
        let mut f = healthy();
        if let Observed::Value(pci) = &mut f.gpus.pci_gpus {
            pci[1].max_link_width = None;
            pci[1].unreadable.push(crate::facts::FactError::new(
                "/sys/bus/pci/devices/0000:00:07.0/max_link_width",
                "\"sixteen\" is not a number",
            ));
        }
        let j = judge(&f, &Policy::default());
        assert_eq!(j.status(), Status::Pass, "{j:?}");
        assert!(
            j.evidence.iter().any(|e| e.starts_with("GPU 1 (")
                && e.contains("PCI attributes not read: /sys/bus/pci/devices/0000:00:07.0/max_link_width: \"sixteen\" is not a number")),
            "{j:?}"
        );
        // A width of 0 (link down or unknown) is not a narrow link.
        let mut f = healthy();
        set_link(&mut f, 1, "Unknown", 0);
        assert_eq!(judge(&f, &Policy::default()).status(), Status::Pass);
    }

    /// The healthy pair with an NDR HCA (400 Gb/s) this container can open, on a job of
    /// `nodes` nodes, GPU 1's link trained at `width` of its x16 Gen5 lanes.
    fn narrow_with_ndr(nodes: &str, width: u32) -> Facts {
        let mut f = crate::test_facts::with_ib(healthy());
        if let Observed::Value(d) = &mut f.rdma.devices {
            d[0].ports[0].rate = Some("400 Gb/sec (4X NDR)".into());
        }
        set_link(&mut f, 1, "2.5 GT/s PCIe", width);
        with_env(f, &[("PET_NNODES", nodes)])
    }

    /// Issue 36: a narrow link caps the GPU's bandwidth, NCCL runs: degraded, a
    /// warning, named by what it caps.
    #[test]
    fn a_narrow_link_under_the_nics_rate_names_the_cap_of_a_multi_node_job() {
        // x8 Gen5 = 32 GB/s under the HCA's 400 Gb/s = 50 GB/s, across nodes: capped.
        let j = judge(&narrow_with_ndr("2", 8), &Policy::default());
        assert_eq!(j.status(), Status::Warn, "{j:?}");
        assert!(
            j.summary.contains(
                "GPU 1 (0000:00:07.0) x8 of x16: x8 Gen5 = 32 GB/s under mlx5_0's 400 Gb/s = 50 GB/s"
            ) && j.summary.contains("the job spans 2 nodes"),
            "{}",
            j.summary
        );
        assert!(j.remediation().unwrap().contains("LnkSta"));
        // One node: NCCL sends nothing over the NIC, the narrow link only warns.
        let j = judge(&narrow_with_ndr("1", 8), &Policy::default());
        assert_eq!(j.status(), Status::Warn, "{j:?}");
        assert!(
            j.summary.contains("x8 of x16 (LnkSta below LnkCap)"),
            "{}",
            j.summary
        );
        // A link still faster than the NIC: x16 would be, and so is x8 Gen5 against 100 Gb/s.
        let mut f = narrow_with_ndr("2", 8);
        if let Observed::Value(d) = &mut f.rdma.devices {
            d[0].ports[0].rate = Some("100 Gb/sec (4X EDR)".into());
        }
        assert_eq!(judge(&f, &Policy::default()).status(), Status::Warn);
        // A NIC whose port is down carries nothing.
        let mut f = narrow_with_ndr("2", 8);
        if let Observed::Value(d) = &mut f.rdma.devices {
            d[0].ports[0].state = Some("DOWN".into());
        }
        assert_eq!(judge(&f, &Policy::default()).status(), Status::Warn);
        // No NIC in the container: the traffic goes over sockets, not this link.
        let mut f = with_env(healthy(), &[("PET_NNODES", "2")]);
        set_link(&mut f, 1, "2.5 GT/s PCIe", 8);
        assert_eq!(judge(&f, &Policy::default()).status(), Status::Warn);
        // A maximum speed that is no PCIe generation: the bandwidth is unknown, so it warns.
        let mut f = narrow_with_ndr("2", 8);
        if let Observed::Value(pci) = &mut f.gpus.pci_gpus {
            pci[1].max_link_speed = Some("Unknown".into());
        }
        assert_eq!(judge(&f, &Policy::default()).status(), Status::Warn);
    }

    #[test]
    fn pcie_lane_figures_per_generation() {
        assert_eq!(pcie_lane(2.5), Some((1, 0.25)));
        assert_eq!(pcie_lane(8.0), Some((3, 1.0)));
        assert_eq!(pcie_lane(16.0), Some((4, 2.0)));
        assert_eq!(pcie_lane(32.0), Some((5, 4.0)));
        assert_eq!(pcie_lane(64.0), Some((6, 8.0)));
        assert_eq!(pcie_lane(20.0), None);
    }

    #[test]
    fn node_gpus_without_nvml_means_no_nvidia_runtime() {
        let mut f = healthy();
        let pci = f.gpus.pci_gpus.clone();
        f.gpus = no_gpus();
        f.gpus.pci_gpus = pci;
        let finding = judge(&f, &Policy::default());
        assert_eq!(finding.status(), Status::Fail);
        assert!(
            finding.summary.contains("without the NVIDIA runtime"),
            "{}",
            finding.summary
        );
    }

    #[test]
    fn fabric_manager_missing_count_and_lost_gpus() {
        let mut f = healthy();
        cuda(&mut f).init_result = 802;
        let finding = judge(&f, &Policy::default());
        assert_eq!(finding.status(), Status::Fail);
        assert!(
            finding
                .remediation()
                .unwrap()
                .contains("nvidia-fabricmanager")
        );
        let need = policy::build(&[], &["gpus=8".into()], None, None).unwrap();
        assert!(
            judge(&healthy(), &need)
                .summary
                .contains("2 GPU(s) visible, 8 required")
        );
        let mut f = healthy();
        f.platform.product_name = Observed::Value(Some("p5.48xlarge".into()));
        let finding = judge(&f, &Policy::default());
        assert!(
            finding.summary.contains("fallen off the bus"),
            "{}",
            finding.summary
        );
    }

    /// The healthy H200 pair as an A100 NVSwitch node seen without CUDA: no NVML fabric
    /// state, NVSwitches on the PCI bus.
    fn a100_without_cuda() -> Facts {
        let mut f = healthy();
        f.gpus.cuda.state = LibraryState::Skipped {
            reason: "--cuda off".into(),
        };
        f.gpus.pci_nvswitches = Observed::Value(vec!["0000:00:1f.0".into()]);
        if let LibraryState::Loaded(n) = &mut f.gpus.nvml.state {
            for g in &mut n.gpus {
                g.fabric_state = Observed::Error(crate::facts::FactError::new(
                    "nvmlDeviceGetGpuFabricInfo",
                    "NotSupported",
                ));
            }
        }
        f
    }

    fn darken(f: &mut Facts, gpus: &[usize]) {
        if let LibraryState::Loaded(n) = &mut f.gpus.nvml.state {
            for &g in gpus {
                n.gpus[g].nvlinks.iter_mut().for_each(|l| l.active = false);
            }
        }
    }

    #[test]
    fn a_stopped_fabric_manager_on_a100_nvswitch_fails_without_cuda() {
        assert_eq!(
            judge(&a100_without_cuda(), &Policy::default()).status(),
            Status::Pass
        );
        let mut f = a100_without_cuda();
        darken(&mut f, &[0, 1]);
        let finding = judge(&f, &Policy::default());
        assert_eq!(finding.status(), Status::Fail);
        assert!(
            finding
                .summary
                .contains("every NVLink of the 2 GPU(s) is down")
                && finding.summary.contains("1 NVSwitch(es) on the PCI bus"),
            "{}",
            finding.summary
        );
        assert!(
            finding
                .remediation()
                .unwrap()
                .contains("nvidia-fabricmanager")
        );
        // One GPU dark while the other is up: that GPU did not register.
        let mut f = a100_without_cuda();
        darken(&mut f, &[1]);
        // Its pairs go over PCIe or host memory: degraded, a warning.
        let finding = judge(&f, &Policy::default());
        assert_eq!(finding.status(), Status::Warn);
        assert!(finding.summary.contains("GPU(s) [1] have no active NVLink"));
        // Links that end at a switch are evidence enough where the VM hides the NVSwitches.
        let mut f = a100_without_cuda();
        f.gpus.pci_nvswitches = Observed::Value(vec![]);
        darken(&mut f, &[0, 1]);
        assert_eq!(judge(&f, &Policy::default()).status(), Status::Fail);
    }

    #[test]
    fn dark_links_are_not_blamed_on_the_fabric_manager_where_it_cannot_be() {
        // Direct GPU-to-GPU links (no NVSwitch): the nvlink check's business.
        let mut f = a100_without_cuda();
        f.gpus.pci_nvswitches = Observed::Value(vec![]);
        if let LibraryState::Loaded(n) = &mut f.gpus.nvml.state {
            for g in &mut n.gpus {
                g.nvlinks
                    .iter_mut()
                    .for_each(|l| l.remote_type = Observed::Value("gpu".into()));
            }
        }
        darken(&mut f, &[0, 1]);
        assert_eq!(judge(&f, &Policy::default()).status(), Status::Pass);
        // Hopper: NVML's fabric state speaks for the fabric manager.
        let mut f = a100_without_cuda();
        if let LibraryState::Loaded(n) = &mut f.gpus.nvml.state {
            n.gpus
                .iter_mut()
                .for_each(|g| g.fabric_state = Observed::Value(FabricState::Completed));
        }
        darken(&mut f, &[0, 1]);
        assert_eq!(judge(&f, &Policy::default()).status(), Status::Pass);
        // cuInit succeeded: the fabric manager is up.
        let mut f = healthy();
        f.gpus.pci_nvswitches = Observed::Value(vec!["0000:00:1f.0".into()]);
        darken(&mut f, &[0, 1]);
        assert_eq!(judge(&f, &Policy::default()).status(), Status::Pass);
    }

    #[test]
    fn cuda_visible_devices_mistakes_warn() {
        let f = with_env(healthy(), &[("CUDA_VISIBLE_DEVICES", "0,5")]);
        let finding = judge(&f, &Policy::default());
        assert_eq!(finding.status(), Status::Warn);
        assert!(finding.summary.contains("\"5\""), "{}", finding.summary);
        assert_eq!(
            judge(
                &with_env(healthy(), &[("CUDA_VISIBLE_DEVICES", "1,0")]),
                &Policy::default()
            )
            .status(),
            Status::Pass
        );
    }

    #[test]
    fn regression_own_resource_exhaustion_is_not_blamed_on_the_node() {
        // prlimit --as=8M: no thread could start; --as=128M: dlopen ENOMEM.
        for e in [
            crate::facts::FactError::new(
                "starting the nvml thread (Resource temporarily unavailable (os error 11))",
                "this process ran out of its own resources",
            )
            .with_kind(crate::facts::FailureKind::OwnResources),
            crate::facts::FactError::new(
                "dlopen(libnvidia-ml.so.1)",
                "libnvidia-ml.so.1: cannot open shared object file: Cannot allocate memory",
            )
            .with_kind(crate::facts::FailureKind::OwnResources),
        ] {
            let mut f = healthy();
            f.gpus.nvml.state = LibraryState::Failed(e);
            let finding = judge(&f, &Policy::default());
            assert_eq!(finding.status(), Status::Warn, "{finding:?}");
            let fix = finding.remediation().unwrap();
            assert!(
                !fix.contains("drain") && !fix.contains("do not match"),
                "{fix}"
            );
            assert!(fix.contains("ulimit -v"), "{fix}");
        }
    }

    #[test]
    fn regression_a_cuda_probe_without_a_thread_is_not_a_driver_failure() {
        let mut f = healthy();
        f.gpus.cuda.state = LibraryState::Failed(
            crate::facts::FactError::new(
                "starting the CUDA thread (Resource temporarily unavailable (os error 11))",
                "this process ran out of its own resources",
            )
            .with_kind(crate::facts::FailureKind::OwnResources),
        );
        let finding = judge(&f, &Policy::default());
        assert_eq!(finding.status(), Status::Warn, "{finding:?}");
        assert!(finding.remediation().unwrap().contains("ulimit -v"));
    }

    #[test]
    fn hung_or_failed_libraries_fail_with_the_call() {
        let mut f = healthy();
        f.gpus.nvml.state = LibraryState::Failed(
            crate::facts::FactError::new(
                "nvmlDeviceGetP2PStatus(GPU 0, GPU 1, read)",
                "did not return within 10.0 s: the driver or a GPU is hung",
            )
            .with_kind(FailureKind::Timeout),
        );
        let finding = judge(&f, &Policy::default());
        assert_eq!(finding.status(), Status::Fail);
        assert!(finding.summary.contains("nvmlDeviceGetP2PStatus"));
        assert!(finding.remediation().unwrap().contains("Xid"));
        let mut f = healthy();
        f.gpus.cuda.state = LibraryState::NotFound {
            message: "libcuda.so.1: cannot open".into(),
        };
        // Issue 36: no libcuda, no CUDA context, no NCCL: a job that cannot start, the
        // pod's variables' (NVIDIA_DRIVER_CAPABILITIES) to fix.
        let j = judge(&f, &Policy::default());
        assert_eq!(j.status(), Status::Fail);
        assert_eq!(j.blame(), Some(crate::finding::Blame::Job));
    }

    #[test]
    fn the_fix_follows_the_recorded_failure_kind_not_its_text() {
        let failed = |kind: Option<FailureKind>, message: &str| {
            let mut e = crate::facts::FactError::new("nvmlInit_v2", message);
            e.kind = kind;
            let mut f = healthy();
            f.gpus.nvml.state = LibraryState::Failed(e);
            let j = judge(&f, &Policy::default());
            assert_eq!(j.status(), Status::Fail, "{j:?}");
            j.remediation().unwrap_or_default().to_string()
        };
        assert!(failed(Some(FailureKind::Timeout), "x").contains("Xid"));
        assert!(failed(Some(FailureKind::DriverNotLoaded), "x").contains("kernel module"));
        assert!(
            failed(Some(FailureKind::Unloadable), "x").contains("libnvidia-ml.so.1 is present")
        );
        // Text that once picked a fix no longer does: a plain NVML error gets the generic one.
        let plain = failed(None, "did not return; DriverNotLoaded; dlopen");
        assert!(plain.contains("Run `nvidia-smi`"), "{plain}");
        // The CUDA driver's unloadable library is named as itself, not as NVML.
        let mut f = healthy();
        f.gpus.cuda.state = LibraryState::Failed(
            crate::facts::FactError::new("dlopen(libcuda.so.1)", "undefined symbol")
                .with_kind(FailureKind::Unloadable),
        );
        let j = judge(&f, &Policy::default());
        assert!(
            j.remediation().unwrap().contains("libcuda.so.1 is present"),
            "{j:?}"
        );
    }
}
