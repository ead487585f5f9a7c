//! What `serve` keeps resident of its own binary. The kernel maps a file's pages around
//! each fault (fault-around, 64 KiB: mm/memory.c `do_fault_around`, whatever of that
//! window is in the page cache) and reads ahead on a miss, so a long-lived process ends
//! up holding every window of its executable that any code ever touched: clap's
//! parsing, the probe child's protocol and the facts deserializer run once at start-up
//! and would stay resident for the pod's life.
//!
//! After the first run of the checks, `page_out_start_up` drops them, on this binary's
//! mappings only: MADV_RANDOM, so that a later miss in the read-only data reads the one
//! page faulted, not a read-ahead window; MADV_DONTNEED on the mappings that hold
//! nothing but the file's own pages (private, not writable, no anonymous page: the
//! text and the read-only data, never the relocated RELRO part); then
//! POSIX_FADV_DONTNEED on the executable, so the pages no process maps any more leave
//! the page cache and fault-around cannot map them back. The next runs fault in what
//! they use. None of it changes what the process reads: those clean file pages are what
//! the kernel's reclaim may drop at any moment anyway, and they come back from the file
//! on the next access. (MADV_PAGEOUT would do the same only for the file's owner or
//! root: mm/madvise.c `can_do_file_pageout`; the image runs serve as user 65532.) Measured with
//! the fake NVML (docs/performance.md, "serve's memory"): the binary's resident pages
//! 3.5 -> 2.8 MB, as root and as nobody alike. The text keeps 64 KiB windows: on Linux
//! 6.18 MADV_RANDOM stops neither fault-around (`should_fault_around` looks at
//! `vm_ops->map_pages` and userfaultfd only) nor, measured, the read-ahead of a fault in
//! an executable mapping; the read-only data comes back a page at a time.

/// One mapping of /proc/PID/smaps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    pub start: usize,
    pub end: usize,
    writable: bool,
    private: bool,
    /// The file mapped; empty for anonymous memory, `[heap]` and the like for others.
    pub path: String,
    /// Anonymous (copied-on-write) memory in it, kB; `None` where smaps did not say.
    anonymous_kb: Option<u64>,
}

impl Mapping {
    /// Holds only the file's own pages, and cannot come to hold others without an
    /// mprotect or a debugger's write: dropping its pages loses nothing.
    fn only_file_pages(&self) -> bool {
        self.private && !self.writable && self.anonymous_kb == Some(0)
    }
}

/// The mappings of /proc/PID/smaps text: a `start-end perms offset dev inode [path]`
/// line (the path may hold spaces), then `Field: value` lines.
fn parse_smaps(smaps: &str) -> Vec<Mapping> {
    let mut out: Vec<Mapping> = Vec::new();
    for line in smaps.lines() {
        if let Some(m) = header(line) {
            out.push(m);
        } else if let (Some(m), Some(kb)) = (out.last_mut(), line.strip_prefix("Anonymous:")) {
            m.anonymous_kb = kb.trim().trim_end_matches("kB").trim().parse().ok();
        }
    }
    out
}

fn header(line: &str) -> Option<Mapping> {
    let mut fields = line.splitn(6, ' ');
    let (range, perms) = (fields.next()?, fields.next()?);
    let (start, end) = range.split_once('-')?;
    let perms = perms.as_bytes();
    if perms.len() != 4 {
        return None;
    }
    Some(Mapping {
        start: usize::from_str_radix(start, 16).ok()?,
        end: usize::from_str_radix(end, 16).ok()?,
        writable: perms[1] == b'w',
        private: perms[3] == b'p',
        path: fields.nth(3).unwrap_or_default().trim().to_string(),
        anonymous_kb: None,
    })
}

/// The mappings of the file that holds address `code`; empty when no file's mapping
/// holds it.
fn mappings_of(mappings: &[Mapping], code: usize) -> Vec<&Mapping> {
    let Some(file) = mappings
        .iter()
        .find(|m| (m.start..m.end).contains(&code))
        .map(|m| m.path.as_str())
        .filter(|path| path.starts_with('/'))
    else {
        return Vec::new();
    };
    mappings.iter().filter(|m| m.path == file).collect()
}

fn advise(m: &Mapping, advice: libc::c_int) {
    // SAFETY: MADV_RANDOM is a hint that changes no page. MADV_DONTNEED is passed only
    // for a mapping that `only_file_pages` holds true of: private, read-only, with no
    // anonymous page when smaps was read, so it drops clean pages of the executable,
    // read back from the file on the next access (as after the kernel's own reclaim).
    // A range unmapped since smaps was read makes madvise fail, harmlessly.
    unsafe {
        libc::madvise(m.start as *mut libc::c_void, m.end - m.start, advice);
    }
}

/// Drops the pages of this binary that start-up touched; see the module's comment.
/// A /proc that cannot be read, or a kernel that refuses an advice, leaves everything
/// as it was.
pub fn page_out_start_up() {
    use std::os::fd::AsRawFd;
    let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else {
        return;
    };
    let mappings = parse_smaps(&smaps);
    let own = mappings_of(&mappings, page_out_start_up as fn() as usize);
    for m in &own {
        advise(m, libc::MADV_RANDOM);
    }
    for m in own.iter().filter(|m| m.only_file_pages()) {
        advise(m, libc::MADV_DONTNEED);
    }
    if let Ok(exe) = std::fs::File::open("/proc/self/exe") {
        // SAFETY: posix_fadvise reads nothing from memory; the descriptor is open.
        unsafe {
            libc::posix_fadvise(exe.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// smaps of a binary under a path with a space: read-only data, text, the relocated
    /// RELRO part (anonymous), data; a shared mapping of it; heap, an anonymous mapping,
    /// libc, the stack.
    const SMAPS: &str = "\
55f08a5c3000-55f08a6b4000 r--p 00000000 fe:00 10036868                   /opt/nccl preflight/bin
Size:                964 kB
Rss:                 196 kB
Anonymous:             0 kB
VmFlags: rd mr mw me
55f08a6b4000-55f08a9b7000 r-xp 000f0000 fe:00 10036868                   /opt/nccl preflight/bin
Rss:                2436 kB
Anonymous:             0 kB
55f08a9b7000-55f08a9c6000 r--p 003f2000 fe:00 10036868                   /opt/nccl preflight/bin
Anonymous:            60 kB
55f08a9c6000-55f08a9c8000 rw-p 00401000 fe:00 10036868                   /opt/nccl preflight/bin
Anonymous:             8 kB
55f08a9c8000-55f08a9c9000 r--s 00000000 fe:00 10036868                   /opt/nccl preflight/bin
Anonymous:             0 kB
55f08aa2c000-55f08aab7000 rw-p 00000000 00:00 0                          [heap]
Anonymous:           524 kB
7f8b160bd000-7f8b162bd000 rw-p 00000000 00:00 0 
Anonymous:            16 kB
7f8b16800000-7f8b16828000 r--p 00000000 fe:00 1234                       /usr/lib/x86_64-linux-gnu/libc.so.6
Anonymous:             0 kB
7f8b16828000-7f8b169bd000 r-xp 00028000 fe:00 1234                       /usr/lib/x86_64-linux-gnu/libc.so.6
7ffd1501e000-7ffd1503f000 rw-p 00000000 00:00 0                          [stack]
Anonymous:            80 kB
";

    fn ranges(found: &[&Mapping]) -> Vec<(usize, usize, bool)> {
        found
            .iter()
            .map(|m| (m.start, m.end, m.only_file_pages()))
            .collect()
    }

    #[test]
    fn the_binary_is_every_mapping_of_the_file_holding_the_code() {
        let mappings = parse_smaps(SMAPS);
        assert_eq!(mappings.len(), 10);
        // Only the read-only data and the text hold nothing but the file's pages: not
        // the RELRO part, the data, or a shared mapping.
        let binary = vec![
            (0x55f0_8a5c_3000, 0x55f0_8a6b_4000, true),
            (0x55f0_8a6b_4000, 0x55f0_8a9b_7000, true),
            (0x55f0_8a9b_7000, 0x55f0_8a9c_6000, false),
            (0x55f0_8a9c_6000, 0x55f0_8a9c_8000, false),
            (0x55f0_8a9c_8000, 0x55f0_8a9c_9000, false),
        ];
        // Any address of any of its mappings names the file.
        assert_eq!(ranges(&mappings_of(&mappings, 0x55f0_8a6b_4000)), binary);
        assert_eq!(ranges(&mappings_of(&mappings, 0x55f0_8a9c_7fff)), binary);
        // A mapping whose smaps says nothing of anonymous memory is not known clean.
        assert_eq!(
            ranges(&mappings_of(&mappings, 0x7f8b_1690_0000)),
            vec![
                (0x7f8b_1680_0000, 0x7f8b_1682_8000, true),
                (0x7f8b_1682_8000, 0x7f8b_169b_d000, false)
            ]
        );
    }

    #[test]
    fn an_address_outside_any_file_mapping_names_nothing() {
        let mappings = parse_smaps(SMAPS);
        for code in [
            0x55f0_8aa2_c000,
            0x7f8b_160b_d000,
            0x7ffd_1501_e000,
            0x10,
            0x55f0_8a5c_2fff,
        ] {
            assert_eq!(
                mappings_of(&mappings, code),
                Vec::<&Mapping>::new(),
                "{code:#x}"
            );
        }
        assert_eq!(parse_smaps(""), Vec::new());
        assert_eq!(
            parse_smaps("garbage\n1-2\nx-y r-xp\nAnonymous: 3 kB\n1-2 rwxpp 0 0:0 0\n"),
            Vec::new()
        );
    }

    /// The real /proc/self/smaps of the test binary: the code of this very function lies
    /// in one of the mappings found, and its text holds only the file's pages.
    #[test]
    fn this_process_finds_its_own_code() {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mappings = parse_smaps(&smaps);
        let code = this_process_finds_its_own_code as fn() as usize;
        let found = mappings_of(&mappings, code);
        let text = found
            .iter()
            .find(|m| (m.start..m.end).contains(&code))
            .unwrap();
        assert!(text.only_file_pages(), "{text:?}");
        assert!(found.len() >= 2, "{found:x?}");
    }
}
