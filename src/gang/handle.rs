//! The 128-byte ncclUniqueId every rank builds for itself, byte for byte what
//! NCCL's own `ncclGetUniqueId` returns with NCCL_COMM_ID set, except the magic.
//!
//! Layout (NVIDIA/nccl v2.16.2-1 .. v2.28.9-1 src/include/bootstrap.h
//! `struct ncclBootstrapHandle { uint64_t magic; union ncclSocketAddress addr; }`,
//! src/include/socket.h for the union; src/bootstrap.cc `bootstrapGetUniqueId`
//! memsets the handle first, so every other byte is zero): the magic as a
//! little-endian u64, then a `sockaddr_in` (family 2, port big-endian, IPv4) or
//! `sockaddr_in6` (family 10, port, flow info 0, address, scope 0), then zeros.
//! v2.30.7-1 appends `int nRanks`, 0 for a fresh communicator: still zeros.
//!
//! The magic is the gang's own job key, derived from the job identity (root,
//! port, pod count, attempt), never NCCL_MAGIC: NCCL's root (src/bootstrap.cc
//! `bootstrapCreateRoot` listens with the handle's magic) drops a connection
//! carrying another one, so a stale pod of another gang cannot check in and
//! kill the root with a duplicate rank. The rendezvous (`rendezvous`) refuses a
//! hello with another key the same way, saying why.

use crate::layout::GangIdentity;
use std::net::{IpAddr, SocketAddr};

/// sizeof(ncclUniqueId) (src/nccl.h.in NCCL_UNIQUE_ID_BYTES).
const HANDLE_BYTES: usize = 128;
/// Where the socket address starts: after the u64 magic.
const ADDR_OFFSET: usize = 8;
/// Linux AF_INET / AF_INET6.
const AF_INET: u16 = 2;
const AF_INET6: u16 = 10;

/// A non-zero job key from the job identity (FNV-1a, 64 bit) and the rendezvous
/// protocol's version.
pub fn magic(identity: &GangIdentity) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let text = format!(
        "nccl-preflight gang|{}|{}|{}|{}|{}",
        super::wire::PROTOCOL,
        identity.root,
        identity.port,
        identity.nodes,
        identity.attempt
    );
    for b in text.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    if h == 0 { 1 } else { h }
}

/// The handle bytes for `magic` and the root's address.
pub fn build(magic: u64, root: SocketAddr) -> [u8; HANDLE_BYTES] {
    let mut h = [0u8; HANDLE_BYTES];
    h[..8].copy_from_slice(&magic.to_le_bytes());
    let a = ADDR_OFFSET;
    match root.ip() {
        IpAddr::V4(ip) => {
            h[a..a + 2].copy_from_slice(&AF_INET.to_ne_bytes());
            h[a + 2..a + 4].copy_from_slice(&root.port().to_be_bytes());
            h[a + 4..a + 8].copy_from_slice(&ip.octets());
        }
        IpAddr::V6(ip) => {
            h[a..a + 2].copy_from_slice(&AF_INET6.to_ne_bytes());
            h[a + 2..a + 4].copy_from_slice(&root.port().to_be_bytes());
            h[a + 8..a + 24].copy_from_slice(&ip.octets());
        }
    }
    h
}

/// The bytes of the socket address inside a handle (16 for IPv4, 28 for IPv6):
/// what rank 0 compares with NCCL's own ncclGetUniqueId.
pub fn address_bytes(handle: &[u8]) -> &[u8] {
    let family = handle
        .get(ADDR_OFFSET..ADDR_OFFSET + 2)
        .map(|b| u16::from_ne_bytes([b[0], b[1]]))
        .unwrap_or(0);
    let len = if family == AF_INET6 { 28 } else { 16 };
    handle.get(ADDR_OFFSET..ADDR_OFFSET + len).unwrap_or(&[])
}

/// NCCL_COMM_ID's text for the root address (src/misc/socket.cc
/// `ncclSocketGetAddrFromString`: `<ipv4>:<port>` or `[<ipv6>]:<port>`).
pub fn comm_id(root: SocketAddr) -> String {
    match root.ip() {
        IpAddr::V4(ip) => format!("{ip}:{}", root.port()),
        IpAddr::V6(ip) => format!("[{ip}]:{}", root.port()),
    }
}

/// Lower-case hex, for carrying bytes in JSON.
pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Bytes from lower- or upper-case hex; None on odd length or a non-hex digit.
pub fn from_hex(text: &str) -> Option<Vec<u8>> {
    let t = text.as_bytes();
    if !t.len().is_multiple_of(2) {
        return None;
    }
    t.chunks(2)
        .map(|p| {
            let s = std::str::from_utf8(p).ok()?;
            u8::from_str_radix(s, 16).ok()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_handle_matches_what_nccl_2_28_returns_but_the_magic() {
        // Captured from NCCL 2.28.9's ncclGetUniqueId with NCCL_COMM_ID=10.0.2.5:29501:
        // 80 02 80 02 80 02 80 02 | 02 00 | 73 3d | 0a 00 02 05 | zeros.
        let root: SocketAddr = "10.0.2.5:29501".parse().unwrap();
        let h = build(0x0280_0280_0280_0280, root);
        assert_eq!(
            &h[..16],
            &[
                0x80, 0x02, 0x80, 0x02, 0x80, 0x02, 0x80, 0x02, 0x02, 0x00, 0x73, 0x3d, 0x0a, 0x00,
                0x02, 0x05
            ]
        );
        assert!(h[16..].iter().all(|&b| b == 0));
        assert_eq!(address_bytes(&h), &h[8..24]);
        assert_eq!(comm_id(root), "10.0.2.5:29501");
    }

    #[test]
    fn ipv6_handle_and_comm_id() {
        let root: SocketAddr = "[fd00::1]:29501".parse().unwrap();
        let h = build(7, root);
        assert_eq!(&h[..8], &7u64.to_le_bytes());
        assert_eq!(&h[8..10], &10u16.to_ne_bytes());
        assert_eq!(&h[10..12], &[0x73, 0x3d]);
        assert_eq!(&h[12..16], &[0, 0, 0, 0]);
        assert_eq!(h[16], 0xfd);
        assert_eq!(h[31], 1);
        assert!(h[36..].iter().all(|&b| b == 0));
        assert_eq!(address_bytes(&h).len(), 28);
        assert_eq!(comm_id(root), "[fd00::1]:29501");
    }

    #[test]
    fn magic_is_per_job_and_attempt_and_never_zero() {
        let id = crate::layout::GangIdentity {
            launcher: "flags".into(),
            node_rank: 0,
            nodes: 2,
            root: "job-master-0".into(),
            port: 23457,
            peers: vec![],
            sources: vec![],
            attempt: String::new(),
        };
        let a = magic(&id);
        assert_ne!(a, 0);
        let retried = GangIdentity {
            attempt: "1".into(),
            ..id.clone()
        };
        assert_ne!(a, magic(&retried));
        // Every rank of the job computes the same, whatever its own rank.
        let other = GangIdentity {
            node_rank: 1,
            ..id.clone()
        };
        assert_eq!(a, magic(&other));
        let another_job = GangIdentity {
            root: "other-master-0".into(),
            ..id
        };
        assert_ne!(a, magic(&another_job));
    }

    #[test]
    fn hex_round_trip_and_refusals() {
        let bytes = [0u8, 1, 0xab, 0xff];
        assert_eq!(from_hex(&to_hex(&bytes)).unwrap(), bytes);
        assert_eq!(from_hex("ABff").unwrap(), [0xab, 0xff]);
        assert!(from_hex("abc").is_none());
        assert!(from_hex("zz").is_none());
        assert!(from_hex("é1").is_none());
    }
}
