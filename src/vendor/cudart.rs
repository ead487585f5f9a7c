//! The CUDA runtime (libcudart): only cudaRuntimeGetVersion, which returns the
//! version the library was built as and creates no context, touching no GPU
//! (cuda_runtime_api.h). Where to look for the library is gather's business
//! (gather::gpu::cudart); loading and calling it is here.

use crate::facts::FactError;
use crate::vendor::deadline::Watch;
use crate::vendor::dl::{LoadError, path_of};
use std::ffi::{c_int, c_void};

crate::vendor::dl::symbols! {
    struct Api {
        runtime_version: "cudaRuntimeGetVersion" => fn(*mut c_int) -> c_int;
    }
}

/// What a loaded libcudart said of its version.
pub enum RuntimeVersion {
    /// It has no cudaRuntimeGetVersion (not a CUDA runtime, or a broken one).
    NoSymbol(FactError),
    /// The call's answer (a version code such as 12040 for 12.4, or the failure) and
    /// the file the loader mapped.
    Answered {
        version: Result<i32, FactError>,
        path: Option<String>,
    },
}

/// Loads `name` (it stays loaded; nothing of it is initialised) and asks its version.
pub fn probe(watch: &Watch, name: &str) -> Result<RuntimeVersion, LoadError> {
    let lib = crate::vendor::dl::load(watch, name)?;
    let api = match Api::load(&lib) {
        Ok(api) => api,
        Err(e) => return Ok(RuntimeVersion::NoSymbol(e)),
    };
    let mut code: c_int = 0;
    // SAFETY: `cudaError_t cudaRuntimeGetVersion(int*)` (cuda_runtime_api.h); it only
    // writes the int and needs no initialised device.
    let rc = watch.call("cudaRuntimeGetVersion", || unsafe {
        (api.runtime_version.get())(&mut code)
    });
    let version = if rc == 0 && code > 0 {
        Ok(code)
    } else {
        Err(FactError::new(
            "cudaRuntimeGetVersion",
            format!("cudaError {rc}, version {code}"),
        ))
    };
    Ok(RuntimeVersion::Answered {
        version,
        path: path_of(api.runtime_version.get() as *const c_void),
    })
}
