//! NCCL_TOPO_FILE: present in this container, and written for this platform.

use super::{Problem, get};
use crate::facts::Facts;
use crate::finding::Outcome;

pub(super) fn lint_topo_file(facts: &Facts) -> Vec<Problem> {
    let Some(path) = get(facts, "NCCL_TOPO_FILE") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    if facts.named_files.get(path) == Some(&false) {
        // src/graph/topo.cc ncclTopoGetSystem: a file that does not open is a WARN
        // ("Could not open XML topology file"), then NCCL detects the topology itself.
        out.push(Problem::predicts(
            Outcome::Unaffected,
            format!("NCCL_TOPO_FILE={path:?} does not exist in this container: NCCL falls back to its own detection"),
            "Point NCCL_TOPO_FILE at a file the training container has, or unset it.",
        ));
    }
    let product = facts
        .platform
        .product_name
        .value()
        .and_then(|p| p.as_deref())
        .unwrap_or("");
    // The topology files aws-ofi-nccl ships name their instance type (p4d-24xl-topo.xml).
    let described = crate::platform::PLATFORMS
        .iter()
        .filter_map(|p| Some((p.topology_marker()?, *p.names.first()?)));
    for (marker, platform) in described {
        if path.contains(marker) {
            if product != platform {
                out.push(Problem::predicts(
                    Outcome::undetermined(format!(
                        "which GPU-NIC paths NCCL takes from {platform}'s topology on another machine"
                    )),
                    format!(
                        "NCCL_TOPO_FILE={path:?} describes {platform}, but this node is {}",
                        if product.is_empty() {
                            "unknown"
                        } else {
                            product
                        }
                    ),
                    "Unset NCCL_TOPO_FILE, or use the file for this instance type.",
                ));
            }
            break;
        }
    }
    out
}
