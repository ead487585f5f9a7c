//! predict: what NCCL itself will do on this node, for this job and the NCCL the
//! trainer loads (`facts.rdma.nccl.library`), computed from the facts alone.
//!
//! The checks judge this prediction against the job instead of matching symptoms:
//! one value per node and job, each decision carrying the NCCL source it follows
//! (file and function, and the tags where the behaviour changed). Where NCCL decides
//! without a GPU (the bootstrap interface, the interfaces NET/Socket uses, the net
//! plugin) the rules live in `crate::nccl` and are proven against real NCCL in the
//! tests; everything else here is derived from NVIDIA/nccl's source, table-driven per
//! version (docs/checks.md: "What NCCL will do").
//!
//! With no libnccl found the newest behaviour is assumed and said so.

mod features;
mod gdr;
mod ib;
mod intra;
mod network;
mod socket;

pub use features::{Feature, ShmNeed};
pub use gdr::{GdrPair, net_gdr_level};
pub use ib::IbPrediction;
pub use intra::PairTransport;
pub use network::{InterNode, NetKind, no_network_error};
pub use socket::SocketInterfaces;

use crate::facts::Facts;
use crate::nccl::Version;
use serde::{Deserialize, Serialize};

/// The schema string of the `nccl` object; bumped when a field changes meaning.
const PREDICTION_SCHEMA: &str = "nccl-preflight/nccl-prediction/v1";

/// One decision NCCL makes, why, and the source it follows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision<T> {
    pub value: T,
    /// Why NCCL decides so on this node, in words.
    pub why: String,
    /// The NVIDIA/nccl source the decision follows: file, function, tags.
    pub source: String,
}

impl<T> Decision<T> {
    fn new(value: T, why: impl Into<String>, source: &str) -> Self {
        Decision {
            value,
            why: why.into(),
            source: source.to_string(),
        }
    }
}

/// What NCCL will do here, field by field.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Prediction {
    /// Always [`PREDICTION_SCHEMA`].
    pub schema: String,
    /// The libnccl version predicted for (`2.28.9`); `None`: none found, the newest
    /// behaviour is assumed.
    pub nccl_version: Option<Version>,
    /// The interface bootstrap binds and the interfaces NET/Socket drives.
    pub sockets: Decision<SocketInterfaces>,
    /// The IB/RoCE devices and ports NCCL's IB transport uses, with their GID, and
    /// those it skips.
    pub ib: Decision<IbPrediction>,
    /// The net plugin that would load, with its API version.
    pub net_plugin: Decision<Option<String>>,
    /// The transport between nodes and, when it is TCP, why.
    pub inter_node: Decision<InterNode>,
    /// For each GPU, the NIC NCCL reaches it with and whether GPUDirect RDMA is used.
    pub gdr: Vec<GdrPair>,
    /// The transport for each GPU pair of this node.
    pub intra_node: Vec<PairTransport>,
    /// What the SHM transport needs from /dev/shm.
    pub shm: Decision<ShmNeed>,
    /// NVLink SHARP.
    pub nvls: Decision<Feature>,
    /// Multi-node NVLink.
    pub mnnvl: Decision<Feature>,
}

/// The rank of one of NCCL's path types (LOC < NVL < ... < PIX < PXB < ... < PHB < SYS);
/// nvidia-smi's NODE counts as PHB.
pub fn path_rank(name: &str) -> usize {
    gdr::rank(name)
}

/// The variable's value as NCCL's getenv sees it.
pub(crate) fn env<'a>(facts: &'a Facts, name: &str) -> Option<&'a str> {
    facts.nccl_env.get(name).map(|v| v.value.as_str())
}

/// NCCL's integer parameters (src/misc/param.cc ncclLoadParam: strtoll, base 0): the
/// value when set and numeric.
pub(crate) fn int_param(facts: &Facts, name: &str) -> Option<i64> {
    let raw = env(facts, name)?.trim();
    if let Some(hex) = raw.strip_prefix("0x") {
        return i64::from_str_radix(hex, 16).ok();
    }
    raw.parse().ok()
}

/// The whole prediction.
pub fn predict(facts: &Facts) -> Prediction {
    let version = crate::nccl::version(facts);
    let sockets = socket::predict(facts, version);
    let ib = ib::predict(facts, version, !sockets.value.interfaces.is_empty());
    let net_plugin = network::plugin(facts);
    let inter_node = network::inter_node(facts, &ib.value, net_plugin.value.is_some());
    let nics = network::nics_in_use(facts, &inter_node.value, &ib.value);
    let gdr = gdr::predict(facts, version, &nics);
    let intra_node = intra::predict(facts, version);
    let shm = features::shm(facts, version, &intra_node);
    Prediction {
        schema: PREDICTION_SCHEMA.to_string(),
        nccl_version: version,
        sockets,
        ib,
        net_plugin,
        inter_node,
        gdr,
        intra_node,
        shm,
        nvls: features::nvls(facts, version),
        mnnvl: features::mnnvl(facts, version),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_facts;

    #[test]
    fn parameters() {
        let f = test_facts::with_env(
            test_facts::healthy(),
            &[("NCCL_IB_DISABLE", " 1"), ("NCCL_NET_GDR_LEVEL", "0x2")],
        );
        assert_eq!(int_param(&f, "NCCL_IB_DISABLE"), Some(1));
        assert_eq!(int_param(&f, "NCCL_NET_GDR_LEVEL"), Some(2));
        assert_eq!(int_param(&f, "NCCL_P2P_LEVEL"), None);
    }

    /// Issue 36: a version written with its build (`2.18.5+cuda12.2`, as libnccl's banner
    /// and some facts write it) is that release, not "unknown, so the newest".
    #[test]
    fn a_version_with_its_build_predicts_that_release() {
        let mut f = test_facts::healthy();
        if let crate::facts::gpu::LibraryState::Loaded(l) = &mut f.rdma.nccl.library.state {
            l.version = crate::facts::Observed::Value("2.18.5+cuda12.2".into());
        }
        let p = predict(&f);
        assert_eq!(p.nccl_version, Some(Version::new(2, 18, 5)));
        // Before cuMem (2.19) P2P between processes is legacy CUDA IPC.
        assert!(
            p.intra_node
                .iter()
                .all(|t| t.transport.starts_with("P2P/IPC")),
            "{:?}",
            p.intra_node
        );
    }

    #[test]
    fn the_healthy_node_predicts_nvlink_p2p_and_no_network() {
        let p = predict(&test_facts::healthy());
        assert_eq!(p.schema, PREDICTION_SCHEMA);
        assert!(!p.intra_node.is_empty());
        assert!(p.intra_node.iter().all(|t| t.transport.starts_with("P2P")));
        assert_eq!(p.inter_node.value.kind, NetKind::Socket);
        assert!(p.ib.value.used.is_empty());
    }
}
