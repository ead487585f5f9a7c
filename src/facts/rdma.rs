//! RDMA facts: devices and ports from sysfs, the uverbs device nodes, what
//! libibverbs can open and register, libfabric's providers, NCCL and its net
//! plugin, and what GPUDirect RDMA needs from the kernel.

use super::gpu::Library;
use super::{FactError, Observed};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RdmaFacts {
    /// Devices under /sys/class/infiniband, sorted by name; empty when there are none.
    pub devices: Observed<Vec<RdmaDevice>>,
    /// /dev/infiniband/uverbs* with the device each serves and whether this process can open it.
    pub uverbs: Observed<Vec<UverbsNode>>,
    /// /dev/infiniband/rdma_cm: `None` when absent.
    pub rdma_cm: Observed<Option<Openable>>,
    pub verbs: Library<VerbsFacts>,
    pub libfabric: Library<FabricFacts>,
    /// Every libfabric location tried, in order, with dlopen's answer for those that failed.
    pub libfabric_attempts: Vec<LoadAttempt>,
    pub nccl: NcclFacts,
    pub gdr: GdrFacts,
    /// Topology files aws-ofi-nccl ships (/opt/amazon/ofi-nccl/share/aws-ofi-nccl/xml), sorted.
    #[serde(default = "no_files")]
    pub ofi_nccl_xml: Observed<Vec<String>>,
}

fn no_files() -> Observed<Vec<String>> {
    Observed::Value(Vec::new())
}

/// One RDMA device (an HCA, an EFA device, a RoCE NIC).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RdmaDevice {
    pub name: String,
    /// Kernel driver (`efa`, `mlx5_core`, `irdma`, ...).
    pub driver: Option<String>,
    /// PCI bus id (`0000:10:1b.0`).
    pub pci_bus_id: Option<String>,
    /// Place in the PCI tree (`/sys/devices/pci0000:00/.../0000:10:1b.0`).
    pub sysfs_path: Option<String>,
    pub numa_node: Option<u32>,
    pub fw_ver: Option<String>,
    pub node_guid: Option<String>,
    /// Network interfaces on the same PCI function (`eth1`, `net1`, `ib0`).
    pub netdevs: Vec<String>,
    pub ports: Vec<RdmaPort>,
    /// The PCIe link of the device's PCI function, when sysfs has it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie: Option<PcieLink>,
    /// EFA only: the GPU peer-memory provider EFA's own driver reports (sysfs `device/p2p`,
    /// e.g. `NVIDIA`; `gdr 1` from the older `device/gdr`); `None` when the driver has neither.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub efa_p2p: Option<String>,
    /// Attributes that exist but could not be read or parsed.
    pub unreadable: Vec<FactError>,
}

impl RdmaDevice {
    /// EFA devices: the efa driver, or the rdmap* names EFA devices get.
    pub fn is_efa(&self) -> bool {
        self.driver.as_deref() == Some("efa")
            || self.name.starts_with("rdmap")
            || self.name.starts_with("efa")
    }
}

/// A PCIe link as sysfs shows it: what it trained at and what it can do. Speeds as sysfs
/// prints them (`32.0 GT/s PCIe`); widths in lanes. A link that trained below its width or
/// speed (a bad riser, slot or cable) carries proportionally less.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PcieLink {
    pub current_speed: Option<String>,
    pub max_speed: Option<String>,
    pub current_width: Option<u32>,
    pub max_width: Option<u32>,
}

impl PcieLink {
    /// GT/s from `32.0 GT/s PCIe`; `None` for `Unknown` or anything else.
    pub fn gts(speed: &str) -> Option<f64> {
        speed.split_whitespace().next()?.parse().ok()
    }

    /// What is below the link's capability, as text (`x8 of x16`, `16.0 of 32.0 GT/s`).
    pub fn degraded(&self) -> Option<String> {
        let mut out = Vec::new();
        if let (Some(c), Some(m)) = (self.current_width, self.max_width)
            && c < m
            && c > 0
        {
            out.push(format!("x{c} of x{m}"));
        }
        if let (Some(c), Some(m)) = (
            self.current_speed.as_deref().and_then(Self::gts),
            self.max_speed.as_deref().and_then(Self::gts),
        ) && c < m
            && c > 0.0
        {
            out.push(format!("{c:.1} of {m:.1} GT/s"));
        }
        (!out.is_empty()).then(|| out.join(", "))
    }
}

/// Parses a kernel release (`5.15.0-1051-aws`) into (major, minor): (5, 15).
pub fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(['.', '-']);
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// Gb/s from a port's sysfs rate (`400 Gb/sec (4X NDR)`, `100 Gb/sec`).
pub fn rate_gbps(rate: &str) -> Option<f64> {
    let (number, rest) = rate.trim().split_once(' ')?;
    rest.starts_with("Gb/sec").then_some(())?;
    number.parse().ok()
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RdmaPort {
    pub port: u32,
    /// `ACTIVE`, `DOWN`, `INIT`, `ARMED` (sysfs `state`, number dropped).
    pub state: Option<String>,
    /// `LinkUp`, `Disabled`, `Polling` (sysfs `phys_state`).
    pub phys_state: Option<String>,
    /// `InfiniBand`, or `Ethernet` for RoCE (and EFA's `Unspecified`).
    pub link_layer: Option<String>,
    /// As sysfs prints it (`400 Gb/sec (4X NDR)`).
    pub rate: Option<String>,
    /// Non-zero GIDs with their type (`RoCE v2`, `IB/RoCE v1`) and netdev.
    pub gids: Vec<Gid>,
    /// The port's error counters from sysfs (`counters/link_downed`, `symbol_error`, ...),
    /// cumulative since the driver loaded; absent ones are left out.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub error_counters: std::collections::BTreeMap<String, u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_and_degraded_links() {
        assert_eq!(rate_gbps("400 Gb/sec (4X NDR)"), Some(400.0));
        assert_eq!(rate_gbps("2.5 Gb/sec (1X SDR)"), Some(2.5));
        assert_eq!(rate_gbps("garbage"), None);
        let link = |cs: &str, ms: &str, cw, mw| PcieLink {
            current_speed: Some(cs.into()),
            max_speed: Some(ms.into()),
            current_width: Some(cw),
            max_width: Some(mw),
        };
        assert_eq!(
            link("32.0 GT/s PCIe", "32.0 GT/s PCIe", 16, 16).degraded(),
            None
        );
        assert_eq!(
            link("16.0 GT/s PCIe", "32.0 GT/s PCIe", 8, 16)
                .degraded()
                .as_deref(),
            Some("x8 of x16, 16.0 of 32.0 GT/s")
        );
        assert_eq!(link("Unknown", "32.0 GT/s PCIe", 0, 16).degraded(), None);
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gid {
    pub index: u32,
    pub gid: String,
    pub kind: Option<String>,
    pub netdev: Option<String>,
}

/// Whether this process can open a device node read-write.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Openable {
    /// `None` when open(O_RDWR) succeeded; otherwise the error.
    pub refused: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UverbsNode {
    /// `uverbs0`.
    pub name: String,
    /// The RDMA device it serves (/sys/class/infiniband_verbs/uverbsN/ibdev).
    pub ibdev: Option<String>,
    /// Why `ibdev` could not be read, when it exists but did not read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ibdev_error: Option<FactError>,
    /// `None` when /dev/infiniband/uverbsN is missing.
    pub open: Option<Openable>,
}

/// What libibverbs reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerbsFacts {
    /// ibv_get_device_list: the devices, or the errno (ENOSYS: no kernel RDMA support).
    pub devices: Observed<Vec<VerbsDevice>>,
    /// The size registered with ibv_reg_mr on each device, in bytes (`--memreg-size`).
    pub memreg_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerbsDevice {
    pub name: String,
    /// ibv_open_device; the remaining fields are empty when it failed.
    pub open: Observed<()>,
    pub fw_ver: Option<String>,
    pub vendor_id: Option<u32>,
    pub vendor_part_id: Option<u32>,
    pub ports: Vec<VerbsPort>,
    /// ibv_alloc_pd + ibv_reg_mr of `memreg_bytes`: `None` when not tried (the device did not open).
    pub memreg: Option<Observed<()>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerbsPort {
    pub port: u32,
    pub query: Observed<()>,
    /// IBV_PORT_* state name (`ACTIVE`, `DOWN`, ...).
    pub state: Option<String>,
    /// `InfiniBand`, `Ethernet` or `Unspecified`.
    pub link_layer: Option<String>,
    pub active_mtu: Option<u32>,
}

/// A library location tried with dlopen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoadAttempt {
    pub library: String,
    /// `None` when it loaded.
    pub error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FabricFacts {
    /// fi_version(): `1.17`.
    pub version: String,
    /// Providers fi_getinfo lists (no hints), sorted.
    pub providers: Vec<String>,
    /// fi_getinfo for the efa provider with RDM endpoints: how many it returned, or why none.
    pub efa_rdm: Observed<u32>,
}

/// NCCL and the net plugin it would load.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NcclFacts {
    pub library: Library<NcclLibrary>,
    /// The net plugin NCCL would load (NCCL_NET_PLUGIN, libnccl-net.so, libnccl-net-ofi.so, /opt/amazon/ofi-nccl/lib).
    pub net_plugin: Observed<Option<NetPlugin>>,
    /// Every plugin location tried, in order.
    pub net_plugin_attempts: Vec<LoadAttempt>,
    /// Why the plugin was not looked for (no RDMA device and nothing asks for one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub net_plugin_skipped: Option<String>,
    /// Every libnccl the image holds that the search found, in the trainer's order
    /// (the first that loads is `library`); empty with `--nccl-lib` and in facts from
    /// older versions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub copies: Vec<NcclCopy>,
}

/// One libnccl file in the image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NcclCopy {
    /// Where the loader found it (dladdr's name for it), or the name tried when it did
    /// not load.
    pub path: String,
    /// How the trainer's process would reach it: `RUNPATH of libtorch_cuda.so`,
    /// `LD_LIBRARY_PATH`, `LD_LIBRARY_PATH / ld.so.cache`, `nvidia-nccl wheel (VIRTUAL_ENV)`.
    pub found_by: String,
    /// ncclGetVersion, or why it could not be read (the file did not load).
    pub version: Observed<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NcclLibrary {
    /// Where it was loaded from.
    pub path: Option<String>,
    /// ncclGetVersion: `2.28.9`.
    pub version: Observed<String>,
    /// How the trainer's process reaches it (as in [`NcclCopy::found_by`]); `None` in
    /// facts from older versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub found_by: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetPlugin {
    /// The library that loaded.
    pub library: String,
    pub path: Option<String>,
    /// The newest ncclNetPlugin_vN symbol it exports (`v9`).
    pub api: Option<String>,
    /// Every N of the ncclNetPlugin_vN symbols it exports (v2 to v16), oldest first; empty in
    /// facts from older versions, which recorded only `api`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub apis: Vec<u32>,
    /// aws-ofi-nccl's own version (`1.13.2-aws`), from the `aws-ofi-nccl <version>` string
    /// its init log line is built from; `None` for other plugins or when not found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ofi_nccl_version: Option<String>,
    /// The name the plugin gives itself (the struct's first field: `Libfabric`, `AWS Libfabric`, `IB`).
    pub name: Option<String>,
}

/// What GPUDirect RDMA needs: nvidia-peermem, or dma-buf (kernel >= 5.12 with the open GPU kernel modules).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GdrFacts {
    /// nvidia_peermem (or the older nv_peer_mem) in /proc/modules or /sys/module.
    pub peermem_module: Observed<Option<String>>,
    /// /proc/sys/kernel/osrelease.
    pub kernel_release: Observed<String>,
    /// /proc/driver/nvidia/version says "Open Kernel Module"; `None` without the NVIDIA driver.
    pub nvidia_open_modules: Observed<Option<bool>>,
}
