//! The machine's identity from DMI (the EC2 instance type lives in product_name).

use super::host::Host;
use crate::facts::{Observed, PlatformFacts};

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
