//! NCCL itself: the libnccl.so.2 the trainer's process will load (found as its
//! loader and Python find it, `locations`), its version through ncclGetVersion, and
//! every other copy the image holds; and the net plugin NCCL would load, found the way NCCL finds it (src/plugin/plugin_open.cc):
//! each NCCL_NET_PLUGIN entry as given, then as libnccl-net-<name>.so; with
//! the variable unset, libnccl-net.so. Nothing is initialised: the plugin is
//! only loaded and its ncclNetPlugin_vN symbol read. aws-ofi-nccl's install
//! directory is checked too, since a plugin there is invisible to NCCL unless
//! it is on the library search path.

use crate::facts::FactError;
use crate::facts::Observed;
use crate::facts::gpu::{Library as LibraryFact, LibraryState};
use crate::facts::rdma::{LoadAttempt, NcclCopy, NcclFacts, NcclLibrary, NetPlugin};
use crate::gather::host::Host;
use crate::gather::trainer_path::{self, Candidate};
use crate::vendor::deadline::Watch;
use crate::vendor::dl::{LoadError, is_missing};
use std::ffi::OsString;

use crate::platform::OFI_NCCL_DIRS;
use crate::vendor::nccl::NetPluginTables;

/// The names NCCL `version` (None: unknown, the newest rules) tries for its net
/// plugins, in order, or `None` when it loads none
/// ([`crate::nccl::net_plugin::net_plugin_entries`], proven against real NCCL).
fn plugin_candidates(
    env_value: Option<&str>,
    version: Option<crate::nccl::Version>,
) -> Option<Vec<String>> {
    let names: Vec<String> = crate::nccl::net_plugin::net_plugin_entries(env_value, version)
        .into_iter()
        .flatten()
        .collect();
    (!names.is_empty()).then_some(names)
}

/// The (major, minor, patch) of a loaded libnccl, when its version was read.
fn loaded_version(library: &LibraryFact<NcclLibrary>) -> Option<crate::nccl::Version> {
    crate::nccl::Version::parse(library.loaded()?.version.value()?)
}

/// The soname NCCL's library carries, and the name a bare dlopen resolves.
const SONAME: &str = "libnccl.so.2";

fn is_nccl_file(path: &str) -> bool {
    path.rsplit('/')
        .next()
        .is_some_and(|f| f.starts_with("libnccl.so"))
}

/// Every libnccl the trainer could load, in the order its process would: LD_PRELOAD;
/// where PyTorch is installed and links libnccl.so.2 dynamically, the loader's search
/// for libtorch_cuda.so's DT_NEEDED (RPATH, LD_LIBRARY_PATH, RUNPATH: the wheel's
/// `nvidia/nccl/lib`), then ld.so.cache; elsewhere LD_LIBRARY_PATH and ld.so.cache;
/// then every other copy the image holds (the nvidia-nccl wheels in each Python site
/// directory, the conda environment's lib). The first that loads is the trainer's;
/// the rest are recorded. `explicit` (`--nccl-lib`) is the only one when given.
pub fn locations(explicit: Option<&str>, env: &[(OsString, OsString)]) -> Vec<Candidate> {
    if let Some(path) = explicit {
        return vec![Candidate::new("--nccl-lib", path)];
    }
    let own = Host::new("/");
    let mut out: Vec<Candidate> = trainer_path::preload(env)
        .into_iter()
        .filter(|p| is_nccl_file(p))
        .map(|p| Candidate::new("LD_PRELOAD", p))
        .collect();
    let sites = trainer_path::python_site_dirs(&own, env);
    let in_dir = |dir: &str| {
        let path = format!("{}/{SONAME}", dir.trim_end_matches('/'));
        own.path(&path).is_file().then_some(path)
    };
    let torch = sites.iter().find_map(|s| {
        let lib = format!("{}/torch/lib/libtorch_cuda.so", s.dir);
        own.path(&lib).is_file().then_some(lib)
    });
    let linked = torch.and_then(|lib| {
        let dynamic = trainer_path::dynamic_section(&lib).ok()?;
        dynamic
            .needed
            .iter()
            .any(|n| n == SONAME)
            .then(|| trainer_path::loader_dirs(&lib, &dynamic, env))
    });
    let dirs = linked.unwrap_or_else(|| {
        trainer_path::path_list(trainer_path::env_value(env, "LD_LIBRARY_PATH"))
            .into_iter()
            .map(|d| ("LD_LIBRARY_PATH".to_string(), d))
            .collect()
    });
    for (why, dir) in dirs {
        if let Some(path) = in_dir(&dir) {
            out.push(Candidate::new(why, path));
        }
    }
    out.push(Candidate::new(trainer_path::BY_LOADER, SONAME));
    for s in &sites {
        if let Some(path) = in_dir(&format!("{}/nvidia/nccl/lib", s.dir)) {
            out.push(Candidate::new(
                format!("nvidia-nccl wheel ({})", s.found_by),
                path,
            ));
        }
    }
    if let Some(conda) = trainer_path::env_value(env, "CONDA_PREFIX").filter(|p| p.starts_with('/'))
        && let Some(path) = in_dir(&format!("{conda}/lib"))
    {
        out.push(Candidate::new("CONDA_PREFIX", path));
    }
    let mut seen = std::collections::BTreeSet::new();
    out.retain(|c| seen.insert(c.name.clone()));
    out
}

/// The names of `candidates`, for a loader that takes the first that loads.
pub fn names(candidates: &[Candidate]) -> Vec<String> {
    candidates.iter().map(|c| c.name.clone()).collect()
}

/// How one candidate loaded.
enum Probe {
    Missing(String),
    Failed(FactError),
    Loaded {
        path: String,
        version: Observed<String>,
    },
}

fn probe(watch: &Watch, name: &str) -> Probe {
    match crate::vendor::nccl::probe(watch, name) {
        Ok(p) => Probe::Loaded {
            path: p.path.unwrap_or_else(|| name.to_string()),
            version: match p.version {
                Ok(code) => Observed::Value(crate::nccl::Version::code_text(code.into())),
                Err(e) => Observed::Error(e),
            },
        },
        Err(LoadError::Missing(message)) => Probe::Missing(message),
        Err(LoadError::Failed(e)) => Probe::Failed(e),
    }
}

/// One file reached two ways (a symlink, a soname, a relative LD_LIBRARY_PATH) is one
/// copy: compared by its real path, recorded as the loader named it.
fn same_file(a: &str, b: &str) -> bool {
    let real = |p: &str| std::fs::canonicalize(p).ok();
    a == b || real(a).is_some_and(|r| Some(r) == real(b))
}

/// Loads every candidate: bare sonames first, since glibc answers a bare soname with
/// any loaded object of that DT_SONAME (elf/dl-load.c `_dl_map_object`), which would
/// hide the system copy behind a wheel's loaded by path. The trainer's library is
/// the first candidate, in the trainer's order, that loads; every copy is recorded.
fn nccl_library(
    watch: &Watch,
    candidates: &[Candidate],
) -> (LibraryFact<NcclLibrary>, Vec<NcclCopy>) {
    let mut order: Vec<usize> = (0..candidates.len()).collect();
    order.sort_by_key(|i| candidates[*i].name.contains('/'));
    let mut probes: Vec<Option<Probe>> = candidates.iter().map(|_| None).collect();
    for i in order {
        probes[i] = Some(probe(watch, &candidates[i].name));
    }
    let mut copies: Vec<NcclCopy> = Vec::new();
    let mut chosen = None;
    let mut missing = Vec::new();
    for (c, p) in candidates.iter().zip(probes.into_iter().flatten()) {
        match p {
            Probe::Missing(m) => missing.push(m),
            Probe::Failed(e) => {
                chosen.get_or_insert_with(|| (c, LibraryState::Failed(e.clone())));
                copies.push(NcclCopy {
                    path: c.name.clone(),
                    found_by: c.found_by.clone(),
                    version: Observed::Error(e),
                });
            }
            Probe::Loaded { path, version } => {
                if copies.iter().any(|k| same_file(&k.path, &path)) {
                    continue;
                }
                chosen.get_or_insert_with(|| {
                    let loaded = NcclLibrary {
                        path: Some(path.clone()),
                        version: version.clone(),
                        found_by: Some(c.found_by.clone()),
                    };
                    (c, LibraryState::Loaded(loaded))
                });
                copies.push(NcclCopy {
                    path,
                    found_by: c.found_by.clone(),
                    version,
                });
            }
        }
    }
    let library = match chosen {
        Some((c, state)) => LibraryFact {
            library: c.name.clone(),
            state,
        },
        None => LibraryFact {
            library: candidates
                .first()
                .map(|c| c.name.clone())
                .unwrap_or_default(),
            state: LibraryState::NotFound {
                message: missing.join("; "),
            },
        },
    };
    (library, copies)
}

/// The most of a plugin file read to find aws-ofi-nccl's version string (aws-ofi-nccl
/// 1.17 is ~5 MB; a plugin larger than this is not aws-ofi-nccl).
const MAX_PLUGIN_READ: u64 = 64 << 20;

/// aws-ofi-nccl's version from the `aws-ofi-nccl <version>` bytes its PACKAGE_STRING
/// leaves in the library (the "Initializing aws-ofi-nccl 1.17.0" log line is built from it:
/// aws/aws-ofi-nccl v1.17.0 src/nccl_ofi_net.cpp).
pub fn ofi_nccl_version(bytes: &[u8]) -> Option<String> {
    const KEY: &[u8] = b"aws-ofi-nccl ";
    let mut from = 0;
    while let Some(i) = bytes[from..].windows(KEY.len()).position(|w| w == KEY) {
        let start = from + i + KEY.len();
        let version: String = bytes[start..]
            .iter()
            .take(32)
            .take_while(|b| b.is_ascii_alphanumeric() || **b == b'.' || **b == b'-')
            .map(|b| char::from(*b))
            .collect();
        if version.starts_with(|c: char| c.is_ascii_digit()) && version.contains('.') {
            return Some(version);
        }
        from = start;
    }
    None
}

fn read_ofi_nccl_version(path: &str) -> Option<String> {
    use std::io::Read;
    let file = std::fs::File::open(path).ok()?;
    let mut bytes = Vec::new();
    file.take(MAX_PLUGIN_READ).read_to_end(&mut bytes).ok()?;
    ofi_nccl_version(&bytes)
}

/// The plugin's tables as facts, and aws-ofi-nccl's version from its file.
fn read_plugin(watch: &Watch, tables: NetPluginTables, name: &str) -> NetPlugin {
    let mut plugin = NetPlugin {
        library: name.to_string(),
        api: tables.apis.last().map(|v| format!("v{v}")),
        apis: tables.apis,
        path: tables.path,
        name: tables.newest_name,
        ofi_nccl_version: None,
    };
    let file = plugin.path.clone().unwrap_or_else(|| name.to_string());
    if file.contains('/') {
        plugin.ofi_nccl_version =
            watch.call(format!("read({file})"), || read_ofi_nccl_version(&file));
    }
    plugin
}

/// NCCL's library, and its net plugin unless `skip_plugin` says why not.
pub fn gather(
    watch: &Watch,
    nccl_candidates: &[Candidate],
    plugin_env: Option<&str>,
    skip_plugin: Option<String>,
) -> NcclFacts {
    let (library, copies) = nccl_library(watch, nccl_candidates);
    let mut attempts = Vec::new();
    let candidates = match plugin_candidates(plugin_env, loaded_version(&library)) {
        Some(c) if skip_plugin.is_none() => c,
        _ => {
            return NcclFacts {
                library,
                net_plugin: Observed::Value(None),
                net_plugin_attempts: attempts,
                net_plugin_skipped: skip_plugin,
                copies,
            };
        }
    };
    let mut found = None;
    let mut broken = None;
    // aws-ofi-nccl's own directory comes last: NCCL would not look there by itself.
    let extra = OFI_NCCL_DIRS.iter().flat_map(|d| {
        [
            format!("{d}/libnccl-net-ofi.so"),
            format!("{d}/libnccl-net.so"),
        ]
    });
    for name in candidates.iter().cloned().chain(extra) {
        match crate::vendor::nccl::open_net_plugin(watch, &name) {
            Ok(tables) => {
                attempts.push(LoadAttempt {
                    library: name.clone(),
                    error: None,
                });
                found = Some(read_plugin(watch, tables, &name));
                break;
            }
            Err(e) => {
                if !is_missing(&name, &e.message) && broken.is_none() {
                    broken = Some(e.clone());
                }
                attempts.push(LoadAttempt {
                    library: name,
                    error: Some(e.message),
                });
            }
        }
    }
    let net_plugin = match (found, broken) {
        (Some(p), _) => Observed::Value(Some(p)),
        (None, Some(e)) => Observed::Error(e),
        (None, None) => Observed::Value(None),
    };
    NcclFacts {
        library,
        net_plugin,
        net_plugin_attempts: attempts,
        net_plugin_skipped: None,
        copies,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugin_names_follow_nccl() {
        assert_eq!(
            plugin_candidates(None, None),
            Some(vec!["libnccl-net.so".to_string()])
        );
        assert_eq!(
            plugin_candidates(Some("ofi"), None),
            Some(vec!["ofi".into(), "libnccl-net-ofi.so".into()])
        );
        assert_eq!(
            plugin_candidates(Some("libnccl-net-ofi.so"), None),
            Some(vec!["libnccl-net-ofi.so".into()])
        );
        assert_eq!(
            plugin_candidates(Some("/opt/x/libp.so,aws"), None),
            Some(vec![
                "/opt/x/libp.so".into(),
                "aws".into(),
                "libnccl-net-aws.so".into()
            ])
        );
        assert_eq!(plugin_candidates(Some("none"), None), None);
        // Before 2.27 the value is one name, and NCCL does not trim it.
        assert_eq!(
            plugin_candidates(Some(" ofi,x"), Some(crate::nccl::Version::new(2, 18, 3))),
            Some(vec!["libnccl-net- ofi,x.so".into()])
        );
        assert_eq!(
            plugin_candidates(Some(""), Some(crate::nccl::Version::new(2, 21, 5))),
            Some(vec!["libnccl-net.so".into()])
        );
    }

    #[test]
    fn aws_ofi_nccl_version_from_its_bytes() {
        let bytes = b"\0NET/OFI aws-ofi-nccl plugin\0Initializing aws-ofi-nccl 1.13.2-aws\0rest";
        assert_eq!(ofi_nccl_version(bytes).as_deref(), Some("1.13.2-aws"));
        assert_eq!(ofi_nccl_version(b"aws-ofi-nccl "), None);
        assert_eq!(ofi_nccl_version(b"IB plugin 2.1"), None);
    }
}
