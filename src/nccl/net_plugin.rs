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

#[cfg(test)]
mod tests {
    use super::*;

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
