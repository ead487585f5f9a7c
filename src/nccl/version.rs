//! An NCCL release number, its one parser, and the releases where NCCL's behaviour
//! changed that the checks key on (each threshold cites the NVIDIA/nccl source).
//!
//! Every place that reads a version (the facts' `2.28.9+cuda12.9`, a tag `v2.28.9-1`,
//! a log's `NCCL version 2.28.9+cuda12.9`, ncclGetVersion's code 22809) goes through
//! [`Version::parse`] or [`Version::from_code`], so no reader refuses a form another
//! accepts and predicts "newest" for it.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

/// An NCCL release, `2.28.9`. Ordered by (major, minor, patch).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Version {
    major: u32,
    minor: u32,
    patch: u32,
}

impl Version {
    pub const fn new(major: u32, minor: u32, patch: u32) -> Version {
        Version {
            major,
            minor,
            patch,
        }
    }

    /// ncclGetVersion's code: from 2.9 `major*10000 + minor*100 + patch` (22809 is
    /// 2.28.9), before it `major*1000 + minor*100 + patch` (2803 is 2.8.3)
    /// (NVIDIA/nccl src/nccl.h.in `NCCL_VERSION(X,Y,Z)`, v2.9.6-1 and v2.8.4-1). No
    /// code of the old form reaches 10000. `None` for a code no release returns.
    pub(crate) fn from_code(code: i64) -> Option<Version> {
        let code = u32::try_from(code).ok().filter(|c| *c >= 1000)?;
        let (major, rest) = if code >= 10000 {
            (code / 10000, code % 10000)
        } else {
            (code / 1000, code % 1000)
        };
        Some(Version::new(major, rest / 100, rest % 100))
    }

    /// ncclGetVersion's code as the version it stands for (`2.28.9`), or the code itself
    /// where no release returns it (a broken or fake library).
    pub fn code_text(code: i64) -> String {
        Version::from_code(code).map_or_else(|| format!("version code {code}"), |v| v.to_string())
    }

    /// `2.28.9`, `2.28.9-1` (a release tag, also with a leading `v`), `2.28.9+cuda12.9`
    /// (how libnccl's own banner and the facts write it), `NCCL version 2.28.9 ...` (a
    /// log or RAS line), or ncclGetVersion's code as text (`22809`, `2809`). Anything
    /// after the three numbers that starts with `-`, `+` or a space is the build's, not
    /// the release's.
    pub fn parse(text: &str) -> Option<Version> {
        let text = text.trim();
        let text = text.strip_prefix("NCCL version ").unwrap_or(text);
        let text = text.strip_prefix('v').unwrap_or(text);
        let end = text
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(text.len());
        let (numbers, rest) = text.split_at(end);
        if !(rest.is_empty() || rest.starts_with(['-', '+', ' '])) {
            return None;
        }
        if !numbers.contains('.') {
            return Version::from_code(numbers.parse().ok()?);
        }
        let mut parts = numbers.split('.').map(|p| p.parse::<u32>().ok());
        let v = Version::new(parts.next()??, parts.next()??, parts.next()??);
        parts.next().is_none().then_some(v)
    }

    /// The release series (2.28 of 2.28.9), for rules that hold across its patches.
    pub fn series(self) -> (u32, u32) {
        (self.major, self.minor)
    }
}

/// Whether NCCL `version` is at least `at`; an unknown version is taken as the newest
/// (what a check assumes when no libnccl was found, and says so).
pub(crate) fn since(version: Option<Version>, at: Version) -> bool {
    version.is_none_or(|v| v >= at)
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

impl std::str::FromStr for Version {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Version::parse(s).ok_or_else(|| format!("{s:?} is not an NCCL version (2.28.9)"))
    }
}

/// Written as `"2.28.9"`, as the reports always wrote it.
impl Serialize for Version {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Version {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

// The releases where NCCL's behaviour changed that the checks key on, oldest first. A
// rule compares against one of these, never against a literal, so each version line
// the tool draws is named once with the NVIDIA/nccl source it follows.

/// PXN: a GPU reaches a NIC through an NVLink peer closer to it (src/graph/paths.cc
/// ncclTopoComputePaths, NCCL_PXN_DISABLE; from v2.12.7-1).
pub(crate) const PXN: Version = Version::new(2, 12, 0);
/// GPUDirect RDMA through dma-buf (src/transport/net_ib.cc ncclIbDmaBufSupport, from
/// v2.13.4-1).
pub(crate) const DMABUF: Version = Version::new(2, 13, 0);
/// cuMem is NCCL's default for P2P buffers, `P2P/CUMEM` (src/transport/p2p.cc,
/// NCCL_CUMEM_ENABLE default on, v2.19.3-1); so P2P needs no shared IPC namespace.
pub(crate) const CUMEM: Version = Version::new(2, 19, 0);
/// GDR read on for every GPU of compute capability 8.0+ (src/graph/paths.cc
/// ncclTopoCheckGdr, v2.19.3-1); before it only for a GPU with an NVLink peer.
pub(crate) const GDR_READ_SM80: Version = Version::new(2, 19, 0);
/// Multi-node NVLink (src/init.cc checkMNNVL, v2.20.3-1; absent at v2.19.4-1).
pub(crate) const MNNVL: Version = Version::new(2, 20, 0);
/// The RoCE GID chosen by NCCL (NCCL_IB_ADDR_FAMILY, NCCL_IB_ROCE_VERSION_NUM;
/// src/transport/net_ib.cc ncclIbGetGidIndex, v2.21.5-1).
pub(crate) const DYNAMIC_GID: Version = Version::new(2, 21, 0);
/// NCCL_NET_PLUGIN's value tried as a library name before `libnccl-net-<value>.so`
/// (src/net.cc ncclNetPluginInit, v2.21.5-1).
pub(crate) const PLUGIN_BARE_NAME: Version = Version::new(2, 21, 0);
/// Before this release a forced NCCL_ALGO/NCCL_PROTO that leaves nothing re-enables
/// Ring and Tree (src/graph/tuning.cc "ignoring NCCL_ALGO", through v2.20.5-1).
pub(crate) const ALGO_NO_FALLBACK: Version = Version::new(2, 21, 0);
/// NCCL_CUMEM_HOST_ENABLE exists (src/misc/cudawrap.cc, v2.23.4-1; default 0).
pub(crate) const CUMEM_HOST_VARIABLE: Version = Version::new(2, 23, 0);
/// NCCL_CONF_FILE is read (src/misc/param.cc initEnv, v2.23.4-1; absent at v2.22.3-1).
pub(crate) const CONF_FILE: Version = Version::new(2, 23, 0);
/// Settings-file lines starting with `#` are skipped (src/misc/param.cc setEnvFile,
/// v2.26.2-1; v2.25.1-1 reads them as variables).
pub(crate) const CONF_FILE_COMMENTS: Version = Version::new(2, 26, 0);
/// `~/.nccl.conf` is `$HOME`'s, not the passwd entry's; a carriage return before the
/// newline is cut and lines are read with fgets into 4096 bytes (src/misc/param.cc
/// userHomeDir, setEnvFile, v2.30.3-1).
pub(crate) const HOME_FROM_ENV: Version = Version::new(2, 30, 0);
/// SHM buffers in cuMem host memory by default on CUDA 12.6 drivers
/// (src/misc/cudawrap.cc ncclCuMemHostEnable, v2.24.3-1).
pub(crate) const CUMEM_HOST: Version = Version::new(2, 24, 0);
/// An unknown name in NCCL_ALGO/NCCL_PROTO is an init error (src/graph/tuning.cc
/// parseList, v2.24.3-1).
pub(crate) const STRICT_LIST: Version = Version::new(2, 24, 0);
/// Bootstrap's "no socket interface found" returns ncclInvalidUsage (5), not
/// ncclInternalError (3) (src/bootstrap.cc bootstrapNetInit, v2.24.3-1).
pub(crate) const BOOTSTRAP_INVALID_USAGE: Version = Version::new(2, 24, 0);
/// NCCL_NET_PLUGIN's value is used as a path when it holds `/` or is `lib*.so`
/// (src/plugin/plugin_open.cc openPluginLib, v2.26.2-1).
pub(crate) const PLUGIN_PATH: Version = Version::new(2, 26, 0);
/// NCCL_NET_PLUGIN is a comma list, empty entries skipped (src/plugin/net.cc
/// ncclNetPluginInit, v2.27.3-1).
pub(crate) const PLUGIN_LIST: Version = Version::new(2, 27, 0);
/// No usable network is "Failed to initialize any NET plugin", no longer "Error: network
/// X not found." (src/plugin/net.cc ncclNetInit, v2.27.3-1; v2.26.2-1 still the latter).
pub(crate) const NET_INIT_MESSAGE: Version = Version::new(2, 27, 0);
/// Multi-node NVLink decided by a trial FABRIC allocation, failing init with an IMEX
/// hint where the clique exists but the trial fails (src/mnnvl.cc ncclMnnvlCheck,
/// v2.27.3-1).
pub(crate) const MNNVL_TRIAL: Version = Version::new(2, 27, 0);
/// NVLS goes on without itself where multicast does not bind ("Continue without NVLS
/// support", src/transport/nvls.cc, v2.27.3-1).
pub(crate) const NVLS_FALLBACK: Version = Version::new(2, 27, 3);
/// NCCL raises its threads' default stack to 8 MiB where RLIMIT_STACK is smaller or
/// unlimited (src/init.cc setCpuStackSize, NCCL_SET_CPU_STACK_SIZE=1, v2.28.3-1).
pub(crate) const OWN_THREAD_STACKS: Version = Version::new(2, 28, 3);
/// Interfaces without IFF_RUNNING skipped, `virbr` avoided (src/misc/socket.cc
/// ncclFindInterfaces, v2.28.3-1).
pub(crate) const RUNNING_INTERFACES: Version = Version::new(2, 28, 0);
/// `NCCL_NET_PLUGIN=none` loads no plugin (src/plugin/net.cc, v2.28.3-1).
pub(crate) const PLUGIN_NONE: Version = Version::new(2, 28, 0);
/// NCCL_MIN_CTAS, NCCL_MAX_CTAS and NCCL_CGA_CLUSTER_SIZE read at init (src/init.cc
/// envConfigOverride, v2.17.1-1).
pub(crate) const CTAS_ENV: Version = Version::new(2, 17, 0);
/// A P2P chunk times NCCL_STEPS is cut to NCCL_BUFFSIZE (src/init.cc computeBuffSizes,
/// v2.19.1-1).
pub(crate) const P2P_CHUNK_CLAMP: Version = Version::new(2, 19, 0);
/// MAXCHANNELS 64, 32 before (src/include/device.h, v2.25.1-1).
pub(crate) const MAXCHANNELS_64: Version = Version::new(2, 25, 0);
/// NCCL's parameter API: ncclParamGetAllParameterKeys, ncclParamGetParameter,
/// ncclParamDumpAll (src/nccl.h.in, src/param/c_api.cc, v2.30.3-1).
pub(crate) const PARAM_API: Version = Version::new(2, 30, 0);
/// NCCL_COMM_ID's IPv4 subnet test inverted (src/os/linux.cc matchSubnet, v2.29.2-1 to
/// v2.29.7-1): bootstrap binds the first IPv4 address outside the subnet.
pub(crate) const COMM_ID_SUBNET_INVERTED: (u32, u32) = (2, 29);
/// The XML reader's limits: MAX_SUBS 128 (checked; 32 unchecked before),
/// NCCL_TOPO_XML_MAX_NODES 256 and NCCL_GRAPH_XML_MAX_NODES 4096 (1024 for both before)
/// (src/graph/xml.h, topo.h, v2.21.5-1).
pub(crate) const XML_LIMITS: Version = Version::new(2, 21, 0);
/// XML values in single quotes, and name and value lengths checked (src/graph/xml.cc
/// xmlGetValue, v2.27.3-1).
pub(crate) const XML_SINGLE_QUOTES: Version = Version::new(2, 27, 0);
/// NCCL_GRAPH_XML_MAX_NODES 65536 (src/graph/topo.h, v2.29.7-1).
pub(crate) const XML_GRAPH_NODES: Version = Version::new(2, 29, 7);
/// NCCL's RAS diagnostics (docs troubleshooting/diagnostics.html: "As of v2.31").
pub(crate) const RAS_DIAGNOSTICS: Version = Version::new(2, 31, 0);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_form_a_version_is_written_in() {
        let v = Some(Version::new(2, 28, 9));
        for text in [
            "2.28.9",
            " 2.28.9\n",
            "2.28.9-1",
            "v2.28.9-1",
            "2.28.9+cuda12.9",
            "NCCL version 2.28.9+cuda13.0",
            "NCCL version 2.28.9 compiled with CUDA 13.0",
            "22809",
        ] {
            assert_eq!(Version::parse(text), v, "{text:?}");
        }
        assert_eq!(Version::parse("2809"), Some(Version::new(2, 8, 9)));
        for bad in ["", "2.28", "2.28.9.1", "2.x.9", "2.28.9cuda", "abc", "999"] {
            assert_eq!(Version::parse(bad), None, "{bad:?}");
        }
        assert_eq!("2.21.5".parse(), Ok(Version::new(2, 21, 5)));
        assert!("2.21".parse::<Version>().unwrap_err().contains("2.21"));
    }

    #[test]
    fn codes_of_both_forms() {
        let code = |c| Version::from_code(c).map(|v| v.to_string());
        assert_eq!(code(22809).as_deref(), Some("2.28.9"));
        assert_eq!(code(21805).as_deref(), Some("2.18.5"));
        assert_eq!(code(20900).as_deref(), Some("2.9.0"));
        assert_eq!(code(2803).as_deref(), Some("2.8.3"));
        assert_eq!(code(2708).as_deref(), Some("2.7.8"));
        assert_eq!(code(30001).as_deref(), Some("3.0.1"));
        assert_eq!(code(0), None);
        assert_eq!(code(-22809), None);
        assert!(Version::from_code(22809) > Version::from_code(2803));
    }

    #[test]
    fn order_since_and_json() {
        assert!(since(None, DYNAMIC_GID));
        assert!(since(Some(Version::new(2, 21, 5)), DYNAMIC_GID));
        assert!(!since(Some(Version::new(2, 18, 5)), DYNAMIC_GID));
        assert!(Version::new(2, 9, 9) < Version::new(2, 10, 0));
        let v = Version::new(2, 28, 9);
        assert_eq!(serde_json::to_string(&v).unwrap(), "\"2.28.9\"");
        assert_eq!(
            serde_json::from_str::<Version>("\"2.28.9+cuda12.9\"").unwrap(),
            v
        );
        assert!(serde_json::from_str::<Version>("\"newest\"").is_err());
        assert_eq!(v.series(), (2, 28));
    }
}
