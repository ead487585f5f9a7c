//! Link kinds (veth, bridge, dummy, macvlan, ...) from one rtnetlink RTM_GETLINK dump.
//!
//! sysfs cannot tell a veth from a dummy (neither has a DEVTYPE in uevent); only
//! IFLA_LINKINFO/IFLA_INFO_KIND names the driver of a virtual link. The parser is
//! separate from the socket so it is tested on literal bytes.

use std::collections::BTreeMap;
use std::io;

const NLMSG_HDR: usize = 16;
const IFINFOMSG: usize = 16;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const RTM_NEWLINK: u16 = 16;
const RTM_GETLINK: u16 = 18;
const IFLA_IFNAME: u16 = 3;
const IFLA_LINKINFO: u16 = 18;
const IFLA_INFO_KIND: u16 = 1;
/// NLA_F_NESTED | NLA_F_NET_BYTEORDER, masked off attribute types.
const NLA_TYPE_MASK: u16 = !(0x8000 | 0x4000);

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

fn read_u16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn read_u32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// Iterates (type, payload) over netlink attributes; stops at the first malformed one.
fn attributes(mut b: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        let len = usize::from(read_u16(b, 0)?);
        let kind = read_u16(b, 2)? & NLA_TYPE_MASK;
        if len < 4 || len > b.len() {
            return None;
        }
        let payload = &b[4..len];
        b = b.get(align4(len)..).unwrap_or(&[]);
        Some((kind, payload))
    })
}

fn c_string(payload: &[u8]) -> String {
    let end = payload
        .iter()
        .position(|&c| c == 0)
        .unwrap_or(payload.len());
    String::from_utf8_lossy(&payload[..end]).into_owned()
}

/// What one receive buffer held.
#[derive(Debug, Default, PartialEq, Eq)]
struct DumpChunk {
    /// (interface name, kind) for links that carry IFLA_INFO_KIND.
    pub kinds: Vec<(String, String)>,
    /// NLMSG_DONE was seen.
    pub done: bool,
}

/// Parses one buffer of an RTM_GETLINK dump.
fn parse_dump(mut buf: &[u8]) -> Result<DumpChunk, io::Error> {
    let malformed = || io::Error::new(io::ErrorKind::InvalidData, "malformed netlink message");
    let mut chunk = DumpChunk::default();
    while buf.len() >= NLMSG_HDR {
        let len = read_u32(buf, 0).ok_or_else(malformed)? as usize;
        let kind = read_u16(buf, 4).ok_or_else(malformed)?;
        if len < NLMSG_HDR || len > buf.len() {
            return Err(malformed());
        }
        let body = &buf[NLMSG_HDR..len];
        match kind {
            NLMSG_DONE => {
                chunk.done = true;
                return Ok(chunk);
            }
            NLMSG_ERROR => {
                let code = read_u32(body, 0).ok_or_else(malformed)? as i32;
                return Err(io::Error::from_raw_os_error(-code));
            }
            RTM_NEWLINK if body.len() >= IFINFOMSG => {
                let mut name = None;
                let mut link_kind = None;
                for (attr, payload) in attributes(&body[IFINFOMSG..]) {
                    match attr {
                        IFLA_IFNAME => name = Some(c_string(payload)),
                        IFLA_LINKINFO => {
                            link_kind = attributes(payload)
                                .find(|(t, _)| *t == IFLA_INFO_KIND)
                                .map(|(_, p)| c_string(p));
                        }
                        _ => {}
                    }
                }
                if let (Some(n), Some(k)) = (name, link_kind) {
                    chunk.kinds.push((n, k));
                }
            }
            _ => {}
        }
        buf = buf.get(align4(len)..).unwrap_or(&[]);
    }
    Ok(chunk)
}

/// Dumps every link of this network namespace and returns the kinds by name.
pub fn link_kinds() -> Result<BTreeMap<String, String>, io::Error> {
    // SAFETY: plain socket calls on a descriptor this function owns and closes
    // (OwnedFd); buffers are local and sized as passed.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_ROUTE,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh, valid descriptor owned by nobody else.
    let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
    // A kernel that never answers must not hang the check: without the receive
    // timeout, recv below could block for good, so a failure here is the dump's failure.
    nix::sys::socket::setsockopt(
        &fd,
        nix::sys::socket::sockopt::ReceiveTimeout,
        &nix::sys::time::TimeVal::new(2, 0),
    )
    .map_err(io::Error::from)?;
    let mut request = [0u8; NLMSG_HDR + IFINFOMSG];
    request[0..4].copy_from_slice(&((NLMSG_HDR + IFINFOMSG) as u32).to_ne_bytes());
    request[4..6].copy_from_slice(&RTM_GETLINK.to_ne_bytes());
    let flags = (libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16;
    request[6..8].copy_from_slice(&flags.to_ne_bytes());
    request[8..12].copy_from_slice(&1u32.to_ne_bytes());
    // SAFETY: request is a valid buffer of the given length.
    let sent = unsafe { libc::send(raw, request.as_ptr().cast(), request.len(), 0) };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut kinds = BTreeMap::new();
    let mut buf = vec![0u8; 64 * 1024];
    // Bounded: a dump of even thousands of links ends well within this many reads.
    for _ in 0..10_000 {
        // SAFETY: buf is a valid, writable buffer of buf.len() bytes.
        let n = unsafe { libc::recv(raw, buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let chunk = parse_dump(&buf[..n as usize])?;
        kinds.extend(chunk.kinds);
        if chunk.done || n == 0 {
            return Ok(kinds);
        }
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidData,
        "netlink dump did not end",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(kind: u16, payload: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend(((4 + payload.len()) as u16).to_ne_bytes());
        v.extend(kind.to_ne_bytes());
        v.extend(payload);
        while v.len() % 4 != 0 {
            v.push(0);
        }
        v
    }

    fn message(kind: u16, body: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend(((NLMSG_HDR + body.len()) as u32).to_ne_bytes());
        v.extend(kind.to_ne_bytes());
        v.extend([0u8; 10]);
        v.extend(body);
        v
    }

    fn newlink(name: &str, kind: Option<&str>) -> Vec<u8> {
        let mut body = vec![0u8; IFINFOMSG];
        body.extend(attr(IFLA_IFNAME, format!("{name}\0").as_bytes()));
        if let Some(k) = kind {
            let info = attr(IFLA_INFO_KIND, format!("{k}\0").as_bytes());
            body.extend(attr(IFLA_LINKINFO | 0x8000, &info));
        }
        message(RTM_NEWLINK, &body)
    }

    #[test]
    fn parses_kinds_and_done() {
        let mut buf = newlink("eth0", None);
        buf.extend(newlink("veth1", Some("veth")));
        buf.extend(newlink("$(id)", Some("dummy")));
        buf.extend(message(NLMSG_DONE, &[0; 4]));
        let chunk = parse_dump(&buf).unwrap();
        assert!(chunk.done);
        assert_eq!(
            chunk.kinds,
            vec![
                ("veth1".to_string(), "veth".to_string()),
                ("$(id)".to_string(), "dummy".to_string())
            ]
        );
    }

    #[test]
    fn error_message_becomes_errno_and_garbage_is_rejected() {
        let err = parse_dump(&message(NLMSG_ERROR, &(-libc::EPERM).to_ne_bytes())).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EPERM));
        let mut bad = newlink("eth0", Some("veth"));
        bad[0] = 200; // length past the buffer
        assert!(parse_dump(&bad).is_err());
        // A truncated attribute inside a message is skipped, not a panic.
        let mut body = vec![0u8; IFINFOMSG];
        body.extend([50u8, 0, 3, 0, b'e']);
        assert_eq!(
            parse_dump(&message(RTM_NEWLINK, &body)).unwrap().kinds,
            vec![]
        );
    }
}
