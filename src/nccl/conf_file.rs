//! Which NCCL reads the nccl.conf `init --nccl-conf` writes: NCCL_CONF_FILE is read from
//! 2.23 (NVIDIA/nccl src/misc/param.cc initEnv at v2.23.4-1; absent at v2.22.3-1, which
//! reads only ~/.nccl.conf and /etc/nccl.conf: FACTS.md section 9).

use crate::finding::{Finding, ids};
use crate::nccl::Version;
use crate::nccl::version::CONF_FILE;

/// The warning that replaces the conf file when the loaded NCCL `version` would not read
/// it; `None` when it would, or when the version is unknown (no libnccl in this image:
/// the trainer's may be new enough). `env_file`: whether `--env-file` was given. The
/// paths stay out of the text, which goes into reports compared across runs.
pub fn unread(version: Option<Version>, env_file: bool) -> Option<Finding> {
    let v = version.filter(|v| *v < CONF_FILE)?;
    let (settings, remediation) = if env_file {
        (
            "the tuned settings are in the --env-file only",
            "source the --env-file in the trainer's command (`. FILE && exec ...`), or run the trainer under `nccl-preflight exec`; or use NCCL 2.23 or later",
        )
    } else {
        (
            "pass --env-file to hand the tuned settings to the trainer",
            "add --env-file FILE and source it in the trainer's command, or run the trainer under `nccl-preflight exec`; or use NCCL 2.23 or later",
        )
    };
    Some(
        Finding::warn(
            ids::NCCL_CONF,
            format!(
                "NCCL {} does not read NCCL_CONF_FILE (2.23 and later do): --nccl-conf not written; {settings}",
                v
            ),
            remediation,
        )
        .evidence(format!("libnccl version {v}")),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::finding::Status;

    #[test]
    fn only_releases_before_2_23_are_warned_about() {
        assert!(unread(Some(Version::new(2, 23, 4)), true).is_none());
        assert!(unread(None, true).is_none());
        let w = unread(Some(Version::new(2, 21, 5)), true).unwrap();
        assert_eq!((w.id.as_str(), w.status()), ("nccl-conf", Status::Warn));
        assert!(
            w.summary.contains("2.21.5") && w.summary.contains("--env-file only"),
            "{}",
            w.summary
        );
        let without = unread(Some(Version::new(2, 22, 3)), false).unwrap();
        assert!(
            without.summary.contains("pass --env-file"),
            "{}",
            without.summary
        );
    }
}
