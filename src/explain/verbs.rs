//! RDMA work-completion statuses: rdma-core's `enum ibv_wc_status`
//! (libibverbs/verbs.h) with the text `ibv_wc_status_str` gives each
//! (libibverbs/enum_strs.c), and what each means for NCCL: which side saw it and
//! which layer failed. NCCL prints them in `NET/IB : Got completion from peer %s
//! with error %d` (2.10-2.19), `... with status=%d` (2.20-2.28.3) and
//! `... with status=%s(%d)` (2.28.7 on) (src/transport/net_ib.cc, net_ib/p2p.cc),
//! and from 2.28.7 adds hints for 4, 5 and 12 (printIbWcStatusHint,
//! src/transport/net_ib/common.h at v2.30.7-1).

/// The layer a failed completion points at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layer {
    /// The path between the NICs (links, switches, routes, GIDs).
    Path,
    /// The remote process or NIC.
    Peer,
    /// Memory registration: GPU memory through GPUDirect RDMA, memlock.
    Registration,
    /// Not a cause: the queue pair was already in error (an earlier failure).
    Consequence,
    /// A bug or an unusual state in NCCL, the driver or the NIC.
    Local,
}

pub struct WcStatus {
    pub code: u32,
    pub name: &'static str,
    /// `ibv_wc_status_str`.
    pub text: &'static str,
    pub layer: Layer,
    /// What it means for NCCL, and where to look.
    pub meaning: &'static str,
}

const fn wc(
    code: u32,
    name: &'static str,
    text: &'static str,
    layer: Layer,
    meaning: &'static str,
) -> WcStatus {
    WcStatus {
        code,
        name,
        text,
        layer,
        meaning,
    }
}

const WC_STATUSES: &[WcStatus] = &[
    wc(
        1,
        "IBV_WC_LOC_LEN_ERR",
        "local length error",
        Layer::Local,
        "this side posted a receive too small for what arrived: the ranks disagree on a message size (mismatched collectives) or a plugin bug",
    ),
    wc(
        2,
        "IBV_WC_LOC_QP_OP_ERR",
        "local QP operation error",
        Layer::Local,
        "this side's queue pair rejected the request (a driver or NIC firmware problem)",
    ),
    wc(
        3,
        "IBV_WC_LOC_EEC_OP_ERR",
        "local EE context operation error",
        Layer::Local,
        "an end-to-end context error on this side (not used by NCCL's reliable connections)",
    ),
    wc(
        4,
        "IBV_WC_LOC_PROT_ERR",
        "local protection error",
        Layer::Registration,
        "this side's NIC could not access the registered buffer: GPU memory through GPUDirect RDMA broken (PCIe ACS or IOMMU redirecting peer-to-peer traffic, nvidia-peermem/dma-buf), or a registration that went away; NCCL 2.28 hints at ACS and NCCL_NET_GDR_LEVEL=0 to confirm",
    ),
    wc(
        5,
        "IBV_WC_WR_FLUSH_ERR",
        "Work Request Flushed Error",
        Layer::Consequence,
        "the queue pair was already in error and its outstanding requests were flushed: a consequence, the first error (on this or the peer's side) is the cause; NCCL 2.28 adds that NICs of one machine that cannot reach each other give it",
    ),
    wc(
        6,
        "IBV_WC_MW_BIND_ERR",
        "memory management operation error",
        Layer::Registration,
        "a memory-window bind failed on this side",
    ),
    wc(
        7,
        "IBV_WC_BAD_RESP_ERR",
        "bad response error",
        Layer::Peer,
        "the peer's NIC answered with something unexpected",
    ),
    wc(
        8,
        "IBV_WC_LOC_ACCESS_ERR",
        "local access error",
        Layer::Registration,
        "this side's registered memory did not allow the access (registration or GPUDirect RDMA)",
    ),
    wc(
        9,
        "IBV_WC_REM_INV_REQ_ERR",
        "remote invalid request error",
        Layer::Peer,
        "the peer rejected the request as invalid (a message larger than its receive, mismatched NCCL versions or collectives)",
    ),
    wc(
        10,
        "IBV_WC_REM_ACCESS_ERR",
        "remote access error",
        Layer::Peer,
        "the peer's NIC could not access its registered buffer: the peer's memory registration or GPUDirect RDMA, or the peer freed it (it is exiting)",
    ),
    wc(
        11,
        "IBV_WC_REM_OP_ERR",
        "remote operation error",
        Layer::Peer,
        "the peer could not complete the operation (its queue pair or memory failed): read the peer's log",
    ),
    wc(
        12,
        "IBV_WC_RETRY_EXC_ERR",
        "transport retry counter exceeded",
        Layer::Path,
        "the peer's NIC never acknowledged within NCCL_IB_TIMEOUT x NCCL_IB_RETRY_CNT: the path is broken (a link or switch down, a RoCE GID or route that does not reach the peer, NICs on different rails) or the peer process died; at the start of a job it is the path, mid-job a link flap or a dead peer",
    ),
    wc(
        13,
        "IBV_WC_RNR_RETRY_EXC_ERR",
        "RNR retry counter exceeded",
        Layer::Peer,
        "the peer had no receive posted for too long: the peer is stuck or gone",
    ),
    wc(
        14,
        "IBV_WC_LOC_RDD_VIOL_ERR",
        "local RDD violation error",
        Layer::Local,
        "a reliable-datagram domain violation (not used by NCCL)",
    ),
    wc(
        15,
        "IBV_WC_REM_INV_RD_REQ_ERR",
        "remote invalid RD request",
        Layer::Peer,
        "the peer rejected a reliable-datagram request (not used by NCCL)",
    ),
    wc(
        16,
        "IBV_WC_REM_ABORT_ERR",
        "aborted error",
        Layer::Peer,
        "the peer aborted the operation",
    ),
    wc(
        17,
        "IBV_WC_INV_EECN_ERR",
        "invalid EE context number",
        Layer::Local,
        "an invalid end-to-end context (not used by NCCL)",
    ),
    wc(
        18,
        "IBV_WC_INV_EEC_STATE_ERR",
        "invalid EE context state",
        Layer::Local,
        "an end-to-end context in a bad state (not used by NCCL)",
    ),
    wc(
        19,
        "IBV_WC_FATAL_ERR",
        "fatal error",
        Layer::Local,
        "the NIC reported a fatal error: check the device's health (dmesg, firmware)",
    ),
    wc(
        20,
        "IBV_WC_RESP_TIMEOUT_ERR",
        "response timeout error",
        Layer::Path,
        "no response from the peer in time: the path or the peer",
    ),
    wc(
        21,
        "IBV_WC_GENERAL_ERR",
        "general error",
        Layer::Local,
        "a general error from the NIC driver",
    ),
];

/// The status a completion message names: `status=12`, `with error 12`,
/// `status=transport retry counter exceeded(12)`.
pub fn status_in(message: &str) -> Option<&'static WcStatus> {
    let code = ["status=", "with error "].iter().find_map(|key| {
        let rest = &message[message.find(key)? + key.len()..];
        let digits: String = if rest.starts_with(|c: char| c.is_ascii_digit()) {
            rest.chars().take_while(char::is_ascii_digit).collect()
        } else {
            // `status=<text>(<code>)`
            let open = rest.find('(')?;
            rest[open + 1..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect()
        };
        digits.parse::<u32>().ok()
    })?;
    WC_STATUSES.iter().find(|s| s.code == code)
}

/// The side a layer puts the cause on, in a sentence.
pub fn layer_text(layer: Layer) -> &'static str {
    match layer {
        Layer::Path => "the path between the NICs",
        Layer::Peer => "the peer",
        Layer::Registration => "memory registration on this side (GPUDirect RDMA)",
        Layer::Consequence => "an earlier error (this is its consequence)",
        Layer::Local => "this side's NIC or driver",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_of_every_format() {
        for (m, code) in [
            (
                "NET/IB : Got completion from peer 1.2.3.4<5> with error 12, opcode 0, len 0, vendor err 129",
                12,
            ),
            (
                "NET/IB : Got completion from peer x with status=4 opcode=0 len=0 vendor err 81 (Send)",
                4,
            ),
            (
                "NET/IB: Got completion from peer x with status=Work Request Flushed Error(5) opcode=RDMA_WRITE(1)",
                5,
            ),
        ] {
            assert_eq!(status_in(m).map(|s| s.code), Some(code), "{m}");
        }
        assert!(status_in("no status here").is_none());
        // The table is rdma-core's, in order.
        for (i, s) in WC_STATUSES.iter().enumerate() {
            assert_eq!(s.code as usize, i + 1);
        }
    }
}
