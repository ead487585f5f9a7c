//! The CUDA driver API (libcuda.so.1), dlopen'ed: cuInit, device count, PCI bus
//! ids and peer access. It catches what NVML does not: cuInit fails with
//! CUDA_ERROR_SYSTEM_NOT_READY (802) on an NVSwitch system whose fabric manager
//! is not running, and cuDeviceCanAccessPeer answers for the runtime NCCL uses.
//! The driver applies CUDA_VISIBLE_DEVICES itself, so ordinals here are the
//! process's CUDA ordinals.

use crate::facts::gpu::{CudaDevice, CudaFacts, PeerAccess, normalize_bus_id};
use crate::facts::{FactError, FailureKind, Observed};
use crate::gather::deadline::Watch;
use crate::gather::dl::{Library, Symbol};
use std::ffi::{CStr, c_char, c_int, c_uint};

type CuResult = c_int;
type CuInit = unsafe extern "C" fn(c_uint) -> CuResult;
type CuIntOut = unsafe extern "C" fn(*mut c_int) -> CuResult;
type CuDeviceGet = unsafe extern "C" fn(*mut c_int, c_int) -> CuResult;
type CuDeviceGetPciBusId = unsafe extern "C" fn(*mut c_char, c_int, c_int) -> CuResult;
type CuDeviceCanAccessPeer = unsafe extern "C" fn(*mut c_int, c_int, c_int) -> CuResult;

/// CUresult names for the codes this tool reports (cuda.h).
pub fn result_name(code: i32) -> &'static str {
    match code {
        0 => "CUDA_SUCCESS",
        1 => "CUDA_ERROR_INVALID_VALUE",
        3 => "CUDA_ERROR_NOT_INITIALIZED",
        34 => "CUDA_ERROR_STUB_LIBRARY",
        35 => "CUDA_ERROR_INSUFFICIENT_DRIVER",
        46 => "CUDA_ERROR_DEVICE_UNAVAILABLE",
        100 => "CUDA_ERROR_NO_DEVICE",
        101 => "CUDA_ERROR_INVALID_DEVICE",
        304 => "CUDA_ERROR_OPERATING_SYSTEM",
        800 => "CUDA_ERROR_NOT_PERMITTED",
        801 => "CUDA_ERROR_NOT_SUPPORTED",
        802 => "CUDA_ERROR_SYSTEM_NOT_READY",
        803 => "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
        804 => "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
        999 => "CUDA_ERROR_UNKNOWN",
        _ => "CUDA_ERROR (unlisted code)",
    }
}

fn failure(call: &str, code: CuResult) -> FactError {
    FactError::new(call, format!("{} ({code})", result_name(code)))
}

/// How loading libcuda ended.
pub type Outcome = crate::gather::Outcome<CudaFacts>;

struct Api {
    init: Symbol<CuInit>,
    driver_version: Symbol<CuIntOut>,
    device_count: Symbol<CuIntOut>,
    device_get: Symbol<CuDeviceGet>,
    bus_id: Symbol<CuDeviceGetPciBusId>,
    can_access_peer: Symbol<CuDeviceCanAccessPeer>,
}

impl Api {
    fn load(lib: &Library) -> Result<Api, FactError> {
        Ok(Api {
            init: lib.symbol("cuInit")?,
            driver_version: lib.symbol("cuDriverGetVersion")?,
            device_count: lib.symbol("cuDeviceGetCount")?,
            device_get: lib.symbol("cuDeviceGet")?,
            bus_id: lib.symbol("cuDeviceGetPCIBusId")?,
            can_access_peer: lib.symbol("cuDeviceCanAccessPeer")?,
        })
    }
}

fn int_out(watch: &Watch, name: &str, f: &Symbol<CuIntOut>) -> Result<i32, FactError> {
    let mut value: c_int = 0;
    // SAFETY: the symbol has the cuda.h signature `CUresult f(int*)`; `value` is a valid out-pointer.
    let rc = watch.call(name, || unsafe { (f.get())(&mut value) });
    if rc == 0 {
        Ok(value)
    } else {
        Err(failure(name, rc))
    }
}

/// cuDeviceCanAccessPeer for every ordered pair of (ordinal, device) `handles`.
fn peer_access(watch: &Watch, api: &Api, handles: &[(u32, c_int)]) -> Vec<PeerAccess> {
    let mut out = Vec::new();
    for &(a, da) in handles {
        for &(b, db) in handles {
            if a == b {
                continue;
            }
            let call = format!("cuDeviceCanAccessPeer({a}, {b})");
            let mut can: c_int = 0;
            // SAFETY: `CUresult cuDeviceCanAccessPeer(int*, CUdevice, CUdevice)`.
            let rc = watch.call(call.clone(), || unsafe {
                (api.can_access_peer.get())(&mut can, da, db)
            });
            out.push(PeerAccess {
                a,
                b,
                can_access: if rc == 0 {
                    Observed::Value(can != 0)
                } else {
                    Observed::Error(failure(&call, rc))
                },
            });
        }
    }
    out
}

/// Loads libcuda from `library` and reads devices and peer access.
pub fn gather(watch: &Watch, library: &str) -> Outcome {
    let lib = match crate::gather::dl::load(watch, library) {
        Ok(lib) => lib,
        Err(crate::gather::dl::LoadError::Missing(why)) => return Outcome::NotFound(why),
        // There but not loadable (a missing dependency, a bad ELF); gpu::mark_own_resources
        // re-marks dlopen's ENOMEM as this process's own limit.
        Err(crate::gather::dl::LoadError::Failed(e)) => {
            return Outcome::Failed(e.with_kind(FailureKind::Unloadable));
        }
    };
    let api = match Api::load(&lib) {
        Ok(api) => api,
        // A libcuda without the driver API's symbols is a stub or not the driver's.
        Err(e) => return Outcome::Failed(e.with_kind(FailureKind::Unloadable)),
    };
    // SAFETY: `CUresult cuInit(unsigned int Flags)`; flags must be 0.
    let init_result = watch.call("cuInit", || unsafe { (api.init.get())(0) });
    let driver_version = int_out(watch, "cuDriverGetVersion", &api.driver_version).into();
    let mut facts = CudaFacts {
        driver_version,
        init_result,
        init_result_name: result_name(init_result).to_string(),
        devices: Vec::new(),
        peer_access: Vec::new(),
    };
    if init_result != 0 {
        return Outcome::Loaded(facts);
    }
    let count = match int_out(watch, "cuDeviceGetCount", &api.device_count) {
        Ok(n) => n.max(0),
        Err(e) => return Outcome::Failed(e),
    };
    let mut handles = Vec::new();
    for ordinal in 0..count {
        let name = format!("cuDeviceGet({ordinal})");
        let mut dev: c_int = 0;
        // SAFETY: `CUresult cuDeviceGet(CUdevice*, int)`; CUdevice is an int.
        let rc = watch.call(name.clone(), || unsafe {
            (api.device_get.get())(&mut dev, ordinal)
        });
        let pci_bus_id = if rc != 0 {
            Observed::Error(failure(&name, rc))
        } else {
            handles.push((ordinal as u32, dev));
            let call = format!("cuDeviceGetPCIBusId({ordinal})");
            let mut buf = [0 as c_char; 64];
            // SAFETY: the buffer is 64 bytes and its length is passed; the driver NUL-terminates.
            let rc = watch.call(call.clone(), || unsafe {
                (api.bus_id.get())(buf.as_mut_ptr(), buf.len() as c_int, dev)
            });
            if rc == 0 {
                // SAFETY: buf is NUL-terminated within its length (zero-initialised, length passed).
                let text = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy();
                Observed::Value(normalize_bus_id(&text))
            } else {
                Observed::Error(failure(&call, rc))
            }
        };
        facts.devices.push(CudaDevice {
            ordinal: ordinal as u32,
            pci_bus_id,
        });
    }
    facts.peer_access = peer_access(watch, &api, &handles);
    // `lib` is never unloaded (gather::dl): libcuda after cuInit must not be.
    Outcome::Loaded(facts)
}
