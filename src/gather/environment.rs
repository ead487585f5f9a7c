//! The process environment, split into what the launcher set and what NCCL,
//! libfabric and aws-ofi-nccl will read. The environment is passed in, never
//! read from a global, so tests state it literally.

use crate::facts::EnvValue;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;

pub use crate::layout::LAUNCHER_VARS;

/// The host path a file variable's value names. NCCL opens these with fopen(3)
/// (NCCL_TOPO_FILE in graph/xml.cc ncclTopoGetXmlFromFile, NCCL_CONF_FILE in
/// misc/param.cc), so a relative value is relative to the working directory of
/// the process, which is this one's in `exec` and the trainer's in an
/// initContainer sharing its workingDir. Absolute values are taken as they are.
pub fn named_file_path(value: &str, working_dir: &std::path::Path) -> String {
    if value.starts_with('/') {
        return value.to_string();
    }
    working_dir.join(value).display().to_string()
}

/// Our own flags' variables; they start with NCCL_ but NCCL never reads them.
const OWN_PREFIX: &str = "NCCL_PREFLIGHT_";

/// True for names NCCL, libfabric or aws-ofi-nccl read.
pub(super) fn is_fabric_var(name: &str) -> bool {
    (name.starts_with("NCCL_") && !name.starts_with(OWN_PREFIX))
        || name.starts_with("FI_")
        || name.starts_with("OFI_NCCL_")
}

fn env_value(raw: &OsString) -> EnvValue {
    match raw.to_str() {
        Some(s) => EnvValue::text(s),
        None => EnvValue {
            value: String::from_utf8_lossy(raw.as_bytes()).into_owned(),
            not_utf8: true,
            from: None,
        },
    }
}

/// (launcher variables, NCCL/libfabric variables). Names that are not UTF-8 cannot
/// be any variable of interest and are skipped.
pub fn split(
    env: &[(OsString, OsString)],
) -> (BTreeMap<String, EnvValue>, BTreeMap<String, EnvValue>) {
    let mut launcher = BTreeMap::new();
    let mut fabric = BTreeMap::new();
    for (name, value) in env {
        let Some(name) = name.to_str() else { continue };
        if LAUNCHER_VARS.contains(&name) {
            launcher.insert(name.to_string(), env_value(value));
        } else if is_fabric_var(name) {
            fabric.insert(name.to_string(), env_value(value));
        }
    }
    (launcher, fabric)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStringExt;

    #[test]
    fn relative_nccl_topo_file_resolves_against_the_working_directory() {
        // Issue 16: a relative NCCL_TOPO_FILE was looked up under / and reported missing.
        let cwd = std::path::Path::new("/workspace/job");
        assert_eq!(
            named_file_path("topo/h200.xml", cwd),
            "/workspace/job/topo/h200.xml"
        );
        assert_eq!(named_file_path("./t.xml", cwd), "/workspace/job/./t.xml");
        assert_eq!(named_file_path("/etc/nccl/t.xml", cwd), "/etc/nccl/t.xml");
    }

    #[test]
    fn splits_and_excludes_own_flags() {
        let env = vec![
            ("NCCL_DEBUG".into(), "INFO".into()),
            ("NCCL_PREFLIGHT_MIN_SHM".into(), "1GiB".into()),
            ("FI_PROVIDER".into(), "efa".into()),
            ("OFI_NCCL_PROTOCOL".into(), "RDMA".into()),
            ("WORLD_SIZE".into(), "16".into()),
            ("HOME".into(), "/root".into()),
            (
                "NCCL_SOCKET_IFNAME".into(),
                OsString::from_vec(vec![b'e', 0xff]),
            ),
            (OsString::from_vec(vec![0xff]), "x".into()),
        ];
        let (launcher, fabric) = split(&env);
        assert_eq!(launcher.keys().collect::<Vec<_>>(), ["WORLD_SIZE"]);
        assert_eq!(
            fabric.keys().collect::<Vec<_>>(),
            [
                "FI_PROVIDER",
                "NCCL_DEBUG",
                "NCCL_SOCKET_IFNAME",
                "OFI_NCCL_PROTOCOL"
            ]
        );
        assert!(fabric["NCCL_SOCKET_IFNAME"].not_utf8);
        assert_eq!(fabric["NCCL_SOCKET_IFNAME"].value, "e\u{fffd}");
    }
}
