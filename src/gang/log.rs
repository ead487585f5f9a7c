//! NCCL's log for the gang's worker: a file in a private directory (mode 0700,
//! a random name, through tempfile as bench's), so nobody else can plant a
//! symlink where NCCL opens it (NCCL's `fopen(path, "w")`, src/debug.cc
//! `ncclDebugInit`, follows symlinks), read back with a size cap and a
//! deadline, and removed with its directory.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The most of NCCL's log read back (INIT,ENV at INFO is a few KiB a rank).
const LOG_CAP: u64 = 8 << 20;
/// The longest the read may take.
const READ_WITHIN: Duration = Duration::from_secs(5);

/// NCCL's log file and its private directory (removed on drop).
pub struct NcclLog {
    dir: tempfile::TempDir,
}

impl NcclLog {
    pub fn create() -> Result<NcclLog, String> {
        use std::os::unix::fs::PermissionsExt;
        // Created with mode 0700 (not umask's), so no window where others can enter.
        let dir = tempfile::Builder::new()
            .prefix("nccl-preflight-gang.")
            .permissions(std::fs::Permissions::from_mode(0o700))
            .tempdir()
            .map_err(|e| format!("creating a private directory for NCCL's log: {e}"))?;
        Ok(NcclLog { dir })
    }

    /// Where NCCL writes (NCCL_DEBUG_FILE); NCCL creates the file.
    pub fn path(&self) -> PathBuf {
        self.dir.path().join("nccl.log")
    }

    /// The `NCCL DIAG` lines (NCCL_RUN_RAS_DIAGNOSTICS=1, 2.31+), from at most LOG_CAP
    /// bytes read within READ_WITHIN.
    pub fn diagnostics(&self) -> crate::nccl::ras_diagnostics::Diagnostics {
        let mut text = String::new();
        if let Some(mut r) = read_capped(&self.path(), LOG_CAP, Instant::now() + READ_WITHIN) {
            let mut bytes = Vec::new();
            let _ = r.read_to_end(&mut bytes);
            text = String::from_utf8_lossy(&bytes).into_owned();
        }
        crate::nccl::ras_diagnostics::parse(&text)
    }

    /// Connections per transport, from at most LOG_CAP bytes read within READ_WITHIN.
    pub fn transports(&self) -> BTreeMap<String, u64> {
        read_capped(&self.path(), LOG_CAP, Instant::now() + READ_WITHIN)
            .and_then(|f| crate::explain::summarize(f).ok())
            .map(|s| s.transport_counts)
            .unwrap_or_default()
    }
}

/// A reader that ends at `deadline`.
struct Until<R> {
    inner: R,
    deadline: Instant,
}

impl<R: Read> Read for Until<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if Instant::now() >= self.deadline {
            return Ok(0);
        }
        self.inner.read(buf)
    }
}

/// A regular file (no symlink followed) as a reader of at most `cap` bytes that ends at `deadline`.
fn read_capped(path: &Path, cap: u64, deadline: Instant) -> Option<impl Read> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    Some(Until {
        inner: file.take(cap),
        deadline,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn regression_the_log_lives_in_a_private_directory_and_is_read_capped() {
        // Issue 31 row 10: a predictable name in a shared TMPDIR let another user
        // plant a symlink that root's NCCL followed; one to /dev/zero made the read spin.
        let log = NcclLog::create().unwrap();
        let dir = log.path().parent().unwrap().to_path_buf();
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        assert!(dir.file_name().unwrap().to_string_lossy().len() > "nccl-preflight-gang.".len());
        std::fs::write(log.path(), "x".repeat(100)).unwrap();
        let mut text = String::new();
        read_capped(&log.path(), 10, Instant::now() + READ_WITHIN)
            .unwrap()
            .read_to_string(&mut text)
            .unwrap();
        assert_eq!(text.len(), 10);
        // A symlink is not followed; a device is not read.
        let link = dir.join("link");
        std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
        assert!(read_capped(&link, 10, Instant::now() + READ_WITHIN).is_none());
        assert!(read_capped(Path::new("/dev/zero"), 10, Instant::now() + READ_WITHIN).is_none());
        drop(log);
        assert!(!dir.exists());
    }
}
