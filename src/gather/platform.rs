//! The machine's identity from DMI (the EC2 instance type lives in product_name),
//! and the RDMA devices sysfs lists.

use super::host::Host;
use crate::facts::{Observed, PlatformFacts, RdmaFacts};

/// First line of a DMI attribute, trimmed; `None` when the file is absent or blank.
fn dmi_field(host: &Host, name: &str) -> Observed<Option<String>> {
    // aws-ofi-nccl reads this exact path (src/platform-aws.cpp).
    host.read(&format!("/sys/devices/virtual/dmi/id/{name}"))
        .map(|text| {
            text.and_then(|t| t.lines().next().map(|l| l.trim().to_string()))
                .filter(|l| !l.is_empty())
        })
        .into()
}

pub fn gather(host: &Host) -> PlatformFacts {
    PlatformFacts {
        product_name: dmi_field(host, "product_name"),
        sys_vendor: dmi_field(host, "sys_vendor"),
    }
}

pub fn gather_rdma(host: &Host) -> RdmaFacts {
    RdmaFacts {
        devices: host
            .list_dir("/sys/class/infiniband")
            .map(Option::unwrap_or_default)
            .into(),
    }
}
