//! NCCL's log for the gang's worker: an anonymous in-memory file (memfd_create(2),
//! Linux 3.17+) that the worker inherits and NCCL opens as `/proc/self/fd/N`
//! (NCCL_DEBUG_FILE; src/debug.cc `ncclDebugInit` fopen()s it), read back with a
//! size cap and a deadline. It has no name in any directory: nobody can plant a
//! symlink where NCCL opens it (issue 31 row 10), and nothing is left behind in
//! TMPDIR however this process ends, SIGTERM and SIGKILL included (issue 39 row 6:
//! a private directory outlived a SIGTERM in the bandwidth phase).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::fd::{AsRawFd, FromRawFd};
use std::time::{Duration, Instant};

/// The most of NCCL's log read back (INIT,ENV at INFO is a few KiB a rank).
const LOG_CAP: u64 = 8 << 20;
/// The longest the read may take.
const READ_WITHIN: Duration = Duration::from_secs(5);

/// NCCL's log file, open in this process and inherited by the worker.
pub struct NcclLog {
    file: File,
}

impl NcclLog {
    pub fn create() -> Result<NcclLog, String> {
        let name = c"nccl-preflight-gang-log";
        // SAFETY: memfd_create(2) through syscall(2) (glibc 2.17 has no wrapper) with
        // a NUL-terminated name and no flags: without MFD_CLOEXEC the descriptor
        // stays open across the worker's exec, which is the point.
        let fd = unsafe { libc::syscall(libc::SYS_memfd_create, name.as_ptr(), 0) };
        if fd < 0 {
            return Err(format!(
                "creating an in-memory file for NCCL's log: {}",
                std::io::Error::last_os_error()
            ));
        }
        // SAFETY: `fd` was just returned by memfd_create and is owned by nobody else.
        let file = unsafe { File::from_raw_fd(fd as i32) };
        Ok(NcclLog { file })
    }

    /// What the worker's NCCL opens (NCCL_DEBUG_FILE): this descriptor, as the
    /// worker inherits it.
    pub fn path(&self) -> String {
        format!("/proc/self/fd/{}", self.file.as_raw_fd())
    }

    /// At most LOG_CAP bytes of the log, read within READ_WITHIN.
    fn text(&self) -> String {
        let deadline = Instant::now() + READ_WITHIN;
        let mut file = &self.file;
        if file.seek(SeekFrom::Start(0)).is_err() {
            return String::new();
        }
        let mut bytes = Vec::new();
        let mut chunk = [0u8; 64 << 10];
        while (bytes.len() as u64) < LOG_CAP && Instant::now() < deadline {
            match file.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => bytes.extend_from_slice(&chunk[..n]),
            }
        }
        bytes.truncate(LOG_CAP as usize);
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The `NCCL DIAG` lines (NCCL_RUN_RAS_DIAGNOSTICS=1, 2.31+).
    pub fn diagnostics(&self) -> crate::nccl::ras_diagnostics::Diagnostics {
        crate::nccl::ras_diagnostics::parse(&self.text())
    }

    /// Connections per transport.
    pub fn transports(&self) -> BTreeMap<String, u64> {
        crate::explain::summarize(self.text().as_bytes())
            .map(|s| s.transport_counts)
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn regression_the_log_has_no_name_and_a_child_writes_it_through_proc() {
        // Issue 31 row 10 (a symlink planted in TMPDIR) and issue 39 row 6 (a private
        // directory left behind after SIGTERM): the log is on no path at all.
        let log = NcclLog::create().unwrap();
        let path = log.path();
        assert!(path.starts_with("/proc/self/fd/"), "{path}");
        let target = std::fs::read_link(&path).unwrap();
        assert!(
            target.to_string_lossy().starts_with("/memfd:"),
            "{target:?}"
        );
        // A child writes it as the worker's NCCL does: opened by that path, truncated.
        let status = std::process::Command::new("sh")
            .args(["-c", &format!("printf 'NCCL INFO hello' > {path}")])
            .status()
            .unwrap();
        assert!(status.success());
        assert_eq!(log.text(), "NCCL INFO hello");
        // Written from this side too (the same file), read back from the start.
        (&log.file).write_all(b" again").unwrap();
        assert_eq!(log.text(), "NCCL INFO hello again");
    }
}
