//! `nccl-env`: the user's own NCCL variables, checked against this node and
//! the NCCL version it will load before NCCL trips on them. One file per
//! concern:
//!
//! - names: NCCL_* names no NCCL release reads (typos, with the nearest known
//!   name), or that this version does not read, from src/nccl/variables.tsv;
//! - values: integers NCCL's strtoll misreads, legacy numeric P2P/GDR levels,
//!   NCCL_BUFFSIZE below its default, NCCL_DEBUG=TRACE, control characters;
//! - socket_ifname: NCCL_SOCKET_IFNAME matching nothing (NCCL 2.28.9 measured:
//!   every rank fails at init with "Bootstrap : no socket interface found"),
//!   a missing Multus interface, lo/docker/virbr bootstrap across nodes, veth,
//!   a prefix matching several interfaces; NCCL_SOCKET_FAMILY; NCCL_COMM_ID with no
//!   address in its subnet or that NCCL cannot read;
//! - ib_hca: NCCL_IB_HCA prefixes, absent devices and DOWN ports;
//!   NCCL_IB_GID_INDEX with NCCL >= 2.21;
//! - ranges: the rules NCCL applies to values at init (thread counts, channel and CTA
//!   limits, a P2P chunk times NCCL_STEPS against NCCL_BUFFSIZE, IB queue pairs against
//!   NCCL's array), clamps NCCL makes with only an INFO line, or an overrun;
//! - transports: P2P/SHM off where NVLink is, LL128 without NVLink, NCCL_ALGO
//!   and NCCL_PROTO names this version lacks, algorithms this node cannot run;
//! - conf_files: the settings files NCCL reads (NCCL_CONF_FILE, ~/.nccl.conf,
//!   /etc/nccl.conf) as the loaded NCCL parses them: lines it misreads, and an
//!   NCCL_CONF_FILE it does not read or that names no file;
//! - params: what the trainer's NCCL itself reports through its parameter API (2.30
//!   and later): values its parser refused, unused or deprecated ones, values from an
//!   env plugin;
//! - topo_file: the files NCCL parses (NCCL_TOPO_FILE or its default topology,
//!   NCCL_GRAPH_FILE) missing, malformed as NCCL reads them, describing devices this
//!   node lacks, or another platform's;
//! - network: aws-ofi-nccl variables with values its parser refuses (the plugin
//!   does not initialize); RDMA turned off or mis-chosen where usable devices exist, and
//!   RDMA asked for where the container has no usable device.
//!
//! Every variable is read where NCCL reads it: the environment, then the settings
//! files (`facts.nccl_env` carries both, each file value with its file and line).
//!
//! Variables that are image metadata (NCCL_VERSION from NVIDIA's images) are
//! neither listed nor linted (crate::nccl::catalog::is_nccl_setting).

mod conf_files;
mod ib_hca;
mod names;
pub(super) mod network;
mod params;
mod prediction;
mod ranges;
mod socket_ifname;
mod topo_file;
mod transports;
mod values;

use super::{Finding, Problem};
use crate::facts::Facts;
use crate::finding::Outcome;
use crate::nccl::catalog::{self, Catalog};
use crate::policy::Policy;
use crate::predict::Prediction;

pub const ID: &str = "nccl-env";

fn get<'a>(facts: &'a Facts, name: &str) -> Option<&'a str> {
    facts.nccl_env.get(name).map(|v| v.value.as_str())
}

/// The bootstrap and socket variables: the interface list, the address family and
/// NCCL_COMM_ID, each judged against this node's interfaces.
fn socket_lints(facts: &Facts, predicted: &Prediction) -> Vec<Problem> {
    let env = &facts.nccl_env;
    let mut lints = Vec::new();
    if let Some(v) = env.get("NCCL_SOCKET_IFNAME") {
        lints.extend(socket_ifname::lint_socket_ifname(facts, v));
    }
    if let Some(v) = env.get("NCCL_SOCKET_FAMILY") {
        lints.extend(socket_ifname::lint_socket_family(facts, predicted, v));
    }
    if let Some(v) = env.get("NCCL_COMM_ID") {
        lints.extend(socket_ifname::lint_comm_id(facts, v));
    }
    lints
}

pub fn judge(facts: &Facts, predicted: &Prediction, _policy: &Policy) -> Finding {
    let env = &facts.nccl_env;
    let mut lints = socket_lints(facts, predicted);
    let mut evidence = Vec::new();
    for lint in [
        ib_hca::lint_gid_index,
        transports::lint_p2p_shm,
        conf_files::lint_conf_files,
        params::lint_params,
        topo_file::lint_named_files,
        network::lint_rdma_requested,
        network::lint_net_plugin_name,
        network::lint_ofi_values,
        values::lint_buffsize,
        ranges::lint_ranges,
        values::lint_debug_and_text,
    ] {
        lints.extend(lint(facts));
    }
    // After the text lints, so a variable's own problem (a misspelled plugin name) leads
    // and the prediction adds what it does to this job.
    lints.extend(prediction::lints(facts, predicted));
    let version = crate::nccl::version(facts);
    let settings: Vec<(&String, &crate::facts::EnvValue)> = match Catalog::embedded() {
        Ok(cat) => {
            for lint in [
                names::lint_names,
                values::lint_ints,
                values::lint_bools,
                values::lint_levels,
                transports::lint_algo,
                transports::lint_proto_names,
            ] {
                lints.extend(lint(facts, &cat, version));
            }
            if env.keys().any(|k| k.starts_with("NCCL_")) {
                evidence.push(match version {
                    Some(v) => format!("names and values checked against NCCL {}, the libnccl this image loads", v),
                    None => format!(
                        "NCCL version unknown (no libnccl loaded here): names and values checked against every release from {} to {}",
                        cat.tags.first().copied().unwrap_or_default(),
                        cat.latest()
                    ),
                });
            }
            env.iter()
                .filter(|(k, _)| catalog::is_nccl_setting(&cat, k))
                .collect()
        }
        Err(e) => {
            lints.push(Problem::predicts(
                Outcome::undetermined("what NCCL makes of the variables' names and values"),
                format!("the NCCL variable table built into this tool is unreadable ({e}): names and value types were not checked"),
                "Rebuild nccl-preflight from a clean checkout (scripts/gen-nccl-vars.py regenerates the table).",
            ));
            env.iter().collect()
        }
    };
    let summary = if settings.is_empty() {
        "no NCCL, libfabric or aws-ofi-nccl variables set".to_string()
    } else {
        format!(
            "{} variable(s) set, none conflicts with this node",
            settings.len()
        )
    };
    let mut listed: Vec<String> = settings
        .iter()
        .map(|(k, v)| match &v.from {
            Some(from) => format!("{k}={:?} (from {from})", v.value),
            None => format!("{k}={:?}", v.value),
        })
        .collect();
    listed.extend(evidence);
    listed.extend(params::evidence(facts));
    super::combine(ID, summary, listed, lints)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::Observed;
    use crate::finding::Status;
    use crate::test_facts::{healthy, iface, v4, with_env};

    /// The judge as the run calls it, with the prediction made from the same facts.
    fn judge(facts: &Facts, policy: &Policy) -> Finding {
        crate::test_facts::judged(super::judge, facts, policy)
    }

    fn docker_node() -> Facts {
        let mut f = healthy();
        f.network.interfaces = Observed::Value(vec![
            iface("lo", None),
            iface("eth0", Some("veth")),
            iface("docker0", Some("bridge")),
            iface("veth12ab", Some("veth")),
        ]);
        f.network.addresses = Observed::Value(vec![
            v4("lo", "127.0.0.1"),
            v4("eth0", "10.0.0.5"),
            v4("docker0", "172.17.0.1"),
            v4("veth12ab", "169.254.1.1"),
        ]);
        f
    }

    fn lint(pairs: &[(&str, &str)]) -> Finding {
        judge(&with_env(docker_node(), pairs), &Policy::default())
    }

    #[test]
    fn no_variables_pass() {
        let f = lint(&[]);
        assert_eq!(f.status(), Status::Pass);
        let f = lint(&[("NCCL_SOCKET_IFNAME", "=eth0"), ("NCCL_DEBUG", "INFO")]);
        assert_eq!(f.status(), Status::Pass, "{f:?}");
        assert_eq!(
            f.summary,
            "2 variable(s) set, none conflicts with this node"
        );
    }

    #[test]
    fn no_matching_interface_fails_with_the_nccl_error() {
        for value in ["nonexist0", "==eth1", "=eth"] {
            let f = lint(&[("NCCL_SOCKET_IFNAME", value)]);
            assert_eq!(f.status(), Status::Fail, "{value}");
            assert!(f.summary.contains("Bootstrap : no socket interface found"));
            assert!(
                f.remediation()
                    .unwrap()
                    .contains("NCCL_SOCKET_IFNAME='=eth0'")
            );
        }
    }

    #[test]
    fn loopback_warns_on_one_node_and_fails_across_nodes() {
        let f = lint(&[("NCCL_SOCKET_IFNAME", "lo")]);
        assert_eq!(f.status(), Status::Warn);
        let f = lint(&[("NCCL_SOCKET_IFNAME", "lo"), ("PET_NNODES", "2")]);
        assert_eq!(f.status(), Status::Fail);
        assert!(f.summary.contains("several nodes"));
    }

    #[test]
    fn exclusion_without_lo_suggests_adding_lo() {
        let f = lint(&[
            ("NCCL_SOCKET_IFNAME", "^docker0"),
            ("WORLD_SIZE", "16"),
            ("LOCAL_WORLD_SIZE", "8"),
        ]);
        assert_eq!(f.status(), Status::Fail);
        assert!(
            f.remediation()
                .unwrap()
                .starts_with("NCCL_SOCKET_IFNAME='^docker0,lo'")
        );
        // ^docker0,lo still leaves veth12ab, whose only address is link-local: NCCL's
        // socket transport would use it too. Harmless on one node.
        assert_eq!(
            lint(&[("NCCL_SOCKET_IFNAME", "^docker0,lo"), ("PET_NNODES", "1")]).status(),
            Status::Pass
        );
    }

    #[test]
    fn a_link_local_interface_left_by_the_filter_warns_or_fails_by_job_size() {
        let value = ("NCCL_SOCKET_IFNAME", "^docker0,lo");
        let f = lint(&[value]);
        assert_eq!(f.status(), Status::Warn, "{f:?}");
        assert!(
            f.summary.contains("veth12ab (169.254.1.1)"),
            "{}",
            f.summary
        );
        assert!(
            f.remediation()
                .unwrap()
                .starts_with("NCCL_SOCKET_IFNAME='^docker0,lo,veth12ab'"),
            "{f:?}"
        );
        let f = lint(&[value, ("PET_NNODES", "4")]);
        assert_eq!(f.status(), Status::Fail, "{f:?}");
        assert!(f.summary.contains("several nodes"), "{}", f.summary);
        // An exact name that avoids it passes.
        assert_eq!(
            lint(&[("NCCL_SOCKET_IFNAME", "=eth0"), ("PET_NNODES", "4")]).status(),
            Status::Pass
        );
    }

    #[test]
    fn a_link_local_interface_past_nccls_sixteenth_carries_nothing() {
        // NCCL's socket transport keeps 16 interfaces (MAX_IFS): a link-local 17th
        // is never used.
        let mut f = healthy();
        let mut interfaces = vec![iface("lo", None)];
        let mut addresses = vec![v4("lo", "127.0.0.1")];
        for i in 0..16 {
            interfaces.push(iface(&format!("eth{i}"), None));
            addresses.push(v4(&format!("eth{i}"), &format!("10.0.{i}.5")));
        }
        interfaces.push(iface("pod-id-link0", None));
        addresses.push(v4("pod-id-link0", "169.254.170.23"));
        f.network.interfaces = Observed::Value(interfaces.clone());
        f.network.addresses = Observed::Value(addresses.clone());
        let judged = |f: &Facts| {
            judge(
                &with_env(
                    f.clone(),
                    &[("NCCL_SOCKET_IFNAME", "^lo"), ("PET_NNODES", "2")],
                ),
                &Policy::default(),
            )
        };
        assert!(
            !judged(&f).summary.contains("link-local"),
            "{:?}",
            judged(&f)
        );
        // Moved to 16th place, it is used.
        interfaces.swap(16, 17);
        addresses.swap(16, 17);
        f.network.interfaces = Observed::Value(interfaces);
        f.network.addresses = Observed::Value(addresses);
        let j = judged(&f);
        assert_eq!(j.status(), Status::Fail, "{j:?}");
        assert!(
            j.summary.contains("pod-id-link0 (169.254.170.23)"),
            "{}",
            j.summary
        );
    }

    #[test]
    fn docker_veth_ignored_and_family() {
        assert_eq!(
            lint(&[("NCCL_SOCKET_IFNAME", "docker")]).status(),
            Status::Warn
        );
        assert_eq!(
            lint(&[("NCCL_SOCKET_IFNAME", "docker"), ("PET_NNODES", "3")]).status(),
            Status::Fail
        );
        let f = lint(&[("NCCL_SOCKET_IFNAME", "veth")]);
        assert!(f.summary.contains("hangs"), "{f:?}");
        // One character is ignored: NCCL's automatic choice here includes the test pod's
        // link-local veth, which is judged as a value would be.
        let f = lint(&[("NCCL_SOCKET_IFNAME", "e")]);
        assert!(f.summary.contains("which NCCL ignores"), "{f:?}");
        assert!(f.remediation().unwrap().contains("one character"), "{f:?}");
        // A family NCCL does not know is ignored (AF_UNSPEC): a note.
        let f = lint(&[("NCCL_SOCKET_FAMILY", "inet6")]);
        assert_eq!(f.status(), Status::Pass);
        assert!(f.summary.contains("note: NCCL_SOCKET_FAMILY"), "{f:?}");
        // Family filter: no IPv6 addresses here, so AF_INET6 leaves nothing.
        let f = lint(&[
            ("NCCL_SOCKET_IFNAME", "eth0"),
            ("NCCL_SOCKET_FAMILY", "AF_INET6"),
        ]);
        assert_eq!(f.status(), Status::Fail);
    }

    #[test]
    fn comm_id_outside_every_subnet_fails_at_init() {
        // Written from src/bootstrap.cc bootstrapNetInit (v2.28.9-1) before the tool ran:
        // docker_node's addresses have no prefix length, so only the exact address matches.
        let f = lint(&[("NCCL_COMM_ID", "10.0.0.5:29500")]);
        assert_eq!(f.status(), Status::Pass, "{f:?}");
        let f = lint(&[("NCCL_COMM_ID", "192.0.2.1:29500")]);
        assert_eq!(f.status(), Status::Fail, "{f:?}");
        assert!(
            f.summary.contains("No usable listening interface found"),
            "{}",
            f.summary
        );
        let f = lint(&[("NCCL_COMM_ID", "[fd00::1:29500")]);
        assert!(f.summary.contains("Invalid NCCL_COMM_ID"), "{}", f.summary);
        let f = lint(&[("NCCL_COMM_ID", "master:29500")]);
        assert_eq!(
            f.status(),
            Status::Pass,
            "a host name is resolved at run time"
        );
    }

    #[test]
    fn aws_ofi_nccl_values_its_parser_refuses() {
        // Written from aws-ofi-nccl include/nccl_ofi_param_impl.h (v1.19.2) before the tool
        // ran: the plugin's init fails with -EINVAL on a value outside the set.
        let efa = || crate::test_facts::with_efa(healthy());
        assert_eq!(
            lint_on(efa(), &[("OFI_NCCL_PROTOCOL", "rdma")]).status(),
            Status::Pass
        );
        // One node: NCCL goes on without the plugin, and nothing crosses nodes: a note.
        let f = lint_on(efa(), &[("OFI_NCCL_PROTOCOL", "RDMA_WRITE")]);
        assert_eq!(f.status(), Status::Pass, "{f:?}");
        assert!(f.summary.contains("set to invalid value"), "{}", f.summary);
        let forced = lint_on(
            efa(),
            &[
                ("OFI_NCCL_PROTOCOL", "RDMA_WRITE"),
                ("NCCL_NET", "AWS Libfabric"),
            ],
        );
        assert_eq!(forced.status(), Status::Fail, "{forced:?}");
        let f = lint_on(
            efa(),
            &[
                ("OFI_NCCL_DISABLE_GDR_REQUIRED_CHECK", "yes"),
                ("PET_NNODES", "2"),
            ],
        );
        // Two nodes: NCCL runs, over TCP between them (degraded), a warning.
        assert_eq!(f.status(), Status::Warn, "{f:?}");
    }

    #[test]
    fn several_problems_are_all_reported() {
        let f = lint(&[
            ("NCCL_SOCKET_IFNAME", "nonexist0"),
            ("NCCL_DEBUG", "TRACE"),
            ("NCCL_SOCKET_FAMILY", "x"),
        ]);
        assert_eq!(f.status(), Status::Fail);
        assert!(f.summary.starts_with("2 problems"), "{f:?}");
        assert_eq!(f.remediation().unwrap().lines().count(), 2);
        // The ignored family is a note: in the evidence, not among the fixes.
        assert!(
            f.evidence
                .iter()
                .any(|e| e.starts_with("note: NCCL_SOCKET_FAMILY")),
            "{f:?}"
        );
    }

    #[test]
    fn unreadable_interfaces_warn() {
        let mut f = with_env(healthy(), &[("NCCL_SOCKET_IFNAME", "eth0")]);
        f.network.interfaces = Observed::Error(crate::facts::FactError::new("getifaddrs", "EPERM"));
        assert_eq!(judge(&f, &Policy::default()).status(), Status::Warn);
    }

    // One test per rule, each with the case that must pass and the case that must not.

    fn ib_node() -> Facts {
        use crate::test_facts::{rdma_device, with_rdma};
        let mut devices: Vec<_> = (0..12)
            .map(|i| {
                rdma_device(
                    &format!("mlx5_{i}"),
                    "mlx5_core",
                    "0000:17:00.0",
                    "/sys/devices/x",
                    "ACTIVE",
                    "InfiniBand",
                )
            })
            .collect();
        devices[2].ports[0].state = Some("DOWN".into());
        with_rdma(healthy(), devices)
    }

    fn efa_node() -> Facts {
        crate::test_facts::with_efa(healthy())
    }

    fn lint_on(f: Facts, pairs: &[(&str, &str)]) -> Finding {
        judge(&with_env(f, pairs), &Policy::default())
    }

    #[test]
    fn ib_hca_prefix_absent_and_down() {
        let f = lint_on(ib_node(), &[("NCCL_IB_HCA", "mlx5_1")]);
        assert!(
            f.summary.contains("also matches mlx5_10, mlx5_11"),
            "{}",
            f.summary
        );
        assert!(f.remediation().unwrap().contains("'=mlx5_1'"));
        assert_eq!(
            lint_on(ib_node(), &[("NCCL_IB_HCA", "=mlx5_1:1,mlx5_3:1")]).status(),
            Status::Pass
        );
        let none = lint_on(ib_node(), &[("NCCL_IB_HCA", "=mlx5_99")]);
        assert!(
            none.summary.contains("leaves no ACTIVE IB or RoCE port"),
            "{}",
            none.summary
        );
        assert_eq!(none.status(), Status::Warn, "one node, or nothing says");
        // NVIDIA/nccl#799: across nodes NCCL finds no HCA and uses TCP: it runs, slower
        // (issue 36: degraded is a warning), and the outcome says so.
        let across = lint_on(
            crate::test_facts::with_env(ib_node(), &[("PET_NNODES", "16")]),
            &[("NCCL_IB_HCA", "=mlx5_99")],
        );
        assert_eq!(across.status(), Status::Warn, "{across:?}");
        assert!(
            matches!(across.outcome(), Some(crate::finding::Outcome::Degraded { path, .. }) if path.contains("TCP")),
            "{across:?}"
        );
        assert!(
            lint_on(ib_node(), &[("NCCL_IB_HCA", "=mlx5_2:1")])
                .summary
                .contains("mlx5_2:1, which is DOWN")
        );
        // Issue 13: no RDMA device here, so asking for one is no longer "checked".
        assert_eq!(
            lint_on(healthy(), &[("NCCL_IB_HCA", "mlx5_1")]).status(),
            Status::Warn,
        );
    }

    #[test]
    fn p2p_shm_and_ll128() {
        assert!(
            lint_on(healthy(), &[("NCCL_P2P_DISABLE", "1")])
                .summary
                .contains("27 GB/s")
        );
        assert_eq!(
            lint_on(healthy(), &[("NCCL_P2P_DISABLE", "0")]).status(),
            Status::Pass
        );
        assert_eq!(
            lint_on(healthy(), &[("NCCL_P2P_LEVEL", "LOC")]).status(),
            Status::Warn
        );
        assert_eq!(
            lint_on(healthy(), &[("NCCL_P2P_LEVEL", "NVL")]).status(),
            Status::Pass
        );
        let both = lint_on(
            healthy(),
            &[("NCCL_P2P_DISABLE", "1"), ("NCCL_SHM_DISABLE", "1")],
        );
        assert!(both.summary.starts_with("2 problems"), "{}", both.summary);
        assert_eq!(
            lint_on(healthy(), &[("NCCL_SHM_DISABLE", "1")]).status(),
            Status::Pass,
            "P2P over NVLink still works"
        );
        let mut pcie = healthy();
        pcie.gpus = crate::test_facts::no_gpus();
        assert!(
            lint_on(pcie.clone(), &[("NCCL_PROTO", "LL128")])
                .summary
                .contains("corrupt")
        );
        assert_eq!(
            lint_on(pcie, &[("NCCL_PROTO", "^LL128")]).status(),
            Status::Pass
        );
        assert_eq!(
            lint_on(healthy(), &[("NCCL_PROTO", "LL128")]).status(),
            Status::Pass,
            "NVLink node"
        );
    }

    fn with_named(mut f: Facts, variable: &str, value: &str, text: Option<&str>) -> Facts {
        f.nccl_env
            .insert(variable.into(), crate::facts::EnvValue::text(value));
        f.nccl_files.named.push(crate::facts::NamedFile {
            variable: Some(variable.into()),
            value: value.into(),
            file: crate::facts::ReadFile {
                path: value.into(),
                text: Observed::Value(text.map(str::to_string)),
                not_utf8: false,
            },
        });
        f
    }

    #[test]
    fn topo_file_missing_or_foreign() {
        let p4d = "/opt/amazon/ofi-nccl/share/aws-ofi-nccl/xml/p4d-24xl-topo.xml";
        let finding = judge(
            &with_named(healthy(), "NCCL_TOPO_FILE", p4d, None),
            &Policy::default(),
        );
        // The missing file NCCL skips (its own detection instead): a note; the other
        // platform's file: what NCCL makes of it is undetermined, a warning.
        assert_eq!(finding.status(), Status::Warn, "{finding:?}");
        assert!(
            finding.summary.contains("describes p4d"),
            "{}",
            finding.summary
        );
        assert!(
            finding
                .evidence
                .iter()
                .any(|e| e.contains("note: NCCL_TOPO_FILE") && e.contains("does not exist")),
            "{finding:?}"
        );
        let mut f = with_named(
            healthy(),
            "NCCL_TOPO_FILE",
            p4d,
            Some("<system version=\"1\"/>"),
        );
        f.platform.product_name = crate::facts::Observed::Value(Some("p4d.24xlarge".into()));
        assert_eq!(judge(&f, &Policy::default()).status(), Status::Pass);
    }

    #[test]
    fn topo_file_parsed_as_nccl_parses_it() {
        // Written from src/graph/xml.cc (v2.28.9-1) before the tool ran: a declaration
        // line is "expected >, got '?'" and init fails; a GPU this node lacks is dropped
        // (ncclTopoTrimXml), so the file is not used for it: a warning.
        let f = with_named(
            healthy(),
            "NCCL_TOPO_FILE",
            "/t.xml",
            Some("<?xml version=\"1.0\"?>\n<system version=\"1\"/>\n"),
        );
        let j = judge(&f, &Policy::default());
        assert_eq!(j.status(), Status::Fail, "{j:?}");
        assert!(j.summary.contains("expected >, got '?'"), "{}", j.summary);
        // A bus id with hex letters, which NCCL writes in lower case.
        let here = "0000:1a:00.0".to_string();
        let healthy = || {
            let mut f = healthy();
            if let Observed::Value(g) = &mut f.gpus.pci_gpus {
                g.truncate(1);
                g[0].bus_id = here.clone();
            }
            f
        };
        let xml = |busid: &str| {
            format!(
                "<system version=\"1\">\n<cpu numaid=\"0\">\n<pci busid=\"{busid}\" class=\"0x030200\"/>\n</cpu>\n</system>\n"
            )
        };
        let ok = with_named(healthy(), "NCCL_TOPO_FILE", "/t.xml", Some(&xml(&here)));
        assert_eq!(judge(&ok, &Policy::default()).status(), Status::Pass);
        let other = with_named(
            healthy(),
            "NCCL_TOPO_FILE",
            "/t.xml",
            Some(&xml("0000:ee:00.0")),
        );
        // ncclTopoTrimXml drops what no detected device keeps: NCCL runs as without
        // the file for them, a note.
        let j = judge(&other, &Policy::default());
        assert_eq!(j.status(), Status::Pass, "{j:?}");
        assert!(j.summary.contains("0000:ee:00.0"), "{}", j.summary);
        let upper = with_named(
            healthy(),
            "NCCL_TOPO_FILE",
            "/t.xml",
            Some(&xml(&here.to_uppercase())),
        );
        assert!(
            judge(&upper, &Policy::default())
                .summary
                .contains("lower case"),
            "NCCL's strcmp"
        );
        // NCCL_GRAPH_FILE that is not there: init fails (ncclSystemError).
        let g = with_named(healthy(), "NCCL_GRAPH_FILE", "/g.xml", None);
        assert_eq!(judge(&g, &Policy::default()).status(), Status::Fail);
    }

    #[test]
    fn settings_files_lines_nccl_misreads() {
        // Written from src/misc/param.cc setEnvFile (v2.28.9-1) before the tool ran.
        let mut f = healthy();
        f.nccl_files.conf = vec![crate::facts::ReadFile {
            path: "/etc/nccl.conf".into(),
            text: Observed::Value(Some(
                "NCCL_DEBUG = INFO\nNCCL_SOCKET_IFNAME=\"eth0\"\nNCCL_ALGO=Ring\nNCCL_ALGO=Tree\n"
                    .into(),
            )),
            not_utf8: false,
        }];
        let j = judge(&f, &Policy::default());
        assert_eq!(j.status(), Status::Warn, "{j:?}");
        assert!(j.summary.starts_with("3 problems"), "{}", j.summary);
        assert!(j.summary.contains("\"NCCL_DEBUG \""), "{}", j.summary);
        // An NCCL_CONF_FILE that names no file is skipped without a word.
        let mut f = with_env(healthy(), &[("NCCL_CONF_FILE", "/job/n.conf")]);
        f.nccl_files.conf = vec![crate::facts::ReadFile {
            path: "/job/n.conf".into(),
            text: Observed::Value(None),
            not_utf8: false,
        }];
        let j = judge(&f, &Policy::default());
        assert!(j.summary.contains("names no file"), "{}", j.summary);
        // NCCL 2.21 does not read it at all.
        let old = judge(&with_version(f, "2.21.5"), &Policy::default());
        assert!(
            old.summary.contains("does not read NCCL_CONF_FILE"),
            "{}",
            old.summary
        );
    }

    #[test]
    fn network_selection() {
        assert!(
            lint_on(ib_node(), &[("NCCL_IB_DISABLE", "1")])
                .summary
                .contains("TCP")
        );
        assert_eq!(
            lint_on(healthy(), &[("NCCL_IB_DISABLE", "1")]).status(),
            Status::Pass,
            "no RDMA: nothing lost"
        );
        assert_eq!(
            lint_on(ib_node(), &[("NCCL_NET", "Socket")]).status(),
            Status::Warn
        );
        assert_eq!(
            lint_on(efa_node(), &[("NCCL_NET", "IB")]).status(),
            Status::Fail
        );
        assert_eq!(
            lint_on(ib_node(), &[("NCCL_NET", "IB")]).status(),
            Status::Pass
        );
        // aws-ofi-nccl loaded: FI_PROVIDER=tcp puts it on libfabric's tcp provider.
        let mut ofi = efa_node();
        ofi.rdma.nccl.net_plugin = Observed::Value(Some(crate::facts::rdma::NetPlugin {
            library: "libnccl-net.so".into(),
            path: None,
            api: Some("v9".into()),
            apis: vec![9],
            ofi_nccl_version: None,
            name: Some("Libfabric".into()),
        }));
        let tcp = lint_on(ofi.clone(), &[("FI_PROVIDER", "tcp")]);
        assert_eq!(tcp.status(), Status::Warn, "{tcp:?}");
        // Across nodes: TCP, a degraded run (issue 36).
        assert_eq!(
            lint_on(ofi, &[("FI_PROVIDER", "tcp"), ("PET_NNODES", "2")]).status(),
            Status::Warn
        );
        assert_eq!(
            lint_on(efa_node(), &[("FI_PROVIDER", "efa")]).status(),
            Status::Pass
        );
    }

    #[test]
    fn gid_index_trace_and_line_breaks() {
        // NCCL 2.28.9 takes the index and a routable GID changes nothing: a note.
        assert_eq!(
            lint_on(healthy(), &[("NCCL_IB_GID_INDEX", "3")]).status(),
            Status::Pass,
            "NCCL 2.28.9"
        );
        let mut old = healthy();
        if let crate::facts::gpu::LibraryState::Loaded(l) = &mut old.rdma.nccl.library.state {
            l.version = crate::facts::Observed::Value("2.18.5".into());
        }
        assert_eq!(
            lint_on(old, &[("NCCL_IB_GID_INDEX", "3")]).status(),
            Status::Pass
        );
        assert_eq!(
            lint_on(healthy(), &[("NCCL_DEBUG", "TRACE")]).status(),
            Status::Warn
        );
        assert_eq!(
            lint_on(healthy(), &[("NCCL_DEBUG", "INFO")]).status(),
            Status::Pass
        );
        assert!(
            lint_on(healthy(), &[("NCCL_DEBUG_SUBSYS", "INIT\nNET")])
                .summary
                .contains("line break")
        );
    }

    fn with_version(mut f: Facts, version: &str) -> Facts {
        if let crate::facts::gpu::LibraryState::Loaded(l) = &mut f.rdma.nccl.library.state {
            l.version = Observed::Value(version.into());
        }
        f
    }

    /// docker_node with eth1 down (no carrier) but holding an address, and virbr0 up.
    fn down_eth1_node(version: &str) -> Facts {
        let mut f = with_version(docker_node(), version);
        let mut down = iface("eth1", None);
        down.running = false;
        if let Observed::Value(i) = &mut f.network.interfaces {
            i.push(down);
            i.push(iface("virbr0", Some("bridge")));
        }
        if let Observed::Value(a) = &mut f.network.addresses {
            a.push(v4("eth1", "10.1.0.5"));
            a.push(v4("virbr0", "192.168.122.1"));
        }
        f
    }

    #[test]
    fn interface_rules_follow_the_loaded_nccl_version() {
        let judge_on = |version: &str, pairs: &[(&str, &str)]| {
            judge(
                &with_env(down_eth1_node(version), pairs),
                &Policy::default(),
            )
        };
        // 2.28 skips interfaces without IFF_RUNNING: nothing left, init fails.
        let new = judge_on("2.28.9", &[("NCCL_SOCKET_IFNAME", "=eth1")]);
        assert_eq!(new.status(), Status::Fail, "{new:?}");
        assert!(new.summary.contains("no socket interface found"), "{new:?}");
        // 2.27 binds the down eth1: init works, other nodes cannot reach it.
        let one = judge_on("2.27.7", &[("NCCL_SOCKET_IFNAME", "=eth1")]);
        assert_eq!(one.status(), Status::Warn, "{one:?}");
        assert!(one.summary.contains("down or has no carrier"), "{one:?}");
        let two = judge_on(
            "2.27.7",
            &[("NCCL_SOCKET_IFNAME", "=eth1"), ("PET_NNODES", "2")],
        );
        assert_eq!(two.status(), Status::Fail, "{two:?}");
        assert!(
            !two.summary.contains("no socket interface found"),
            "{two:?}"
        );
        // The prefix eth matches eth0 alone on 2.28, eth0 and eth1 on 2.27.
        let prefix = |v: &str| judge_on(v, &[("NCCL_SOCKET_IFNAME", "eth")]);
        assert_eq!(
            prefix("2.28.9").status(),
            Status::Pass,
            "{:?}",
            prefix("2.28.9")
        );
        let old = prefix("2.27.7");
        assert_eq!(old.status(), Status::Warn, "{old:?}");
        assert!(old.summary.contains("matches 2 interfaces"), "{old:?}");
    }

    #[test]
    fn nccl_ib_hba_typo_passed_as_checked() {
        // NCCL never reads it, so it runs as without it: a note with its fix.
        let f = lint_on(ib_node(), &[("NCCL_IB_HBA", "mlx5_1")]);
        assert_eq!(f.status(), Status::Pass);
        assert!(
            f.summary.contains("a typo for NCCL_IB_HCA"),
            "{}",
            f.summary
        );
        assert!(
            f.evidence
                .iter()
                .any(|e| e.ends_with("Rename it: NCCL_IB_HCA='mlx5_1'")),
            "{f:?}"
        );
        let f = lint_on(healthy(), &[("NCCL_TOTALLY_MADE_UP_SETTING", "1")]);
        assert!(
            f.summary.contains("not a variable NCCL reads"),
            "{}",
            f.summary
        );
        assert_eq!(
            lint_on(healthy(), &[("NCCL_TESTS_MIN_BW", "100")]).status(),
            Status::Pass,
            "nccl-tests' own setting"
        );
        // PyTorch's legacy names are not NCCL's, but not typos either.
        assert_eq!(
            lint_on(healthy(), &[("NCCL_ASYNC_ERROR_HANDLING", "1")]).status(),
            Status::Pass
        );
    }

    #[test]
    fn variable_this_version_does_not_read_warns() {
        let f = lint_on(with_version(healthy(), "2.9.9"), &[("NCCL_NET", "Socket")]);
        assert!(f.summary.contains("does not read it yet"), "{}", f.summary);
        assert!(f.summary.contains("NCCL 2.9.9"), "{}", f.summary);
        let f = lint_on(
            with_version(healthy(), "2.28.9"),
            &[("NCCL_IB_GDR_LEVEL", "2")],
        );
        assert!(f.summary.contains("no longer reads it"), "{}", f.summary);
        // Unknown version: the union of all releases, and the evidence says so.
        let mut unknown = healthy();
        unknown.rdma.nccl.library.state = crate::facts::gpu::LibraryState::NotFound {
            message: "libnccl.so.2: cannot open shared object file".into(),
        };
        let f = lint_on(unknown, &[("NCCL_IB_GDR_LEVEL", "2")]);
        assert_eq!(f.status(), Status::Pass, "{f:?}");
        assert!(
            f.evidence
                .iter()
                .any(|e| e.contains("NCCL version unknown"))
        );
    }

    #[test]
    fn nccl_version_from_cuda_images_is_not_a_setting() {
        let f = lint_on(healthy(), &[("NCCL_VERSION", "2.21.5-1")]);
        assert_eq!(f.status(), Status::Pass);
        assert_eq!(
            f.summary,
            "no NCCL, libfabric or aws-ofi-nccl variables set"
        );
        assert!(f.evidence.iter().all(|e| !e.contains("NCCL_VERSION")));
    }

    #[test]
    fn integers_are_read_the_way_strtoll_reads_them() {
        use crate::nccl::catalog::{IntRead, strtoll};
        assert_eq!(strtoll("8388608"), IntRead::Whole(8388608));
        assert_eq!(strtoll("0x10"), IntRead::Whole(16));
        assert_eq!(strtoll("010"), IntRead::Whole(8));
        assert_eq!(strtoll("08"), IntRead::Prefix(0));
        assert_eq!(strtoll("4MB"), IntRead::Prefix(4));
        assert_eq!(strtoll(" -2"), IntRead::Whole(-2));
        assert_eq!(strtoll("abc"), IntRead::NoDigits);
        assert_eq!(strtoll("99999999999999999999"), IntRead::Overflow);
        let f = lint_on(healthy(), &[("NCCL_BUFFSIZE", "4MB")]);
        assert!(f.summary.starts_with("2 problems"), "{}", f.summary);
        assert!(
            f.evidence
                .iter()
                .any(|e| e.contains("NCCL reads the leading number only, 4"))
        );
        // NCCL_BUFFSIZE=4MB is 4 bytes to NCCL: measured, every rank dies of SIGFPE.
        assert_eq!(f.status(), Status::Fail);
        assert!(f.summary.contains("SIGFPE"), "{}", f.summary);
        let f = lint_on(healthy(), &[("NCCL_BUFFSIZE", "262144")]);
        assert_eq!(f.status(), Status::Warn);
        assert!(
            f.summary.contains("to 238 GB/s with 256 KiB"),
            "{}",
            f.summary
        );
        let f = lint_on(healthy(), &[("NCCL_BUFFSIZE", "2097152")]);
        assert!(f.summary.contains("no loss was measured"), "{}", f.summary);
        assert_eq!(
            lint_on(healthy(), &[("NCCL_BUFFSIZE", "513")]).status(),
            Status::Warn
        );
        assert_eq!(
            lint_on(healthy(), &[("NCCL_BUFFSIZE", "512")]).status(),
            Status::Fail
        );
        assert_eq!(
            lint_on(healthy(), &[("NCCL_BUFFSIZE", "8388608")]).status(),
            Status::Pass
        );
        assert!(
            lint_on(healthy(), &[("NCCL_NTHREADS", "many")])
                .summary
                .contains("NCCL reads it as 0")
        );
    }

    #[test]
    fn legacy_level_numbers_say_what_they_mean() {
        // NCCL does what the number says: a note that says what that is.
        let f = lint_on(healthy(), &[("NCCL_P2P_LEVEL", "5")]);
        assert_eq!(f.status(), Status::Pass);
        assert!(f.summary.contains("reads it as SYS"), "{}", f.summary);
        assert!(f.summary.contains("across CPU sockets"), "{}", f.summary);
        assert!(
            f.evidence.iter().any(|e| e.contains("NCCL_P2P_LEVEL=SYS")),
            "{f:?}"
        );
        let f = lint_on(healthy(), &[("NCCL_NET_GDR_LEVEL", "2")]);
        assert!(f.summary.contains("reads it as PXB"), "{}", f.summary);
        assert!(f.summary.contains("GPUDirect RDMA"), "{}", f.summary);
        // Numbers above 5 clamp to the last legacy level.
        assert!(
            lint_on(healthy(), &[("NCCL_P2P_LEVEL", "9")])
                .summary
                .contains("as SYS")
        );
        let f = lint_on(healthy(), &[("NCCL_P2P_LEVEL", "nvl")]);
        assert!(f.summary.contains("case-sensitive: NVL"), "{}", f.summary);
        assert_eq!(
            lint_on(healthy(), &[("NCCL_NET_GDR_LEVEL", "PHB")]).status(),
            Status::Pass
        );
    }

    #[test]
    fn algo_names_forced_and_unavailable() {
        let f = lint_on(healthy(), &[("NCCL_ALGO", "Ring")]);
        assert_eq!(f.status(), Status::Warn);
        assert!(
            f.summary.contains("overrides NCCL's tuner"),
            "{}",
            f.summary
        );
        assert_eq!(
            lint_on(healthy(), &[("NCCL_ALGO", "^NVLS")]).status(),
            Status::Pass
        );
        // 2.28.9 rejects an unknown name at init; 2.21 skips it (and has no PAT).
        let f = lint_on(healthy(), &[("NCCL_ALGO", "Rng")]);
        assert_eq!(f.status(), Status::Fail);
        assert!(f.summary.contains("Unrecognized element token"));
        let f = lint_on(with_version(healthy(), "2.21.5"), &[("NCCL_ALGO", "PAT")]);
        assert_eq!(f.status(), Status::Pass, "2.21 skips it: a note");
        assert!(
            f.summary
                .contains("names PAT that NCCL 2.21.5 does not have"),
            "{}",
            f.summary
        );
        // NVLS forced off an NVSwitch fabric: every collective fails.
        let mut pcie = healthy();
        if let crate::facts::gpu::LibraryState::Loaded(n) = &mut pcie.gpus.nvml.state {
            for g in &mut n.gpus {
                g.fabric_state = Observed::Value(crate::facts::gpu::FabricState::NotSupported);
            }
        }
        let f = lint_on(pcie, &[("NCCL_ALGO", "NVLS")]);
        assert_eq!(f.status(), Status::Fail, "{f:?}");
        assert!(f.summary.contains("no algorithm/protocol available"));
        assert_eq!(
            lint_on(healthy(), &[("NCCL_ALGO", "NVLS")]).status(),
            Status::Warn
        );
        assert_eq!(
            lint_on(healthy(), &[("NCCL_ALGO", "CollNetDirect")]).status(),
            Status::Fail
        );
        let f = lint_on(
            healthy(),
            &[("NCCL_ALGO", "NVLS"), ("NCCL_NVLS_ENABLE", "0")],
        );
        assert_eq!(f.status(), Status::Fail);
        assert!(f.summary.contains("NCCL_NVLS_ENABLE=0"), "{}", f.summary);
        let one_node = [("NCCL_ALGO", "NVLSTree"), ("PET_NNODES", "1")];
        let f = lint_on(healthy(), &one_node);
        assert_eq!(f.status(), Status::Fail);
        assert!(
            f.summary.contains("disables on a single node"),
            "{}",
            f.summary
        );
        let f = lint_on(with_version(healthy(), "2.23.4"), &one_node);
        assert_eq!(f.status(), Status::Warn, "2.21 to 2.23 not verified: warn");
        assert!(f.summary.contains("NCCL >= 2.24 fails"), "{}", f.summary);
        let f = lint_on(healthy(), &[("NCCL_ALGO", "NVLS"), ("PET_NNODES", "4")]);
        assert_eq!(f.status(), Status::Fail);
        assert!(f.summary.contains("across nodes"), "{}", f.summary);
        let with_collnet = [
            ("NCCL_ALGO", "NVLS"),
            ("PET_NNODES", "4"),
            ("NCCL_COLLNET_ENABLE", "1"),
        ];
        assert!(
            lint_on(healthy(), &with_collnet)
                .summary
                .contains("overrides NCCL's tuner")
        );
        // NCCL <= 2.20 put Ring and Tree back ("ignoring NCCL_ALGO=COLLNET").
        let f = lint_on(
            with_version(healthy(), "2.19.3"),
            &[("NCCL_ALGO", "CollNetDirect")],
        );
        assert_eq!(f.status(), Status::Pass, "a note: {f:?}");
        assert!(
            f.summary.contains("NCCL 2.19.3 ignores the setting"),
            "{}",
            f.summary
        );
        assert_eq!(
            lint_on(healthy(), &[("NCCL_PROTO", "LL,Simple")]).status(),
            Status::Pass
        );
        assert_eq!(
            lint_on(healthy(), &[("NCCL_PROTO", "LL129")]).status(),
            Status::Fail
        );
    }

    #[test]
    fn rdma_asked_for_without_a_device() {
        // NCCL_NET=IB with no IB device: no network initializes, and NCCL fails at init
        // even on one node (src/plugin/net.cc ncclNetInit, "Failed to initialize any NET
        // plugin", v2.28.9).
        let f = lint_on(healthy(), &[("NCCL_NET", "IB")]);
        assert_eq!(f.status(), Status::Fail, "{f:?}");
        assert!(f.summary.contains("fails at init"), "{}", f.summary);
        for pair in [
            ("NCCL_IB_HCA", "=mlx5_1"),
            ("NCCL_NET_PLUGIN", "ofi"),
            ("FI_PROVIDER", "efa"),
            ("OFI_NCCL_PROTOCOL", "RDMA"),
        ] {
            let f = lint_on(healthy(), &[pair]);
            assert_eq!(f.status(), Status::Warn, "{pair:?}: {f:?}");
            assert!(
                f.summary.contains("this container has no RDMA device"),
                "{}",
                f.summary
            );
            // Across nodes: TCP, a degraded run (issue 36).
            let f = lint_on(healthy(), &[pair, ("PET_NNODES", "2")]);
            assert_eq!(f.status(), Status::Warn, "{pair:?}");
        }
        let f = lint_on(
            healthy(),
            &[("NCCL_IB_HCA", "=mlx5_1"), ("PET_NNODES", "2")],
        );
        let fix = f.remediation().unwrap();
        assert!(fix.contains("k8s.v1.cni.cncf.io/networks"), "{fix}");
        assert!(fix.contains("rdma/rdma_shared_device_a"), "{fix}");
        let mut p5 = healthy();
        p5.platform.product_name = Observed::Value(Some("p5.48xlarge".into()));
        let f = lint_on(p5, &[("FI_PROVIDER", "efa"), ("PET_NNODES", "2")]);
        assert!(
            f.remediation()
                .unwrap()
                .contains("vpc.amazonaws.com/efa: 32")
        );
        // In sysfs but no /dev/infiniband node in the container.
        let mut hidden = ib_node();
        hidden.rdma.uverbs = Observed::Value(vec![]);
        let f = lint_on(hidden, &[("NCCL_IB_HCA", "=mlx5_1")]);
        assert!(
            f.summary.contains("none has a /dev/infiniband/uverbs node"),
            "{}",
            f.summary
        );
        assert_eq!(
            lint_on(ib_node(), &[("NCCL_NET", "IB")]).status(),
            Status::Pass
        );
        assert_eq!(
            lint_on(healthy(), &[("NCCL_IB_HCA", "^mlx5_1")]).status(),
            Status::Pass
        );
    }

    #[test]
    fn ifname_prefix_matching_a_bridge_too() {
        let mut node = docker_node();
        if let (Observed::Value(i), Observed::Value(a)) =
            (&mut node.network.interfaces, &mut node.network.addresses)
        {
            i.push(iface("eth1", Some("bridge")));
            a.push(v4("eth1", "192.168.0.1"));
        }
        let f = judge(
            &with_env(node.clone(), &[("NCCL_SOCKET_IFNAME", "eth")]),
            &Policy::default(),
        );
        assert_eq!(f.status(), Status::Warn);
        assert!(
            f.summary.contains("matches 2 interfaces (eth0, eth1)"),
            "{}",
            f.summary
        );
        assert!(
            f.remediation()
                .unwrap()
                .starts_with("NCCL_SOCKET_IFNAME='=eth0'")
        );
        let f = judge(
            &with_env(node, &[("NCCL_SOCKET_IFNAME", "=eth0")]),
            &Policy::default(),
        );
        assert_eq!(f.status(), Status::Pass);
    }

    #[test]
    fn ifname_net1_absent_points_at_multus_not_eth0() {
        let f = lint(&[("NCCL_SOCKET_IFNAME", "net1")]);
        assert_eq!(f.status(), Status::Fail);
        let fix = f.remediation().unwrap();
        assert!(fix.contains("k8s.v1.cni.cncf.io/networks"), "{fix}");
        assert!(fix.contains("NetworkAttachmentDefinition"), "{fix}");
        assert!(!fix.contains("NCCL_SOCKET_IFNAME='=eth0'"), "{fix}");
    }

    #[test]
    fn misspelled_net_plugin_names_the_variable() {
        use crate::facts::rdma::LoadAttempt;
        let mut f = with_env(efa_node(), &[("NCCL_NET_PLUGIN", "aws_ofi")]);
        f.rdma.nccl.net_plugin = Observed::Value(None);
        f.rdma.nccl.net_plugin_attempts = vec![LoadAttempt {
            library: "libnccl-net-aws_ofi.so".into(),
            error: Some("libnccl-net-aws_ofi.so: cannot open shared object file".into()),
        }];
        let finding = judge(&f, &Policy::default());
        assert!(
            finding
                .summary
                .contains("NCCL tries aws_ofi then libnccl-net-aws_ofi.so"),
            "{}",
            finding.summary
        );
        assert!(
            finding
                .remediation()
                .unwrap()
                .starts_with("Fix NCCL_NET_PLUGIN")
        );
        let plugin =
            crate::test_facts::judged(crate::judge::nccl_net_plugin::judge, &f, &Policy::default());
        let fix = plugin.remediation().unwrap();
        assert!(fix.contains("NCCL_NET_PLUGIN=\"aws_ofi\""), "{fix}");
        assert!(!fix.contains("Install aws-ofi-nccl"), "{fix}");
        f.nccl_env.insert(
            "NCCL_NET_PLUGIN".into(),
            crate::facts::EnvValue::text("none"),
        );
        assert!(
            !judge(&f, &Policy::default())
                .summary
                .contains("names no library")
        );
    }
}
