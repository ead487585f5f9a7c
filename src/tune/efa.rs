//! EFA instances: aws-ofi-nccl's platform table (src/platform-aws.cpp; FACTS.md
//! section 4, kept in `crate::platform::PLATFORMS`), matched on the DMI product
//! name the way aws-ofi-nccl matches it (first match wins). aws-ofi-nccl inserts these itself without overwriting,
//! but only the plugin versions that know the instance type do; writing them
//! here keeps them whichever plugin loads, and the reason says where they come
//! from. Nothing is proposed without EFA devices: the values tune the EFA path.

use super::Setting;
use crate::facts::Facts;

use crate::platform::OFI_NCCL_XML_DIR as XML_DIR;

/// libfabric's version as (major, minor).
fn fabric_version(facts: &Facts) -> Option<(u32, u32)> {
    let f = facts.rdma.libfabric.loaded()?;
    let (a, b) = f.version.split_once('.')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

pub fn rule(facts: &Facts) -> Vec<Setting> {
    let efa = facts
        .rdma
        .devices
        .value()
        .is_some_and(|d| d.iter().any(|d| d.is_efa()));
    let Some(product) = facts
        .platform
        .product_name
        .value()
        .and_then(|p| p.as_deref())
    else {
        return Vec::new();
    };
    if !efa {
        return Vec::new();
    }
    let mut out = Vec::new();
    if let Some(p) = crate::platform::ofi_lookup(product) {
        for (name, value) in p.settings {
            out.push(Setting::tuned(
                name,
                *value,
                format!("aws-ofi-nccl's platform table for {product} (src/platform-aws.cpp)"),
            ));
        }
        if let Some(file) = p.topology {
            let path = format!("{XML_DIR}/{file}");
            if facts
                .rdma
                .ofi_nccl_xml
                .value()
                .is_some_and(|files| files.iter().any(|f| f == file))
            {
                out.push(Setting::tuned(
                    "NCCL_TOPO_FILE",
                    path,
                    format!("the topology aws-ofi-nccl ships for {product}: the hypervisor hides the real PCIe switches from NCCL"),
                ));
            }
        }
    }
    // doc/efa-env-var.md: FI_EFA_USE_DEVICE_RDMA=1 is needed before libfabric 1.18 and must not
    // be set from 1.18 on; only instances with device RDMA (p4d and later) have it.
    let device_rdma = crate::platform::lookup(product).is_some_and(|p| p.gdr_required);
    if device_rdma && fabric_version(facts).is_some_and(|v| v < (1, 18)) {
        out.push(Setting::tuned(
            "FI_EFA_USE_DEVICE_RDMA",
            "1",
            format!(
                "libfabric {} predates 1.18, which turns EFA device RDMA on by itself (aws-ofi-nccl doc/efa-env-var.md)",
                facts.rdma.libfabric.loaded().map_or("?", |f| f.version.as_str())
            ),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::Observed;
    use crate::facts::rdma::FabricFacts;
    use crate::test_facts::healthy;

    fn efa(product: &str) -> Facts {
        let mut f = crate::test_facts::with_efa(healthy());
        f.platform.product_name = Observed::Value(Some(product.into()));
        f.rdma.libfabric.state = crate::facts::gpu::LibraryState::Loaded(FabricFacts {
            version: "1.22".into(),
            providers: vec!["efa".into()],
            efa_rdm: Observed::Value(4),
        });
        f
    }

    fn names(s: &[Setting]) -> Vec<&str> {
        s.iter().map(|s| s.name.as_str()).collect()
    }

    #[test]
    fn first_match_wins_and_topology_needs_the_file() {
        let mut p4d = efa("p4d.24xlarge");
        assert_eq!(
            names(&rule(&p4d)),
            ["NCCL_BUFFSIZE", "NCCL_P2P_NET_CHUNKSIZE"]
        );
        p4d.rdma.ofi_nccl_xml = Observed::Value(vec!["p4d-24xl-topo.xml".into()]);
        let s = rule(&p4d);
        assert_eq!(
            s[2].value,
            "/opt/amazon/ofi-nccl/share/aws-ofi-nccl/xml/p4d-24xl-topo.xml"
        );
        assert!(names(&rule(&efa("p5en.48xlarge"))).contains(&"NCCL_NETDEVS_POLICY"));
        assert!(!names(&rule(&efa("p5.48xlarge"))).contains(&"NCCL_NETDEVS_POLICY"));
        assert_eq!(rule(&efa("m7i.48xlarge")), vec![]);
        assert_eq!(rule(&healthy()), vec![], "no EFA device");
    }

    #[test]
    fn device_rdma_only_for_old_libfabric() {
        let mut f = efa("p4d.24xlarge");
        f.rdma.libfabric.state = crate::facts::gpu::LibraryState::Loaded(FabricFacts {
            version: "1.15".into(),
            providers: vec!["efa".into()],
            efa_rdm: Observed::Value(4),
        });
        assert!(names(&rule(&f)).contains(&"FI_EFA_USE_DEVICE_RDMA"));
        f.rdma.libfabric.state = crate::facts::gpu::LibraryState::Loaded(FabricFacts {
            version: "1.22".into(),
            providers: vec!["efa".into()],
            efa_rdm: Observed::Value(4),
        });
        assert!(!names(&rule(&f)).contains(&"FI_EFA_USE_DEVICE_RDMA"));
    }
}
