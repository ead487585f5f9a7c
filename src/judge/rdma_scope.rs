//! What RDMA means for this job and this container, shared by every RDMA check
//! so they agree: which of the node's devices this container can use, how many
//! the pod's GPUs need, whether the job crosses nodes, and whether the image is
//! the trainer's.
//!
//! - sysfs is not namespaced: /sys/class/infiniband lists every device of the
//!   node. A device is usable from this container only when its
//!   /dev/infiniband/uverbs node is there and opens (the device plugin adds the
//!   nodes of the devices the pod requested).
//! - A single-node job never sends NCCL traffic over EFA or InfiniBand (NVLink,
//!   PCIe and shared memory carry it), so there RDMA problems warn at most; a
//!   multi-node job runs at the network's speed, so there they fail.
//! - Could not read is never absent: an unreadable /sys/class/infiniband or
//!   /sys/class/infiniband_verbs is "could not determine", with the path.

use crate::facts::rdma::RdmaDevice;
use crate::facts::{FactError, Facts, ImageRole, Observed};
use crate::finding::Outcome;
use crate::layout::Span;

/// The RDMA picture of this container.
pub struct Scope<'a> {
    pub span: Span,
    /// nccl-preflight's own image: the RDMA and NCCL libraries here are not the trainer's.
    pub own_image: bool,
    /// The node's devices; `Err` when /sys/class/infiniband could not be read.
    pub devices: Result<&'a [RdmaDevice], &'a FactError>,
    /// Why the device nodes could not be matched to devices (/sys/class/infiniband_verbs unreadable).
    pub nodes_unknown: Option<&'a FactError>,
    /// Devices whose device node is in this container and opens.
    pub usable: Vec<&'a RdmaDevice>,
    /// Device nodes in this container that refuse to open (the pod got them, something blocks them).
    pub refused_nodes: usize,
}

/// How many RDMA NICs the pod's GPUs need, and why that many.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NicNeed {
    pub count: u32,
    /// EFA devices (the instance type's table) rather than any RDMA device.
    pub efa: bool,
    /// One line: where the number comes from.
    pub basis: String,
}

impl<'a> Scope<'a> {
    pub fn of(facts: &'a Facts) -> Scope<'a> {
        let devices = match &facts.rdma.devices {
            Observed::Value(d) => Ok(d.as_slice()),
            Observed::Error(e) => Err(e),
        };
        let (nodes, nodes_unknown) = match &facts.rdma.uverbs {
            Observed::Value(n) => (n.as_slice(), None),
            Observed::Error(e) => (&[][..], Some(e)),
        };
        let usable = devices
            .map(|d| {
                d.iter()
                    .filter(|d| {
                        nodes.iter().any(|n| {
                            n.ibdev.as_deref() == Some(d.name.as_str())
                                && n.open.as_ref().is_some_and(|o| o.refused.is_none())
                        })
                    })
                    .collect()
            })
            .unwrap_or_default();
        let refused_nodes = nodes
            .iter()
            .filter(|n| n.open.as_ref().is_some_and(|o| o.refused.is_some()))
            .count();
        Scope {
            refused_nodes,
            span: crate::layout::span(facts),
            own_image: facts.image == ImageRole::Own,
            devices,
            nodes_unknown,
            usable,
        }
    }

    /// The node's devices, or none when they could not be read.
    pub fn node_devices(&self) -> &'a [RdmaDevice] {
        self.devices.unwrap_or(&[])
    }

    /// Usable EFA devices.
    pub fn usable_efa(&self) -> usize {
        self.usable.iter().filter(|d| d.is_efa()).count()
    }

    /// True when this container will carry NCCL traffic over RDMA if the job crosses
    /// nodes: it can open a device, or could not tell and the node has devices.
    pub fn in_use(&self) -> bool {
        !self.usable.is_empty() || (self.nodes_unknown.is_some() && !self.node_devices().is_empty())
    }

    /// What a problem with RDMA this container uses does: `across`, where NCCL's traffic
    /// crosses nodes (a pod that holds RDMA devices and whose span nothing states is taken
    /// to cross them: that is what it requested them for; `--require` asking for RDMA
    /// counts too); nothing on one node, where NCCL never touches the network.
    pub fn in_use_outcome(&self, required: bool, across: Outcome) -> Outcome {
        match (self.span, required) {
            (Span::Single, false) => Outcome::Unaffected,
            _ => across,
        }
    }

    /// What leaves NCCL without the RDMA this container has (no library, no plugin) does:
    /// a job that cannot start where `--require` asks for RDMA, else as
    /// [`Scope::in_use_outcome`].
    pub fn unusable_outcome(&self, required: bool, across: Outcome) -> Outcome {
        if required {
            super::unmet("--require rdma/efa")
        } else {
            self.in_use_outcome(false, across)
        }
    }

    /// What RDMA this pod lacks (no device, or fewer than its GPUs need) does: `across`
    /// where the job crosses nodes; could not determine where nothing states its span;
    /// nothing on one node; a job that cannot start where `--require` asks for RDMA.
    pub fn missing_outcome(&self, required: bool, across: Outcome) -> Outcome {
        match (self.span, required) {
            (_, true) => super::unmet("--require rdma/efa"),
            (Span::Multi(_), false) => across,
            (Span::Unknown, false) => Outcome::undetermined(format!(
                "whether the job spans nodes (the launcher does not say); across nodes: {}",
                across.describe()
            )),
            (Span::Single, false) => Outcome::Unaffected,
        }
    }

    /// The outcome of inter-node traffic on TCP where RDMA (`what`: EFA, IB) was meant to
    /// carry it: NCCL falls back to NET/Socket (src/net.cc ncclNetInit: plugin, then IB,
    /// then Socket) and runs, at TCP's rate.
    pub fn tcp_instead(what: &str) -> Outcome {
        Outcome::degraded(
            format!("NET/Socket (TCP) between nodes instead of {what}"),
            "all-reduce at TCP's rate (3.3-3.7 GB/s busbw measured over NET/Socket, FACTS.md section 1), a small fraction of the NICs' RDMA bandwidth",
        )
    }

    /// Words for the job's span, for summaries: why a problem fails or only warns.
    pub fn span_words(&self) -> String {
        match self.span {
            Span::Single => "the job runs on one node, where NCCL does not use RDMA".into(),
            Span::Multi(n) => format!("the job spans {n} nodes"),
            Span::Unknown => "nothing says the job spans nodes (set --nodes N, or the launcher's PET_NNODES, to make this a failure for multi-node jobs)".into(),
        }
    }
}

/// How many RDMA NICs the GPUs this container sees need for NCCL to reach the
/// node's network bandwidth: on an instance type of the table, its EFA devices
/// shared out per GPU (p5: 32 for 8 GPUs, so 4 a GPU); elsewhere, every NIC of the
/// node that shares a PCIe switch (PIX/PXB) with one of these GPUs, as NCCL pairs
/// each GPU with its closest NIC. `None` when nothing says.
pub fn nic_need(facts: &Facts) -> Option<NicNeed> {
    let nvml = facts.gpus.nvml.loaded()?;
    let pod_gpus = nvml.gpus.len() as u32;
    if pod_gpus == 0 {
        return None;
    }
    if let Some(platform) = crate::platform::of(facts)
        && let Some(efa) = platform.efa_devices
    {
        let count = (u64::from(efa) * u64::from(pod_gpus)).div_ceil(u64::from(platform.gpus));
        return Some(NicNeed {
            count: count as u32,
            efa: true,
            basis: format!(
                "{}: {efa} EFA devices for {} GPUs; this pod has {pod_gpus} GPU(s)",
                platform.names[0], platform.gpus
            ),
        });
    }
    let node_gpus = facts.gpus.pci_gpus.value()?;
    let nics = facts.rdma.devices.value()?;
    let pod_paths: Vec<(&str, Option<u32>)> = nvml
        .gpus
        .iter()
        .filter_map(|g| g.pci_bus_id.value())
        .map(|b| crate::facts::gpu::normalize_bus_id(b))
        .filter_map(|bus| node_gpus.iter().find(|p| p.bus_id == bus))
        .filter_map(|p| p.sysfs_path.as_deref().map(|s| (s, p.numa_node)))
        .collect();
    let close: Vec<&RdmaDevice> = nics
        .iter()
        .filter(|n| {
            n.sysfs_path.as_deref().is_some_and(|nic| {
                pod_paths.iter().any(|(gpu, numa)| {
                    crate::topology::affinity::gdr_close(crate::topology::affinity::level(
                        gpu,
                        nic,
                        *numa,
                        n.numa_node,
                    ))
                })
            })
        })
        .collect();
    if close.is_empty() {
        return None;
    }
    Some(NicNeed {
        count: close.len() as u32,
        efa: false,
        basis: format!(
            "{} RDMA NIC(s) of the node share a PCIe switch with this pod's {pod_gpus} GPU(s): {}",
            close.len(),
            close
                .iter()
                .map(|d| d.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_facts::{healthy, rdma_device, with_env, with_rdma};

    #[test]
    fn usable_means_a_device_node_that_opens() {
        let mut f = with_rdma(
            healthy(),
            vec![
                rdma_device(
                    "mlx5_0",
                    "mlx5_core",
                    "0000:17:00.0",
                    "/x",
                    "ACTIVE",
                    "Ethernet",
                ),
                rdma_device(
                    "mlx5_1",
                    "mlx5_core",
                    "0000:18:00.0",
                    "/y",
                    "ACTIVE",
                    "Ethernet",
                ),
            ],
        );
        if let Observed::Value(nodes) = &mut f.rdma.uverbs {
            nodes.truncate(1);
        }
        let s = Scope::of(&f);
        assert_eq!(s.usable.len(), 1);
        assert!(s.in_use());
        f.rdma.uverbs = Observed::Error(FactError::new(
            "/sys/class/infiniband_verbs",
            "Permission denied",
        ));
        let s = Scope::of(&f);
        assert!(
            s.usable.is_empty() && s.in_use(),
            "unreadable is not absent"
        );
    }

    #[test]
    fn span_decides_the_outcome() {
        use crate::finding::Severity;
        let one = with_env(healthy(), &[("PET_NNODES", "1")]);
        let many = with_env(healthy(), &[("PET_NNODES", "4")]);
        let unknown = healthy();
        let fails = || Outcome::init_fails("x");
        let tcp = || Outcome::degraded("NET/Socket", "slow");
        let sev = |o: Outcome| o.severity();
        assert_eq!(sev(Scope::of(&one).in_use_outcome(false, fails())), None);
        assert_eq!(Scope::of(&one).in_use_outcome(true, tcp()), tcp());
        assert_eq!(
            sev(Scope::of(&one).unusable_outcome(true, tcp())),
            Some(Severity::Fail)
        );
        assert_eq!(Scope::of(&unknown).in_use_outcome(false, fails()), fails());
        assert_eq!(
            sev(Scope::of(&unknown).missing_outcome(false, fails())),
            Some(Severity::Warn)
        );
        assert_eq!(Scope::of(&many).missing_outcome(false, tcp()), tcp());
        assert_eq!(sev(Scope::of(&one).missing_outcome(false, fails())), None);
    }
}
