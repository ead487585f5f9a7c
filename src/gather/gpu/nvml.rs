//! NVML's facts, through vendor::nvml (libnvidia-ml.so.1, or the path given, loaded
//! at run time). Every call goes through the `Watch` so a hung driver is named. A
//! call that fails degrades its own fact only; the run goes on.

use crate::facts::gpu::{
    FabricClique, FabricState, GpuHealth, GpuPair, NvLink, NvmlFacts, NvmlGpu, ReadPath,
    RemappedRows, normalize_bus_id,
};
use crate::facts::{FactError, Observed};
use crate::vendor::deadline::Watch;
use crate::vendor::dl::LoadError;
use crate::vendor::nvml::{
    Device, Nvml, NvmlError, P2pCapabilitiesIndex, P2pStatus, TopologyLevel, error as nvml_error,
    fact_error,
};

/// NVML_NVLINK_MAX_LINKS in nvml.h (18 on Hopper; older GPUs report fewer).
const MAX_LINKS: u32 = 18;

/// How loading NVML ended.
pub type Outcome = crate::gather::Outcome<NvmlFacts>;

fn observed<T>(call: &str, r: Result<T, NvmlError>) -> Observed<T> {
    match r {
        Ok(v) => Observed::Value(v),
        Err(e) => Observed::Error(fact_error(call, &e)),
    }
}

/// nvml-wrapper's P2P status as the fact's type (the same nvmlGpuP2PStatus_t values).
fn p2p_status(s: &P2pStatus) -> crate::facts::gpu::P2pStatus {
    use crate::facts::gpu::P2pStatus as Fact;
    match s {
        P2pStatus::Ok => Fact::Ok,
        P2pStatus::ChipsetNotSupported => Fact::ChipsetNotSupported,
        P2pStatus::GpuNotSupported => Fact::GpuNotSupported,
        P2pStatus::IohTopologyNotSupported => Fact::TopologyNotSupported,
        P2pStatus::DisabledByRegkey => Fact::DisabledByRegkey,
        P2pStatus::NotSupported => Fact::NotSupported,
        P2pStatus::Unknown => Fact::Unknown,
    }
}

fn topology_label(t: &TopologyLevel) -> &'static str {
    match t {
        TopologyLevel::Internal => "INTERNAL",
        TopologyLevel::Single => "SINGLE",
        TopologyLevel::Multiple => "MULTIPLE",
        TopologyLevel::HostBridge => "HOSTBRIDGE",
        TopologyLevel::Node => "NODE",
        TopologyLevel::System => "SYSTEM",
    }
}

/// Turns NVML's CPU affinity bitmask (64-bit words, lowest CPU first) into a CPU list.
fn cpu_list(words: &[u64]) -> String {
    let mut ranges: Vec<(usize, usize)> = Vec::new();
    for (w, word) in words.iter().enumerate() {
        for bit in 0..64 {
            if word & (1 << bit) != 0 {
                let cpu = w * 64 + bit;
                match ranges.last_mut() {
                    Some((_, end)) if *end + 1 == cpu => *end = cpu,
                    _ => ranges.push((cpu, cpu)),
                }
            }
        }
    }
    ranges
        .iter()
        .map(|(a, b)| {
            if a == b {
                a.to_string()
            } else {
                format!("{a}-{b}")
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

fn remote_type(device: &Device<'_>, nvml: &Nvml, link: u32) -> Result<String, NvmlError> {
    Ok(
        match crate::vendor::nvml::remote_device_type(device, nvml, link)? {
            0 => "gpu",
            1 => "ibmnpu",
            2 => "switch",
            _ => "unknown",
        }
        .to_string(),
    )
}

/// nvmlDeviceGetNvLinkVersion answers an enum (nvml.h NVML_NVLINK_VERSION_*), not the
/// spec version: 4 is NVLink 3.0 (A100), 6 is 4.0 (H100/H200), 7 is 5.0 (B200).
fn nvlink_version(code: u32) -> String {
    match code {
        1 => "1.0",
        2 => "2.0",
        3 => "2.2",
        4 => "3.0",
        5 => "3.1",
        6 => "4.0",
        7 => "5.0",
        other => return format!("unknown ({other})"),
    }
    .to_string()
}

/// NVML field ids (nvml.h `NVML_FI_*`) read in one nvmlDeviceGetFieldValues call per GPU.
///
/// Measured on the 2x H200 (driver 580.159.04, scripts/nvml_fields_probe.py, captures in
/// tests/data/h200x2/nvml/fields-run1.txt and nvml-fields.txt): per link, 161 DL_REPLAY, 162 DL_RECOVERY, 165
/// GET_STATE and 166 GET_VERSION equal what nvmlDeviceGetNvLinkErrorCounter,
/// nvmlDeviceGetNvLinkState and nvmlDeviceGetNvLinkVersion answer on all 36 links;
/// 163 DL_CRC equals the per-call CRC *flit* counter (0 on every link) but not the CRC
/// *data* counter (2-17 per link, where 163 gives 0), so CRC data errors stay per call.
/// Per GPU, 147 NVSWITCH_CONNECTED_LINK_COUNT was 18 where every link's
/// nvmlDeviceGetNvLinkRemoteDeviceType said NVSwitch, and 4, 142-145 and 230 equal
/// nvmlDeviceGetTotalEccErrors, nvmlDeviceGetRemappedRows and the recovery action.
/// One field-values call of 125 entries took 15-16 ms a GPU where the 108 per-link calls
/// it replaces took 65 ms. The legacy per-link counters (32-59) answer NOT_SUPPORTED on
/// Hopper, and NVML removes 161-163 on Blackwell (release notes, r570): a field the
/// driver refuses falls back to its per-call function, and `read_paths` records which.
mod field {
    pub const ECC_DBE_VOLATILE_TOTAL: u32 = 4;
    pub const NVLINK_SPEED_MBPS_COMMON: u32 = 90;
    pub const REMAPPED_CORRECTABLE: u32 = 142;
    pub const REMAPPED_UNCORRECTABLE: u32 = 143;
    pub const REMAPPED_PENDING: u32 = 144;
    pub const REMAPPED_FAILURE: u32 = 145;
    pub const NVSWITCH_CONNECTED_LINK_COUNT: u32 = 147;
    pub const NVLINK_ERROR_DL_REPLAY: u32 = 161;
    pub const NVLINK_ERROR_DL_RECOVERY: u32 = 162;
    /// Equal to the per-call CRC flit counter, not the CRC data counter (see above).
    pub const NVLINK_ERROR_DL_CRC: u32 = 163;
    /// Speed per link and direction in MB/s: what `nvidia-smi nvlink -s` prints; the only
    /// speed field Hopper answers (90 is NOT_SUPPORTED there).
    pub const NVLINK_GET_SPEED: u32 = 164;
    pub const NVLINK_GET_STATE: u32 = 165;
    pub const NVLINK_GET_VERSION: u32 = 166;
    /// What the driver says must happen before the GPU can be used again
    /// (`nvmlDeviceGpuRecoveryAction_t`: 0 none, 1 GPU reset, 2 node reboot, 3 drain P2P,
    /// 4 drain and reset).
    pub const GPU_RECOVERY_ACTION: u32 = 230;
}

/// The answers of one nvmlDeviceGetFieldValues call, by (field, scope): a value, or the
/// NVML return code that refused it; and how the call as a whole failed, if it did.
struct Fields {
    answers: std::collections::BTreeMap<(u32, u32), Result<u64, u32>>,
    /// dlsym's error where this NVML has no such function, or the call's return code.
    failed: Option<Result<u32, String>>,
}

impl Fields {
    fn read(device: &Device<'_>, nvml: &Nvml, requests: &[(u32, u32)]) -> Fields {
        let (answers, failed) = match crate::vendor::nvml::field_values(device, nvml, requests) {
            Ok(values) => (values.into_iter().collect(), None),
            Err(NvmlError::FailedToLoadSymbol(dlerror)) => (Default::default(), Some(Err(dlerror))),
            // The call as a whole failed: every entry is refused, so each value falls
            // back to its per-call function.
            Err(e) => {
                let rc = u32::from(e);
                (
                    requests.iter().map(|&k| (k, Err(rc))).collect(),
                    Some(Ok(rc)),
                )
            }
        };
        Fields { answers, failed }
    }

    /// How the call as a whole failed.
    fn failure(&self) -> Option<NvmlError> {
        match &self.failed {
            Some(Err(dlerror)) => Some(NvmlError::FailedToLoadSymbol(dlerror.clone())),
            Some(Ok(rc)) => Some(nvml_error(*rc)),
            None => None,
        }
    }

    fn get(&self, field: u32, scope: u32) -> Result<u64, NvmlError> {
        match self.answers.get(&(field, scope)) {
            Some(Ok(v)) => Ok(*v),
            Some(Err(rc)) => Err(nvml_error(*rc)),
            None => Err(self.failure().unwrap_or(NvmlError::NotSupported)),
        }
    }
}

/// NVLink speed per link and direction in MB/s from the batch: field 164 on the first
/// active link, else the common-speed field 90 that older drivers and GPUs answer.
fn nvlink_speed(fields: &Fields, link: Option<u32>) -> Result<u32, NvmlError> {
    if let Some(e) = fields.failure() {
        return Err(e);
    }
    for (f, scope) in [
        (field::NVLINK_GET_SPEED, link.unwrap_or(0)),
        (field::NVLINK_SPEED_MBPS_COMMON, 0),
    ] {
        if let Ok(v) = fields.get(f, scope)
            && let Ok(v) = u32::try_from(v)
            && v > 0
        {
            return Ok(v);
        }
    }
    Err(NvmlError::NotSupported)
}

/// NVSwitch fabric registration state, and the MNNVL cluster and clique the fabric placed
/// the GPU in.
fn fabric_info(
    device: &Device<'_>,
    nvml: &Nvml,
) -> Result<(FabricState, Option<FabricClique>), NvmlError> {
    let info = crate::vendor::nvml::gpu_fabric_info(device, nvml)?;
    let state = FabricState::from_nvml(u32::from(info.state), info.status);
    let clique = (info.state != 0).then(|| FabricClique {
        cluster_uuid: uuid_text(&info.cluster_uuid),
        clique_id: info.clique_id,
    });
    Ok((state, clique))
}

/// 16 bytes as a UUID (`8-4-4-4-12` lower-case hex).
fn uuid_text(bytes: &[u8; 16]) -> String {
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// Row remapping state.
fn remapped_rows(device: &Device<'_>, nvml: &Nvml) -> Result<RemappedRows, NvmlError> {
    let (correctable, uncorrectable, pending, failure) =
        crate::vendor::nvml::remapped_rows(device, nvml)?;
    Ok(RemappedRows {
        correctable,
        uncorrectable,
        pending,
        failure,
    })
}

/// Which way each batched value was read on one GPU (`NvmlGpu::read_paths`).
#[derive(Default)]
struct Paths(std::collections::BTreeMap<String, ReadPath>);

impl Paths {
    /// One value read per call anywhere on the GPU makes that value's path `per_call`.
    fn note(&mut self, what: &str, path: ReadPath) {
        let e = self.0.entry(what.to_string()).or_insert(path);
        if path == ReadPath::PerCall {
            *e = ReadPath::PerCall;
        }
    }
}

fn health(
    watch: &Watch,
    index: u32,
    device: &Device<'_>,
    nvml: &Nvml,
    fields: &Fields,
    paths: &mut Paths,
) -> GpuHealth {
    use crate::vendor::nvml::{EccCounter, MemoryError};
    let call = |what: &str| format!("{what}(GPU {index})");
    let ecc = match fields.get(field::ECC_DBE_VOLATILE_TOTAL, 0) {
        Ok(v) => {
            paths.note("ecc_uncorrected_volatile", ReadPath::FieldValues);
            Observed::Value(v)
        }
        Err(_) => {
            paths.note("ecc_uncorrected_volatile", ReadPath::PerCall);
            observed(
                &call("nvmlDeviceGetTotalEccErrors"),
                watch.call(call("nvmlDeviceGetTotalEccErrors"), || {
                    device.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
                }),
            )
        }
    };
    let row = |f: u32| fields.get(f, 0).ok().and_then(|v| u32::try_from(v).ok());
    let remapped = match (
        row(field::REMAPPED_CORRECTABLE),
        row(field::REMAPPED_UNCORRECTABLE),
        row(field::REMAPPED_PENDING),
        row(field::REMAPPED_FAILURE),
    ) {
        (Some(correctable), Some(uncorrectable), Some(pending), Some(failure)) => {
            paths.note("remapped_rows", ReadPath::FieldValues);
            Observed::Value(RemappedRows {
                correctable,
                uncorrectable,
                pending: pending != 0,
                failure: failure != 0,
            })
        }
        _ => {
            paths.note("remapped_rows", ReadPath::PerCall);
            observed(
                &call("nvmlDeviceGetRemappedRows"),
                watch.call(call("nvmlDeviceGetRemappedRows"), || {
                    remapped_rows(device, nvml)
                }),
            )
        }
    };
    GpuHealth {
        ecc_uncorrected_volatile: ecc,
        remapped_rows: remapped,
        retired_pages_pending: observed(
            &call("nvmlDeviceGetRetiredPagesPendingStatus"),
            watch.call(call("nvmlDeviceGetRetiredPagesPendingStatus"), || {
                device.are_pages_pending_retired()
            }),
        ),
        // A field only: no per-call function gives it.
        recovery_action: observed(
            &call("NVML_FI_DEV_GET_GPU_RECOVERY_ACTION"),
            fields
                .get(field::GPU_RECOVERY_ACTION, 0)
                .and_then(|v| u32::try_from(v).map_err(|_| NvmlError::Unknown)),
        ),
    }
}

/// The non-zero NVLink error counters of one link (zero and unsupported ones left out,
/// which keeps saved facts small: 4 counters x 18 links x 8 GPUs). Replay, recovery and
/// CRC flit come from the batch where the driver answers them, at no cost; CRC data has
/// no matching field (see `field`) and is read per call, ~1 ms a link on the H200, only
/// with `per_call` (the facts no check judges), as are counters the driver refuses as
/// fields.
fn link_errors(
    watch: &Watch,
    (index, link): (u32, u32),
    wrapper: &crate::vendor::nvml::NvLink<'_, '_>,
    fields: &Fields,
    paths: &mut Paths,
    per_call: bool,
) -> std::collections::BTreeMap<String, u64> {
    use crate::vendor::nvml::ErrorCounter;
    let mut out = std::collections::BTreeMap::new();
    for (name, batched, counter) in [
        (
            "replay",
            Some(field::NVLINK_ERROR_DL_REPLAY),
            ErrorCounter::DlReplay,
        ),
        (
            "recovery",
            Some(field::NVLINK_ERROR_DL_RECOVERY),
            ErrorCounter::DlRecovery,
        ),
        (
            "crc_flit",
            Some(field::NVLINK_ERROR_DL_CRC),
            ErrorCounter::DlCrcFlit,
        ),
        ("crc_data", None, ErrorCounter::DlCrcData),
    ] {
        let value = match batched.map(|f| fields.get(f, link)) {
            Some(Ok(v)) => {
                paths.note("nvlink_errors", ReadPath::FieldValues);
                Ok(v)
            }
            _ if !per_call => continue,
            refused => {
                let call =
                    format!("nvmlDeviceGetNvLinkErrorCounter(GPU {index}, link {link}, {name})");
                let r = watch.call(call, || wrapper.error_counter(counter));
                if refused.is_some() && r.is_ok() {
                    paths.note("nvlink_errors", ReadPath::PerCall);
                }
                r
            }
        };
        if let Ok(v) = value
            && v > 0
        {
            out.insert(name.to_string(), v);
        }
    }
    out
}

/// A link NVML reports a state for, before its remote end is read.
struct LinkState {
    link: u32,
    active: bool,
    version: Observed<String>,
}

/// State and version of every link the GPU has: from the batch where the driver answers
/// both fields for the link (a version of 0 is no link), else per call, where links the
/// GPU does not have answer NotSupported or InvalidArg. A link whose state could not be
/// read is left out, with the first such error: unread is not down (issue 39 row 2: an
/// NVML without nvmlDeviceGetNvLinkState read as 144 broken links).
fn link_states(
    watch: &Watch,
    index: u32,
    device: &Device<'_>,
    fields: &Fields,
    paths: &mut Paths,
) -> (Vec<LinkState>, Option<FactError>) {
    let mut out = Vec::new();
    let mut unread = None;
    for link in 0..MAX_LINKS {
        let batched = (
            fields.get(field::NVLINK_GET_STATE, link),
            fields
                .get(field::NVLINK_GET_VERSION, link)
                .ok()
                .and_then(|v| u32::try_from(v).ok())
                .filter(|v| *v > 0),
        );
        if let (Ok(state), Some(version)) = batched {
            paths.note("nvlink_state", ReadPath::FieldValues);
            paths.note("nvlink_version", ReadPath::FieldValues);
            out.push(LinkState {
                link,
                // nvml.h NVML_NVLINK_STATE_*: 0 inactive, 1 active, 2 sleep (a low-power
                // state of a trained link, which wakes on traffic).
                active: state != 0,
                version: Observed::Value(nvlink_version(version)),
            });
            continue;
        }
        let wrapper = device.link_wrapper_for(link);
        let call = format!("nvmlDeviceGetNvLinkState(GPU {index}, link {link})");
        let active = match watch.call(call.clone(), || wrapper.is_active()) {
            Ok(a) => a,
            // Links the GPU does not have answer NotSupported or InvalidArg.
            Err(NvmlError::NotSupported | NvmlError::InvalidArg) => continue,
            Err(e) => {
                let e = fact_error(&call, &e);
                // A function the library lacks is lacking for every link.
                let absent = e.kind == Some(crate::facts::FailureKind::NotInLibrary);
                unread.get_or_insert(e);
                if absent {
                    break;
                }
                continue;
            }
        };
        paths.note("nvlink_state", ReadPath::PerCall);
        paths.note("nvlink_version", ReadPath::PerCall);
        let name = format!("nvmlDeviceGetNvLinkVersion(GPU {index}, link {link})");
        out.push(LinkState {
            link,
            active,
            version: observed(&name, watch.call(name.clone(), || wrapper.version()))
                .map(nvlink_version),
        });
    }
    (out, unread)
}

/// The batch of one GPU: per link state, version, speed and error counters, and the
/// per-GPU fields (a field more costs nothing measurable: 54 or 125 entries, ~16 ms).
fn requests() -> Vec<(u32, u32)> {
    let mut out = Vec::new();
    for link in 0..MAX_LINKS {
        out.extend([
            (field::NVLINK_GET_STATE, link),
            (field::NVLINK_GET_VERSION, link),
            (field::NVLINK_GET_SPEED, link),
            (field::NVLINK_ERROR_DL_REPLAY, link),
            (field::NVLINK_ERROR_DL_RECOVERY, link),
            (field::NVLINK_ERROR_DL_CRC, link),
        ]);
    }
    out.extend([
        (field::NVLINK_SPEED_MBPS_COMMON, 0),
        (field::NVSWITCH_CONNECTED_LINK_COUNT, 0),
        (field::GPU_RECOVERY_ACTION, 0),
        (field::ECC_DBE_VOLATILE_TOTAL, 0),
        (field::REMAPPED_CORRECTABLE, 0),
        (field::REMAPPED_UNCORRECTABLE, 0),
        (field::REMAPPED_PENDING, 0),
        (field::REMAPPED_FAILURE, 0),
    ]);
    out
}

/// One NVLink of GPU `index`: its remote end (an NVSwitch without asking where
/// `all_switch` says every link ends at one) and its error counters.
fn nvlink(
    watch: &Watch,
    (nvml, device, index): (&Nvml, &Device<'_>, u32),
    LinkState {
        link,
        active,
        version,
    }: LinkState,
    all_switch: bool,
    fields: &Fields,
    paths: &mut Paths,
    unjudged: bool,
) -> NvLink {
    let wrapper = device.link_wrapper_for(link);
    let name = |what: &str| format!("{what}(GPU {index}, link {link})");
    let remote_type = if all_switch {
        paths.note("nvlink_remote_type", ReadPath::FieldValues);
        Observed::Value("switch".to_string())
    } else {
        paths.note("nvlink_remote_type", ReadPath::PerCall);
        observed(
            &name("nvmlDeviceGetNvLinkRemoteDeviceType"),
            watch.call(name("nvmlDeviceGetNvLinkRemoteDeviceType"), || {
                remote_type(device, nvml, link)
            }),
        )
    };
    // NVML gives no bus id for an NVSwitch (ffffffff:ff:ff.0 on the H200), and
    // nothing reads one: the call is saved.
    let remote_pci_bus_id = if remote_type.value().is_some_and(|t| t == "switch") {
        Observed::Error(FactError::new(
            name("nvmlDeviceGetNvLinkRemotePciInfo_v2"),
            "not read: an NVSwitch end, which has no bus id in NVML",
        ))
    } else {
        observed(
            &name("nvmlDeviceGetNvLinkRemotePciInfo_v2"),
            watch.call(name("nvmlDeviceGetNvLinkRemotePciInfo_v2"), || {
                wrapper.remote_pci_info()
            }),
        )
        .map(|p| normalize_bus_id(&p.bus_id))
    };
    NvLink {
        link,
        active,
        version,
        remote_pci_bus_id,
        remote_type,
        error_counters: link_errors(watch, (index, link), &wrapper, fields, paths, unjudged),
    }
}

/// The NUMA nodes close to the GPU, read only with `unjudged` (no check judges them).
fn numa_affinity(
    watch: &Watch,
    index: u32,
    device: &Device<'_>,
    unjudged: bool,
) -> Option<Observed<String>> {
    if !unjudged {
        return None;
    }
    let call = format!("nvmlDeviceGetMemoryAffinity(GPU {index})");
    // One word holds 64 NUMA nodes; scope 0 is NVML_AFFINITY_SCOPE_NODE.
    let words = watch.call(call.clone(), || device.memory_affinity(1, 0));
    Some(observed(&call, words).map(|words| cpu_list(&words)))
}

fn gpu(watch: &Watch, nvml: &Nvml, index: u32, device: &Device<'_>, unjudged: bool) -> NvmlGpu {
    let call = |what: &str| format!("{what}(GPU {index})");
    let requests = requests();
    let fields = watch.call(call("nvmlDeviceGetFieldValues"), || {
        Fields::read(device, nvml, &requests)
    });
    let mut paths = Paths::default();
    let (states, nvlinks_unread) = link_states(watch, index, device, &fields, &mut paths);
    // Every link the GPU has ends at an NVSwitch when NVML counts as many
    // NVSwitch-connected links as the GPU has links: then no link needs asking.
    let all_switch = fields
        .get(field::NVSWITCH_CONNECTED_LINK_COUNT, 0)
        .is_ok_and(|n| n > 0 && n == states.len() as u64);
    let links: Vec<NvLink> = states
        .into_iter()
        .map(|state| {
            nvlink(
                watch,
                (nvml, device, index),
                state,
                all_switch,
                &fields,
                &mut paths,
                unjudged,
            )
        })
        .collect();
    let first_active = links.iter().find(|l| l.active).map(|l| l.link);
    let speed = nvlink_speed(&fields, first_active);
    let health = health(watch, index, device, nvml, &fields, &mut paths);
    macro_rules! ask {
        ($what:literal, $e:expr) => {
            observed(&call($what), watch.call(call($what), || $e))
        };
    }
    let fabric = ask!("nvmlDeviceGetGpuFabricInfo", fabric_info(device, nvml));
    NvmlGpu {
        index,
        name: ask!("nvmlDeviceGetName", device.name()),
        uuid: ask!("nvmlDeviceGetUUID", device.uuid()),
        pci_bus_id: ask!("nvmlDeviceGetPciInfo_v3", device.pci_info())
            .map(|p| normalize_bus_id(&p.bus_id)),
        compute_capability: ask!(
            "nvmlDeviceGetCudaComputeCapability",
            device.cuda_compute_capability()
        )
        .map(|c| format!("{}.{}", c.major, c.minor)),
        memory_bytes: ask!("nvmlDeviceGetMemoryInfo_v2", device.memory_info()).map(|m| m.total),
        numa_node: ask!("nvmlDeviceGetNumaNodeId", device.numa_node_id()),
        numa_affinity: numa_affinity(watch, index, device, unjudged),
        // Not judged: the gates leave it unread (14.6 ms on the 2x H200: NVML builds its
        // topology on the first such query).
        cpu_affinity: unjudged.then(|| {
            ask!("nvmlDeviceGetCpuAffinity", device.cpu_affinity(16)).map(|words| cpu_list(&words))
        }),
        persistence_mode: ask!(
            "nvmlDeviceGetPersistenceMode",
            device.is_in_persistent_mode()
        ),
        mig_mode: ask!("nvmlDeviceGetMigMode", device.mig_mode()).map(|m| m.current == 1),
        nvlink_speed_mbps: observed(&call("nvmlDeviceGetFieldValues"), speed),
        pcie_max_generation: ask!(
            "nvmlDeviceGetMaxPcieLinkGeneration",
            device.max_pcie_link_gen()
        ),
        pcie_max_width: ask!(
            "nvmlDeviceGetMaxPcieLinkWidth",
            device.max_pcie_link_width()
        ),
        fabric_state: fabric.clone().map(|(state, _)| state),
        fabric_clique: fabric.value().and_then(|(_, clique)| clique.clone()),
        nvlinks: links,
        nvlinks_unread,
        read_paths: paths.0,
        health: Some(health),
    }
}

/// What to read of a pair beyond the P2P read and write status gpu-p2p judges.
struct PairReads {
    /// The other P2P capabilities (doctor's matrices).
    all_p2p: bool,
    /// The PCIe path: judged only where the two GPUs share no NVLink (the link label
    /// is NV<n> otherwise). NVML's first topology query builds its topology: 18.9 ms of
    /// the 2x H200's `check --cuda off`.
    common_ancestor: bool,
}

/// One ordered pair of GPUs.
fn pair(
    watch: &Watch,
    nvml: &Nvml,
    (a, b): ((u32, &Device<'_>), (u32, &Device<'_>)),
    reads: &PairReads,
) -> GpuPair {
    let p2p = |index: P2pCapabilitiesIndex, label: &str| {
        let name = format!("nvmlDeviceGetP2PStatus(GPU {}, GPU {}, {label})", a.0, b.0);
        observed(
            &name,
            watch.call(name.clone(), || a.1.p2p_status(b.1, index)),
        )
        .map(|s| p2p_status(&s))
    };
    let name = format!(
        "nvmlDeviceGetTopologyCommonAncestor(GPU {}, GPU {})",
        a.0, b.0
    );
    GpuPair {
        a: a.0,
        b: b.0,
        // nvml-wrapper takes the other device by value, so it gets a handle of its own.
        common_ancestor: reads.common_ancestor.then(|| {
            observed(
                &name,
                watch.call(name.clone(), || {
                    nvml.device_by_index(b.0)
                        .and_then(|other| a.1.topology_common_ancestor(other))
                }),
            )
            .map(|t| topology_label(&t).to_string())
        }),
        p2p_read: p2p(P2pCapabilitiesIndex::Read, "read"),
        p2p_write: p2p(P2pCapabilitiesIndex::Write, "write"),
        // Not judged: a P2P status costs 1.7 ms per pair and capability on the 2x H200,
        // and an 8-GPU node has 56 pairs.
        p2p_nvlink: reads
            .all_p2p
            .then(|| p2p(P2pCapabilitiesIndex::NvLink, "nvlink")),
        p2p_atomics: reads
            .all_p2p
            .then(|| p2p(P2pCapabilitiesIndex::Atomics, "atomics")),
        p2p_prop: reads
            .all_p2p
            .then(|| p2p(P2pCapabilitiesIndex::Prop, "prop")),
    }
}

fn lost<T>(call: &str, e: &NvmlError) -> Observed<T> {
    Observed::Error(fact_error(call, e))
}

/// A GPU NVML gives no handle for: its index, with every fact the error of that call.
fn lost_gpu(index: u32, call: &str, e: &NvmlError) -> NvmlGpu {
    NvmlGpu {
        index,
        name: lost(call, e),
        uuid: lost(call, e),
        pci_bus_id: lost(call, e),
        compute_capability: lost(call, e),
        memory_bytes: lost(call, e),
        numa_node: lost(call, e),
        numa_affinity: Some(lost(call, e)),
        cpu_affinity: Some(lost(call, e)),
        persistence_mode: lost(call, e),
        mig_mode: lost(call, e),
        nvlink_speed_mbps: lost(call, e),
        pcie_max_generation: lost(call, e),
        pcie_max_width: lost(call, e),
        fabric_state: lost(call, e),
        fabric_clique: None,
        nvlinks: Vec::new(),
        nvlinks_unread: Some(fact_error(call, e)),
        read_paths: Default::default(),
        health: None,
    }
}

/// Every ordered pair of the GPUs NVML gave a handle for.
fn pairs(
    watch: &Watch,
    nvml: &Nvml,
    devices: &[(u32, Device<'_>)],
    gpus: &[NvmlGpu],
    unjudged: bool,
) -> Vec<GpuPair> {
    let mut pairs = Vec::new();
    let by_index = |i: u32| gpus.iter().find(|g| g.index == i);
    for (ia, da) in devices {
        for (ib, db) in devices {
            if ia != ib {
                let nvlinked = by_index(*ia)
                    .zip(by_index(*ib))
                    .is_some_and(|(ga, gb)| crate::topology::matrix::nvlinks_between(ga, gb) > 0);
                let reads = PairReads {
                    all_p2p: unjudged,
                    common_ancestor: unjudged || !nvlinked,
                };
                pairs.push(pair(watch, nvml, ((*ia, da), (*ib, db)), &reads));
            }
        }
    }
    pairs
}

/// Loads NVML from `library` and reads every GPU fact (those no check judges, the
/// NVLink error counters and the NUMA affinity, only with `unjudged`).
pub fn gather(watch: &Watch, library: &str, unjudged: bool) -> Outcome {
    let nvml = match crate::vendor::nvml::init(watch, library) {
        Ok(n) => n,
        Err(LoadError::Missing(message)) => return Outcome::NotFound(message),
        Err(LoadError::Failed(e)) => return Outcome::Failed(e),
    };
    let count = match watch.call("nvmlDeviceGetCount_v2", || nvml.device_count()) {
        Ok(n) => n,
        Err(e) => return Outcome::Failed(fact_error("nvmlDeviceGetCount_v2", &e)),
    };
    let mut devices = Vec::new();
    let mut gpus = Vec::new();
    for index in 0..count {
        match watch.call(format!("nvmlDeviceGetHandleByIndex_v2({index})"), || {
            nvml.device_by_index(index)
        }) {
            Ok(d) => {
                gpus.push(gpu(watch, &nvml, index, &d, unjudged));
                devices.push((index, d));
            }
            Err(e) => {
                // A lost GPU: keep the index with every fact in error.
                let call = format!("nvmlDeviceGetHandleByIndex_v2({index})");
                gpus.push(lost_gpu(index, &call, &e));
            }
        }
    }
    let pairs = pairs(watch, &nvml, &devices, &gpus, unjudged);
    Outcome::Loaded(NvmlFacts {
        driver_version: observed(
            "nvmlSystemGetDriverVersion",
            watch.call("nvmlSystemGetDriverVersion", || nvml.sys_driver_version()),
        ),
        cuda_driver_version: observed(
            "nvmlSystemGetCudaDriverVersion_v2",
            watch.call("nvmlSystemGetCudaDriverVersion_v2", || {
                nvml.sys_cuda_driver_version()
            }),
        ),
        gpus,
        pairs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(cpu_list(&[0xffff_ffff]), "0-31");
        assert_eq!(cpu_list(&[0b1011, 1]), "0-1,3,64");
        assert_eq!(cpu_list(&[u64::MAX, 1]), "0-64");
        assert_eq!(cpu_list(&[0]), "");
    }
}
