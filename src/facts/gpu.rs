//! GPU facts: what NVML and the CUDA driver report, and the NVIDIA GPUs sysfs
//! lists on the PCI bus. Pairs are ordered (a, b) with a != b, as
//! `nvidia-smi topo` prints them.

use super::{FactError, Observed};
use serde::{Deserialize, Serialize};

/// A vendor library loaded at run time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Library<T> {
    /// The name or path passed to dlopen.
    pub library: String,
    pub state: LibraryState<T>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LibraryState<T> {
    /// dlopen found no such library (dlerror's text): nothing of this vendor here.
    NotFound {
        message: String,
    },
    /// The library loaded but could not do its job: dlopen failed for another
    /// reason (a missing dependency), init failed, or a call did not return in time.
    Failed(FactError),
    Loaded(T),
    /// Not asked (`--cuda off`).
    Skipped {
        reason: String,
    },
}

impl<T> Library<T> {
    pub fn loaded(&self) -> Option<&T> {
        match &self.state {
            LibraryState::Loaded(t) => Some(t),
            _ => None,
        }
    }
}

/// Everything about the GPUs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuFacts {
    pub nvml: Library<NvmlFacts>,
    pub cuda: Library<CudaFacts>,
    /// NVIDIA GPUs on the PCI bus from sysfs, sorted by bus id. sysfs is not
    /// namespaced: a container sees the whole node's GPUs here, not just its own.
    pub pci_gpus: Observed<Vec<PciGpu>>,
    /// NVSwitches on the PCI bus from sysfs (NVIDIA functions of class 0x0680, "other
    /// bridge"), by bus id, sorted: the switches of an HGX/DGX baseboard where the host or
    /// VM sees them (DGX A100, p4d). Empty where none is visible, which does not prove
    /// there is none (a VM may hide them); left out of saved facts when empty, and read
    /// back as empty from facts that lack it.
    #[serde(default = "no_nvswitch", skip_serializing_if = "no_nvswitch_seen")]
    pub pci_nvswitches: Observed<Vec<String>>,
    /// The per-call deadline applied to NVML and CUDA, in milliseconds.
    pub call_timeout_ms: u64,
    /// IMEX channel device nodes in this container (/dev/nvidia-caps-imex-channels, e.g.
    /// `channel0`), sorted: what cross-node NVLink memory sharing needs on MNNVL systems.
    /// `None` when the directory does not exist; read back as `None` from older facts.
    #[serde(default = "no_imex_dir")]
    pub imex_channels: Observed<Option<Vec<String>>>,
    /// The CUDA runtime (libcudart) the image holds, to compare with the driver's CUDA
    /// version; read back as "not in these saved facts" from facts that lack it.
    #[serde(default = "cuda_runtime_not_saved")]
    pub cuda_runtime: CudaRuntimeFacts,
}

/// The CUDA runtimes (libcudart) this image holds, found where a trainer's loader or
/// PyTorch finds them, and the forward-compatibility libcuda (cuda-compat) if installed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CudaRuntimeFacts {
    /// Every libcudart found, in search order; empty when the image has none.
    pub libraries: Vec<CudaRuntime>,
    /// Every location tried, with dlopen's answer for those that failed.
    pub attempts: Vec<String>,
    /// Files of NVIDIA's forward-compatibility package (`libcuda.so.570.124.06` in
    /// /usr/local/cuda/compat), sorted; empty when it is not installed.
    pub compat_libcuda: Vec<String>,
    /// Why the image was not searched (nccl-preflight's own image, saved facts without it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
}

/// Where NVIDIA's forward-compatibility package (cuda-compat) puts its libcuda
/// (https://docs.nvidia.com/deploy/cuda-compatibility/forward-compatibility.html).
pub const CUDA_COMPAT_DIR: &str = "/usr/local/cuda/compat";

/// One libcudart found in the image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CudaRuntime {
    /// Where it was found: `LD_LIBRARY_PATH / ld.so.cache` (dlopen by soname, as a program
    /// linked against it loads it), `python wheel` (nvidia-cuda-runtime under
    /// site-packages, where PyTorch's libraries find it), or `--cudart-lib`.
    pub found_by: String,
    /// The file that loaded (dladdr), or the name tried.
    pub path: String,
    /// The CUDA version it implements, as CUDA encodes it (12080 = 12.8):
    /// cudaRuntimeGetVersion, or the file name's version when the library does not load.
    pub version: Observed<i32>,
}

impl CudaRuntimeFacts {
    /// Nothing looked for, and why.
    pub fn skipped(reason: impl Into<String>) -> Self {
        CudaRuntimeFacts {
            libraries: Vec::new(),
            attempts: Vec::new(),
            compat_libcuda: Vec::new(),
            skipped: Some(reason.into()),
        }
    }
}

fn no_imex_dir() -> Observed<Option<Vec<String>>> {
    Observed::Value(None)
}

fn cuda_runtime_not_saved() -> CudaRuntimeFacts {
    CudaRuntimeFacts::skipped("not in these saved facts")
}

/// A CUDA version code as `major.minor` (12080 -> `12.8`), as CUDA encodes it
/// (1000 * major + 10 * minor).
pub fn cuda_version_text(code: i32) -> String {
    format!("{}.{}", code / 1000, (code % 1000) / 10)
}

/// NVML's view: the GPUs this process may use and how each pair is linked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NvmlFacts {
    pub driver_version: Observed<String>,
    /// CUDA version the driver supports, as NVML encodes it (12020 = 12.2).
    pub cuda_driver_version: Observed<i32>,
    pub gpus: Vec<NvmlGpu>,
    /// Every ordered pair of `gpus`.
    pub pairs: Vec<GpuPair>,
}

/// One GPU as NVML reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NvmlGpu {
    /// NVML index (0-based, in PCI order).
    pub index: u32,
    pub name: Observed<String>,
    pub uuid: Observed<String>,
    /// PCI bus id, lower case with a 4-digit domain (`0000:10:1c.0`), as sysfs names it.
    pub pci_bus_id: Observed<String>,
    /// CUDA compute capability, `major.minor`.
    pub compute_capability: Observed<String>,
    /// Total memory in bytes.
    pub memory_bytes: Observed<u64>,
    pub numa_node: Observed<u32>,
    /// NUMA nodes close to the GPU (nvmlDeviceGetMemoryAffinity), nvidia-smi's
    /// "NUMA Affinity", as a list like "0" or "0-1".
    #[serde(default = "numa_affinity_not_saved")]
    pub numa_affinity: Observed<String>,
    /// CPUs closest to the GPU, as a CPU list (`0-47,96-143`).
    pub cpu_affinity: Observed<String>,
    pub persistence_mode: Observed<bool>,
    /// MIG mode currently enabled.
    pub mig_mode: Observed<bool>,
    /// NVLink speed per link and direction, in MB/s (26562 on H200), as `nvidia-smi nvlink -s` shows it.
    pub nvlink_speed_mbps: Observed<u32>,
    pub pcie_max_generation: Observed<u32>,
    pub pcie_max_width: Observed<u32>,
    /// NVSwitch fabric registration (nvmlDeviceGetGpuFabricInfo, Hopper and later):
    /// `completed`, `in_progress`, `not_started` (the fabric manager has not taken
    /// the GPU in), `not_supported`, or `completed with error N`.
    pub fabric_state: Observed<String>,
    /// The multi-node NVLink domain the fabric placed the GPU in (nvmlDeviceGetGpuFabricInfo:
    /// GB200 NVL72 and other MNNVL systems): `None` where the call failed or the GPU has no
    /// fabric (state not_supported), and in facts from older versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric_clique: Option<FabricClique>,
    /// Links NVML reports a state for (absent links are not listed).
    pub nvlinks: Vec<NvLink>,
    /// How each value NVML can give as a field was read, by fact name (`nvlink_state`,
    /// `nvlink_version`, `nvlink_remote_type`, `nvlink_errors`, `ecc_uncorrected_volatile`,
    /// `remapped_rows`): `field_values` (one nvmlDeviceGetFieldValues call for the GPU)
    /// or `per_call` (the driver refused the field, so the per-call function answered).
    /// Empty in facts from older versions.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub read_paths: std::collections::BTreeMap<String, ReadPath>,
    /// Memory health (absent in facts from older versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<GpuHealth>,
}

/// Where the NVLink fabric placed a GPU. NCCL groups ranks into one MNNVL clique by equal
/// cluster UUID and clique id, and a zero cluster UUID means "no MNNVL fabric"
/// (NVIDIA/nccl v2.28.9-1 src/mnnvl.cc ncclMnnvlCheck).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FabricClique {
    /// The NVLink cluster's UUID, `8-4-4-4-12` hex; all zeros when the GPU is in none.
    pub cluster_uuid: String,
    pub clique_id: u32,
}

impl FabricClique {
    pub fn has_cluster(&self) -> bool {
        self.cluster_uuid
            .chars()
            .any(|c| c.is_ascii_hexdigit() && c != '0')
    }
}

/// How an NVML value was read (see `NvmlGpu::read_paths`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReadPath {
    /// Batched in the GPU's one nvmlDeviceGetFieldValues call.
    FieldValues,
    /// The driver refused the field (NVML_ERROR_NOT_SUPPORTED for that entry), so the
    /// per-call function was asked, one call per link or value.
    PerCall,
}

/// What says a GPU's memory is failing, as `nvidia-smi -q -d ECC,ROW_REMAPPER,PAGE_RETIREMENT` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuHealth {
    /// Uncorrectable ECC errors since the driver loaded (volatile count).
    pub ecc_uncorrected_volatile: Observed<u64>,
    /// Row remapping (A100 and later).
    pub remapped_rows: Observed<RemappedRows>,
    /// Pages waiting to be retired at the next reset (pre-A100 page retirement).
    pub retired_pages_pending: Observed<bool>,
    /// The driver's own verdict after an uncorrectable error: NVML field 230,
    /// NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (`nvmlDeviceGpuRecoveryAction_t`, 0 = none).
    #[serde(default = "recovery_action_not_saved")]
    pub recovery_action: Observed<u32>,
}

fn no_nvswitch() -> Observed<Vec<String>> {
    Observed::Value(Vec::new())
}

fn no_nvswitch_seen(o: &Observed<Vec<String>>) -> bool {
    o.value().is_some_and(Vec::is_empty)
}

fn numa_affinity_not_saved() -> Observed<String> {
    Observed::Error(crate::facts::FactError::new(
        "nvmlDeviceGetMemoryAffinity",
        "not in these saved facts",
    ))
}

fn recovery_action_not_saved() -> Observed<u32> {
    Observed::Error(crate::facts::FactError::new(
        "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION",
        "not in these saved facts",
    ))
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemappedRows {
    pub correctable: u32,
    pub uncorrectable: u32,
    /// A remapping waits for a GPU reset.
    pub pending: bool,
    /// A remapping failed: the GPU needs service.
    pub failure: bool,
}

/// One NVLink of a GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NvLink {
    pub link: u32,
    pub active: bool,
    /// NVLink version (`3.0` on A100, `4.0` on H100/H200).
    pub version: Observed<String>,
    /// Bus id of the device at the other end (normalized like `NvmlGpu::pci_bus_id`).
    pub remote_pci_bus_id: Observed<String>,
    /// `gpu`, `switch`, `ibmnpu` or `unknown`.
    pub remote_type: Observed<String>,
    /// NVLink error counters (`replay`, `recovery`, `crc_flit`, `crc_data`) that are not zero,
    /// since the driver loaded. `crc_data` is read per call, by `doctor`, `facts` and `serve` only.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub error_counters: std::collections::BTreeMap<String, u64>,
}

/// How two GPUs reach each other.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuPair {
    pub a: u32,
    pub b: u32,
    /// nvmlDeviceGetTopologyCommonAncestor: INTERNAL, SINGLE, MULTIPLE, HOSTBRIDGE, NODE, SYSTEM.
    pub common_ancestor: Observed<String>,
    /// nvmlDeviceGetP2PStatus per capability, in nvidia-smi's notation: OK, CNS, GNS, TNS, NS, U
    /// (and DISABLED for disabled by registry key).
    pub p2p_read: Observed<String>,
    pub p2p_write: Observed<String>,
    pub p2p_nvlink: Observed<String>,
    pub p2p_atomics: Observed<String>,
    pub p2p_prop: Observed<String>,
}

/// The CUDA driver's view (libcuda), which applies CUDA_VISIBLE_DEVICES and
/// refuses what NVML may still list (e.g. fabric manager not running).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CudaFacts {
    /// cuDriverGetVersion (12020 = 12.2).
    pub driver_version: Observed<i32>,
    /// cuInit's CUresult: 0 is success.
    pub init_result: i32,
    /// The CUresult's name (CUDA_SUCCESS, CUDA_ERROR_SYSTEM_NOT_READY, ...).
    pub init_result_name: String,
    /// Devices in CUDA ordinal order, empty when cuInit failed.
    pub devices: Vec<CudaDevice>,
    /// cuDeviceCanAccessPeer for every ordered pair of `devices`.
    pub peer_access: Vec<PeerAccess>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CudaDevice {
    pub ordinal: u32,
    /// Normalized like `NvmlGpu::pci_bus_id`.
    pub pci_bus_id: Observed<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PeerAccess {
    /// CUDA ordinals.
    pub a: u32,
    pub b: u32,
    pub can_access: Observed<bool>,
}

/// An NVIDIA GPU function on the PCI bus, from /sys/bus/pci/devices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PciGpu {
    /// `0000:10:1c.0`.
    pub bus_id: String,
    /// PCI device id (`0x20b0`).
    pub device_id: String,
    /// The device's place in the PCI tree (`/sys/devices/pci0000:00/.../0000:10:1c.0`):
    /// the common prefix of two paths is their closest common bridge.
    pub sysfs_path: Option<String>,
    /// NUMA node, `None` when the kernel reports -1 or nothing.
    pub numa_node: Option<u32>,
    /// `max_link_speed` as sysfs prints it (`16.0 GT/s PCIe`).
    pub max_link_speed: Option<String>,
    pub max_link_width: Option<u32>,
    /// `current_link_speed` (LnkSta): an idle GPU trains its link down to 2.5 GT/s to
    /// save power, so a speed below the maximum is no fault by itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_link_speed: Option<String>,
    /// `current_link_width` in lanes (LnkSta): idle power saving keeps the width.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_link_width: Option<u32>,
    /// The PCIe bridges above the GPU (root port first, the GPU's own downstream port
    /// last) with their ACS control register; empty for facts saved before it was read.
    #[serde(default)]
    pub upstream_acs: Vec<BridgeAcs>,
}

/// A PCIe bridge above a GPU and its Access Control Services control register.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BridgeAcs {
    /// `0000:e0:00.0`.
    pub bus_id: String,
    /// The root port (the first bridge below the host bridge): peer traffic between
    /// root ports goes through the root complex whatever ACS says.
    pub root_port: bool,
    /// The ACS control register (PCIe extended capability 0x000d, offset 6); `None`
    /// when the bridge has no ACS capability; an error when the config space could not
    /// be read far enough (sysfs gives 64 bytes, not the extended space, to non-root).
    pub control: Observed<Option<u16>>,
}

/// ACS control bits (Linux include/uapi/linux/pci_regs.h PCI_ACS_*).
pub mod acs {
    pub const SOURCE_VALIDATION: u16 = 0x01;
    pub const REQUEST_REDIRECT: u16 = 0x04;
    pub const COMPLETION_REDIRECT: u16 = 0x08;
    pub const UPSTREAM_FORWARDING: u16 = 0x10;

    /// Bits that send peer requests or completions up to the root complex instead of
    /// across the switch (lspci `ACSCtl: ReqRedir+` / `CmpltRedir+`).
    pub fn redirects(control: u16) -> bool {
        control & (REQUEST_REDIRECT | COMPLETION_REDIRECT) != 0
    }

    /// lspci's names for the bits set, `SrcValid+ ReqRedir+ ...`.
    pub fn names(control: u16) -> String {
        let all = [
            (0x01, "SrcValid"),
            (0x02, "TransBlk"),
            (0x04, "ReqRedir"),
            (0x08, "CmpltRedir"),
            (0x10, "UpstreamFwd"),
            (0x20, "EgressCtrl"),
            (0x40, "DirectTrans"),
        ];
        all.iter()
            .filter(|(bit, _)| control & bit != 0)
            .map(|(_, n)| format!("{n}+"))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Normalizes a PCI bus id from NVML (`00000000:10:1C.0`), CUDA (`0000:10:1C.0`) or sysfs
/// to sysfs' form: lower case, 4-digit domain. Returns the input lower-cased if it does not parse.
pub fn normalize_bus_id(raw: &str) -> String {
    let raw = raw.trim().trim_end_matches('\0').to_ascii_lowercase();
    let parts: Vec<&str> = raw.split(':').collect();
    match parts.as_slice() {
        [domain, bus, devfn] => {
            let domain = domain.trim_start_matches('0');
            format!("{:0>4}:{bus:0>2}:{devfn}", domain)
        }
        [bus, devfn] => format!("0000:{bus:0>2}:{devfn}"),
        _ => raw,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_normalize_across_sources() {
        assert_eq!(normalize_bus_id("00000000:10:1C.0"), "0000:10:1c.0");
        assert_eq!(normalize_bus_id("0000:10:1C.0"), "0000:10:1c.0");
        assert_eq!(normalize_bus_id("0000:10:1c.0\0\0"), "0000:10:1c.0");
        assert_eq!(normalize_bus_id("00000001:a0:00.0"), "0001:a0:00.0");
        assert_eq!(normalize_bus_id("garbage"), "garbage");
    }
}
