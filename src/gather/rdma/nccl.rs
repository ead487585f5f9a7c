//! NCCL itself (libnccl.so.2: its version through ncclGetVersion) and the net
//! plugin NCCL would load, found the way NCCL finds it (src/plugin/plugin_open.cc):
//! each NCCL_NET_PLUGIN entry as given, then as libnccl-net-<name>.so; with
//! the variable unset, libnccl-net.so. Nothing is initialised: the plugin is
//! only loaded and its ncclNetPlugin_vN symbol read. aws-ofi-nccl's install
//! directory is checked too, since a plugin there is invisible to NCCL unless
//! it is on the library search path.

use crate::facts::Observed;
use crate::facts::gpu::{Library as LibraryFact, LibraryState};
use crate::facts::rdma::{LoadAttempt, NcclFacts, NcclLibrary, NetPlugin};
use crate::vendor::deadline::Watch;
use crate::vendor::dl::{LoadError, is_missing};
use crate::vendor::nccl::version_text;

use crate::platform::OFI_NCCL_DIRS;
use crate::vendor::nccl::NetPluginTables;

/// The names NCCL tries for its net plugin, in order, or `None` when the plugin is disabled.
pub fn plugin_candidates(env_value: Option<&str>) -> Option<Vec<String>> {
    let Some(value) = env_value.map(str::trim).filter(|v| !v.is_empty()) else {
        return Some(vec!["libnccl-net.so".into()]);
    };
    if value.eq_ignore_ascii_case("none") {
        return None;
    }
    let mut names = Vec::new();
    for name in value.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        names.push(name.to_string());
        let is_path = name.contains('/');
        let is_lib = name.starts_with("lib") && name.ends_with(".so");
        if !is_path && !is_lib {
            names.push(format!("libnccl-net-{name}.so"));
        }
    }
    Some(names)
}

fn nccl_library(watch: &Watch, candidates: &[String]) -> LibraryFact<NcclLibrary> {
    let mut missing = Vec::new();
    for name in candidates {
        match crate::vendor::nccl::probe(watch, name) {
            Ok(probe) => {
                let version = match probe.version {
                    Ok(code) => Observed::Value(version_text(code)),
                    Err(e) => Observed::Error(e),
                };
                return LibraryFact {
                    library: name.clone(),
                    state: LibraryState::Loaded(NcclLibrary {
                        path: probe.path,
                        version,
                    }),
                };
            }
            Err(LoadError::Missing(message)) => missing.push(message),
            Err(LoadError::Failed(e)) => {
                return LibraryFact {
                    library: name.clone(),
                    state: LibraryState::Failed(e),
                };
            }
        }
    }
    LibraryFact {
        library: candidates.first().cloned().unwrap_or_default(),
        state: LibraryState::NotFound {
            message: missing.join("; "),
        },
    }
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
    nccl_candidates: &[String],
    plugin_env: Option<&str>,
    skip_plugin: Option<String>,
) -> NcclFacts {
    let library = nccl_library(watch, nccl_candidates);
    let mut attempts = Vec::new();
    let candidates = match plugin_candidates(plugin_env) {
        Some(c) if skip_plugin.is_none() => c,
        _ => {
            return NcclFacts {
                library,
                net_plugin: Observed::Value(None),
                net_plugin_attempts: attempts,
                net_plugin_skipped: skip_plugin,
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugin_names_follow_nccl() {
        assert_eq!(
            plugin_candidates(None),
            Some(vec!["libnccl-net.so".to_string()])
        );
        assert_eq!(
            plugin_candidates(Some("ofi")),
            Some(vec!["ofi".into(), "libnccl-net-ofi.so".into()])
        );
        assert_eq!(
            plugin_candidates(Some("libnccl-net-ofi.so")),
            Some(vec!["libnccl-net-ofi.so".into()])
        );
        assert_eq!(
            plugin_candidates(Some("/opt/x/libp.so,aws")),
            Some(vec![
                "/opt/x/libp.so".into(),
                "aws".into(),
                "libnccl-net-aws.so".into()
            ])
        );
        assert_eq!(plugin_candidates(Some("none")), None);
    }

    #[test]
    fn aws_ofi_nccl_version_from_its_bytes() {
        let bytes = b"\0NET/OFI aws-ofi-nccl plugin\0Initializing aws-ofi-nccl 1.13.2-aws\0rest";
        assert_eq!(ofi_nccl_version(bytes).as_deref(), Some("1.13.2-aws"));
        assert_eq!(ofi_nccl_version(b"aws-ofi-nccl "), None);
        assert_eq!(ofi_nccl_version(b"IB plugin 2.1"), None);
    }

    #[test]
    fn versions() {
        assert_eq!(version_text(22809), "2.28.9");
        assert_eq!(version_text(21805), "2.18.5");
        assert_eq!(version_text(2708), "2.7.8");
    }
}
