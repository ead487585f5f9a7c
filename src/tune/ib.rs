//! InfiniBand and RoCE: which HCAs and ports NCCL uses, and the RoCE GID index
//! where NCCL cannot pick it itself.
//!
//! NCCL_IB_HCA is written with `=` and explicit ports (FACTS.md section 3:
//! `mlx5_1` alone also matches mlx5_10..19), lists only ACTIVE ports on
//! devices this container can open, and, where some NICs share a PCIe switch
//! with the GPUs, only those. It is proposed only when that leaves out something
//! NCCL would otherwise use; otherwise NCCL's own choice is right.
//! NCCL_IB_GID_INDEX: NCCL >= 2.21 picks the RoCE v2 GID itself (do not set it);
//! older NCCL gets the RoCE v2 GID index from sysfs, IPv4-mapped first.

use super::Setting;
use crate::facts::Facts;
use crate::facts::rdma::RdmaDevice;
use crate::topology::affinity;

fn openable(facts: &Facts, d: &RdmaDevice) -> bool {
    facts.rdma.uverbs.value().is_some_and(|u| {
        u.iter().any(|n| {
            n.ibdev.as_deref() == Some(&d.name)
                && n.open.as_ref().is_some_and(|o| o.refused.is_none())
        })
    })
}

/// NICs that share a PCIe switch (PIX/PXB) with some GPU.
fn close_to_gpus(facts: &Facts) -> Vec<String> {
    let Some(m) = affinity::matrix(facts) else {
        return Vec::new();
    };
    m.nics
        .iter()
        .enumerate()
        .filter(|(j, _)| m.levels.iter().any(|row| affinity::gdr_close(&row[*j])))
        .map(|(_, n)| n.clone())
        .collect()
}

pub fn rule(facts: &Facts) -> Vec<Setting> {
    let Some(devices) = facts.rdma.devices.value() else {
        return Vec::new();
    };
    let ib: Vec<&RdmaDevice> = devices
        .iter()
        .filter(|d| !d.is_efa() && openable(facts, d))
        .collect();
    if ib.is_empty() {
        return Vec::new();
    }
    let mut out = Vec::new();
    let active = |d: &&RdmaDevice| {
        d.ports
            .iter()
            .filter(|p| p.state.as_deref() == Some("ACTIVE"))
            .map(|p| p.port)
            .collect::<Vec<_>>()
    };
    let all: Vec<(String, u32)> = ib
        .iter()
        .flat_map(|d| active(d).into_iter().map(|p| (d.name.clone(), p)))
        .collect();
    let close = close_to_gpus(facts);
    let chosen: Vec<(String, u32)> = if close.is_empty() {
        all.clone()
    } else {
        all.iter()
            .filter(|(n, _)| close.contains(n))
            .cloned()
            .collect()
    };
    // Compared with every port of every IB/RoCE device sysfs lists: NCCL's libibverbs sees
    // them all, and tries the ones this container cannot open or that are down.
    let every_port: usize = devices
        .iter()
        .filter(|d| !d.is_efa())
        .map(|d| d.ports.len())
        .sum();
    let leaves_out = chosen.len() < every_port;
    if !chosen.is_empty() && leaves_out {
        let value = format!(
            "={}",
            chosen
                .iter()
                .map(|(n, p)| format!("{n}:{p}"))
                .collect::<Vec<_>>()
                .join(",")
        );
        let why = if close.is_empty() {
            "only ACTIVE ports of the devices this container can open".to_string()
        } else {
            "the NICs that share a PCIe switch with the GPUs, ACTIVE ports only".to_string()
        };
        out.push(Setting::tuned(
            "NCCL_IB_HCA",
            value,
            format!("{why}; exact names, since mlx5_1 alone would also match mlx5_10..19"),
        ));
    }
    let roce = chosen.iter().any(|(n, _)| {
        ib.iter().any(|d| {
            &d.name == n
                && d.ports
                    .iter()
                    .any(|p| p.link_layer.as_deref() == Some("Ethernet"))
        })
    });
    if roce
        && let Some(v) = crate::nccl::version(facts)
        && v < (2, 21, 0)
    {
        let gid = chosen.iter().find_map(|(n, port)| {
            let d = ib.iter().find(|d| &d.name == n)?;
            let p = d.ports.iter().find(|p| p.port == *port)?;
            let v2 = p
                .gids
                .iter()
                .filter(|g| g.kind.as_deref() == Some("RoCE v2"));
            let mapped = v2.clone().find(|g| g.gid.contains("ffff:"));
            mapped.or_else(|| v2.clone().next()).map(|g| g.index)
        });
        if let Some(index) = gid {
            out.push(Setting::tuned(
                "NCCL_IB_GID_INDEX",
                index.to_string(),
                format!("NCCL {}.{}.{} predates dynamic GID selection (2.21): RoCE v2 GID with an IPv4-mapped address", v.0, v.1, v.2),
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::Observed;
    use crate::facts::gpu::LibraryState;
    use crate::facts::rdma::Gid;
    use crate::test_facts::{healthy, rdma_device, with_rdma};

    fn two_nics(second_state: &str) -> Facts {
        with_rdma(
            healthy(),
            vec![
                rdma_device(
                    "mlx5_0",
                    "mlx5_core",
                    "0000:19:00.0",
                    "/sys/devices/x/0000:19:00.0",
                    "ACTIVE",
                    "Ethernet",
                ),
                rdma_device(
                    "mlx5_1",
                    "mlx5_core",
                    "0000:9a:00.0",
                    "/sys/devices/y/0000:9a:00.0",
                    second_state,
                    "Ethernet",
                ),
            ],
        )
    }

    #[test]
    fn hca_only_when_it_leaves_something_out() {
        assert_eq!(
            rule(&two_nics("ACTIVE")),
            vec![],
            "NCCL would use both anyway"
        );
        let s = rule(&two_nics("DOWN"));
        assert_eq!(s[0].name, "NCCL_IB_HCA");
        assert_eq!(s[0].value, "=mlx5_0:1");
    }

    #[test]
    fn gid_index_only_for_old_nccl() {
        let mut f = two_nics("DOWN");
        if let Observed::Value(d) = &mut f.rdma.devices {
            d[0].ports[0].gids = vec![
                Gid {
                    index: 1,
                    gid: "fe80::1".into(),
                    kind: Some("RoCE v2".into()),
                    netdev: None,
                },
                Gid {
                    index: 3,
                    gid: "0000:0000:0000:0000:0000:ffff:c0a8:6405".into(),
                    kind: Some("RoCE v2".into()),
                    netdev: None,
                },
            ];
        }
        assert_eq!(rule(&f).len(), 1, "NCCL 2.28.9 picks the GID itself");
        if let LibraryState::Loaded(l) = &mut f.rdma.nccl.library.state {
            l.version = Observed::Value("2.18.5".into());
        }
        let s = rule(&f);
        assert_eq!(
            (s[1].name.as_str(), s[1].value.as_str()),
            ("NCCL_IB_GID_INDEX", "3")
        );
    }
}
