//! NVML (libnvidia-ml.so.1) through nvml-wrapper, which loads it with libloading.
//! Everything of NVML the crate uses comes through here: [`init`] (the one place
//! NVML is loaded, telling an absent library from a broken one and a stopped
//! driver), the wrapper's typed API re-exported, and the calls nvml-wrapper 0.13
//! does not wrap or wraps wrongly, made on its resolved symbols with their nvml.h
//! types. Callers run each call under their `Watch`.

use crate::facts::{FactError, FailureKind};
use crate::vendor::deadline::Watch;
use crate::vendor::dl::LoadError;
use nvml_wrapper_sys::bindings::{nvmlFieldValue_t, nvmlGpuFabricInfo_t};
use std::ffi::OsStr;

pub use nvml_wrapper::bitmasks::event::EventTypes;
pub use nvml_wrapper::enum_wrappers::device::{
    EccCounter, MemoryError, P2pCapabilitiesIndex, P2pStatus, TopologyLevel,
};
pub use nvml_wrapper::enum_wrappers::nv_link::ErrorCounter;
pub use nvml_wrapper::enums::event::XidError;
pub use nvml_wrapper::error::NvmlError;
pub use nvml_wrapper::{Device, EventSet, NvLink, Nvml};

/// nvmlInit_v2 on `library` (loaded by nvml-wrapper) under `watch`. `Missing` when the
/// library is not installed; `Failed` with kind `Unloadable` when it exists but does not
/// load, `NotInLibrary` when it has no nvmlInit_v2, `DriverNotLoaded` when the kernel
/// driver is not running.
pub fn init(watch: &Watch, library: &str) -> Result<Nvml, LoadError> {
    let failed = |e: FactError| Err(LoadError::Failed(e));
    // nvml-wrapper's init calls nvmlSystemGetDriverVersion after nvmlInit_v2 (to pick
    // its field-id scheme): a hang in either is named.
    match watch.call("nvmlInit_v2, nvmlSystemGetDriverVersion", || {
        Nvml::builder().lib_path(OsStr::new(library)).init()
    }) {
        Ok(n) => Ok(n),
        Err(NvmlError::LibloadingError(e)) => {
            let message = e.to_string();
            // dlopen says "cannot open shared object file" only when the file itself is
            // absent; anything else (a dependency missing, a bad ELF) is a broken install.
            if crate::vendor::dl::is_missing(library, &message) {
                Err(LoadError::Missing(message))
            } else {
                failed(
                    FactError::new(format!("dlopen({library})"), message)
                        .with_kind(FailureKind::Unloadable),
                )
            }
        }
        Err(e @ NvmlError::FailedToLoadSymbol(_)) => failed(fact_error("nvmlInit_v2", &e)),
        Err(e @ NvmlError::DriverNotLoaded) => {
            failed(FactError::new("nvmlInit_v2", e).with_kind(FailureKind::DriverNotLoaded))
        }
        Err(e) => failed(FactError::new("nvmlInit_v2", e)),
    }
}

/// A failed NVML call as a fact, with the kind that decides what a check may say of it
/// (issue 39 row 2: a query that could not be made is never a state of the hardware):
/// the function is not in this library, the call failed without an answer, or the driver
/// says the GPU is lost. NOT_SUPPORTED and INVALID_ARGUMENT are answers (this GPU has no
/// such thing, no such link) and keep no kind.
pub fn fact_error(call: &str, e: &NvmlError) -> FactError {
    let function = call.split('(').next().unwrap_or(call);
    match e {
        // nvml-wrapper resolves every symbol when it loads the library and hands back
        // dlsym's error (glibc: "PATH: undefined symbol: NAME") when one is called.
        NvmlError::FailedToLoadSymbol(dlerror) => {
            let message = match dlerror.rsplit_once(": undefined symbol: ") {
                Some((path, name)) => {
                    format!("{name} is not in this NVML ({})", library_file(path))
                }
                None => format!("{function} is not in this NVML ({dlerror})"),
            };
            FactError::new(call, message).with_kind(FailureKind::NotInLibrary)
        }
        NvmlError::FunctionNotFound => FactError::new(
            call,
            format!("{function} is not implemented by this NVML (NVML_ERROR_FUNCTION_NOT_FOUND)"),
        )
        .with_kind(FailureKind::NotInLibrary),
        // nvml.h: "the GPU has fallen off the bus or has otherwise become inaccessible",
        // and "the GPU requires a reset before it can be used again".
        NvmlError::GpuLost | NvmlError::ResetRequired => {
            FactError::new(call, e).with_kind(FailureKind::GpuLost)
        }
        NvmlError::NotSupported | NvmlError::InvalidArg => FactError::new(call, e),
        _ => FactError::new(call, e).with_kind(FailureKind::CallFailed),
    }
}

/// The library as dlerror named it, and the file it resolves to where that names the
/// driver release (`libnvidia-ml.so.1` -> `libnvidia-ml.so.535.104.05`), so the finding
/// can say which NVML this is even where nvmlSystemGetDriverVersion is missing too.
fn library_file(path: &str) -> String {
    let resolved = std::fs::canonicalize(path).ok();
    let name = resolved
        .as_deref()
        .and_then(std::path::Path::file_name)
        .map(|n| n.to_string_lossy().into_owned());
    match name {
        Some(n) if !path.ends_with(&n) => format!("{path}, {n}"),
        _ => path.to_string(),
    }
}

/// An NVML return code as nvml-wrapper names it, for calls made directly.
pub fn error(rc: u32) -> NvmlError {
    NvmlError::from(rc)
}

/// nvmlDeviceGetNvLinkRemoteDeviceType: the `nvmlIntNvLinkDeviceType_t` code (0 GPU,
/// 1 IBM NPU, 2 NVSwitch). nvml-wrapper 0.13's NvLink::remote_device_type writes into
/// a temporary and always returns Unknown, so the symbol is called directly.
pub fn remote_device_type(device: &Device<'_>, nvml: &Nvml, link: u32) -> Result<u32, NvmlError> {
    let sym = nvml
        .lib()
        .nvmlDeviceGetNvLinkRemoteDeviceType
        .as_ref()
        .map_err(|e| NvmlError::FailedToLoadSymbol(e.to_string()))?;
    let mut kind: u32 = 255;
    // SAFETY: the symbol has nvml.h's type (bindgen's, in nvml-wrapper-sys); the handle
    // comes from this Nvml instance, which outlives the call; `kind` is a valid
    // out-pointer for the enum NVML writes.
    let rc = unsafe { sym(device.handle(), link, &mut kind) };
    if rc != 0 {
        return Err(error(rc));
    }
    Ok(kind)
}

/// One field's answer: its (field id, scope), and its value or the NVML return code
/// that refused it.
type FieldAnswer = ((u32, u32), Result<u64, u32>);

/// One nvmlDeviceGetFieldValues call for `(field, scope)` requests: each answer as an
/// integer, or the NVML return code that refused it; the error when the call as a whole
/// failed (`FailedToLoadSymbol` for a library without the function). nvml-wrapper
/// cannot set a field's scope, so the symbol is called directly.
pub fn field_values(
    device: &Device<'_>,
    nvml: &Nvml,
    requests: &[(u32, u32)],
) -> Result<Vec<FieldAnswer>, NvmlError> {
    let sym = nvml
        .lib()
        .nvmlDeviceGetFieldValues
        .as_ref()
        .map_err(|e| NvmlError::FailedToLoadSymbol(e.to_string()))?;
    let count = i32::try_from(requests.len()).map_err(|_| NvmlError::InvalidArg)?;
    let mut values: Vec<nvmlFieldValue_t> = requests
        .iter()
        .map(|&(field, scope)| {
            // SAFETY: a plain C struct; all-zero is valid, and NVML fills it in.
            let mut v: nvmlFieldValue_t = unsafe { std::mem::zeroed() };
            v.fieldId = field;
            v.scopeId = scope;
            v
        })
        .collect();
    // SAFETY: nvml.h's type; `values` holds `count` initialised elements (the length is
    // passed with the buffer); the handle belongs to this Nvml instance, which outlives
    // the call.
    let rc = unsafe { sym(device.handle(), count, values.as_mut_ptr()) };
    if rc != 0 {
        return Err(error(rc));
    }
    Ok(values
        .iter()
        .map(|v| ((v.fieldId, v.scopeId), decode(v)))
        .collect())
}

/// One field value as an integer.
fn decode(value: &nvmlFieldValue_t) -> Result<u64, u32> {
    if value.nvmlReturn != 0 {
        return Err(value.nvmlReturn);
    }
    // SAFETY: valueType says which union member NVML wrote.
    unsafe {
        match value.valueType {
            1 => Ok(u64::from(value.value.uiVal)),
            2 => Ok(value.value.ulVal),
            3 => Ok(value.value.ullVal),
            // A negative count is no count: NVML_ERROR_UNKNOWN (999).
            4 => u64::try_from(value.value.sllVal).map_err(|_| 999),
            5 => u64::try_from(value.value.siVal).map_err(|_| 999),
            6 => Ok(u64::from(value.value.usVal)),
            // A double (0) or a type this code does not know: not a counter.
            _ => Err(999),
        }
    }
}

/// What nvmlDeviceGetGpuFabricInfo says: the NVSwitch fabric registration state and
/// status, and the MNNVL cluster and clique the fabric placed the GPU in.
pub struct FabricInfo {
    /// NVML_GPU_FABRIC_STATE_*.
    pub state: u8,
    /// An nvmlReturn_t: the registration's result.
    pub status: u32,
    pub cluster_uuid: [u8; 16],
    pub clique_id: u32,
}

/// nvmlDeviceGetGpuFabricInfo (nvml-wrapper 0.13 does not wrap it).
pub fn gpu_fabric_info(device: &Device<'_>, nvml: &Nvml) -> Result<FabricInfo, NvmlError> {
    let sym = nvml
        .lib()
        .nvmlDeviceGetGpuFabricInfo
        .as_ref()
        .map_err(|e| NvmlError::FailedToLoadSymbol(e.to_string()))?;
    // SAFETY: a plain C struct of integers and bytes; all-zero is a valid value.
    let mut info: nvmlGpuFabricInfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: nvml.h's type; the handle belongs to this Nvml instance; `info` is a valid
    // out-pointer.
    let rc = unsafe { sym(device.handle(), &mut info) };
    if rc != 0 {
        return Err(error(rc));
    }
    Ok(FabricInfo {
        state: info.state,
        status: info.status,
        cluster_uuid: info.clusterUuid,
        clique_id: info.cliqueId,
    })
}

/// What nvmlDeviceGetRemappedRows says: (correctable, uncorrectable, pending, failure).
pub fn remapped_rows(
    device: &Device<'_>,
    nvml: &Nvml,
) -> Result<(u32, u32, bool, bool), NvmlError> {
    let sym = nvml
        .lib()
        .nvmlDeviceGetRemappedRows
        .as_ref()
        .map_err(|e| NvmlError::FailedToLoadSymbol(e.to_string()))?;
    let (mut corr, mut unc, mut pending, mut failure) = (0, 0, 0, 0);
    // SAFETY: nvml.h's type; the handle belongs to this Nvml instance; four valid
    // out-pointers.
    let rc = unsafe {
        sym(
            device.handle(),
            &mut corr,
            &mut unc,
            &mut pending,
            &mut failure,
        )
    };
    if rc != 0 {
        return Err(error(rc));
    }
    Ok((corr, unc, pending != 0, failure != 0))
}
