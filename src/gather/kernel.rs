//! The few syscalls gather makes, behind one narrow trait.
//!
//! `LiveKernel` asks the running kernel; `ReplayKernel` (replay.rs) answers from a
//! recorded JSON file so fixture host trees can be run end to end; unit tests
//! implement the trait directly. Everything that is a plain file (namespace
//! links, mountinfo, sysfs, procfs) goes through `Host` instead.

use crate::facts::{FactError, Family, FsUsage, IfAddress, Limit, Rlimit};
use nix::net::if_::InterfaceFlags;
use nix::sys::resource::{Resource, getrlimit};
use nix::sys::socket::{AddressFamily, SockaddrLike, SockaddrStorage};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io;
use std::path::Path;

/// Which resource limit to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitKind {
    Memlock,
    Stack,
}

impl LimitKind {
    pub fn syscall_name(self) -> &'static str {
        match self {
            LimitKind::Memlock => "getrlimit(RLIMIT_MEMLOCK)",
            LimitKind::Stack => "getrlimit(RLIMIT_STACK)",
        }
    }
}

/// One interface as getifaddrs reports it, before sysfs and netlink add to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Link {
    pub name: String,
    pub up: bool,
    pub running: bool,
    pub loopback: bool,
}

/// getifaddrs' answer: interfaces and their IPv4/IPv6 addresses, each in the order listed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InterfaceList {
    pub links: Vec<Link>,
    pub addresses: Vec<IfAddress>,
}

/// The syscalls gather needs.
pub trait Kernel {
    /// getrlimit for `kind`.
    fn rlimit(&self, kind: LimitKind) -> Result<Rlimit, FactError>;
    /// Locks and unlocks a fresh anonymous buffer of `bytes`. `Ok(None)`: locked;
    /// `Ok(Some(reason))`: the kernel refused; `Err`: the probe itself could not run.
    fn mlock_probe(&self, bytes: u64) -> Result<Option<String>, FactError>;
    /// statvfs of `path`; `None` when it does not exist.
    fn statvfs(&self, path: &Path) -> Result<Option<FsUsage>, FactError>;
    /// getifaddrs.
    fn interfaces(&self) -> Result<InterfaceList, FactError>;
    /// Link kinds (IFLA_INFO_KIND) by interface name, from an rtnetlink dump.
    fn link_kinds(&self) -> Result<BTreeMap<String, String>, FactError>;
}

/// The running kernel.
#[derive(Debug, Default)]
pub struct LiveKernel;

fn limit_from_raw(raw: u64) -> Limit {
    if raw == libc::RLIM_INFINITY {
        Limit::Unlimited
    } else {
        Limit::Bytes(raw)
    }
}

/// An OS error as `ENOMEM: Cannot allocate memory`: the errno name users search for, and its text.
pub fn errno_text(err: io::Error) -> String {
    match err.raw_os_error() {
        // nix prints the name and the description.
        Some(code) => nix::errno::Errno::from_raw(code).to_string(),
        None => err.to_string(),
    }
}

impl Kernel for LiveKernel {
    fn rlimit(&self, kind: LimitKind) -> Result<Rlimit, FactError> {
        let resource = match kind {
            LimitKind::Memlock => Resource::RLIMIT_MEMLOCK,
            LimitKind::Stack => Resource::RLIMIT_STACK,
        };
        let (soft, hard) =
            getrlimit(resource).map_err(|e| FactError::new(kind.syscall_name(), e.desc()))?;
        Ok(Rlimit {
            soft: limit_from_raw(soft),
            hard: limit_from_raw(hard),
        })
    }

    fn mlock_probe(&self, bytes: u64) -> Result<Option<String>, FactError> {
        let len = usize::try_from(bytes.max(1))
            .map_err(|_| FactError::new("mlock", format!("{bytes} bytes does not fit")))?;
        // SAFETY: an anonymous private mapping owned only by this function; it is
        // unlocked and unmapped before returning and no reference to it escapes.
        unsafe {
            let addr = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            );
            if addr == libc::MAP_FAILED {
                let err = io::Error::last_os_error();
                let errno = err.raw_os_error().unwrap_or(0);
                return Err(
                    FactError::new(format!("mmap({len})"), errno_text(err)).with_errno(errno)
                );
            }
            let outcome = if libc::mlock(addr, len) == 0 {
                libc::munlock(addr, len);
                None
            } else {
                Some(errno_text(io::Error::last_os_error()))
            };
            libc::munmap(addr, len);
            Ok(outcome)
        }
    }

    fn statvfs(&self, path: &Path) -> Result<Option<FsUsage>, FactError> {
        match nix::sys::statvfs::statvfs(path) {
            Ok(st) => {
                let frag = st.fragment_size();
                Ok(Some(FsUsage {
                    size_bytes: st.blocks().saturating_mul(frag),
                    free_bytes: st.blocks_available().saturating_mul(frag),
                }))
            }
            Err(nix::errno::Errno::ENOENT) => Ok(None),
            Err(e) => Err(FactError::new(
                format!("statvfs({})", path.display()),
                e.desc(),
            )),
        }
    }

    fn interfaces(&self) -> Result<InterfaceList, FactError> {
        let addrs =
            nix::ifaddrs::getifaddrs().map_err(|e| FactError::new("getifaddrs", e.desc()))?;
        let mut list = InterfaceList::default();
        for ifa in addrs {
            if !list.links.iter().any(|l| l.name == ifa.interface_name) {
                list.links.push(Link {
                    name: ifa.interface_name.clone(),
                    up: ifa.flags.contains(InterfaceFlags::IFF_UP),
                    running: ifa.flags.contains(InterfaceFlags::IFF_RUNNING),
                    loopback: ifa.flags.contains(InterfaceFlags::IFF_LOOPBACK),
                });
            }
            if let Some(address) = ifa.address.as_ref().and_then(ip_address) {
                let (family, address) = address;
                list.addresses.push(IfAddress {
                    interface: ifa.interface_name.clone(),
                    family,
                    address,
                    prefix_len: ifa.netmask.as_ref().and_then(prefix_len),
                });
            }
        }
        Ok(list)
    }

    fn link_kinds(&self) -> Result<BTreeMap<String, String>, FactError> {
        super::netlink::link_kinds().map_err(|e| {
            let errno = e.raw_os_error();
            let error = FactError::new("rtnetlink RTM_GETLINK", errno_text(e));
            match errno {
                Some(n) => error.with_errno(n),
                None => error,
            }
        })
    }
}

fn ip_address(sa: &SockaddrStorage) -> Option<(Family, String)> {
    match sa.family()? {
        AddressFamily::Inet => Some((Family::Inet, sa.as_sockaddr_in()?.ip().to_string())),
        AddressFamily::Inet6 => Some((Family::Inet6, sa.as_sockaddr_in6()?.ip().to_string())),
        _ => None,
    }
}

fn prefix_len(mask: &SockaddrStorage) -> Option<u8> {
    let bits = if let Some(v4) = mask.as_sockaddr_in() {
        u32::from(v4.ip()).count_ones()
    } else {
        u128::from(mask.as_sockaddr_in6()?.ip()).count_ones()
    };
    u8::try_from(bits).ok()
}
