//! PCIe Access Control Services on the bridges above the GPUs: a switch port with
//! P2P Request or Completion Redirect on (lspci `ACSCtl: ReqRedir+ CmpltRedir+`)
//! sends peer traffic between the devices below it up to the root complex instead
//! of across the switch. NVML and CUDA still report P2P as supported, so NCCL uses
//! it, at a fraction of the bandwidth or with hangs (NVIDIA/nccl-tests#112,
//! NVIDIA/nccl#2079; NCCL user guide, Troubleshooting, "PCI Access Control
//! Services (ACS)"). Root ports are left out: traffic between root ports goes
//! through the root complex whatever ACS says.

use crate::facts::Facts;
use crate::facts::gpu::acs;

/// What the bridges above a set of GPUs say about ACS.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct AcsFindings {
    /// `0000:e0:00.0 above 0000:17:00.0: SrcValid+ ReqRedir+ CmpltRedir+`, one per
    /// switch port that redirects, in bus order.
    pub redirecting: Vec<String>,
    /// Switch ports whose ACS could not be read, with why (usually: not root).
    pub unreadable: Vec<String>,
    /// The switch ports that redirect, by bus id, for the fix.
    pub ports: Vec<String>,
}

/// ACS on the switch ports above the GPUs with these bus ids (sysfs form).
pub fn above(facts: &Facts, gpu_bus_ids: &[String]) -> AcsFindings {
    let mut out = AcsFindings::default();
    let Some(pci) = facts.gpus.pci_gpus.value() else {
        return out;
    };
    for gpu in pci.iter().filter(|g| gpu_bus_ids.contains(&g.bus_id)) {
        for bridge in gpu.upstream_acs.iter().filter(|b| !b.root_port) {
            match &bridge.control {
                crate::facts::Observed::Value(Some(c)) if acs::redirects(*c) => {
                    if !out.ports.contains(&bridge.bus_id) {
                        out.ports.push(bridge.bus_id.clone());
                        out.redirecting.push(format!(
                            "{} above {}: {}",
                            bridge.bus_id,
                            gpu.bus_id,
                            acs::names(*c)
                        ));
                    }
                }
                crate::facts::Observed::Value(_) => {}
                crate::facts::Observed::Error(e) => {
                    out.unreadable.push(format!("{}: {e}", bridge.bus_id));
                }
            }
        }
    }
    out.unreadable.sort();
    out.unreadable.dedup();
    out
}

/// The fix for redirecting ports, naming them.
pub fn fix(ports: &[String]) -> String {
    format!(
        "Disable ACS redirection on the PCIe switch ports between the GPUs and NICs: in the BIOS (PCIe ACS / \
\"ACS Control\" off), or after each boot as root on the node (NCCL user guide, Troubleshooting, \"PCI Access \
Control Services\"): {}. Keep ACS on where VMs or containers need the isolation (GPU passthrough): there P2P must \
go through the root complex, and NCCL_P2P_DISABLE=1 or NCCL_P2P_LEVEL=PHB is the honest setting.",
        ports
            .iter()
            .map(|p| format!("setpci -s {p} ECAP_ACS+0x6.w=0000"))
            .collect::<Vec<_>>()
            .join("; ")
    )
}
