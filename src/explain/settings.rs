//! Settings NCCL echoed (`NCCL_X set by environment to V`) judged against what
//! the same log shows: the GID index against the link layer, NCCL's version and
//! the GID the failing queue pair used; a disabled transport against the fabric
//! and the communicators; a forced algorithm; a GPUDirect RDMA level that turned
//! GPUDirect RDMA off. FACTS.md section 3 (NCCL's variables).

use super::summary::LogSummary;
use crate::finding::Finding;
use crate::nccl::Version;
use crate::nccl::version::DYNAMIC_GID;

fn values(s: &LogSummary, name: &str) -> Option<String> {
    s.setting(name)
        .map(|v| v.iter().cloned().collect::<Vec<_>>().join(","))
}

fn evidence(s: &LogSummary, name: &str) -> Vec<String> {
    s.setting_examples
        .get(name)
        .map(|e| e.0.clone())
        .unwrap_or_default()
}

/// `local GID index 3` in 2.27's `ibv_modify_qp` WARN (src/misc/ibvwrap.cc).
fn gid_index_used(s: &LogSummary) -> Option<(u64, String)> {
    s.warnings.iter().find_map(|w| {
        let at = w.message.find("local GID index ")? + 16;
        let n: String = w.message[at..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        Some((w.first_line, n))
    })
}

/// NCCL_IB_GID_INDEX: chosen by NCCL itself from 2.21; meaningless on
/// InfiniBand; named by the failing queue pair.
fn gid_index(s: &LogSummary) -> Option<Finding> {
    let set = values(s, "NCCL_IB_GID_INDEX")?;
    let newest = s
        .nccl_versions
        .iter()
        .filter_map(|v| Version::parse(v))
        .max();
    let roce = s.ib_devices.iter().any(|d| d.contains("/RoCE"));
    let ib_only = !s.ib_devices.is_empty() && !roce;
    let mut why = Vec::new();
    if ib_only {
        why.push(
            "the log's devices are InfiniBand ports, where the GID index is not used".to_string(),
        );
    }
    if newest.is_some_and(|v| v >= DYNAMIC_GID) {
        why.push("NCCL >= 2.21 picks the RoCE v2 GID itself (NCCL_IB_ADDR_FAMILY, NCCL_IB_ROCE_VERSION_NUM), and a fixed index fails where nodes' GID tables differ".to_string());
    }
    let used = gid_index_used(s);
    if let Some((line, n)) = &used {
        why.push(format!(
            "the queue pair that failed on line {line} used GID index {n}"
        ));
    }
    if why.is_empty() {
        return None;
    }
    let mut f = Finding::warn(
        "log-setting-gid-index",
        format!("NCCL_IB_GID_INDEX={set}: {}", why.join("; ")),
        "On NCCL >= 2.21 unset NCCL_IB_GID_INDEX; on older NCCL set it to the port's RoCE v2 GID index on every node \
         (`show_gids`, /sys/class/infiniband/<dev>/ports/<n>/gid_attrs/types/*).",
    );
    f.evidence = evidence(s, "NCCL_IB_GID_INDEX");
    f.evidence
        .extend(s.ib_devices.iter().map(|d| format!("NET/IB : Using {d}")));
    Some(f)
}

/// NCCL_ALGO forcing an algorithm (an exclusion `^NVLS` only removes one).
fn algo_forced(s: &LogSummary) -> Option<Finding> {
    let set = values(s, "NCCL_ALGO")?;
    if set.starts_with('^') {
        return None;
    }
    let mut f = Finding::warn(
        "log-algo-forced",
        format!(
            "NCCL_ALGO={set} forces NCCL's algorithm for every size and communicator: a value tuned on one topology is slow on others, and an algorithm a communicator cannot use fails its init"
        ),
        "Unset NCCL_ALGO; to avoid one algorithm only, exclude it (NCCL_ALGO=^NVLS).",
    );
    f.evidence = evidence(s, "NCCL_ALGO");
    Some(f)
}

/// NCCL_SHM_DISABLE=1 where ranks of one node then talk over the network.
fn shm_disabled(s: &LogSummary) -> Option<Finding> {
    if !s
        .setting("NCCL_SHM_DISABLE")
        .is_some_and(|v| v.contains("1"))
        || s.connections("NET") == 0
    {
        return None;
    }
    let one_node = s.communicators.values().any(|c| c.nodes == Some(1));
    if !one_node {
        return None;
    }
    let mut f = Finding::warn(
        "log-shm-disabled",
        "NCCL_SHM_DISABLE=1 and a communicator on one node uses the network: ranks of one machine talk over NET (measured 3.4 GB/s over sockets against 27 GB/s over SHM on 2x H200)",
        "Unset NCCL_SHM_DISABLE (and NCCL_P2P_DISABLE): within a node NCCL uses NVLink/PCIe or shared memory.",
    );
    f.evidence = evidence(s, "NCCL_SHM_DISABLE");
    Some(f)
}

/// NCCL_NET_GDR_LEVEL set while NCCL says it disabled GPUDirect RDMA for a
/// GPU/NIC pair by distance (src/graph/paths.cc: `distance %d > %d`).
fn gdr_level(s: &LogSummary) -> Option<Finding> {
    let set = values(s, "NCCL_NET_GDR_LEVEL")?;
    let by_distance: Vec<String> = s
        .notable_info
        .iter()
        .filter(|n| {
            n.message.contains("GPU Direct RDMA Disabled") && n.message.contains("distance")
        })
        .map(|n| format!("line {}: {}", n.first_line, n.message))
        .collect();
    if by_distance.is_empty() {
        return None;
    }
    let mut f = Finding::warn(
        "log-gdr-level",
        format!(
            "NCCL_NET_GDR_LEVEL={set} is lower than the distance between GPUs and their NICs: NCCL turned GPUDirect RDMA off for them"
        ),
        "Unset NCCL_NET_GDR_LEVEL (NCCL's default allows GPUs and NICs under one PCIe switch or host bridge), or place GPUs and NICs closer.",
    );
    f.evidence = evidence(s, "NCCL_NET_GDR_LEVEL");
    f.evidence.extend(by_distance);
    Some(f)
}

/// Every setting judged against the log.
pub fn findings(s: &LogSummary) -> Vec<Finding> {
    [gid_index, algo_forced, shm_disabled, gdr_level]
        .into_iter()
        .filter_map(|rule| rule(s))
        .collect()
}

#[cfg(test)]
mod tests {
    fn ids(text: &str) -> Vec<String> {
        let s = crate::explain::summarize(text.as_bytes()).unwrap();
        super::findings(&s).into_iter().map(|f| f.id).collect()
    }

    #[test]
    fn gid_index_against_version_link_layer_and_the_failing_qp() {
        let gid = "h:1:1 [0] NCCL INFO NCCL_IB_GID_INDEX set by environment to 3.\n";
        let old_roce = "h:1:1 [0] NCCL INFO NCCL version 2.18.5+cuda12.2\nh:1:1 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/RoCE ; OOB eth0:10.0.0.1<0>\n";
        assert!(
            ids(&format!("{gid}{old_roce}")).is_empty(),
            "2.18 on RoCE needs it"
        );
        assert_eq!(
            ids(&format!(
                "{gid}h:1:1 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n"
            )),
            ["log-setting-gid-index"]
        );
        assert_eq!(
            ids(&format!(
                "{gid}h:1:1 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:10.0.0.1<0>\n"
            )),
            ["log-setting-gid-index"]
        );
        let s = crate::explain::summarize(
            format!("{gid}{old_roce}h:1:2 [5] ibvwrap.c:262 NCCL WARN Call to ibv_modify_qp failed with 110 Connection timed out, on dev mlx5_0:1, curr state INIT, next state RTR, local GID index 3, local GID ::ffff:1.2.3.4\n").as_bytes(),
        )
        .unwrap();
        let f = super::findings(&s);
        assert!(
            f[0].summary.contains("used GID index 3"),
            "{}",
            f[0].summary
        );
    }

    #[test]
    fn algo_shm_and_gdr_level() {
        assert_eq!(
            ids("h:1:1 [0] NCCL INFO NCCL_ALGO set by environment to Ring\n"),
            ["log-algo-forced"]
        );
        assert!(ids("h:1:1 [0] NCCL INFO NCCL_ALGO set by environment to ^NVLS\n").is_empty());
        let shm = "h:1:1 [0] NCCL INFO NCCL_SHM_DISABLE set by environment to 1.\n\
                   h:1:1 [0] NCCL INFO comm 0x1 rank 0 nRanks 2 nNodes 1 localRanks 2 localRank 0 MNNVL 0\n\
                   h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] [send] via NET/Socket/0\n";
        assert_eq!(ids(shm), ["log-shm-disabled"]);
        assert_eq!(
            ids(
                "h:1:1 [0] NCCL INFO NCCL_NET_GDR_LEVEL set by environment to LOC\n\
                 h:1:1 [0] NCCL INFO GPU Direct RDMA Disabled for GPU 1b000 / HCA 0 (distance 4 > 0)\n"
            ),
            ["log-gdr-level"]
        );
    }
}
