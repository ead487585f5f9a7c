//! Known machines, keyed by DMI product_name the way aws-ofi-nccl keys its
//! platform table (aws/aws-ofi-nccl src/platform-aws.cpp: a regex table, first
//! match wins). One row per instance family with everything the checks, the
//! tuning and log analysis need: GPUs, EFA devices, NVLink, whether
//! aws-ofi-nccl requires GPUDirect RDMA, the topology file it ships, the NCCL
//! values it inserts, and whether it forced NCCL_PROTO=simple. Values from
//! FACTS.md section 4 (aws-ofi-nccl) and section 6 (EFA counts), and the
//! instance types' published specifications.

/// Where aws-ofi-nccl installs itself (FACTS.md section 4): NCCL does not look there
/// unless the directory is on the library search path.
pub const OFI_NCCL_DIRS: &[&str] = &["/opt/amazon/ofi-nccl/lib", "/opt/amazon/ofi-nccl/lib64"];

/// Where aws-ofi-nccl installs its topology files.
pub const OFI_NCCL_XML_DIR: &str = "/opt/amazon/ofi-nccl/share/aws-ofi-nccl/xml";

/// One known machine type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Platform {
    /// DMI product_name values of the sizes the hardware counts below describe.
    pub names: &'static [&'static str],
    /// The product names aws-ofi-nccl's platform table matches for this row: exact names,
    /// or prefixes ending in '*' (its regexes match every size of p5, p5e, p5en, p6-b200).
    /// Empty where aws-ofi-nccl has no entry (g6e).
    ofi_names: &'static [&'static str],
    pub gpus: u32,
    /// EFA devices, where known.
    pub efa_devices: Option<u32>,
    pub nvlink: bool,
    /// aws-ofi-nccl requires GPUDirect RDMA here (FACTS.md section 4: p4d, p4de, p5, p5e; p5en and p6 likewise).
    pub gdr_required: bool,
    /// aws-ofi-nccl's topology file for the instance type, under [`OFI_NCCL_XML_DIR`], when one ships.
    pub topology: Option<&'static str>,
    /// The NCCL values aws-ofi-nccl inserts (without overwriting user values).
    pub settings: &'static [(&'static str, &'static str)],
    /// aws-ofi-nccl 1.6.0 forced NCCL_PROTO=simple on this platform by name (src/platform-aws.c
    /// force_proto_simple): EFA here lacks in-order delivery, which LL and LL128 need.
    pub forces_proto_simple: bool,
}

const CHUNKS: &[(&str, &str)] = &[
    ("NCCL_BUFFSIZE", "8388608"),
    ("NCCL_P2P_NET_CHUNKSIZE", "524288"),
];

const P5: &[(&str, &str)] = &[
    ("NCCL_BUFFSIZE", "8388608"),
    ("NCCL_P2P_NET_CHUNKSIZE", "524288"),
    ("NCCL_NVLSTREE_MAX_CHUNKSIZE", "524288"),
    ("NCCL_NVLS_CHUNKSIZE", "524288"),
    ("NCCL_NET_FORCE_FLUSH", "0"),
];

/// p5en and p6-b200: the p5 values and NCCL_NETDEVS_POLICY=max:1.
const P5EN: &[(&str, &str)] = &[
    ("NCCL_BUFFSIZE", "8388608"),
    ("NCCL_P2P_NET_CHUNKSIZE", "524288"),
    ("NCCL_NVLSTREE_MAX_CHUNKSIZE", "524288"),
    ("NCCL_NVLS_CHUNKSIZE", "524288"),
    ("NCCL_NET_FORCE_FLUSH", "0"),
    ("NCCL_NETDEVS_POLICY", "max:1"),
];

/// In aws-ofi-nccl's order: the first row whose `ofi_names` match is the platform.
pub const PLATFORMS: &[Platform] = &[
    Platform {
        names: &["p4d.24xlarge"],
        ofi_names: &["p4d.24xlarge"],
        gpus: 8,
        efa_devices: Some(4),
        nvlink: true,
        gdr_required: true,
        topology: Some("p4d-24xl-topo.xml"),
        settings: CHUNKS,
        forces_proto_simple: true,
    },
    Platform {
        names: &["p4de.24xlarge"],
        ofi_names: &["p4de.24xlarge"],
        gpus: 8,
        efa_devices: Some(4),
        nvlink: true,
        gdr_required: true,
        topology: Some("p4de-24xl-topo.xml"),
        settings: CHUNKS,
        forces_proto_simple: true,
    },
    Platform {
        names: &["p5en.48xlarge"],
        ofi_names: &["p5en.*"],
        gpus: 8,
        efa_devices: Some(16),
        nvlink: true,
        gdr_required: true,
        topology: None,
        settings: P5EN,
        forces_proto_simple: false,
    },
    Platform {
        names: &["p6-b200.48xlarge"],
        ofi_names: &["p6-b200.*"],
        gpus: 8,
        efa_devices: Some(8),
        nvlink: true,
        gdr_required: true,
        topology: None,
        settings: P5EN,
        forces_proto_simple: false,
    },
    Platform {
        names: &["p5.48xlarge", "p5e.48xlarge"],
        ofi_names: &["p5.*", "p5e.*"],
        gpus: 8,
        efa_devices: Some(32),
        nvlink: true,
        gdr_required: true,
        topology: None,
        settings: P5,
        forces_proto_simple: false,
    },
    Platform {
        names: &["g5.48xlarge"],
        ofi_names: &["g5.48xlarge"],
        gpus: 8,
        efa_devices: None,
        nvlink: false,
        gdr_required: false,
        topology: Some("g5.48xl-topo.xml"),
        settings: &[],
        forces_proto_simple: false,
    },
    Platform {
        names: &["g6e.48xlarge"],
        ofi_names: &[],
        gpus: 8,
        efa_devices: None,
        nvlink: false,
        gdr_required: false,
        topology: None,
        settings: &[],
        forces_proto_simple: false,
    },
];

impl Platform {
    /// The part of its topology file's name that says which instance type it describes
    /// (`p4d-24xl` of `p4d-24xl-topo.xml`).
    pub fn topology_marker(&self) -> Option<&'static str> {
        self.topology
            .map(|t| t.strip_suffix("-topo.xml").unwrap_or(t))
    }
}

/// The platform of a node, from its facts.
pub fn of(facts: &crate::facts::Facts) -> Option<&'static Platform> {
    facts
        .platform
        .product_name
        .value()
        .and_then(|p| p.as_deref())
        .and_then(lookup)
}

/// The platform a product name belongs to (the sizes whose hardware counts are known).
pub fn lookup(product_name: &str) -> Option<&'static Platform> {
    let name = product_name.trim();
    PLATFORMS.iter().find(|p| p.names.contains(&name))
}

fn matches(pattern: &str, name: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => name == pattern,
    }
}

/// The row aws-ofi-nccl's platform table picks for a product name: the first that matches.
pub fn ofi_lookup(product_name: &str) -> Option<&'static Platform> {
    PLATFORMS
        .iter()
        .find(|p| p.ofi_names.iter().any(|n| matches(n, product_name)))
}

/// True when aws-ofi-nccl 1.6.0 forced NCCL_PROTO=simple on the platform its log names
/// (`p4d.24xlarge`, or any name that starts with one of those families).
pub fn forces_proto_simple(logged: &str) -> bool {
    PLATFORMS
        .iter()
        .filter(|p| p.forces_proto_simple)
        .flat_map(|p| p.names)
        .any(|n| logged.starts_with(n.split('.').next().unwrap_or(n)))
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
        // aws-ofi-nccl matches every p5 size; the hardware counts only the 48xlarge.
        assert_eq!(ofi_lookup("p5.4xlarge").map(|p| p.settings.len()), Some(5));
        assert!(lookup("p5.4xlarge").is_none());
        assert_eq!(
            ofi_lookup("p5en.48xlarge").map(|p| p.names),
            Some(&["p5en.48xlarge"][..])
        );
        assert!(ofi_lookup("g6e.48xlarge").is_none());
        assert!(forces_proto_simple("p4de.24xlarge") && forces_proto_simple("p4d.24xlarge"));
        assert!(!forces_proto_simple("p5.48xlarge"));
    }

    /// Every row against FACTS.md section 4 (aws-ofi-nccl's table) and section 6 (EFA
    /// counts), where ../shared is beside the repository.
    #[test]
    fn rows_agree_with_facts_md() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/FACTS.md");
        let Ok(text) = std::fs::read_to_string(path) else {
            assert!(
                std::env::var_os("NCCL_PREFLIGHT_TEST_STRICT").is_none(),
                "{path} is missing and NCCL_PREFLIGHT_TEST_STRICT is set"
            );
            eprintln!("skipped rows_agree_with_facts_md: {path} is not on this machine");
            return;
        };
        let section = |n: &str| -> Vec<&str> {
            text.split("\n## ")
                .find(|s| s.starts_with(n))
                .map(|s| s.lines().collect())
                .unwrap_or_default()
        };
        let ofi = section("4.");
        let bandwidth = section("6.");
        assert!(!ofi.is_empty() && !bandwidth.is_empty(), "sections 4 and 6");
        let mut checked = 0;
        for p in PLATFORMS {
            let Some(pattern) = p.ofi_names.first() else {
                assert!(
                    ofi.iter().any(|l| l.contains("No entries for g6")),
                    "{:?} has no aws-ofi-nccl row",
                    p.names
                );
                continue;
            };
            let family = pattern.trim_end_matches(".*");
            let line = ofi
                .iter()
                .find(|l| l.starts_with("- ") && l.contains(family))
                .unwrap_or_else(|| panic!("no FACTS.md section 4 line for {family}"));
            match p.topology {
                Some(file) => assert!(line.contains(file), "{family}: {file} in {line}"),
                None => assert!(!line.contains("-topo.xml"), "{family}: {line}"),
            }
            assert_eq!(p.gdr_required, line.contains("GDR required"), "{line}");
            for (name, value) in p.settings {
                let short = name.trim_start_matches("NCCL_");
                assert!(
                    line.contains(short) && line.contains(value),
                    "{family}: {name}={value} in {line}"
                );
            }
            // Section 6 names the families (`p5/p5e 3200 Gbps over 32 cards`); p4de, the
            // p4d with more GPU memory, is not named there.
            let efa = bandwidth
                .iter()
                .find(|l| l.starts_with("- EFA:"))
                .unwrap_or_else(|| panic!("no EFA line in section 6"));
            let short = |n: &str| n.split('.').next().unwrap_or(n).to_string();
            let families: Vec<String> = p.names.iter().map(|n| short(n)).collect();
            let said = efa.trim_start_matches("- EFA:").split(';').find(|part| {
                part.split([' ', '/'])
                    .any(|token| families.iter().any(|f| f == token))
            });
            if let (Some(n), Some(said)) = (p.efa_devices, said) {
                assert!(
                    said.contains(&format!("over {n}")) || said.contains(&format!("{n}x")),
                    "{family}: {n} EFA devices in {said}"
                );
                checked += 1;
            }
        }
        assert_eq!(checked, 4, "EFA counts checked: p4d, p5/p5e, p5en, p6-b200");
    }
}
