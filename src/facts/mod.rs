//! `Facts`: everything gather saw on the host, as plain serializable data.
//!
//! Absence is data (`None`, an empty list); a read or syscall that failed is an
//! `Observed::Error` carrying what was read and why it failed. Nothing here
//! defaults to zero. The judge, tune and render stages read only this struct, so
//! a `facts` capture replays anywhere.

pub(crate) mod gpu;
pub(crate) mod rdma;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::BTreeMap;
use std::fmt;

/// The schema string of a facts document. Bumped when a field changes meaning.
pub(crate) const FACTS_SCHEMA: &str = "nccl-preflight/facts/v1";

/// The result of reading one fact: its value, or why it could not be read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Observed<T> {
    Value(T),
    Error(FactError),
}

impl<T> Observed<T> {
    pub fn value(&self) -> Option<&T> {
        match self {
            Observed::Value(v) => Some(v),
            Observed::Error(_) => None,
        }
    }

    pub fn error(&self) -> Option<&FactError> {
        match self {
            Observed::Value(_) => None,
            Observed::Error(e) => Some(e),
        }
    }

    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Observed<U> {
        match self {
            Observed::Value(v) => Observed::Value(f(v)),
            Observed::Error(e) => Observed::Error(e),
        }
    }
}

impl<T> From<Result<T, FactError>> for Observed<T> {
    fn from(result: Result<T, FactError>) -> Self {
        match result {
            Ok(v) => Observed::Value(v),
            Err(e) => Observed::Error(e),
        }
    }
}

/// Why a fact could not be read: the file or call, and the error text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FactError {
    /// The path read (under the host root) or the syscall made, e.g. `getrlimit(RLIMIT_MEMLOCK)`.
    pub source: String,
    /// The operating system's or parser's message.
    pub message: String,
    /// What kind of failure it was, where that decides the verdict; `None` for the rest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<FailureKind>,
    /// The errno of a failed system or vendor call, where a check's verdict depends on
    /// which one it was (ibv_reg_mr's ENOMEM, EAGAIN or EPERM is the memlock limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub errno: Option<i32>,
}

/// Failures whose kind, not their text, decides what a check says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// A vendor call or read did not return within `--timeout`: the driver or device is stuck.
    Timeout,
    /// This process ran out of its own resources (a thread it could not start, ENOMEM from
    /// dlopen or mmap under a small `ulimit -v`): the tool's limits, not the node's fault.
    OwnResources,
    /// A vendor library is there but does not load or lacks a symbol it must have (a
    /// missing dependency, a bad ELF, driver libraries of another version).
    Unloadable,
    /// The vendor library loaded but the kernel driver is not (NVML_ERROR_DRIVER_NOT_LOADED).
    DriverNotLoaded,
    /// The function is not in the library loaded (dlsym found no such symbol, or NVML's
    /// NVML_ERROR_FUNCTION_NOT_FOUND, nvml.h: "Local version of NVML doesn't implement this
    /// function"): an older or another driver's library. The query could not be made, so
    /// nothing is known of what it reads.
    NotInLibrary,
    /// The call was made and failed with an error that is no answer about the device
    /// (NVML_ERROR_UNKNOWN, NO_PERMISSION, ...; not NOT_SUPPORTED, which says the device
    /// has no such thing): nothing is known of what it reads.
    CallFailed,
    /// NVML_ERROR_GPU_IS_LOST: the driver says the GPU fell off the bus or is otherwise
    /// inaccessible, a state of the node.
    GpuLost,
}

impl FactError {
    pub fn new(source: impl Into<String>, message: impl fmt::Display) -> Self {
        FactError {
            source: source.into(),
            message: message.to_string(),
            kind: None,
            errno: None,
        }
    }

    /// The same error, with the errno of the call that failed.
    pub fn with_errno(mut self, errno: i32) -> Self {
        self.errno = Some(errno);
        self
    }

    /// The same error, marked with its kind.
    pub fn with_kind(mut self, kind: FailureKind) -> Self {
        self.kind = Some(kind);
        self
    }

    /// True when this process's own limits caused it (gather marks those: a thread it could
    /// not start, dlopen's ENOMEM).
    pub fn is_own_resources(&self) -> bool {
        self.kind == Some(FailureKind::OwnResources)
    }

    /// True when the query could not be made or failed without an answer (absent from the
    /// library, or an error that says nothing of the device): the value is unknown, and
    /// no check may read its absence as a state of the hardware.
    pub fn is_unread(&self) -> bool {
        matches!(
            self.kind,
            Some(FailureKind::NotInLibrary | FailureKind::CallFailed)
        )
    }
}

impl fmt::Display for FactError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.source, self.message)
    }
}

/// A resource limit: a number of bytes, or unlimited (`RLIM_INFINITY`).
/// Serialized as a number or the string `"unlimited"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Limit {
    Bytes(u64),
    Unlimited,
}

impl Limit {
    /// True when this limit is at least `other`.
    pub fn covers(self, other: Limit) -> bool {
        match (self, other) {
            (Limit::Unlimited, _) => true,
            (Limit::Bytes(_), Limit::Unlimited) => false,
            (Limit::Bytes(a), Limit::Bytes(b)) => a >= b,
        }
    }
}

impl Serialize for Limit {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Limit::Bytes(n) => s.serialize_u64(*n),
            Limit::Unlimited => s.serialize_str("unlimited"),
        }
    }
}

impl<'de> Deserialize<'de> for Limit {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Number(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Number(n) => Ok(Limit::Bytes(n)),
            Raw::Text(t) if t == "unlimited" => Ok(Limit::Unlimited),
            Raw::Text(t) => Err(serde::de::Error::custom(format!(
                "expected a byte count or \"unlimited\", found {t:?}"
            ))),
        }
    }
}

/// Soft and hard values of one resource limit, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rlimit {
    /// The limit in force (`rlim_cur`).
    pub soft: Limit,
    /// The ceiling the process may raise the soft limit to (`rlim_max`).
    pub hard: Limit,
}

/// Everything the tool saw, in one document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Facts {
    /// Always [`FACTS_SCHEMA`].
    pub schema: String,
    /// The version of nccl-preflight that gathered these facts.
    pub tool_version: String,
    /// The directory every host file was read under (`--host-root`).
    pub host_root: String,
    pub memlock: MemlockFacts,
    /// RLIMIT_STACK of this process, in bytes.
    pub stack_limit: Observed<Rlimit>,
    pub dev_shm: ShmFacts,
    pub namespaces: NamespaceFacts,
    pub network: NetworkFacts,
    pub platform: PlatformFacts,
    pub rdma: rdma::RdmaFacts,
    pub gpus: gpu::GpuFacts,
    /// Launcher and container variables (WORLD_SIZE, CUDA_VISIBLE_DEVICES, ...) that were set.
    pub launcher: BTreeMap<String, EnvValue>,
    /// `--nodes`: the nodes the job spans, as the manifest states it (an initContainer
    /// gets no launcher variables). Part of the launcher section; `layout::job_nodes`
    /// counts from it first, then from the launcher's variables.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<u64>,
    /// Every NCCL_*, FI_* and OFI_NCCL_* variable that was set (NCCL_PREFLIGHT_* excluded: those are ours).
    pub nccl_env: BTreeMap<String, EnvValue>,
    /// Which image this process runs in: the trainer's (its libibverbs, libfabric, libnccl
    /// and net plugin are the ones NCCL will load) or nccl-preflight's own (they are not).
    #[serde(default)]
    pub image: ImageRole,
    /// Files the user's variables name (NCCL_TOPO_FILE, NCCL_CONF_FILE, NCCL_GRAPH_FILE) and
    /// whether each is a readable file under the host root.
    #[serde(default)]
    pub named_files: BTreeMap<String, bool>,
}

/// One top-level section of [`Facts`]: what a check declares it reads (`judge::CHECKS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fact {
    Memlock,
    StackLimit,
    DevShm,
    Namespaces,
    Network,
    Platform,
    Rdma,
    Gpus,
    Launcher,
    NcclEnv,
    Image,
    NamedFiles,
}

impl Fact {
    /// The section's key in the facts document (`nccl-preflight facts`).
    /// Only judge's tests read it: they hold each check to its `needs`.
    #[cfg(test)]
    pub fn key(self) -> &'static str {
        match self {
            Fact::Memlock => "memlock",
            Fact::StackLimit => "stack_limit",
            Fact::DevShm => "dev_shm",
            Fact::Namespaces => "namespaces",
            Fact::Network => "network",
            Fact::Platform => "platform",
            Fact::Rdma => "rdma",
            Fact::Gpus => "gpus",
            Fact::Launcher => "launcher",
            Fact::NcclEnv => "nccl_env",
            Fact::Image => "image",
            Fact::NamedFiles => "named_files",
        }
    }

    /// Copies this section from `from` into `to`, leaving every other section alone.
    /// Only judge's tests read it: they hold each check to its `needs`.
    #[cfg(test)]
    pub fn copy(self, from: &Facts, to: &mut Facts) {
        match self {
            Fact::Memlock => to.memlock = from.memlock.clone(),
            Fact::StackLimit => to.stack_limit = from.stack_limit.clone(),
            Fact::DevShm => to.dev_shm = from.dev_shm.clone(),
            Fact::Namespaces => to.namespaces = from.namespaces.clone(),
            Fact::Network => to.network = from.network.clone(),
            Fact::Platform => to.platform = from.platform.clone(),
            Fact::Rdma => to.rdma = from.rdma.clone(),
            Fact::Gpus => to.gpus = from.gpus.clone(),
            Fact::Launcher => {
                to.launcher = from.launcher.clone();
                to.nodes = from.nodes;
            }
            Fact::NcclEnv => to.nccl_env = from.nccl_env.clone(),
            Fact::Image => to.image = from.image,
            Fact::NamedFiles => to.named_files = from.named_files.clone(),
        }
    }
}

/// Which image the tool runs in. Node-level facts (devices, ports, limits, GPUs through
/// the NVIDIA runtime's injected libraries) are the same in every container of a pod;
/// the RDMA and NCCL libraries are the image's own, so only the trainer's image can
/// show the ones training will load.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ImageRole {
    /// The image the trainer runs (`exec`, or the installed binary run in the training
    /// image): every check is judged.
    #[default]
    Trainer,
    /// nccl-preflight's own image (docker/Dockerfile sets NCCL_PREFLIGHT_IMAGE=own):
    /// checks of the image's libraries skip, saying how to get them judged.
    Own,
}

impl ImageRole {
    /// Why the image's libraries are not probed in nccl-preflight's own image, and where
    /// they are judged instead.
    pub const OWN_REASON: &'static str = "nccl-preflight's own image, not the trainer's: judged where the trainer runs, by `nccl-preflight exec` in the training container or the installed binary run as an initContainer of the training image";
}

/// An environment variable's value. Values that are not UTF-8 are kept with
/// U+FFFD replacements and flagged, so nothing downstream mistakes them for the real bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnvValue {
    pub value: String,
    /// True when the raw value was not valid UTF-8 and `value` is a lossy rendering.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub not_utf8: bool,
}

impl EnvValue {
    pub fn text(value: impl Into<String>) -> Self {
        EnvValue {
            value: value.into(),
            not_utf8: false,
        }
    }
}

/// Locked-memory limits and what a real `mlock` showed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemlockFacts {
    /// RLIMIT_MEMLOCK of this process, in bytes.
    pub limit: Observed<Rlimit>,
    /// Whether CAP_IPC_LOCK is in the effective set (from `/proc/self/status` CapEff): it lifts
    /// RLIMIT_MEMLOCK for both mlock and RDMA memory registration.
    pub cap_ipc_lock: Observed<bool>,
    /// The effective user id (`/proc/self/status` Uid, second field): capabilities added to a
    /// non-root container are not effective, so the fix depends on it. `None` when unread.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub euid: Option<u32>,
    /// A small buffer locked and unlocked again: proves mlock works at all here.
    pub probe: Option<MlockProbe>,
    /// A buffer one page larger than the soft limit: proves whether the limit is enforced.
    /// Only tried when the soft limit is finite and small, and CAP_IPC_LOCK is not held.
    pub enforcement_probe: Option<MlockProbe>,
    /// Probes that could not run at all (the buffer could not be mapped), with the errno.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub probe_errors: Vec<FactError>,
}

/// One real `mlock` of an anonymous buffer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MlockProbe {
    /// Size of the buffer, in bytes.
    pub bytes: u64,
    /// `None` when the lock succeeded, otherwise the error text (e.g. `ENOMEM: Cannot allocate memory`).
    pub refused: Option<String>,
}

/// The POSIX shared-memory mount NCCL and PyTorch use.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShmFacts {
    /// statvfs of /dev/shm; `None` when /dev/shm does not exist.
    pub usage: Observed<Option<FsUsage>>,
    /// The mount at /dev/shm from /proc/self/mountinfo; `None` when /dev/shm is not a mount point.
    pub mount: Observed<Option<MountEntry>>,
}

/// Size and free space of a filesystem, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsUsage {
    pub size_bytes: u64,
    /// Bytes available to an unprivileged process.
    pub free_bytes: u64,
}

/// One line of /proc/self/mountinfo.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountEntry {
    pub mount_point: String,
    pub fs_type: String,
    pub source: String,
    /// Per-mount options (ro, nosuid, ...).
    pub mount_options: Vec<String>,
    /// Filesystem options (size=..., mode=...).
    pub super_options: Vec<String>,
}

/// The namespaces this process runs in, and the identity NCCL uses to decide "same host".
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamespaceFacts {
    /// Inode of /proc/self/ns/ipc.
    pub ipc: Observed<u64>,
    /// Inode of /proc/self/ns/uts.
    pub uts: Observed<u64>,
    /// Inode of /proc/self/ns/net.
    pub net: Observed<u64>,
    /// /proc/sys/kernel/hostname: half of NCCL's host hash.
    pub hostname: Observed<String>,
    /// /proc/sys/kernel/random/boot_id: the other half of NCCL's host hash.
    pub boot_id: Observed<String>,
}

/// Network interfaces as getifaddrs and sysfs show them, and the routes that matter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkFacts {
    /// Every interface, in getifaddrs order (the order NCCL walks them in).
    pub interfaces: Observed<Vec<Interface>>,
    /// Every IPv4/IPv6 address, in getifaddrs order.
    pub addresses: Observed<Vec<IfAddress>>,
    /// Default routes from /proc/net/route and /proc/net/ipv6_route, best metric first.
    pub default_routes: Observed<Vec<DefaultRoute>>,
    /// Addresses /etc/hosts gives this host's name (kubelet writes the pod IP there).
    pub hosts_entries: Observed<Vec<String>>,
    /// Queries that failed without spoiling the facts above: the rtnetlink link-kind dump
    /// (every interface's `kind` is then unknown, not physical).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<FactError>,
}

/// One network interface.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Interface {
    pub name: String,
    /// IFF_UP: administratively up.
    pub up: bool,
    /// IFF_RUNNING: up with carrier. NCCL only uses running interfaces.
    pub running: bool,
    /// IFF_LOOPBACK.
    pub loopback: bool,
    /// The link kind rtnetlink reports (veth, bridge, dummy, macvlan, ipvlan, vlan, bond, ...);
    /// `None` for a physical device, or when netlink could not be asked (the query's error
    /// is then in [`NetworkFacts::errors`]).
    pub kind: Option<String>,
}

/// Address family of an interface address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    Inet,
    Inet6,
}

/// One address of an interface.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IfAddress {
    pub interface: String,
    pub family: Family,
    pub address: String,
    /// Prefix length of the netmask, when the kernel gave one.
    pub prefix_len: Option<u8>,
}

/// A default route.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DefaultRoute {
    pub interface: String,
    pub family: Family,
    pub metric: u32,
}

/// The machine, as DMI names it (cloud instance type on EC2).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlatformFacts {
    /// First line of /sys/devices/virtual/dmi/id/product_name (e.g. `p4d.24xlarge`); `None` when absent.
    pub product_name: Observed<Option<String>>,
    /// First line of /sys/devices/virtual/dmi/id/sys_vendor; `None` when absent.
    pub sys_vendor: Observed<Option<String>>,
}
