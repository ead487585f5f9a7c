//! `Host`: every file gather reads, resolved under one root (`--host-root`).
//!
//! A missing file is `Ok(None)` (absence is data); any other failure is a
//! `FactError` naming the full path. Reads are bounded so a hostile or runaway
//! pseudo-file cannot exhaust memory.

use crate::facts::{FactError, Observed};
use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

/// Upper bound on one file read. /proc/self/mountinfo on a busy node is a few hundred KiB.
const MAX_FILE_BYTES: u64 = 16 << 20;

/// The filesystem tree that stands for `/` on the host being checked.
#[derive(Debug, Clone)]
pub struct Host {
    root: PathBuf,
}

impl Host {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Host { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The real path of `abs` (an absolute path as seen on the host) under the root.
    pub fn path(&self, abs: &str) -> PathBuf {
        self.root.join(abs.trim_start_matches('/'))
    }

    fn error(&self, abs: &str, err: impl std::fmt::Display) -> FactError {
        FactError::new(self.path(abs).display().to_string(), err)
    }

    /// Reads a text file. Invalid UTF-8 is an error: every file read here is ASCII on Linux.
    pub fn read(&self, abs: &str) -> Result<Option<String>, FactError> {
        let path = self.path(abs);
        let file = match fs::File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(self.error(abs, e)),
        };
        let mut bytes = Vec::new();
        file.take(MAX_FILE_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| self.error(abs, e))?;
        if bytes.len() as u64 > MAX_FILE_BYTES {
            return Err(self.error(abs, format!("larger than {MAX_FILE_BYTES} bytes")));
        }
        String::from_utf8(bytes)
            .map(Some)
            .map_err(|_| self.error(abs, "not valid UTF-8"))
    }

    /// Reads a file that must exist and parses it; a missing file, a read error or
    /// a parse error becomes an error fact naming the path.
    pub fn parse_required<T>(
        &self,
        abs: &str,
        parse: impl FnOnce(&str) -> Result<T, String>,
    ) -> Observed<T> {
        match self.read(abs) {
            Ok(Some(text)) => parse(&text).map_err(|e| self.error(abs, e)).into(),
            Ok(None) => Observed::Error(self.error(abs, "missing")),
            Err(e) => Observed::Error(e),
        }
    }

    /// Opens `abs` read-write and closes it again, as a process that will use the
    /// device node must: `None` when it does not exist, `Some(Err)` with the error
    /// when it exists but cannot be opened (permissions, a device cgroup).
    pub fn try_open_rw(&self, abs: &str) -> Option<Result<(), String>> {
        match fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(self.path(abs))
        {
            Ok(_) => Some(Ok(())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => Some(Err(e.to_string())),
        }
    }

    /// The canonical path of `abs` with every symlink resolved, as a host path
    /// (sysfs links through links: /sys/class/infiniband/X/device); `None` when missing.
    pub fn real_path(&self, abs: &str) -> Result<Option<String>, FactError> {
        let root = fs::canonicalize(&self.root).map_err(|e| self.error("/", e))?;
        match fs::canonicalize(self.path(abs)) {
            Ok(p) => Ok(p
                .strip_prefix(&root)
                .ok()
                .map(|rel| format!("/{}", rel.display()))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.error(abs, e)),
        }
    }

    /// Reads the target of a symbolic link (e.g. /proc/self/ns/ipc).
    pub fn read_link(&self, abs: &str) -> Result<Option<String>, FactError> {
        match fs::read_link(self.path(abs)) {
            Ok(target) => Ok(Some(target.to_string_lossy().into_owned())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.error(abs, e)),
        }
    }

    /// Lists a directory's entry names, sorted; `None` when the directory does not exist.
    pub fn list_dir(&self, abs: &str) -> Result<Option<Vec<String>>, FactError> {
        let entries = match fs::read_dir(self.path(abs)) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(self.error(abs, e)),
        };
        let mut names = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| self.error(abs, e))?;
            names.push(entry.file_name().to_string_lossy().into_owned());
        }
        names.sort();
        Ok(Some(names))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_file_is_none_and_unreadable_names_the_path() {
        let dir = std::env::temp_dir().join(format!("host-test-{}", std::process::id()));
        fs::create_dir_all(dir.join("proc")).unwrap();
        fs::write(dir.join("proc/x"), "hello\n").unwrap();
        fs::create_dir_all(dir.join("proc/adir")).unwrap();
        let host = Host::new(&dir);
        assert_eq!(host.read("/proc/x").unwrap().as_deref(), Some("hello\n"));
        assert_eq!(host.read("/proc/missing").unwrap(), None);
        let err = host.read("/proc/adir").unwrap_err();
        assert!(err.source.ends_with("proc/adir"), "{err}");
        assert_eq!(host.list_dir("/nothing").unwrap(), None);
        fs::write(dir.join("proc/bin"), [0xff, 0xfe]).unwrap();
        assert!(
            host.read("/proc/bin")
                .unwrap_err()
                .message
                .contains("UTF-8")
        );
        fs::remove_dir_all(&dir).unwrap();
    }
}
