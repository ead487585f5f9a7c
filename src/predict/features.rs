//! What NCCL needs from /dev/shm, and whether NVLS and multi-node NVLink are used or
//! fail init, per version.

use super::intra::PairTransport;
use super::{Decision, env, int_param};
use crate::facts::Facts;
use crate::facts::gpu::FabricState;
use crate::nccl::Version;
use crate::nccl::version::{self, since};
use serde::{Deserialize, Serialize};

/// src/include/device.h: LL = NCCL_LL_LINES_PER_THREAD (8) x NCCL_LL_MAX_NTHREADS (512) x
/// NCCL_STEPS (8) x 16 bytes; LL128 = 120 x 640 x 8 x 8 bytes; Simple = NCCL_BUFFSIZE.
const LL_BYTES: u64 = 8 * 512 * 8 * 16;
const LL128_BYTES: u64 = 120 * 640 * 8 * 8;
const SIMPLE_BYTES: u64 = 4 << 20;

/// What the SHM transport needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShmNeed {
    /// Some GPU pair of this node uses SHM.
    pub used: bool,
    /// Its buffers are files in /dev/shm (else cuMem host memory).
    pub in_dev_shm: bool,
    /// Bytes of buffers per SHM connection (one per channel and peer direction):
    /// init.cc computeBuffSizes, LL + LL128 + Simple.
    pub bytes_per_connection: u64,
}

/// A feature NCCL may try.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Feature {
    Enabled,
    Disabled,
    /// NCCL's init fails trying it.
    FailsInit,
    /// The facts cannot tell (CUDA multicast support is not gathered).
    Unknown,
}

pub(super) fn shm(
    facts: &Facts,
    version: Option<Version>,
    pairs: &[PairTransport],
) -> Decision<ShmNeed> {
    let used = pairs.iter().any(|p| p.transport == "SHM");
    let driver = facts
        .gpus
        .nvml
        .loaded()
        .and_then(|n| n.cuda_driver_version.value().copied());
    let cumem_host = match int_param(facts, "NCCL_CUMEM_HOST_ENABLE") {
        Some(v) => {
            since(version, version::CUMEM_HOST_VARIABLE)
                && v != 0
                && driver.is_none_or(|d| d >= 12020)
        }
        None => since(version, version::CUMEM_HOST) && driver.is_none_or(|d| d >= 12060),
    };
    let simple = int_param(facts, "NCCL_BUFFSIZE")
        .and_then(|b| u64::try_from(b).ok())
        .unwrap_or(SIMPLE_BYTES);
    let why = match (used, cumem_host) {
        (false, _) => "no GPU pair of this node uses SHM".to_string(),
        (true, true) => "SHM buffers in cuMem host memory (NCCL >= 2.24 on a CUDA 12.6+ driver), not /dev/shm".to_string(),
        (true, false) => "SHM buffers are /dev/shm files (NCCL < 2.24, NCCL_CUMEM_HOST_ENABLE=0, or a driver before CUDA 12.6)".to_string(),
    };
    Decision::new(
        ShmNeed {
            used,
            in_dev_shm: used && !cumem_host,
            bytes_per_connection: LL_BYTES + LL128_BYTES + simple,
        },
        why,
        "src/transport/shm.cc shmSendSetup/shmRecvSetup, src/misc/cudawrap.cc ncclCuMemHostEnable (v2.24+), src/init.cc computeBuffSizes",
    )
}

/// NVLink SHARP (src/transport/nvls.cc ncclNvlsInit, src/init.cc): off with
/// NCCL_NVLS_ENABLE=0 or one GPU; needs NVSwitches (the NVLS graph finds no channel
/// otherwise, even when forced); forced (=1) where multicast binding fails, init fails,
/// and before 2.27 even the default failed there.
pub(super) fn nvls(facts: &Facts, version: Option<Version>) -> Decision<Feature> {
    const SOURCE: &str = "src/transport/nvls.cc ncclNvlsInit and ncclNvlsGroupCreate (\"Continue without NVLS support\" since v2.27.3), src/init.cc (NVLS graph with no channel drops NVLS)";
    let gpus = facts.gpus.nvml.loaded().map_or(0, |n| n.gpus.len());
    // NVLinks whose far end is an NVSwitch (NVML's remote device type); the PCI listing
    // of NVSwitch functions is not enough, a PCIe node may show a bridge there.
    let switches = facts.gpus.nvml.loaded().is_some_and(|n| {
        n.gpus.iter().any(|g| {
            g.nvlinks
                .iter()
                .any(|l| l.remote_type.value().is_some_and(|t| t == "switch"))
        })
    });
    let (value, why) = match int_param(facts, "NCCL_NVLS_ENABLE") {
        Some(0) => (Feature::Disabled, "NCCL_NVLS_ENABLE=0".to_string()),
        _ if gpus < 2 => (Feature::Disabled, "fewer than two GPUs".to_string()),
        _ if !switches => (Feature::Disabled, "no NVSwitch: the NVLS graph has no channel".to_string()),
        Some(1) => (Feature::Unknown, "forced: init fails if NVSwitch multicast does not bind (fabric manager, /dev/nvidia-caps)".to_string()),
        _ if !since(version, version::NVLS_FALLBACK) => (Feature::Unknown, "on NVSwitches where multicast does not bind, NCCL before 2.27.3 fails init".to_string()),
        _ => (Feature::Unknown, "used when CUDA reports multicast support, dropped otherwise".to_string()),
    };
    Decision::new(value, why, SOURCE)
}

/// Multi-node NVLink, per version (NVIDIA/nccl):
/// - before v2.20.3-1 there is none;
/// - v2.20.3-1 to v2.26.x, src/init.cc checkMNNVL (run when nNodes > 1): needs cuMem
///   (NCCL_CUMEM_ENABLE), CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, every
///   rank's fabric state COMPLETED and a non-zero cluster UUID; an IMEX channel is not
///   checked, so without one MNNVL is enabled and the first FABRIC handle shared fails
///   (cuMemExportToShareableHandle/cuMemImportFromShareableHandle, nccl#1647); forced
///   with NCCL_MNNVL_ENABLE=1 where unsupported: "MNNVL is not supported on this
///   system", init fails;
/// - from v2.27.3-1, src/mnnvl.cc ncclMnnvlCheck (run when nNodes > 1 with
///   NCCL_MNNVL_ENABLE != 0 and P2P not disabled, or when forced): the same
///   conditions, then a trial FABRIC allocation, export and import; where the clique
///   exists but that fails, "MNNVL ... is available but not working on this system.
///   Check the IMEX channel configuration", init fails; forced without a clique goes on
///   without MNNVL.
pub(super) fn mnnvl(facts: &Facts, version: Option<Version>) -> Decision<Feature> {
    const SOURCE: &str = "src/init.cc checkMNNVL (v2.20.3-1 to v2.26), src/mnnvl.cc ncclMnnvlCheck (v2.27.3-1+), NCCL_MNNVL_ENABLE";
    let nvml = facts.gpus.nvml.loaded();
    // "A zero UUID means we don't have MNNVL fabric info - disable MNNVL" (HGX nodes
    // register with the fabric manager but in no cluster).
    let cliques = nvml.map_or(0, |n| {
        n.gpus
            .iter()
            .filter_map(|g| g.fabric_clique.as_ref())
            .filter(|c| {
                c.cluster_uuid
                    .chars()
                    .any(|ch| ch.is_ascii_hexdigit() && ch != '0')
            })
            .count()
    });
    let forced_on = int_param(facts, "NCCL_MNNVL_ENABLE") == Some(1);
    let one_node = crate::layout::span(facts) == crate::layout::Span::Single;
    let completed = nvml.is_some_and(|n| {
        !n.gpus.is_empty()
            && n.gpus
                .iter()
                .all(|g| g.fabric_state.value() == Some(&FabricState::Completed))
    });
    let imex = facts
        .gpus
        .imex_channels
        .value()
        .is_some_and(|c| c.as_ref().is_some_and(|c| !c.is_empty()));
    let forced_off = env(facts, "NCCL_MNNVL_ENABLE").is_some_and(|v| v.trim() == "0");
    let cumem_off = int_param(facts, "NCCL_CUMEM_ENABLE") == Some(0);
    let p2p_off = int_param(facts, "NCCL_P2P_DISABLE").is_some_and(|v| v != 0);
    let trial = since(version, version::MNNVL_TRIAL);
    let off = |why: &str| (Feature::Disabled, why.to_string());
    let (value, why) = if !since(version, version::MNNVL) {
        off("this NCCL predates multi-node NVLink (2.20)")
    } else if forced_off {
        off("NCCL_MNNVL_ENABLE=0")
    } else if one_node && !forced_on {
        off(
            "one node: NCCL checks multi-node NVLink only across nodes, or when NCCL_MNNVL_ENABLE=1",
        )
    } else if trial && p2p_off && !forced_on {
        off("NCCL_P2P_DISABLE: from 2.27 NCCL checks multi-node NVLink only with P2P on")
    } else if !completed || cliques == 0 || cumem_off {
        let why = if cumem_off {
            "NCCL_CUMEM_ENABLE=0: multi-node NVLink requires cuMem"
        } else {
            "no GPU is registered in an NVLink fabric clique"
        };
        if forced_on && !trial {
            (
                Feature::FailsInit,
                format!(
                    "{why}, and NCCL_MNNVL_ENABLE=1: \"MNNVL is not supported on this system\" (NCCL 2.20-2.26)"
                ),
            )
        } else {
            (Feature::Disabled, format!("{why}: NCCL goes on without it"))
        }
    } else if !imex && trial {
        (Feature::FailsInit, "\"MNNVL ... is available but not working on this system. Check the IMEX channel configuration\": no /dev/nvidia-caps-imex-channels in the container".to_string())
    } else if !imex {
        (Feature::FailsInit, "NCCL 2.20-2.26 enables multi-node NVLink without trying a FABRIC handle first; with no /dev/nvidia-caps-imex-channels in the container the first FABRIC handle it shares fails (cuMemExportToShareableHandle / cuMemImportFromShareableHandle), with no IMEX hint in the error".to_string())
    } else {
        (
            Feature::Enabled,
            "fabric registered, clique and IMEX channel present".to_string(),
        )
    };
    Decision::new(value, why, SOURCE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_facts;

    #[test]
    fn shm_lives_in_dev_shm_before_2_24() {
        let f = test_facts::with_env(test_facts::healthy(), &[("NCCL_P2P_DISABLE", "1")]);
        let pairs = super::super::intra::predict(&f, Some(Version::new(2, 23, 4)));
        let old = shm(&f, Some(Version::new(2, 23, 4)), &pairs).value;
        assert!(old.used && old.in_dev_shm);
        assert_eq!(old.bytes_per_connection, 524_288 + 4_915_200 + 4_194_304);
        let new = shm(&f, Some(Version::new(2, 28, 9)), &pairs).value;
        assert!(new.used && !new.in_dev_shm);
        let off = test_facts::with_env(f.clone(), &[("NCCL_CUMEM_HOST_ENABLE", "0")]);
        assert!(
            shm(&off, Some(Version::new(2, 28, 9)), &pairs)
                .value
                .in_dev_shm
        );
    }

    #[test]
    fn mnnvl_follows_the_version() {
        let f = test_facts::healthy();
        // The healthy node has no clique: off whatever the version.
        assert_eq!(
            mnnvl(&f, Some(Version::new(2, 28, 9))).value,
            Feature::Disabled
        );
        let two = test_facts::with_env(f.clone(), &[("PET_NNODES", "2")]);
        assert_eq!(
            mnnvl(&two, Some(Version::new(2, 19, 3))).why,
            "this NCCL predates multi-node NVLink (2.20)"
        );
        assert!(
            mnnvl(&two, Some(Version::new(2, 20, 5)))
                .why
                .contains("no GPU is registered")
        );
        // Forced without a clique: 2.20-2.26 fail init, 2.27+ go on without it.
        let forced = test_facts::with_env(two, &[("NCCL_MNNVL_ENABLE", "1")]);
        assert_eq!(
            mnnvl(&forced, Some(Version::new(2, 21, 5))).value,
            Feature::FailsInit
        );
        assert_eq!(
            mnnvl(&forced, Some(Version::new(2, 28, 9))).value,
            Feature::Disabled
        );
    }

    #[test]
    fn features_off_on_the_healthy_node() {
        let f = test_facts::healthy();
        assert_eq!(mnnvl(&f, None).value, Feature::Disabled);
        let off = test_facts::with_env(f, &[("NCCL_NVLS_ENABLE", "0")]);
        assert_eq!(nvls(&off, None).value, Feature::Disabled);
    }
}
