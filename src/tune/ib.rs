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
    let close = close_to_gpus(facts);
    let chosen = chosen_ports(&ib, &close);
    let mut out = Vec::new();
    out.extend(hca(devices, &chosen, close.is_empty()));
    out.extend(gid_index(facts, &ib, &chosen));
    out
}

/// The ACTIVE ports of the openable IB/RoCE devices, narrowed to the NICs close
/// to the GPUs (`close`) when any are.
fn chosen_ports(ib: &[&RdmaDevice], close: &[String]) -> Vec<(String, u32)> {
    let all = ib.iter().flat_map(|d| {
        d.ports
            .iter()
            .filter(|p| p.state.as_deref() == Some("ACTIVE"))
            .map(|p| (d.name.clone(), p.port))
    });
    if close.is_empty() {
        all.collect()
    } else {
        all.filter(|(n, _)| close.contains(n)).collect()
    }
}

/// NCCL_IB_HCA naming the chosen ports exactly, when they leave some port out.
fn hca(devices: &[RdmaDevice], chosen: &[(String, u32)], no_close: bool) -> Option<Setting> {
    // Compared with every port of every IB/RoCE device sysfs lists: NCCL's libibverbs sees
    // them all, and tries the ones this container cannot open or that are down.
    let every_port: usize = devices
        .iter()
        .filter(|d| !d.is_efa())
        .map(|d| d.ports.len())
        .sum();
    if chosen.is_empty() || chosen.len() >= every_port {
        return None;
    }
    let value = format!(
        "={}",
        chosen
            .iter()
            .map(|(n, p)| format!("{n}:{p}"))
            .collect::<Vec<_>>()
            .join(",")
    );
    let why = if no_close {
        "only ACTIVE ports of the devices this container can open"
    } else {
        "the NICs that share a PCIe switch with the GPUs, ACTIVE ports only"
    };
    Some(Setting::tuned(
        "NCCL_IB_HCA",
        value,
        format!("{why}; exact names, since mlx5_1 alone would also match mlx5_10..19"),
    ))
}

/// NCCL_IB_GID_INDEX for RoCE under NCCL older than 2.21: the first chosen
/// port's RoCE v2 GID, one with an IPv4-mapped address first.
fn gid_index(facts: &Facts, ib: &[&RdmaDevice], chosen: &[(String, u32)]) -> Option<Setting> {
    let roce = chosen.iter().any(|(n, _)| {
        ib.iter().any(|d| {
            &d.name == n
                && d.ports
                    .iter()
                    .any(|p| p.link_layer.as_deref() == Some("Ethernet"))
        })
    });
    let v =
        crate::nccl::version(facts).filter(|v| roce && *v < crate::nccl::version::DYNAMIC_GID)?;
    let index = chosen.iter().find_map(|(n, port)| {
        let d = ib.iter().find(|d| &d.name == n)?;
        let p = d.ports.iter().find(|p| p.port == *port)?;
        let v2 = p
            .gids
            .iter()
            .filter(|g| g.kind.as_deref() == Some("RoCE v2"));
        let mapped = v2.clone().find(|g| g.gid.contains("ffff:"));
        mapped.or_else(|| v2.clone().next()).map(|g| g.index)
    })?;
    Some(Setting::tuned(
        "NCCL_IB_GID_INDEX",
        index.to_string(),
        format!(
            "NCCL {v} predates dynamic GID selection (2.21): RoCE v2 GID with an IPv4-mapped address"
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::Observed;
    use crate::facts::gpu::LibraryState;
    use crate::facts::rdma::Gid;
    use crate::test_facts::{healthy, rdma_device, roce_two_nics as two_nics, with_rdma};

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

    fn roce_gid(index: u32, gid: &str) -> Gid {
        Gid {
            index,
            gid: gid.into(),
            kind: Some("RoCE v2".into()),
            netdev: None,
        }
    }

    fn old_nccl(mut f: Facts) -> Facts {
        if let LibraryState::Loaded(l) = &mut f.rdma.nccl.library.state {
            l.version = Observed::Value("2.18.5".into());
        }
        f
    }

    #[test]
    fn hca_prefers_the_nic_that_shares_a_pcie_switch_with_the_gpus() {
        let mut f = healthy();
        f.gpus = crate::test_facts::h200x2_gpus();
        let gpu = f.gpus.pci_gpus.value().unwrap()[0]
            .sysfs_path
            .clone()
            .unwrap();
        // mlx5_1 sits under the first GPU's switch (PIX); mlx5_0 under another root.
        let f = with_rdma(
            f,
            vec![
                rdma_device(
                    "mlx5_0",
                    "mlx5_core",
                    "0000:99:00.0",
                    "/sys/devices/pci0000:80/0000:99:00.0",
                    "ACTIVE",
                    "InfiniBand",
                ),
                rdma_device(
                    "mlx5_1",
                    "mlx5_core",
                    "0000:1a:00.0",
                    &format!("{gpu}/0000:1a:00.0"),
                    "ACTIVE",
                    "InfiniBand",
                ),
            ],
        );
        let s = rule(&f);
        assert_eq!(s.len(), 1, "{s:?}");
        assert_eq!(
            (s[0].name.as_str(), s[0].value.as_str()),
            ("NCCL_IB_HCA", "=mlx5_1:1")
        );
        assert!(
            s[0].reason.contains("share a PCIe switch with the GPUs"),
            "{}",
            s[0].reason
        );
        assert!(s[0].reason.contains("mlx5_10..19"), "{}", s[0].reason);
        assert_eq!(s[0].source, crate::tune::Source::Tuned);
    }

    #[test]
    fn hca_reason_names_active_ports_when_no_nic_is_close() {
        let s = rule(&two_nics("DOWN"));
        assert_eq!(s.len(), 1, "{s:?}");
        assert!(
            s[0].reason
                .starts_with("only ACTIVE ports of the devices this container can open"),
            "{}",
            s[0].reason
        );
    }

    #[test]
    fn a_device_this_container_cannot_open_is_left_out() {
        let mut f = two_nics("ACTIVE");
        if let Observed::Value(nodes) = &mut f.rdma.uverbs {
            nodes[1].open = Some(crate::facts::rdma::Openable {
                refused: Some("EACCES".into()),
            });
        }
        let s = rule(&f);
        assert_eq!(
            s.iter().map(|s| s.value.as_str()).collect::<Vec<_>>(),
            ["=mlx5_0:1"]
        );
    }

    #[test]
    fn nothing_without_an_open_active_ib_port() {
        assert_eq!(rule(&healthy()), vec![], "no RDMA devices");
        assert_eq!(
            rule(&crate::test_facts::with_efa(healthy())),
            vec![],
            "EFA is not IB"
        );
        let mut f = two_nics("DOWN");
        if let Observed::Value(d) = &mut f.rdma.devices {
            d[0].ports[0].state = Some("DOWN".into());
        }
        assert_eq!(rule(&f), vec![], "every port down: nothing to name");
    }

    #[test]
    fn gid_index_falls_back_to_the_first_roce_v2_gid() {
        let mut f = old_nccl(two_nics("DOWN"));
        if let Observed::Value(d) = &mut f.rdma.devices {
            d[0].ports[0].gids = vec![roce_gid(2, "fe80::2"), roce_gid(5, "fe80::5")];
        }
        let s = rule(&f);
        let gid = s.iter().find(|s| s.name == "NCCL_IB_GID_INDEX").unwrap();
        assert_eq!(gid.value, "2");
        assert!(gid.reason.contains("NCCL 2.18.5"), "{}", gid.reason);
        assert!(gid.reason.contains("(2.21)"), "{}", gid.reason);
    }

    #[test]
    fn no_gid_index_on_infiniband_even_for_old_nccl() {
        let mut f = old_nccl(two_nics("DOWN"));
        if let Observed::Value(d) = &mut f.rdma.devices {
            d[0].ports[0].link_layer = Some("InfiniBand".into());
            d[0].ports[0].gids = vec![roce_gid(3, "::ffff:10.0.0.1")];
        }
        let names: Vec<String> = rule(&f).into_iter().map(|s| s.name).collect();
        assert_eq!(names, ["NCCL_IB_HCA"]);
    }

    #[test]
    fn the_users_hca_and_gid_index_are_never_overridden() {
        let mut f = old_nccl(two_nics("DOWN"));
        if let Observed::Value(d) = &mut f.rdma.devices {
            d[0].ports[0].gids = vec![roce_gid(3, "::ffff:192.168.1.5")];
        }
        assert_eq!(rule(&f).len(), 2, "both would be tuned");
        let f =
            crate::test_facts::with_env(f, &[("NCCL_IB_HCA", "mlx5"), ("NCCL_IB_GID_INDEX", "0")]);
        let settings = crate::tune::tune(&f);
        for (name, value, ours) in [
            ("NCCL_IB_HCA", "mlx5", "=mlx5_0:1"),
            ("NCCL_IB_GID_INDEX", "0", "3"),
        ] {
            let s = settings.iter().find(|s| s.name == name).unwrap();
            assert_eq!(
                (s.value.as_str(), s.source),
                (value, crate::tune::Source::User)
            );
            assert!(
                s.reason
                    .contains(&format!("nccl-preflight would set {ours:?}")),
                "{}",
                s.reason
            );
        }
    }
}
