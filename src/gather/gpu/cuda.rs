//! The CUDA driver's facts: cuInit, device count, PCI bus ids and peer access,
//! read through `vendor::cuda`. It catches what NVML does not: cuInit fails with
//! CUDA_ERROR_SYSTEM_NOT_READY (802) on an NVSwitch system whose fabric manager
//! is not running, and cuDeviceCanAccessPeer answers for the runtime NCCL uses.
//! The driver applies CUDA_VISIBLE_DEVICES itself, so ordinals here are the
//! process's CUDA ordinals.

use crate::facts::gpu::{CudaDevice, CudaFacts, PeerAccess, normalize_bus_id};
use crate::facts::{FactError, Observed};
use crate::vendor::cuda::{Cuda, Device, Status, result_name};
use crate::vendor::deadline::Watch;
use crate::vendor::dl::LoadError;

/// How loading libcuda ended.
pub type Outcome = crate::gather::Outcome<CudaFacts>;

fn observed<T>(r: Result<T, FactError>) -> Observed<T> {
    match r {
        Ok(v) => Observed::Value(v),
        Err(e) => Observed::Error(e),
    }
}

/// cuDeviceCanAccessPeer for every ordered pair of (ordinal, device) `handles`.
fn peer_access(cuda: &Cuda<'_>, handles: &[(u32, Device)]) -> Vec<PeerAccess> {
    let mut out = Vec::new();
    for &(a, da) in handles {
        for &(b, db) in handles {
            if a != b {
                out.push(PeerAccess {
                    a,
                    b,
                    can_access: observed(cuda.can_access_peer((a, b), da, db)),
                });
            }
        }
    }
    out
}

/// Loads libcuda from `library` and reads devices and peer access.
pub fn gather(watch: &Watch, library: &str) -> Outcome {
    let cuda = match crate::vendor::cuda::load(watch, library) {
        Ok(cuda) => cuda,
        Err(LoadError::Missing(why)) => return Outcome::NotFound(why),
        // There but not loadable, or not the driver's (kind Unloadable); gpu::mark_own_resources
        // re-marks dlopen's ENOMEM as this process's own limit.
        Err(LoadError::Failed(e)) => return Outcome::Failed(e),
    };
    let init = cuda.init();
    let mut facts = CudaFacts {
        driver_version: cuda.driver_version().into(),
        init_result: init.0,
        init_result_name: result_name(init.0).to_string(),
        devices: Vec::new(),
        peer_access: Vec::new(),
    };
    if init != Status::SUCCESS {
        return Outcome::Loaded(facts);
    }
    let count = match cuda.device_count() {
        Ok(n) => n,
        Err(e) => return Outcome::Failed(e),
    };
    let mut handles = Vec::new();
    for ordinal in 0..count {
        let pci_bus_id = match cuda.device(ordinal) {
            Err(e) => Observed::Error(e),
            Ok(dev) => {
                handles.push((ordinal, dev));
                observed(cuda.pci_bus_id(ordinal, dev).map(|t| normalize_bus_id(&t)))
            }
        };
        facts.devices.push(CudaDevice {
            ordinal,
            pci_bus_id,
        });
    }
    facts.peer_access = peer_access(&cuda, &handles);
    // libcuda is never unloaded (vendor::dl): libcuda after cuInit must not be.
    Outcome::Loaded(facts)
}
