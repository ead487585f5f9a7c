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

use crate::nccl::catalog::Version;

/// The names NCCL tries for NCCL_NET_PLUGIN=`value`, in order; `None` version:
/// the newest rules.
pub fn library_names(value: &str, version: Option<Version>) -> Vec<String> {
    let value = value.trim();
    let prefixed = format!("libnccl-net-{value}.so");
    match version {
        Some(v) if v < (2, 21, 0) => vec![prefixed],
        Some(v) if v < (2, 26, 0) => vec![value.to_string(), prefixed],
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
    let (major, minor, _) = version;
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
pub fn newer_than_known(version: Version) -> bool {
    version > (2, 30, u32::MAX)
}

/// The oldest libfabric (major, minor) aws-ofi-nccl `plugin_version` accepts for the efa
/// provider; older ones make it return ENOTSUP at init ("EFA provider requires at least
/// libfabric version ..."), so NCCL does not use EFA. Read from aws/aws-ofi-nccl,
/// nccl_net_ofi_query_provider_capabilities: 1.9.0-aws to 1.12.x need 1.18 (v1.9.0-aws
/// src/nccl_ofi_net.c), 1.13.0-aws and later 1.22 (v1.13.0-aws src/nccl_ofi_net.c, still
/// so in v1.21.1 src/nccl_ofi_net.cpp). Earlier releases fall back to FI_VERSION(1, 6) at
/// run time (v1.7.0-aws src/nccl_ofi_net.c): `None`.
pub fn ofi_nccl_min_libfabric(plugin_version: &str) -> Option<(u32, u32)> {
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

/// (major, minor) of a libfabric version string (`1.22`, `2.1.0amzn3.0`).
pub fn libfabric_version(text: &str) -> Option<(u32, u32)> {
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

    #[test]
    fn api_versions_per_release() {
        assert_eq!(accepted_apis((2, 11, 4)), None);
        assert_eq!(accepted_apis((2, 18, 5)), Some((4, 6)));
        assert_eq!(accepted_apis((2, 19, 4)), Some((5, 7)));
        assert_eq!(accepted_apis((2, 23, 4)), Some((5, 8)));
        assert_eq!(accepted_apis((2, 25, 1)), Some((5, 9)));
        assert_eq!(accepted_apis((2, 26, 2)), Some((6, 10)));
        assert_eq!(accepted_apis((2, 28, 9)), Some((6, 11)));
        assert_eq!(accepted_apis((2, 30, 7)), Some((6, 12)));
        assert!(newer_than_known((2, 31, 1)));
        assert!(!newer_than_known((2, 30, 7)));
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
    fn names_follow_the_version() {
        assert_eq!(
            library_names("ofi", Some((2, 18, 5))),
            ["libnccl-net-ofi.so"]
        );
        assert_eq!(
            library_names("ofi", Some((2, 23, 4))),
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
