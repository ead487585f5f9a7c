//! Known machines, keyed by DMI product_name the way aws-ofi-nccl keys its
//! platform table (src/platform-aws.cpp: first match wins). Only what this
//! tool checks against: how many GPUs and EFA devices the machine has, and
//! whether its GPUs share NVLink. Counts from FACTS.md section 6 and the
//! instance types' published specifications.

/// Where aws-ofi-nccl installs itself (FACTS.md section 4): NCCL does not look there
/// unless the directory is on the library search path.
pub const OFI_NCCL_DIRS: &[&str] = &["/opt/amazon/ofi-nccl/lib", "/opt/amazon/ofi-nccl/lib64"];

/// Where aws-ofi-nccl installs its topology files.
pub const OFI_NCCL_XML_DIR: &str = "/opt/amazon/ofi-nccl/share/aws-ofi-nccl/xml";

/// One known machine type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Platform {
    /// DMI product_name values that identify it.
    pub names: &'static [&'static str],
    pub gpus: u32,
    /// EFA devices, where known.
    pub efa_devices: Option<u32>,
    pub nvlink: bool,
    /// aws-ofi-nccl requires GPUDirect RDMA here (FACTS.md section 4: p4d, p4de, p5, p5e; p5en and p6 likewise).
    pub gdr_required: bool,
}

pub const PLATFORMS: &[Platform] = &[
    Platform {
        names: &["p4d.24xlarge", "p4de.24xlarge"],
        gpus: 8,
        efa_devices: Some(4),
        nvlink: true,
        gdr_required: true,
    },
    Platform {
        names: &["p5.48xlarge", "p5e.48xlarge"],
        gpus: 8,
        efa_devices: Some(32),
        nvlink: true,
        gdr_required: true,
    },
    Platform {
        names: &["p5en.48xlarge"],
        gpus: 8,
        efa_devices: Some(16),
        nvlink: true,
        gdr_required: true,
    },
    Platform {
        names: &["p6-b200.48xlarge"],
        gpus: 8,
        efa_devices: Some(8),
        nvlink: true,
        gdr_required: true,
    },
    Platform {
        names: &["g5.48xlarge"],
        gpus: 8,
        efa_devices: None,
        nvlink: false,
        gdr_required: false,
    },
    Platform {
        names: &["g6e.48xlarge"],
        gpus: 8,
        efa_devices: None,
        nvlink: false,
        gdr_required: false,
    },
];

/// The platform of a node, from its facts.
pub fn of(facts: &crate::facts::Facts) -> Option<&'static Platform> {
    facts
        .platform
        .product_name
        .value()
        .and_then(|p| p.as_deref())
        .and_then(lookup)
}

/// The platform a product name belongs to.
pub fn lookup(product_name: &str) -> Option<&'static Platform> {
    let name = product_name.trim();
    PLATFORMS.iter().find(|p| p.names.contains(&name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_and_unknown() {
        assert_eq!(lookup("p4d.24xlarge").map(|p| p.gpus), Some(8));
        assert_eq!(
            lookup(" p5.48xlarge ").and_then(|p| p.efa_devices),
            Some(32)
        );
        assert!(lookup("PowerEdge XE9680").is_none());
    }
}
