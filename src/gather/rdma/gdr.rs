//! What GPUDirect RDMA needs from the node: the nvidia-peermem module (or the
//! older nv_peer_mem), or dma-buf, which takes a 5.12+ kernel and the NVIDIA
//! open kernel modules.

use crate::facts::Observed;
use crate::facts::rdma::GdrFacts;
use crate::gather::host::Host;

/// Peer-memory modules: NVIDIA's (nvidia-peermem, R470+), Mellanox's older nv_peer_mem, and
/// the EFA installer's efa_nv_peermem (loaded with `efa_installer.sh --enable-gdr`), which
/// binds EFA to the NVIDIA driver's P2P API.
const MODULES: &[&str] = &["nvidia_peermem", "nv_peer_mem", "efa_nv_peermem"];

/// The first peer-memory module listed in /proc/modules text.
fn peermem_in(modules: &str) -> Option<String> {
    modules
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .find(|m| MODULES.contains(m))
        .map(String::from)
}

pub fn gather(host: &Host) -> GdrFacts {
    let peermem_module = match host.read("/proc/modules") {
        Ok(Some(text)) => Observed::Value(peermem_in(&text)),
        // Without /proc/modules (some sandboxes), /sys/module still shows loaded modules.
        Ok(None) => Observed::Value(
            MODULES
                .iter()
                .find(|m| matches!(host.list_dir(&format!("/sys/module/{m}")), Ok(Some(_))))
                .map(|m| m.to_string()),
        ),
        Err(e) => Observed::Error(e),
    };
    let kernel_release = host.parse_required("/proc/sys/kernel/osrelease", |t| {
        Some(t.trim().to_string())
            .filter(|s| !s.is_empty())
            .ok_or_else(|| "empty".to_string())
    });
    let nvidia_open_modules = match host.read("/proc/driver/nvidia/version") {
        Ok(Some(text)) => Observed::Value(Some(text.contains("Open Kernel Module"))),
        Ok(None) => Observed::Value(None),
        Err(e) => Observed::Error(e),
    };
    GdrFacts {
        peermem_module,
        kernel_release,
        nvidia_open_modules,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::rdma::kernel_version;

    #[test]
    fn modules_and_kernel() {
        let modules = "nvidia_uvm 1 0 - Live 0x0\nnvidia_peermem 16384 0 - Live 0x0\nnvidia 1 2 nvidia_peermem, Live 0x0\n";
        assert_eq!(peermem_in(modules).as_deref(), Some("nvidia_peermem"));
        assert_eq!(peermem_in("ib_core 1 0 - Live\n"), None);
        assert_eq!(kernel_version("5.15.0-1051-aws"), Some((5, 15)));
        assert_eq!(kernel_version("6.18.44-fc-v769"), Some((6, 18)));
        assert_eq!(kernel_version("garbage"), None);
    }
}
