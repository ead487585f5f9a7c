//! How NCCL turns NCCL_NET_PLUGIN into the library names it dlopens.
//!
//! From NVIDIA/nccl, per release:
//! - 2.11 to 2.20 (src/net.cc): only `libnccl-net-<value>.so`;
//! - 2.21 to 2.25 (src/net.cc): the value as given (a library name or a path),
//!   then `libnccl-net-<value>.so`;
//! - 2.26 and later (src/plugin/plugin_open.cc openPluginLib): the value as
//!   given, then `libnccl-net-<value>.so` unless the value holds a `/` or is
//!   already a library name (`lib*.so`).
//!
//! Unset, NCCL tries `libnccl-net.so`. `none` is not special to NCCL: it is a
//! name no library has, which is how users turn plugins off.
//!
//! Once loaded, NCCL looks for the ncclNetPlugin_vN symbols of the API versions it
//! knows, newest first, and takes the first one there; a plugin that exports none of
//! them is dropped with an INFO line only ("NET/Plugin: Failed to find
//! ncclNetPlugin_vN symbol") and NCCL carries on with its built-in transports.
//! [`accepted_apis`] holds those versions per release; [`ofi_nccl_min_libfabric`] the
//! libfabric that aws-ofi-nccl refuses to use EFA without.

use crate::nccl::Version;
use crate::nccl::version::{PLUGIN_BARE_NAME, PLUGIN_LIST, PLUGIN_NONE, PLUGIN_PATH};

/// The names NCCL tries for NCCL_NET_PLUGIN=`value`, in order; `None` version:
/// the newest rules.
pub(crate) fn library_names(value: &str, version: Option<Version>) -> Vec<String> {
    plugin_names("libnccl-net", Some(value.trim()), version)
}

/// The names NCCL dlopens, in order, for a plugin of kind `prefix` (`libnccl-net`;
/// from 2.26 also `libnccl-tuner`, `libnccl-profiler`, `libnccl-env`, which share
/// src/plugin/plugin_open.cc openPluginLib) named by `value` (the variable as set, not
/// trimmed: NCCL does not trim). Unset or empty: `<prefix>.so` (every release).
/// Proven against real NCCL 2.13-2.21 (tests/integration/nccl_oracle.rs), the releases
/// whose ncclGetUniqueId loads the net plugin.
pub fn plugin_names(prefix: &str, value: Option<&str>, version: Option<Version>) -> Vec<String> {
    let Some(value) = value.filter(|v| !v.is_empty()) else {
        return vec![format!("{prefix}.so")];
    };
    let prefixed = format!("{prefix}-{value}.so");
    match version {
        Some(v) if v < PLUGIN_BARE_NAME => vec![prefixed],
        Some(v) if v < PLUGIN_PATH => vec![value.to_string(), prefixed],
        _ => {
            let is_library = value.starts_with("lib") && value.ends_with(".so");
            if value.contains('/') || is_library {
                vec![value.to_string()]
            } else {
                vec![value.to_string(), prefixed]
            }
        }
    }
}

/// The net plugin libraries NCCL `version` tries for NCCL_NET_PLUGIN=`value` (None:
/// unset), one list of [`plugin_names`] per plugin it will load:
/// - unset: `libnccl-net.so` (every release);
/// - up to 2.26: the value is one name (src/net.cc; src/plugin/net.cc at v2.26.2-1);
/// - from 2.27: a comma list, empty entries skipped (strtok_r; src/plugin/net.cc
///   ncclNetPluginInit at v2.27.7-1), so an empty value loads no external plugin;
/// - from 2.28: `none` (any case) is the empty list (v2.28.3-1 src/plugin/net.cc).
pub(crate) fn net_plugin_entries(
    value: Option<&str>,
    version: Option<Version>,
) -> Vec<Vec<String>> {
    let Some(value) = value else {
        return vec![plugin_names("libnccl-net", None, version)];
    };
    if version.is_some_and(|v| v < PLUGIN_LIST) {
        return vec![plugin_names("libnccl-net", Some(value), version)];
    }
    if version.is_none_or(|v| v >= PLUGIN_NONE) && value.eq_ignore_ascii_case("none") {
        return Vec::new();
    }
    value
        .split(',')
        .filter(|entry| !entry.is_empty())
        .map(|entry| plugin_names("libnccl-net", Some(entry), version))
        .collect()
}

/// What NCCL does with its net plugin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PluginLoad {
    /// No name opened: NCCL uses its internal transports (IB, Socket).
    Internal { tried: Vec<String> },
    /// `library` opened, but it exports no ncclNetPlugin_vN this release accepts
    /// ("Failed to find ncclNetPlugin symbol"): internal transports.
    NoSymbol { library: String },
    /// `library` loaded through ncclNetPlugin_v`api`.
    Loaded { library: String, api: u32 },
}

/// The net plugin NCCL `version` loads for NCCL_NET_PLUGIN=`value`: the first of
/// [`plugin_names`] that opens (`exports(name)`: the ncclNetPlugin_vN versions the
/// library dlopen would find under that name exports, `None` when it would not open),
/// then the newest API of [`accepted_apis`] it exports (NCCL tries them newest first and
/// takes the first found; src/net.cc ncclNetPluginInit at v2.13.4-1 to v2.25.1-1).
pub fn plugin_load(
    value: Option<&str>,
    version: Version,
    exports: impl Fn(&str) -> Option<Vec<u32>>,
) -> PluginLoad {
    let names = plugin_names("libnccl-net", value, Some(version));
    let Some((library, apis)) = names.iter().find_map(|n| Some((n.clone(), exports(n)?))) else {
        return PluginLoad::Internal { tried: names };
    };
    let accepted = accepted_apis(version);
    let api = apis
        .iter()
        .copied()
        .filter(|a| accepted.is_some_and(|(lo, hi)| (lo..=hi).contains(a)))
        .max();
    match api {
        Some(api) => PluginLoad::Loaded { library, api },
        None => PluginLoad::NoSymbol { library },
    }
}

/// The ncclNet API versions (N of ncclNetPlugin_vN) a release of NCCL looks for, oldest to
/// newest, read from NVIDIA/nccl at every tag from v2.12.7-1 to v2.30.7-1 (the dlsym calls
/// in src/net.cc up to 2.25, src/plugin/net/net_vN.cc from 2.26):
/// - 2.12: v4-v5; 2.13 to 2.18: v4-v6 (v2.18.5-1 src/net.cc)
/// - 2.19: v5-v7 (v2.19.4-1 src/net.cc); 2.20 to 2.23: v5-v8 (v2.23.4-1 src/net.cc)
/// - 2.24, 2.25: v5-v9 (v2.24.3-1 src/net.cc)
/// - 2.26, 2.27: v6-v10 (v2.26.2-1 src/plugin/net.cc, which dropped v5)
/// - 2.28, 2.29: v6-v11 (v2.28.9-1 src/plugin/net.cc); 2.30: v6-v12 (v2.30.7-1)
///
/// `None` before 2.12 (not read); a release newer than 2.30 is taken as 2.30, whose
/// oldest accepted version it is unlikely to raise silently but whose newest it may.
pub fn accepted_apis(version: Version) -> Option<(u32, u32)> {
    let (major, minor) = version.series();
    if major != 2 || minor < 12 {
        return None;
    }
    Some(match minor {
        12 => (4, 5),
        13..=18 => (4, 6),
        19 => (5, 7),
        20..=23 => (5, 8),
        24 | 25 => (5, 9),
        26 | 27 => (6, 10),
        28 | 29 => (6, 11),
        _ => (6, 12),
    })
}

/// True when `version` is newer than the releases [`accepted_apis`] was read from: NCCL
/// may then accept API versions newer than the table's.
pub(crate) fn newer_than_known(version: Version) -> bool {
    version > Version::new(2, 30, u32::MAX)
}

/// The oldest libfabric (major, minor) aws-ofi-nccl `plugin_version` accepts for the efa
/// provider; older ones make it return ENOTSUP at init ("EFA provider requires at least
/// libfabric version ..."), so NCCL does not use EFA. Read from aws/aws-ofi-nccl,
/// nccl_net_ofi_query_provider_capabilities: 1.9.0-aws to 1.12.x need 1.18 (v1.9.0-aws
/// src/nccl_ofi_net.c), 1.13.0-aws and later 1.22 (v1.13.0-aws src/nccl_ofi_net.c, still
/// so in v1.21.1 src/nccl_ofi_net.cpp). Earlier releases fall back to FI_VERSION(1, 6) at
/// run time (v1.7.0-aws src/nccl_ofi_net.c): `None`.
pub(crate) fn ofi_nccl_min_libfabric(plugin_version: &str) -> Option<(u32, u32)> {
    let mut parts = plugin_version
        .split(|c: char| !c.is_ascii_digit())
        .filter(|p| !p.is_empty())
        .map(|p| p.parse::<u32>().ok());
    let (major, minor) = (parts.next()??, parts.next()??);
    match (major, minor) {
        (1, 0..=8) | (0, _) => None,
        (1, 9..=12) => Some((1, 18)),
        _ => Some((1, 22)),
    }
}

/// The ncclNet API version NCCL `version` takes from a plugin exporting `apis`: the newest
/// it exports that this release looks for (newer ones too where the release is newer than
/// [`accepted_apis`] was read from); `None` when NCCL skips the plugin.
pub(crate) fn api_in_use(version: Version, apis: &[u32]) -> Option<u32> {
    let (lo, hi) = accepted_apis(version)?;
    let newer = newer_than_known(version);
    apis.iter()
        .rev()
        .find(|a| (lo..=hi).contains(*a) || (newer && **a > hi))
        .copied()
}

/// The names a net plugin answers to for NCCL_NET, which NCCL compares without case
/// against the `name` of the ncclNet struct it took (src/plugin/net.cc ncclNetInit, src/net.cc
/// before 2.26: `strcasecmp(netName, ncclNet->name)`), by each plugin's own rules:
/// - aws-ofi-nccl (`ofi_version`): "AWS Libfabric" up to 1.12.x; from 1.13.0-aws "Libfabric",
///   and a constructor renames every struct to "AWS Libfabric" or "OFI" when NCCL_NET is
///   that (src/nccl_ofi_interface_nvidia.c nvidia_plugin_name_fixup, v1.13.0-aws to v1.21.1);
/// - the IB/SHARP plugin (Mellanox/nccl-rdma-sharp-plugins): "IBext" up to its v6 structs,
///   "IBext_v<N>" per struct from 2023-09 (src/ib_plugin.c, "Plugin version v7"), so the
///   name follows the API version NCCL takes (`api`);
/// - any other plugin: the name its newest struct carries (`name`).
pub(crate) fn answers_to(name: &str, ofi_version: Option<&str>, api: Option<u32>) -> Vec<String> {
    let ofi = ofi_version
        .and_then(|v| {
            let mut parts = v
                .split(|c: char| !c.is_ascii_digit())
                .filter(|p| !p.is_empty())
                .map(|p| p.parse::<u32>().ok());
            Some((parts.next()??, parts.next()??))
        })
        .map(|v| v >= (1, 13))
        .or_else(|| {
            ["libfabric", "ofi", "aws libfabric"]
                .contains(&name.to_ascii_lowercase().as_str())
                .then(|| !name.eq_ignore_ascii_case("aws libfabric"))
        });
    match (ofi, api) {
        (Some(true), _) => vec!["Libfabric".into(), "AWS Libfabric".into(), "OFI".into()],
        (Some(false), _) => vec!["AWS Libfabric".into()],
        (None, Some(n)) if name.starts_with("IBext_v") => vec![format!("IBext_v{n}")],
        _ => vec![name.to_string()],
    }
}

/// (major, minor) of a libfabric version string (`1.22`, `2.1.0amzn3.0`).
pub(crate) fn libfabric_version(text: &str) -> Option<(u32, u32)> {
    let mut parts = text.trim().split('.');
    let major = parts.next()?.parse().ok()?;
    let minor: String = parts
        .next()?
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    Some((major, minor.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 36: NCCL_NET is matched against each plugin's own names, per its version.
    #[test]
    fn names_each_plugin_answers_to() {
        let v = |a, b, c| Version::new(a, b, c);
        // aws-ofi-nccl 1.12 calls itself "AWS Libfabric" only; 1.13 and later "Libfabric",
        // renamed to "AWS Libfabric" or "OFI" when NCCL_NET asks.
        assert_eq!(
            answers_to("AWS Libfabric", Some("1.12.1-aws"), Some(6)),
            ["AWS Libfabric"]
        );
        assert_eq!(
            answers_to("Libfabric", Some("1.13.2-aws"), Some(8)),
            ["Libfabric", "AWS Libfabric", "OFI"]
        );
        assert_eq!(answers_to("Libfabric", None, None).len(), 3);
        assert_eq!(answers_to("AWS Libfabric", None, None), ["AWS Libfabric"]);
        // The SHARP plugin's struct names carry their API: NCCL 2.23 takes v8 of v6-v11.
        let api = api_in_use(v(2, 23, 4), &[6, 7, 8, 9, 10, 11]);
        assert_eq!(api, Some(8));
        assert_eq!(answers_to("IBext_v11", None, api), ["IBext_v8"]);
        assert_eq!(answers_to("IBext", None, Some(5)), ["IBext"]);
        assert_eq!(answers_to("UCX", None, Some(8)), ["UCX"]);
        assert_eq!(api_in_use(v(2, 28, 9), &[4]), None);
        assert_eq!(api_in_use(v(2, 31, 1), &[13]), Some(13));
    }

    #[test]
    fn api_versions_per_release() {
        assert_eq!(accepted_apis(Version::new(2, 11, 4)), None);
        assert_eq!(accepted_apis(Version::new(2, 18, 5)), Some((4, 6)));
        assert_eq!(accepted_apis(Version::new(2, 19, 4)), Some((5, 7)));
        assert_eq!(accepted_apis(Version::new(2, 23, 4)), Some((5, 8)));
        assert_eq!(accepted_apis(Version::new(2, 25, 1)), Some((5, 9)));
        assert_eq!(accepted_apis(Version::new(2, 26, 2)), Some((6, 10)));
        assert_eq!(accepted_apis(Version::new(2, 28, 9)), Some((6, 11)));
        assert_eq!(accepted_apis(Version::new(2, 30, 7)), Some((6, 12)));
        assert!(newer_than_known(Version::new(2, 31, 1)));
        assert!(!newer_than_known(Version::new(2, 30, 7)));
    }

    #[test]
    fn libfabric_minimum_of_aws_ofi_nccl() {
        assert_eq!(ofi_nccl_min_libfabric("1.7.4-aws"), None);
        assert_eq!(ofi_nccl_min_libfabric("1.9.1-aws"), Some((1, 18)));
        assert_eq!(ofi_nccl_min_libfabric("1.13.2-aws"), Some((1, 22)));
        assert_eq!(ofi_nccl_min_libfabric("1.17.0"), Some((1, 22)));
        assert_eq!(ofi_nccl_min_libfabric("garbage"), None);
        assert_eq!(libfabric_version("1.22"), Some((1, 22)));
        assert_eq!(libfabric_version("2.1.0amzn3.0"), Some((2, 1)));
        assert_eq!(libfabric_version("x"), None);
    }

    #[test]
    fn unset_and_empty_mean_the_default_library_and_values_are_not_trimmed() {
        for v in [
            Some(Version::new(2, 18, 3)),
            Some(Version::new(2, 21, 5)),
            None,
        ] {
            assert_eq!(plugin_names("libnccl-net", None, v), ["libnccl-net.so"]);
            assert_eq!(plugin_names("libnccl-net", Some(""), v), ["libnccl-net.so"]);
        }
        assert_eq!(
            plugin_names("libnccl-net", Some(" ofi"), Some(Version::new(2, 18, 3))),
            ["libnccl-net- ofi.so"]
        );
        let exports = |n: &str| match n {
            "libnccl-net.so" => Some(vec![4, 6, 8]),
            "fake" => Some(vec![4]),
            _ => None,
        };
        assert_eq!(
            plugin_load(None, Version::new(2, 18, 3), exports),
            PluginLoad::Loaded {
                library: "libnccl-net.so".into(),
                api: 6
            }
        );
        assert_eq!(
            plugin_load(None, Version::new(2, 21, 5), exports),
            PluginLoad::Loaded {
                library: "libnccl-net.so".into(),
                api: 8
            }
        );
        assert_eq!(
            plugin_load(Some("fake"), Version::new(2, 21, 5), exports),
            PluginLoad::NoSymbol {
                library: "fake".into()
            }
        );
        assert_eq!(
            plugin_load(Some("fake"), Version::new(2, 18, 3), exports),
            PluginLoad::Internal {
                tried: vec!["libnccl-net-fake.so".into()]
            }
        );
    }

    #[test]
    fn lists_from_2_27_and_none_from_2_28() {
        let one = |v| net_plugin_entries(Some("ofi,,/x/libp.so"), Some(v));
        // 2.26: one name, and a name holding a `/` is a path, used as is.
        assert_eq!(one(Version::new(2, 26, 5)), [["ofi,,/x/libp.so"]]);
        assert_eq!(
            one(Version::new(2, 27, 7)),
            [vec!["ofi", "libnccl-net-ofi.so"], vec!["/x/libp.so"]]
        );
        assert_eq!(
            net_plugin_entries(Some(""), Some(Version::new(2, 21, 5))),
            [["libnccl-net.so"]]
        );
        assert!(net_plugin_entries(Some(""), Some(Version::new(2, 28, 9))).is_empty());
        assert!(net_plugin_entries(Some("None"), Some(Version::new(2, 28, 9))).is_empty());
        assert_eq!(
            net_plugin_entries(Some("none"), Some(Version::new(2, 27, 7))),
            [["none", "libnccl-net-none.so"]]
        );
        assert_eq!(net_plugin_entries(None, None), [["libnccl-net.so"]]);
    }

    #[test]
    fn names_follow_the_version() {
        assert_eq!(
            library_names("ofi", Some(Version::new(2, 18, 5))),
            ["libnccl-net-ofi.so"]
        );
        assert_eq!(
            library_names("ofi", Some(Version::new(2, 23, 4))),
            ["ofi", "libnccl-net-ofi.so"]
        );
        assert_eq!(
            library_names("/opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so", None),
            ["/opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so"]
        );
        assert_eq!(
            library_names("libnccl-net-aws.so", None),
            ["libnccl-net-aws.so"]
        );
        assert_eq!(
            library_names("aws-ofi", None),
            ["aws-ofi", "libnccl-net-aws-ofi.so"]
        );
    }
}
