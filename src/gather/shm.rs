//! /dev/shm facts: statvfs for size and free space, /proc/self/mountinfo for
//! what is mounted there.

use super::host::Host;
use super::kernel::Kernel;
use crate::facts::{MountEntry, ShmFacts};

const SHM_PATH: &str = "/dev/shm";

/// Undoes mountinfo's octal escapes (`\040` for space, `\011`, `\012`, `\134`).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 4 <= bytes.len() {
            let digits = &bytes[i + 1..i + 4];
            if digits.iter().all(|d| (b'0'..=b'7').contains(d)) {
                let value = digits
                    .iter()
                    .fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
                if let Ok(v) = u8::try_from(value) {
                    out.push(v);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn split_options(field: &str) -> Vec<String> {
    field
        .split(',')
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

/// Parses /proc/self/mountinfo (proc(5)); a malformed line is an error naming its number.
fn parse_mountinfo(text: &str) -> Result<Vec<MountEntry>, String> {
    let mut mounts = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split(' ').collect();
        let sep = fields
            .iter()
            .position(|f| *f == "-")
            .filter(|&p| p >= 6 && fields.len() >= p + 4)
            .ok_or_else(|| format!("line {}: not in mountinfo format", n + 1))?;
        mounts.push(MountEntry {
            mount_point: unescape(fields[4]),
            mount_options: split_options(fields[5]),
            fs_type: unescape(fields[sep + 1]),
            source: unescape(fields[sep + 2]),
            super_options: split_options(fields[sep + 3]),
        });
    }
    Ok(mounts)
}

/// The mount visible at `point`: the last one listed, since later mounts stack on top.
fn mount_at<'a>(mounts: &'a [MountEntry], point: &str) -> Option<&'a MountEntry> {
    mounts.iter().rev().find(|m| m.mount_point == point)
}

pub fn gather(host: &Host, kernel: &dyn Kernel) -> ShmFacts {
    let usage = kernel.statvfs(&host.path(SHM_PATH)).into();
    let mount = host.parse_required("/proc/self/mountinfo", |text| {
        parse_mountinfo(text).map(|mounts| mount_at(&mounts, SHM_PATH).cloned())
    });
    ShmFacts { usage, mount }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
22 1 0:21 / / rw,relatime - overlay overlay rw,lowerdir=/a,upperdir=/b
25 22 0:23 / /dev rw,nosuid - tmpfs tmpfs rw,size=65536k,mode=755
30 25 0:27 / /dev/shm rw,nosuid,nodev,noexec,relatime - tmpfs shm rw,size=65536k
31 25 0:28 / /dev/shm rw,relatime shared:5 - tmpfs tmpfs rw,size=1048576k
40 22 0:30 / /mnt/with\\040space rw - ext4 /dev/vda rw
";

    #[test]
    fn finds_topmost_dev_shm_and_unescapes() {
        let mounts = parse_mountinfo(MOUNTINFO).unwrap();
        assert_eq!(mounts.len(), 5);
        let shm = mount_at(&mounts, "/dev/shm").unwrap();
        assert_eq!(shm.super_options, vec!["rw", "size=1048576k"]);
        assert_eq!(shm.fs_type, "tmpfs");
        assert_eq!(mounts[4].mount_point, "/mnt/with space");
        assert!(mount_at(&mounts, "/nope").is_none());
    }

    #[test]
    fn malformed_line_is_an_error_with_its_number() {
        let err = parse_mountinfo("22 1 0:21 / / rw - overlay overlay rw\ngarbage\n").unwrap_err();
        assert!(err.contains("line 2"), "{err}");
        assert!(parse_mountinfo("").unwrap().is_empty());
        // A trailing backslash or bad octal is kept literally, not a panic.
        assert_eq!(unescape("a\\"), "a\\");
        assert_eq!(unescape("a\\9z"), "a\\9z");
    }
}
