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

/// A bounded, seeded fuzz of the procfs and sysfs parsers: the files of fixture
/// host trees, mutated (bytes flipped, lines cut, repeated or emptied, numbers
/// made huge), are gathered, judged, tuned and rendered, and nothing panics.
#[cfg(test)]
mod host_tree_fuzz {
    use super::*;
    use crate::gather::{VendorOptions, gpu::GpuOptions, host::Host, rdma::RdmaOptions};
    use std::time::Duration;

    fn files(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let entry = entry.unwrap();
            let kind = entry.file_type().unwrap();
            if kind.is_dir() {
                files(&entry.path(), out);
            } else if kind.is_file() {
                out.push(entry.path());
            }
        }
    }

    #[test]
    fn fuzz_procfs_and_sysfs_parsers_with_seeded_mutations() {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
        let vendor = VendorOptions {
            gpu: GpuOptions {
                nvml_library: "absent/libnvidia-ml.so.1".into(),
                cuda_library: "absent/libcuda.so.1".into(),
                call_timeout: Duration::from_secs(5),
                trace: false,
                cuda: false,
                unjudged: true,
            },
            rdma: RdmaOptions {
                verbs_library: "absent/libibverbs.so.1".into(),
                fabric_libraries: vec!["absent/libfabric.so.1".into()],
                nccl_libraries: vec!["absent/libnccl.so.2".into()],
                net_plugin_env: None,
                memreg_bytes: 1 << 20,
                call_timeout: Duration::from_secs(5),
                trace: false,
                probe_all: false,
                own_image: false,
            },
            image: crate::facts::ImageRole::Trainer,
        };
        let policy = crate::policy::build(&[], &[], None, None).unwrap();
        let mut state = 0xfeed_f00d_u64;
        let mut next = move |n: usize| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % n.max(1) as u64) as usize
        };
        for fixture in [
            "rdma-roce-multus",
            "rdma-port-down",
            "healthy-pod",
            "gpu-h100-nv18",
        ] {
            let src = repo.join("tests/fixtures").join(fixture);
            let dir =
                std::env::temp_dir().join(format!("fuzz-tree-{fixture}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            let copied = std::process::Command::new("cp")
                .arg("-a")
                .arg(src.join("root"))
                .arg(&dir)
                .status()
                .unwrap();
            assert!(copied.success());
            let root = dir.join("root");
            let mut paths = Vec::new();
            files(&root, &mut paths);
            paths.sort();
            let originals: Vec<Vec<u8>> = paths.iter().map(|p| std::fs::read(p).unwrap()).collect();
            let recording: Recording =
                serde_json::from_str(&std::fs::read_to_string(src.join("kernel.json")).unwrap())
                    .unwrap();
            for _ in 0..40 {
                let mut touched = Vec::new();
                for _ in 0..=next(4) {
                    let i = next(paths.len());
                    let mut bytes = originals[i].clone();
                    match next(6) {
                        0 if !bytes.is_empty() => {
                            let at = next(bytes.len());
                            bytes[at] = next(256) as u8;
                        }
                        1 => bytes.truncate(next(bytes.len() + 1)),
                        2 => bytes = bytes.repeat(1 + next(50)),
                        3 => bytes.clear(),
                        4 => bytes = b"18446744073709551616 -1 0x\n".to_vec(),
                        _ => bytes.extend_from_slice(b"\n\x1b[2J\t:\n"),
                    }
                    std::fs::write(&paths[i], &bytes).unwrap();
                    touched.push(i);
                }
                let host = Host::new(&root);
                let kernel = ReplayKernel::new(recording.clone(), &root);
                let (facts, _) = crate::gather::gather(&host, &kernel, &[], &vendor);
                let findings = crate::judge::judge(&facts, &policy);
                let settings = crate::tune::tune(&facts);
                let report = crate::report::Report::new(facts, findings, settings);
                assert!(crate::render::human::render(&report, false).contains("Verdict: "));
                assert!(!crate::render::doctor::render(&report, false).is_empty());
                for i in touched {
                    std::fs::write(&paths[i], &originals[i]).unwrap();
                }
            }
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }
}
