//! `ReplayKernel`: answers the `Kernel` syscalls from a recorded JSON file.
//!
//! This is how fixture host trees run end to end through the real binary
//! (`--replay-kernel FILE` beside `--host-root DIR`): files come from the tree,
//! syscall answers from the recording. A syscall the recording does not answer is
//! an error fact, exactly like a failed syscall, never a made-up value.

use super::kernel::{InterfaceList, Kernel, LimitKind};
use crate::facts::{FactError, FsUsage, Limit, Observed, Rlimit};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The recorded answers.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Recording {
    #[serde(default)]
    pub memlock: Option<Observed<Rlimit>>,
    #[serde(default)]
    pub stack: Option<Observed<Rlimit>>,
    /// The largest buffer mlock accepts; larger ones are refused with ENOMEM.
    #[serde(default)]
    pub mlock_allows: Option<Limit>,
    /// Why an mlock probe could not run at all (its buffer could not be mapped); when set,
    /// every probe fails with it and `mlock_allows` is not consulted.
    #[serde(default)]
    pub mlock_error: Option<FactError>,
    /// statvfs answers by host path (`/dev/shm`); a path not listed does not exist.
    #[serde(default)]
    pub statvfs: BTreeMap<String, Observed<FsUsage>>,
    #[serde(default)]
    pub interfaces: Option<Observed<InterfaceList>>,
    #[serde(default)]
    pub link_kinds: Option<Observed<BTreeMap<String, String>>>,
}

/// A kernel that replays a `Recording`.
#[derive(Debug)]
pub struct ReplayKernel {
    recording: Recording,
    host_root: PathBuf,
}

impl ReplayKernel {
    /// `host_root` is stripped from statvfs paths so recordings name host paths.
    pub fn new(recording: Recording, host_root: &Path) -> Self {
        ReplayKernel {
            recording,
            host_root: host_root.to_path_buf(),
        }
    }
}

fn unrecorded(call: &str) -> FactError {
    FactError::new(call, "no answer in the kernel recording")
}

fn answer<T: Clone>(recorded: &Option<Observed<T>>, call: &str) -> Result<T, FactError> {
    match recorded {
        Some(Observed::Value(v)) => Ok(v.clone()),
        Some(Observed::Error(e)) => Err(e.clone()),
        None => Err(unrecorded(call)),
    }
}

impl Kernel for ReplayKernel {
    fn rlimit(&self, kind: LimitKind) -> Result<Rlimit, FactError> {
        let recorded = match kind {
            LimitKind::Memlock => &self.recording.memlock,
            LimitKind::Stack => &self.recording.stack,
        };
        answer(recorded, kind.syscall_name())
    }

    fn mlock_probe(&self, bytes: u64) -> Result<Option<String>, FactError> {
        if let Some(e) = &self.recording.mlock_error {
            return Err(e.clone());
        }
        let allows = self
            .recording
            .mlock_allows
            .ok_or_else(|| unrecorded("mlock"))?;
        Ok(if allows.covers(Limit::Bytes(bytes)) {
            None
        } else {
            Some("ENOMEM: Cannot allocate memory".to_string())
        })
    }

    fn statvfs(&self, path: &Path) -> Result<Option<FsUsage>, FactError> {
        let relative = path.strip_prefix(&self.host_root).unwrap_or(path);
        let key = format!("/{}", relative.display());
        match self.recording.statvfs.get(&key) {
            Some(Observed::Value(v)) => Ok(Some(*v)),
            Some(Observed::Error(e)) => Err(e.clone()),
            None => Ok(None),
        }
    }

    fn interfaces(&self) -> Result<InterfaceList, FactError> {
        answer(&self.recording.interfaces, "getifaddrs")
    }

    fn link_kinds(&self) -> Result<BTreeMap<String, String>, FactError> {
        answer(&self.recording.link_kinds, "rtnetlink RTM_GETLINK")
    }
}
