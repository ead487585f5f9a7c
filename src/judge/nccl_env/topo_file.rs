//! The files NCCL's variables point it to, parsed as the loaded NCCL parses them
//! (`crate::nccl::topo_xml`): NCCL_TOPO_FILE (or NCCL's default topology file) missing,
//! malformed, describing GPUs or NICs this node lacks, or another platform's; and
//! NCCL_GRAPH_FILE missing or malformed.

use super::Problem;
use crate::facts::{Facts, NamedFile, Observed};
use crate::finding::Outcome;
use crate::nccl::topo_xml::{self, Kind};

pub(super) fn lint_named_files(facts: &Facts) -> Vec<Problem> {
    let mut out = Vec::new();
    for named in &facts.nccl_files.named {
        let graph = named.variable.as_deref() == Some("NCCL_GRAPH_FILE");
        out.extend(if graph {
            lint_graph(facts, named)
        } else {
            lint_topology(facts, named)
        });
    }
    out.extend(lint_platform(facts));
    out
}

/// `NCCL_TOPO_FILE="x"`, or the default file's path.
fn what(named: &NamedFile) -> String {
    match &named.variable {
        Some(v) => format!("{v}={:?}", named.value),
        None => format!("NCCL's default topology file {}", named.value),
    }
}

fn lint_graph(facts: &Facts, named: &NamedFile) -> Vec<Problem> {
    // src/graph/search.cc ncclTopoCompute -> ncclTopoGetXmlGraphFromFile (v2.28.9-1): a
    // file it cannot open is a WARN and ncclSystemError, so init fails.
    let failed = match &named.file.text {
        Observed::Value(None) => "does not exist in this container".to_string(),
        Observed::Error(e) => format!("could not be read ({})", e.message),
        Observed::Value(Some(text)) => {
            match topo_xml::parse(text.as_bytes(), Kind::Graph, crate::nccl::version(facts)) {
                Ok(_) => return Vec::new(),
                Err(e) => format!("is not a graph file NCCL can read (NCCL: \"{e}\")"),
            }
        }
    };
    vec![Problem::predicts(
        Outcome::init_fails("the graph search (ncclTopoCompute) returns ncclSystemError"),
        format!(
            "{} {failed}: NCCL fails at init (the graph search returns an error)",
            what(named)
        ),
        "Point NCCL_GRAPH_FILE at a graph file NCCL wrote (NCCL_GRAPH_DUMP_FILE) that the training container has, or unset it.",
    )]
}

fn lint_topology(facts: &Facts, named: &NamedFile) -> Vec<Problem> {
    let text = match &named.file.text {
        // src/graph/xml.cc ncclTopoGetXmlFromFile: a file fopen cannot open is an INFO
        // line ("Could not open XML topology file"), and NCCL detects the topology itself.
        Observed::Value(None) => {
            return vec![Problem::predicts(
                Outcome::Unaffected,
                format!(
                    "{} does not exist in this container: NCCL falls back to its own detection",
                    what(named)
                ),
                "Point NCCL_TOPO_FILE at a file the training container has, or unset it.",
            )];
        }
        Observed::Error(e) => {
            return vec![Problem::predicts(
                Outcome::undetermined("whether the trainer's NCCL can open the topology file"),
                format!(
                    "{} could not be read ({}): where NCCL cannot open it either, it falls back to its own detection",
                    what(named),
                    e.message
                ),
                "Make the topology file readable by the trainer's user, or unset NCCL_TOPO_FILE.",
            )];
        }
        Observed::Value(Some(text)) => text,
    };
    let nodes = match topo_xml::parse(text.as_bytes(), Kind::Topology, crate::nccl::version(facts))
    {
        Ok(nodes) => nodes,
        Err(e) => {
            // Any parse error fails ncclTopoGetSystem, so every communicator's init.
            return vec![Problem::predicts(
                Outcome::init_fails(format!("ncclTopoGetSystem: {e}")),
                format!(
                    "{} is not a topology NCCL can read: every rank fails at init with \"{e}\"",
                    what(named)
                ),
                "Fix the file as NCCL reads it (quoted values, tags on one line, no <?xml?> line, spaces not tabs), or unset NCCL_TOPO_FILE.",
            )];
        }
    };
    absent_devices(facts, named, &topo_xml::described(&nodes))
        .into_iter()
        .collect()
}

/// The GPUs and NICs the file names that this node lacks. NCCL matches a GPU's `pci`
/// element by its exact bus id (src/graph/xml.cc ncclTopoGetPciNode: strcmp against
/// `%04lx:%02lx:%02lx.%01lx`, lower case) and trims every branch no detected device
/// keeps (ncclTopoTrimXml): what the file says of an absent device is not used.
fn absent_devices(facts: &Facts, named: &NamedFile, d: &topo_xml::Described) -> Option<Problem> {
    let gpus: Vec<&str> = match facts.gpus.pci_gpus.value() {
        Some(g) => g.iter().map(|g| g.bus_id.as_str()).collect(),
        None => return None,
    };
    let devices = facts.rdma.devices.value();
    let nic_ids: Vec<&str> = devices
        .iter()
        .flat_map(|d| d.iter().filter_map(|r| r.pci_bus_id.as_deref()))
        .collect();
    let missing = |listed: &[String], here: &[&str]| -> Vec<String> {
        listed
            .iter()
            .filter(|b| !here.contains(&b.as_str()))
            .map(|b| {
                if here.iter().any(|h| h.eq_ignore_ascii_case(b)) {
                    format!("{b} (NCCL compares bus ids in lower case)")
                } else {
                    b.clone()
                }
            })
            .collect()
    };
    let mut absent = missing(&d.gpus, &gpus);
    absent.extend(
        missing(&d.nics, &nic_ids)
            .into_iter()
            .filter(|_| devices.is_some()),
    );
    if absent.is_empty() {
        return None;
    }
    let shown: Vec<String> = absent.iter().take(4).cloned().collect();
    let more = absent.len().saturating_sub(shown.len());
    let more = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    Some(Problem::predicts(
        Outcome::Unaffected,
        format!(
            "{} describes PCI devices this node lacks ({}{more}): NCCL drops them and detects what is here itself, so the file's layout is not used for them",
            what(named),
            shown.join(", ")
        ),
        "Use the topology file written for this machine type (its bus ids must match `nvidia-smi -q`'s in lower case), or unset NCCL_TOPO_FILE.",
    ))
}

/// The topology files aws-ofi-nccl ships name their instance type (p4d-24xl-topo.xml).
fn lint_platform(facts: &Facts) -> Option<Problem> {
    let path = facts.nccl_env.get("NCCL_TOPO_FILE")?.value.as_str();
    let product = facts
        .platform
        .product_name
        .value()
        .and_then(|p| p.as_deref())
        .unwrap_or("");
    let (_, platform) = crate::platform::PLATFORMS
        .iter()
        .filter_map(|p| Some((p.topology_marker()?, *p.names.first()?)))
        .find(|(marker, _)| path.contains(marker))?;
    (product != platform).then(|| {
        Problem::predicts(
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
        )
    })
}
