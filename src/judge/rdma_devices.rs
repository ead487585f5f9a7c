//! `rdma-devices`: the RDMA devices NCCL will use exist, are up, and can be
//! opened from this container. One unopenable verbs device can make
//! libfabric's EFA provider vanish so NCCL falls back to TCP (FACTS.md section
//! 2, ofiwg/libfabric#12708): every device is opened, not just listed.

use super::{Finding, Problem, Status};
use crate::facts::Facts;
use crate::facts::gpu::LibraryState;
use crate::facts::rdma::RdmaDevice;
use crate::policy::Policy;

pub const ID: &str = "rdma-devices";

const REQUEST_EFA: &str = "\
Request the EFA devices in the pod spec (EKS, with the EFA device plugin) and lift memlock:
  resources:
    limits:
      vpc.amazonaws.com/efa: 4        # p4d: 4, p5: 32, p5en: 16
  securityContext:
    capabilities:
      add: [\"IPC_LOCK\"]";

const REQUEST_RDMA: &str = "\
Give the pod the RDMA devices: with the NVIDIA network operator, request its resource
(e.g. rdma/rdma_shared_device_a: 1, or an SR-IOV resource with a Multus network), and add
IPC_LOCK to the container's capabilities.";

const PORT_FIX: &str = "\
Check the link on the node: ibstat / ibv_devinfo -v (physical state, rate), the cable or switch port,
and for InfiniBand that a subnet manager is running (a port stuck in INIT has none).";

pub fn judge(facts: &Facts, policy: &Policy) -> Finding {
    let devices = match facts.rdma.devices.value() {
        Some(d) => d,
        None => {
            let e = facts
                .rdma
                .devices
                .error()
                .map(|e| e.to_string())
                .unwrap_or_default();
            let status = if policy.require.rdma || policy.require.efa {
                Status::Fail
            } else {
                Status::Warn
            };
            return Finding::new(ID, status, "could not read /sys/class/infiniband")
                .evidence(e)
                .remediation(REQUEST_RDMA);
        }
    };
    let platform = crate::platform::of(facts);
    let efa: Vec<&RdmaDevice> = devices.iter().filter(|d| d.is_efa()).collect();
    let mut problems = Vec::new();
    let mut evidence = Vec::new();
    let expected_efa = platform.and_then(|p| p.efa_devices);
    // The instance type's EFA devices matter when the job crosses nodes; a single-node job on
    // NVLink does not need them, so there (or when the launcher does not say) this only warns.
    let multi_node = crate::layout::is_multi_node(&facts.launcher);
    let platform_status = if multi_node {
        Status::Fail
    } else {
        Status::Warn
    };
    if devices.is_empty() {
        let required = policy.require.rdma || policy.require.efa;
        if !required && expected_efa.is_none() {
            return Finding::new(ID, Status::Skip, "no RDMA devices on this node");
        }
        let fix = if policy.require.efa || expected_efa.is_some() {
            REQUEST_EFA
        } else {
            REQUEST_RDMA
        };
        let (status, why) = match expected_efa {
            Some(n) if !required => (
                platform_status,
                format!(" (this instance type has {n} EFA devices)"),
            ),
            _ => (Status::Fail, String::new()),
        };
        return Finding::new(
            ID,
            status,
            format!("no RDMA devices{why}: NCCL between nodes will use TCP sockets"),
        )
        .remediation(fix);
    }
    if let Some(n) = expected_efa
        && (efa.len() as u32) < n
    {
        problems.push(Problem::new(
            platform_status,
            format!("{} EFA device(s) on a node that has {n}", efa.len()),
            REQUEST_EFA,
        ));
    }
    if policy.require.efa && efa.is_empty() {
        problems.push(Problem::new(
            Status::Fail,
            "--require efa: no EFA device".to_string(),
            REQUEST_EFA,
        ));
    }
    let uverbs = facts.rdma.uverbs.value().cloned().unwrap_or_default();
    let mut usable = 0;
    for d in devices {
        let node = uverbs.iter().find(|u| u.ibdev.as_deref() == Some(&d.name));
        let ports: Vec<String> = d
            .ports
            .iter()
            .map(|p| {
                format!(
                    "port {} {} {}",
                    p.port,
                    p.state.as_deref().unwrap_or("?"),
                    p.link_layer.as_deref().unwrap_or("?")
                )
            })
            .collect();
        evidence.push(format!(
            "{} ({}, {}): {}{}",
            d.name,
            d.driver.as_deref().unwrap_or("?"),
            d.pci_bus_id.as_deref().unwrap_or("?"),
            ports.join(", "),
            match node.and_then(|n| n.open.as_ref()) {
                Some(o) if o.refused.is_none() => format!(
                    "; /dev/infiniband/{} opens",
                    node.map_or("?", |n| n.name.as_str())
                ),
                Some(o) => format!(
                    "; /dev/infiniband/{} refused: {}",
                    node.map_or("?", |n| n.name.as_str()),
                    o.refused.as_deref().unwrap_or("")
                ),
                None => "; no device node in this container".into(),
            }
        ));
        for e in &d.unreadable {
            evidence.push(format!("unreadable: {e}"));
        }
        match node.and_then(|n| n.open.as_ref()) {
            Some(o) if o.refused.is_some() => problems.push(Problem::new(
                Status::Fail,
                format!(
                    "{}: /dev/infiniband/{} exists but cannot be opened ({}): libfabric's EFA provider and NCCL can lose every device over one",
                    d.name,
                    node.map_or("?", |n| n.name.as_str()),
                    o.refused.as_deref().unwrap_or("")
                ),
                "Give the container access to the device (the device plugin's resource, or a device cgroup rule) or remove the node from /dev/infiniband in the pod.",
            )),
            Some(_) => usable += 1,
            None => {}
        }
        let down: Vec<String> = d
            .ports
            .iter()
            .filter(|p| p.state.as_deref() != Some("ACTIVE"))
            .map(|p| {
                format!(
                    "port {} {} ({})",
                    p.port,
                    p.state.as_deref().unwrap_or("?"),
                    p.phys_state.as_deref().unwrap_or("?")
                )
            })
            .collect();
        if !down.is_empty() && node.is_some() {
            problems.push(Problem::new(
                Status::Fail,
                format!("{}: {}", d.name, down.join(", ")),
                PORT_FIX,
            ));
        }
    }
    if (policy.require.rdma || policy.require.efa) && usable == 0 {
        problems.push(Problem::new(
            Status::Fail,
            "no RDMA device can be opened from this container".to_string(),
            if efa.is_empty() {
                REQUEST_RDMA
            } else {
                REQUEST_EFA
            },
        ));
    }
    match &facts.rdma.verbs.state {
        LibraryState::NotFound { message } if usable > 0 => problems.push(Problem {
            status: Status::Fail,
            summary: format!("{usable} RDMA device(s) but no libibverbs in this image: NCCL cannot use them"),
            evidence: vec![message.clone()],
            remediation: "Install rdma-core's libibverbs1 and the providers (ibverbs-providers; on EFA the EFA installer) in the image.".into(),
        }),
        LibraryState::Failed(e) if usable > 0 => {
            problems.push(Problem::new(Status::Fail, format!("libibverbs failed: {e}"), "Reinstall rdma-core in the image; its providers must match the library."))
        }
        LibraryState::Loaded(v) => match &v.devices {
            crate::facts::Observed::Error(e) if usable > 0 => problems.push(Problem::new(
                Status::Fail,
                format!("libibverbs lists no device: {e}"),
                "The container needs the uverbs device nodes and sysfs entries; check the device plugin.",
            )),
            crate::facts::Observed::Value(list) => {
                for d in list {
                    if let Some(e) = d.open.error() {
                        problems.push(Problem::new(Status::Fail, format!("{}: {e}", d.name), "Check the device's permissions and the provider library for its driver (ibverbs-providers)."));
                    }
                }
            }
            _ => {}
        },
        _ => {}
    }
    let summary = format!(
        "{} RDMA device(s){}, {usable} usable from this container, ports up",
        devices.len(),
        if efa.is_empty() {
            String::new()
        } else {
            format!(" ({} EFA)", efa.len())
        }
    );
    super::combine(ID, summary, evidence, problems)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::Observed;
    use crate::facts::rdma::Openable;
    use crate::judge::test_facts::{healthy, rdma_device, with_rdma};
    use crate::policy;

    fn efa_node(n: usize) -> Facts {
        let mut f = crate::judge::test_facts::with_env(healthy(), &[("PET_NNODES", "4")]);
        f = with_rdma(
            f,
            (0..n)
                .map(|i| {
                    rdma_device(
                        &format!("rdmap{i}s27"),
                        "efa",
                        "0000:10:1b.0",
                        "/sys/devices/x",
                        "ACTIVE",
                        "Unspecified",
                    )
                })
                .collect(),
        );
        f.platform.product_name = Observed::Value(Some("p4d.24xlarge".into()));
        f
    }

    #[test]
    fn platform_count_ports_and_device_nodes() {
        assert_eq!(judge(&efa_node(4), &Policy::default()).status, Status::Pass);
        let f = judge(&efa_node(3), &Policy::default());
        assert_eq!(f.status, Status::Fail);
        assert!(
            f.summary.contains("3 EFA device(s) on a node that has 4"),
            "{}",
            f.summary
        );
        let mut down = efa_node(4);
        if let Observed::Value(d) = &mut down.rdma.devices {
            d[2].ports[0].state = Some("DOWN".into());
        }
        assert!(
            judge(&down, &Policy::default())
                .summary
                .contains("rdmap2s27: port 1 DOWN")
        );
        let mut locked = efa_node(4);
        if let Observed::Value(u) = &mut locked.rdma.uverbs {
            u[1].open = Some(Openable {
                refused: Some("Permission denied (os error 13)".into()),
            });
        }
        let f = judge(&locked, &Policy::default());
        assert_eq!(f.status, Status::Fail);
        assert!(f.summary.contains("cannot be opened"), "{}", f.summary);
    }

    #[test]
    fn requirements_and_missing_library() {
        let none = healthy();
        assert_eq!(judge(&none, &Policy::default()).status, Status::Skip);
        let need = policy::build(&[], &["rdma".into()], None, None).unwrap();
        assert_eq!(judge(&none, &need).status, Status::Fail);
        let mut p4d = healthy();
        p4d.platform.product_name = Observed::Value(Some("p4d.24xlarge".into()));
        let f = judge(&p4d, &Policy::default());
        assert!(
            f.summary.contains("this instance type has 4 EFA devices"),
            "{}",
            f.summary
        );
        let mut nolib = efa_node(4);
        nolib.rdma.verbs.state = LibraryState::NotFound {
            message: "libibverbs.so.1: cannot open".into(),
        };
        assert!(
            judge(&nolib, &Policy::default())
                .summary
                .contains("no libibverbs")
        );
    }
}
