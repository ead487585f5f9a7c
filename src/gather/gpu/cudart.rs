//! The CUDA runtime (libcudart) this image holds, found the ways a trainer loads it:
//! by soname through the dynamic loader (LD_LIBRARY_PATH, then ld.so.cache), and in
//! the nvidia-cuda-runtime Python wheel under site-packages, where PyTorch's own
//! libraries find it (their RUNPATH points at `nvidia/cuda_runtime/lib`). Its version
//! comes from cudaRuntimeGetVersion, which only returns the version the library was
//! built as (it creates no context and touches no GPU); a library that does not load
//! is dated by its file name (`libcudart.so.12.4.127`). These are this process's own
//! files (it dlopens them), not the host root's, as for libnccl.
//!
//! Also listed: NVIDIA's forward-compatibility package (cuda-compat), whose newer
//! libcuda lives in /usr/local/cuda/compat
//! (https://docs.nvidia.com/deploy/cuda-compatibility/forward-compatibility.html).

use crate::facts::Observed;
use crate::facts::gpu::{CUDA_COMPAT_DIR, CudaRuntime, CudaRuntimeFacts};
use crate::gather::host::Host;
use crate::gather::trainer_path;
use crate::vendor::cudart::RuntimeVersion;
use crate::vendor::deadline::Watch;
use crate::vendor::dl::LoadError;
use std::ffi::OsString;

/// Sonames of the runtimes that have minor-version compatibility (CUDA 11 and later),
/// newest first. CUDA 11's soname is `libcudart.so.11.0` for every 11.x.
const SONAMES: &[&str] = &["libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"];

pub use crate::gather::trainer_path::{BY_LOADER, Candidate};

/// Where found_by says a Python wheel holds it.
const BY_WHEEL: &str = "python wheel";

/// The libcudart files in a wheel's `nvidia/cuda_runtime/lib` under `packages`.
fn wheel_files(own: &Host, packages: &str, out: &mut Vec<Candidate>) {
    let dir = format!("{}/nvidia/cuda_runtime/lib", packages.trim_end_matches('/'));
    let Ok(Some(entries)) = own.list_dir(&dir) else {
        return;
    };
    for file in entries.iter().filter(|e| e.starts_with("libcudart.so.")) {
        let name = format!("{dir}/{file}");
        if own.path(&name).is_file() && !out.iter().any(|c| c.name == name) {
            out.push(Candidate::new(BY_WHEEL, name));
        }
    }
}

/// Every place to look, in order: `explicit` alone when given (`--cudart-lib`); else
/// the sonames through the loader, then the wheels in every Python site directory the
/// trainer's interpreter searches (`trainer_path::python_site_dirs`).
pub fn locations(explicit: Option<&str>, env: &[(OsString, OsString)]) -> Vec<Candidate> {
    if let Some(path) = explicit {
        return vec![Candidate::new("--cudart-lib", path)];
    }
    let mut out: Vec<Candidate> = SONAMES
        .iter()
        .map(|s| Candidate::new(BY_LOADER, *s))
        .collect();
    let own = Host::new("/");
    for site in trainer_path::python_site_dirs(&own, env) {
        wheel_files(&own, &site.dir, &mut out);
    }
    out
}

/// The CUDA version a file name carries (`libcudart.so.12.4.127` -> 12040); `None` when
/// it names only the major version (`libcudart.so.12`), which says nothing of the minor.
fn version_from_name(name: &str) -> Option<i32> {
    let file = name.rsplit('/').next()?;
    let rest = file.strip_prefix("libcudart.so.")?;
    let mut parts = rest.split('.');
    let major: i32 = parts.next()?.parse().ok()?;
    let minor: i32 = parts.next()?.parse().ok()?;
    (major > 0 && (0..100).contains(&minor)).then_some(major * 1000 + minor * 10)
}

/// The forward-compatibility libcuda files in `CUDA_COMPAT_DIR`, sorted.
fn compat_files() -> Vec<String> {
    match Host::new("/").list_dir(CUDA_COMPAT_DIR) {
        Ok(Some(entries)) => entries
            .into_iter()
            .filter(|e| e.starts_with("libcuda.so"))
            .collect(),
        _ => Vec::new(),
    }
}

fn runtime(c: &Candidate, answer: RuntimeVersion) -> CudaRuntime {
    let (version, path) = match answer {
        RuntimeVersion::Answered { version, path } => (version.into(), path),
        RuntimeVersion::NoSymbol(e) => (
            version_from_name(&c.name).map_or(Observed::Error(e), Observed::Value),
            None,
        ),
    };
    CudaRuntime {
        found_by: c.found_by.clone(),
        path: path.unwrap_or_else(|| c.name.clone()),
        version,
    }
}

/// Loads each candidate and reads its version. Libraries are closed again: nothing of
/// them was initialised.
pub fn gather(watch: &Watch, candidates: &[Candidate]) -> CudaRuntimeFacts {
    let mut facts = CudaRuntimeFacts {
        libraries: Vec::new(),
        attempts: Vec::new(),
        compat_libcuda: compat_files(),
        skipped: None,
    };
    for c in candidates {
        match crate::vendor::cudart::probe(watch, &c.name) {
            Ok(answer) => {
                let runtime = runtime(c, answer);
                facts.attempts.push(format!("{}: loaded", c.name));
                // The same file reached two ways (a wheel directory on LD_LIBRARY_PATH) is listed once.
                if !facts.libraries.iter().any(|r| r.path == runtime.path) {
                    facts.libraries.push(runtime);
                }
            }
            Err(LoadError::Missing(_)) => {
                facts.attempts.push(format!("{}: not found", c.name));
            }
            Err(LoadError::Failed(e)) => {
                facts.attempts.push(e.message.clone());
                // Present but not loadable here: the file name may still date it.
                facts.libraries.push(CudaRuntime {
                    found_by: c.found_by.clone(),
                    path: c.name.clone(),
                    version: version_from_name(&c.name).map_or(Observed::Error(e), Observed::Value),
                });
            }
        }
    }
    facts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_from_file_names() {
        assert_eq!(version_from_name("libcudart.so.12.4.127"), Some(12040));
        assert_eq!(version_from_name("/x/y/libcudart.so.11.0.221"), Some(11000));
        assert_eq!(version_from_name("libcudart.so.10.2"), Some(10020));
        assert_eq!(version_from_name("libcudart.so.12"), None);
        assert_eq!(version_from_name("libcudart.so.x.y"), None);
        assert_eq!(version_from_name("libcuda.so.1"), None);
    }

    #[test]
    fn explicit_library_is_the_only_candidate() {
        let got = locations(Some("/opt/cudart/libcudart.so.12"), &[]);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].found_by, "--cudart-lib");
    }

    #[test]
    fn sonames_come_first_then_wheels_on_pythonpath() {
        let dir = std::env::temp_dir().join(format!("cudart-wheel-{}", std::process::id()));
        let lib = dir.join("nvidia/cuda_runtime/lib");
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::write(lib.join("libcudart.so.12"), b"").unwrap();
        std::fs::write(lib.join("README"), b"").unwrap();
        let env = [(
            OsString::from("PYTHONPATH"),
            OsString::from(format!("relative:{}", dir.display())),
        )];
        let got = locations(None, &env);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(got[0].name, "libcudart.so.13");
        let wheel: Vec<&Candidate> = got.iter().filter(|c| c.found_by == BY_WHEEL).collect();
        assert!(
            wheel
                .iter()
                .any(|c| c.name == format!("{}/libcudart.so.12", lib.display())),
            "{got:?}"
        );
        assert!(!got.iter().any(|c| c.name.ends_with("README")));
    }
}
