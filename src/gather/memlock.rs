//! Locked-memory facts: RLIMIT_MEMLOCK, CAP_IPC_LOCK and two real mlock probes.
//!
//! The limit alone can mislead: CAP_IPC_LOCK lifts it for mlock and for RDMA
//! memory registration alike (the kernel's ib_umem_get checks the capability
//! before the limit), so the probes show what is really enforced.

use super::host::Host;
use super::kernel::{Kernel, LimitKind};
use crate::facts::{FactError, Limit, MemlockFacts, MlockProbe, Observed};

/// Size of the plain probe: 64 KiB, the default limit of old kernels.
pub const PROBE_BYTES: u64 = 64 << 10;
/// The over-limit probe is only tried below this soft limit: if the kernel
/// unexpectedly accepts it, it pins this much memory for an instant.
const ENFORCEMENT_PROBE_MAX: u64 = 256 << 20;
const PAGE: u64 = 4096;
/// Capability number of CAP_IPC_LOCK (linux/capability.h).
const CAP_IPC_LOCK: u32 = 14;

/// Reads the effective capability mask from /proc/self/status text.
fn parse_cap_eff(status: &str) -> Result<u64, String> {
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .ok_or("no CapEff line")?;
    u64::from_str_radix(line.trim(), 16).map_err(|e| format!("CapEff {:?}: {e}", line.trim()))
}

/// The effective uid from /proc/self/status text (`Uid: real effective saved fs`).
fn parse_euid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn probe(kernel: &dyn Kernel, bytes: u64) -> Result<MlockProbe, FactError> {
    kernel
        .mlock_probe(bytes)
        .map(|refused| MlockProbe { bytes, refused })
}

pub fn gather(host: &Host, kernel: &dyn Kernel) -> MemlockFacts {
    let limit: Observed<_> = kernel.rlimit(LimitKind::Memlock).into();
    let cap_ipc_lock = host.parse_required("/proc/self/status", |text| {
        parse_cap_eff(text).map(|mask| mask & (1 << CAP_IPC_LOCK) != 0)
    });
    let euid = host
        .parse_required("/proc/self/status", |text| {
            parse_euid(text).ok_or_else(|| "no Uid line".to_string())
        })
        .value()
        .copied();
    // A probe that cannot even run (mmap failed) is recorded with its error; the
    // limit and capability still judge the check.
    let mut probe_errors = Vec::new();
    let mut run = |bytes: u64| match probe(kernel, bytes) {
        Ok(p) => Some(p),
        Err(e) => {
            probe_errors.push(e);
            None
        }
    };
    let small = run(PROBE_BYTES);
    let enforcement = match (limit.value(), cap_ipc_lock.value()) {
        (Some(l), cap) if cap != Some(&true) => match l.soft {
            Limit::Bytes(n) if n < ENFORCEMENT_PROBE_MAX => run((n / PAGE + 1) * PAGE),
            _ => None,
        },
        _ => None,
    };
    MemlockFacts {
        limit,
        cap_ipc_lock,
        euid,
        probe: small,
        enforcement_probe: enforcement,
        probe_errors,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_eff_parses_and_rejects_garbage() {
        let status = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t000001fffeffffff\n";
        let mask = parse_cap_eff(status).unwrap();
        assert!(mask & (1 << CAP_IPC_LOCK) != 0);
        let docker = "CapEff:\t00000000a80425fb\n";
        assert_eq!(parse_cap_eff(docker).unwrap() & (1 << CAP_IPC_LOCK), 0);
        assert!(parse_cap_eff("CapEff:\tzz\n").is_err());
        assert!(parse_cap_eff("Name: x\n").is_err());
        assert_eq!(parse_euid("Uid:\t1000\t1001\t1001\t1001\n"), Some(1001));
        assert_eq!(parse_euid("Uid:\tx\n"), None);
    }
}
