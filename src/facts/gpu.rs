//! GPU facts: what NVML and the CUDA driver report, and the NVIDIA GPUs sysfs
//! lists on the PCI bus. Pairs are ordered (a, b) with a != b, as
//! `nvidia-smi topo` prints them.

use super::{FactError, FailureKind, Observed};
use serde::{Deserialize, Deserializer, Serialize};
use std::fmt;

/// A vendor library loaded at run time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Library<T> {
    /// The name or path passed to dlopen.
    pub library: String,
    #[serde(deserialize_with = "state_with_kind")]
    #[serde(bound(deserialize = "T: Deserialize<'de>"))]
    pub state: LibraryState<T>,
}

/// Reads a library's state, giving a failure saved without its kind (by versions that
/// kept the kind in the text only) the kind its text names, so a replayed capture is
/// judged as it was when it was taken. New captures carry the kind and skip this.
fn state_with_kind<'de, D, T>(d: D) -> Result<LibraryState<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    let mut state = LibraryState::<T>::deserialize(d)?;
    if let LibraryState::Failed(e) = &mut state
        && e.kind.is_none()
    {
        e.kind = legacy_kind(e);
    }
    Ok(state)
}

/// The kind an untyped saved failure's text names: the deadline's "did not return
/// within", NVML's "NVIDIA driver is not loaded" (nvml-wrapper's DriverNotLoaded text),
/// or a dlopen that failed for another reason than an absent file.
fn legacy_kind(e: &FactError) -> Option<FailureKind> {
    if e.message.contains("did not return within") {
        Some(FailureKind::Timeout)
    } else if e.message.contains("driver is not loaded") {
        Some(FailureKind::DriverNotLoaded)
    } else if e.source.starts_with("dlopen(") {
        Some(FailureKind::Unloadable)
    } else {
        None
    }
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

impl NvmlFacts {
    /// Every NVML call that could not be made or failed without an answer
    /// (`FactError::is_unread`), in the order gather made them: what no check may read
    /// as a state of the hardware.
    pub fn unread(&self) -> Vec<&FactError> {
        fn e<T>(o: &Observed<T>) -> Option<&FactError> {
            o.error()
        }
        fn opt<T>(o: &Option<Observed<T>>) -> Option<&FactError> {
            o.as_ref().and_then(Observed::error)
        }
        let mut out = vec![e(&self.driver_version), e(&self.cuda_driver_version)];
        for g in &self.gpus {
            out.extend([
                e(&g.name),
                e(&g.uuid),
                e(&g.pci_bus_id),
                e(&g.compute_capability),
                e(&g.memory_bytes),
                e(&g.numa_node),
                opt(&g.numa_affinity),
                opt(&g.cpu_affinity),
                e(&g.persistence_mode),
                e(&g.mig_mode),
                e(&g.nvlink_speed_mbps),
                e(&g.pcie_max_generation),
                e(&g.pcie_max_width),
                e(&g.fabric_state),
                g.nvlinks_unread.as_ref(),
            ]);
            for l in &g.nvlinks {
                out.extend([e(&l.version), e(&l.remote_pci_bus_id), e(&l.remote_type)]);
            }
            if let Some(h) = &g.health {
                out.extend([
                    e(&h.ecc_uncorrected_volatile),
                    e(&h.remapped_rows),
                    e(&h.retired_pages_pending),
                    e(&h.recovery_action),
                ]);
            }
        }
        for p in &self.pairs {
            out.extend([
                opt(&p.common_ancestor),
                e(&p.p2p_read),
                e(&p.p2p_write),
                opt(&p.p2p_nvlink),
                opt(&p.p2p_atomics),
                opt(&p.p2p_prop),
            ]);
        }
        out.into_iter()
            .flatten()
            .filter(|e| e.is_unread())
            .collect()
    }
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
    /// Absent where not read: the gates (`check`, `probe`, `init`) leave the facts no
    /// check judges unread; `doctor`, `facts` and `serve` read them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa_affinity: Option<Observed<String>>,
    /// CPUs closest to the GPU, as a CPU list (`0-47,96-143`). Absent where not read, as
    /// `numa_affinity`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_affinity: Option<Observed<String>>,
    pub persistence_mode: Observed<bool>,
    /// MIG mode currently enabled.
    pub mig_mode: Observed<bool>,
    /// NVLink speed per link and direction, in MB/s (26562 on H200), as `nvidia-smi nvlink -s` shows it.
    pub nvlink_speed_mbps: Observed<u32>,
    pub pcie_max_generation: Observed<u32>,
    pub pcie_max_width: Observed<u32>,
    /// NVSwitch fabric registration (nvmlDeviceGetGpuFabricInfo, Hopper and later).
    pub fabric_state: Observed<FabricState>,
    /// The multi-node NVLink domain the fabric placed the GPU in (nvmlDeviceGetGpuFabricInfo:
    /// GB200 NVL72 and other MNNVL systems): `None` where the call failed or the GPU has no
    /// fabric (state not_supported), and in facts from older versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric_clique: Option<FabricClique>,
    /// Links NVML reports a state for (absent links are not listed).
    pub nvlinks: Vec<NvLink>,
    /// Why the state of some of this GPU's links could not be read (the first such
    /// error): those links are not in `nvlinks`, which says nothing of them. Absent when
    /// every link NVML has was read (and in facts from older versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvlinks_unread: Option<FactError>,
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
    /// nvmlDeviceGetTopologyCommonAncestor: INTERNAL, SINGLE, MULTIPLE, HOSTBRIDGE, NODE,
    /// SYSTEM. Absent where not read: the gates read it only for GPUs that share no
    /// NVLink (the pair's link is NV<n> otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub common_ancestor: Option<Observed<String>>,
    /// nvmlDeviceGetP2PStatus per capability: read and write (what gpu-p2p judges) always,
    /// the others where read (`doctor`, `facts` and `serve`; absent from the gates).
    pub p2p_read: Observed<P2pStatus>,
    pub p2p_write: Observed<P2pStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p2p_nvlink: Option<Observed<P2pStatus>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p2p_atomics: Option<Observed<P2pStatus>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p2p_prop: Option<Observed<P2pStatus>>,
}

/// What nvmlDeviceGetP2PStatus answers for one capability of a pair (nvml.h
/// `nvmlGpuP2PStatus_t`), saved in `nvidia-smi topo -p2p`'s notation. A call that
/// failed is the `Observed` error around it, not a status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum P2pStatus {
    /// NVML_P2P_STATUS_OK.
    #[serde(rename = "OK")]
    Ok,
    /// NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED.
    #[serde(rename = "CNS")]
    ChipsetNotSupported,
    /// NVML_P2P_STATUS_GPU_NOT_SUPPORTED.
    #[serde(rename = "GNS")]
    GpuNotSupported,
    /// NVML_P2P_STATUS_IOH_TOPOLOGY_NOT_SUPPORTED.
    #[serde(rename = "TNS")]
    TopologyNotSupported,
    /// NVML_P2P_STATUS_DISABLED_BY_REGKEY (NVreg_RegistryDwords).
    #[serde(rename = "DISABLED")]
    DisabledByRegkey,
    /// NVML_P2P_STATUS_NOT_SUPPORTED.
    #[serde(rename = "NS")]
    NotSupported,
    /// NVML_P2P_STATUS_UNKNOWN.
    #[serde(rename = "U")]
    Unknown,
}

impl P2pStatus {
    /// The status in `nvidia-smi topo -p2p` notation (`OK`, `CNS`, `NS`, ...).
    pub fn label(self) -> &'static str {
        match self {
            P2pStatus::Ok => "OK",
            P2pStatus::ChipsetNotSupported => "CNS",
            P2pStatus::GpuNotSupported => "GNS",
            P2pStatus::TopologyNotSupported => "TNS",
            P2pStatus::DisabledByRegkey => "DISABLED",
            P2pStatus::NotSupported => "NS",
            P2pStatus::Unknown => "U",
        }
    }

    /// The status a `nvidia-smi topo -p2p` label names (`OK`, `CNS`, ...): the tests'
    /// fixtures are written in those labels.
    #[cfg(test)]
    pub fn from_label(label: &str) -> Option<P2pStatus> {
        [
            P2pStatus::Ok,
            P2pStatus::ChipsetNotSupported,
            P2pStatus::GpuNotSupported,
            P2pStatus::TopologyNotSupported,
            P2pStatus::DisabledByRegkey,
            P2pStatus::NotSupported,
            P2pStatus::Unknown,
        ]
        .into_iter()
        .find(|s| s.label() == label)
    }
}

impl fmt::Display for P2pStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// A GPU's NVSwitch fabric registration (nvml.h `nvmlGpuFabricState_t` with the
/// `nvmlReturn_t` status NVML gives a completed registration). Saved as the text earlier
/// versions wrote (`completed`, `not_started`, `completed with error 3`), which reads back
/// into the same value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum FabricState {
    /// NVML_GPU_FABRIC_STATE_NOT_SUPPORTED: the GPU has no NVSwitch fabric.
    NotSupported,
    /// NVML_GPU_FABRIC_STATE_NOT_STARTED: the fabric manager has not taken the GPU in.
    NotStarted,
    /// NVML_GPU_FABRIC_STATE_IN_PROGRESS.
    InProgress,
    /// NVML_GPU_FABRIC_STATE_COMPLETED with status NVML_SUCCESS.
    Completed,
    /// Completed, but with this NVML return code as its status.
    CompletedWithError(u32),
    /// A state this version does not know.
    Unknown(u32),
}

impl FabricState {
    /// From nvmlGpuFabricInfo_t's `state` and `status`.
    pub fn from_nvml(state: u32, status: u32) -> FabricState {
        match (state, status) {
            (0, _) => FabricState::NotSupported,
            (1, _) => FabricState::NotStarted,
            (2, _) => FabricState::InProgress,
            (3, 0) => FabricState::Completed,
            (3, status) => FabricState::CompletedWithError(status),
            (other, _) => FabricState::Unknown(other),
        }
    }

    /// Registration has not finished or finished with an error: NVLink peer traffic
    /// through the NVSwitches cannot run.
    pub fn incomplete(self) -> bool {
        matches!(
            self,
            FabricState::NotStarted | FabricState::InProgress | FabricState::CompletedWithError(_)
        )
    }
}

impl fmt::Display for FabricState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FabricState::NotSupported => f.write_str("not_supported"),
            FabricState::NotStarted => f.write_str("not_started"),
            FabricState::InProgress => f.write_str("in_progress"),
            FabricState::Completed => f.write_str("completed"),
            FabricState::CompletedWithError(n) => write!(f, "completed with error {n}"),
            FabricState::Unknown(n) => write!(f, "unknown state {n}"),
        }
    }
}

impl From<FabricState> for String {
    fn from(s: FabricState) -> String {
        s.to_string()
    }
}

impl TryFrom<String> for FabricState {
    type Error = String;

    fn try_from(text: String) -> Result<FabricState, String> {
        let number = |rest: &str| rest.trim().parse::<u32>().ok();
        Ok(match text.as_str() {
            "not_supported" => FabricState::NotSupported,
            "not_started" => FabricState::NotStarted,
            "in_progress" => FabricState::InProgress,
            "completed" => FabricState::Completed,
            t => {
                if let Some(n) = t.strip_prefix("completed with error ").and_then(number) {
                    FabricState::CompletedWithError(n)
                } else if let Some(n) = t.strip_prefix("unknown state ").and_then(number) {
                    FabricState::Unknown(n)
                } else {
                    return Err(format!("{text:?} is no fabric state"));
                }
            }
        })
    }
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
    /// Attributes that exist but could not be read or parsed (the path and why): the
    /// fields above they feed are `None` or empty for that reason, not because sysfs
    /// lacks them. Left out when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unreadable: Vec<FactError>,
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
    const REQUEST_REDIRECT: u16 = 0x04;
    const COMPLETION_REDIRECT: u16 = 0x08;

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

    #[test]
    fn fabric_states_read_back_from_the_text_they_are_saved_as() {
        for state in [
            FabricState::NotSupported,
            FabricState::NotStarted,
            FabricState::InProgress,
            FabricState::Completed,
            FabricState::CompletedWithError(3),
            FabricState::Unknown(9),
        ] {
            let json = serde_json::to_string(&state).unwrap();
            assert_eq!(serde_json::from_str::<FabricState>(&json).unwrap(), state);
        }
        assert_eq!(
            serde_json::to_string(&FabricState::CompletedWithError(3)).unwrap(),
            "\"completed with error 3\""
        );
        assert_eq!(FabricState::from_nvml(3, 0), FabricState::Completed);
        assert_eq!(
            FabricState::from_nvml(3, 17),
            FabricState::CompletedWithError(17)
        );
        assert!(FabricState::from_nvml(2, 0).incomplete());
        assert!(!FabricState::Completed.incomplete() && !FabricState::NotSupported.incomplete());
        let e = serde_json::from_str::<FabricState>("\"completed with error x\"").unwrap_err();
        assert!(e.to_string().contains("no fabric state"), "{e}");
    }

    #[test]
    fn p2p_statuses_are_saved_in_nvidia_smi_notation() {
        assert_eq!(
            serde_json::to_string(&P2pStatus::ChipsetNotSupported).unwrap(),
            "\"CNS\""
        );
        assert_eq!(
            serde_json::from_str::<P2pStatus>("\"DISABLED\"").unwrap(),
            P2pStatus::DisabledByRegkey
        );
        assert_eq!(P2pStatus::from_label("U"), Some(P2pStatus::Unknown));
        assert_eq!(P2pStatus::from_label("maybe"), None);
        assert!(serde_json::from_str::<P2pStatus>("\"maybe\"").is_err());
    }

    #[test]
    fn regression_failures_saved_without_a_kind_read_back_with_the_kind_their_text_names() {
        let saved = |source: &str, message: &str| {
            let json = serde_json::json!({
                "library": "libnvidia-ml.so.1",
                "state": {"failed": {"source": source, "message": message}}
            });
            match serde_json::from_value::<Library<NvmlFacts>>(json)
                .unwrap()
                .state
            {
                LibraryState::Failed(e) => e.kind,
                _ => unreachable!("a failed state was saved"),
            }
        };
        assert_eq!(
            saved("nvmlInit_v2", "NVIDIA driver is not loaded"),
            Some(FailureKind::DriverNotLoaded)
        );
        assert_eq!(
            saved(
                "nvmlDeviceGetCount_v2",
                "did not return within 1.0 s: the driver or a GPU is hung"
            ),
            Some(FailureKind::Timeout)
        );
        assert_eq!(
            saved(
                "dlopen(libnvidia-ml.so.1)",
                "libz.so: cannot open shared object file"
            ),
            Some(FailureKind::Unloadable)
        );
        assert_eq!(saved("nvmlInit_v2", "Unknown Error"), None);
        // A saved kind is kept as it is.
        let json = serde_json::json!({
            "library": "x",
            "state": {"failed": {"source": "dlopen(x)", "message": "m", "kind": "own_resources"}}
        });
        let state = serde_json::from_value::<Library<CudaFacts>>(json)
            .unwrap()
            .state;
        assert!(matches!(state, LibraryState::Failed(e) if e.is_own_resources()));
    }
}
