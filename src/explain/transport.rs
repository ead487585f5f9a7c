//! Connection lines and the transport they name, with channel, device and
//! proxy-rank numbers removed so counts group by transport:
//! `Channel 00/0 : 0[0] -> 1[1] [send] via NET/IB/0(3)/GDRDMA` -> `NET/IB/GDRDMA`,
//! proxied. Formats from NVIDIA/nccl src/transport/{p2p,shm,net,coll_net}.cc:
//! `Ring NN : a -> b via ...` (2.4), `Channel NN : a[bus] -> b[bus] via ...`
//! (2.5-2.11), `Channel NN/C : a[dev] -> b[dev] via ...` (2.12 on), `CollNet NN/C : ...`.
//! NCCL 2.3-2.5 named host memory `via direct shared memory` (src/transport/shm.cu:174
//! at v2.3.7-1, src/transport/shm.cc:78 at v2.5.6-1): that is `SHM/direct`.

/// True for the line kinds that announce a connection.
fn is_connection(message: &str) -> bool {
    ["Channel ", "Ring ", "CollNet ", "Coll ", "NVLS "]
        .iter()
        .any(|p| message.starts_with(p))
}

/// Writes the normalized transport of a connection line into `out`; returns
/// `Some(proxied)` when the line is a connection, `None` otherwise.
pub fn normalize_into(message: &str, out: &mut String) -> Option<bool> {
    if !is_connection(message) {
        return None;
    }
    let at = message.find(" via ")?;
    let raw = transport_text(&message[at + 5..]);
    if raw.is_empty() {
        return None;
    }
    out.clear();
    if raw == "direct shared memory" {
        out.push_str("SHM/direct");
        return Some(false);
    }
    let mut proxied = false;
    for segment in raw.split('/') {
        let mut seg = segment;
        // `0(3)`: device 0 through proxy rank 3 (PXN).
        if let Some(open) = seg.find('(') {
            let inner = seg[open + 1..].trim_end_matches(')');
            if seg.ends_with(')') && !inner.is_empty() && inner.bytes().all(|b| b.is_ascii_digit())
            {
                proxied = true;
                seg = &seg[..open];
            }
        }
        // `2[2]`: an intermediate rank and its device (P2P/indirect).
        if let Some(open) = seg.find('[') {
            seg = &seg[..open];
        }
        if seg.is_empty() || seg.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        if !out.is_empty() {
            out.push('/');
        }
        out.push_str(seg);
    }
    (!out.is_empty()).then_some(proxied)
}

/// The transport name alone: what a terminal frame, a table cell or padding put
/// after it is dropped (`NET/IB/0/GDRDMA<padding>│`, seen in logs copied from k9s).
/// NCCL's names hold ASCII letters, digits, `/ ( ) [ ] _ - .` and, in 2.3-2.5
/// (`P2P/direct pointer`, `direct shared memory`), single spaces.
fn transport_text(text: &str) -> &str {
    let end = text
        .find(|c: char| !(c.is_ascii_alphanumeric() || "/()[]_-. ".contains(c)))
        .unwrap_or(text.len());
    let text = &text[..end];
    let end = text.find("  ").unwrap_or(text.len());
    text[..end].trim()
}

/// The transport family: `P2P`, `SHM`, `NET`, `COLLNET`, ...
pub fn family(transport: &str) -> &str {
    transport.split('/').next().unwrap_or(transport)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(m: &str) -> Option<(String, bool)> {
        let mut s = String::new();
        normalize_into(m, &mut s).map(|p| (s, p))
    }

    #[test]
    fn every_version_format() {
        let cases = [
            (
                "Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read",
                "P2P/CUMEM/read",
                false,
            ),
            (
                "Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM",
                "P2P/CUMEM",
                false,
            ),
            (
                "Channel 00 : 0[0] -> 1[1] via SHM/direct/direct",
                "SHM/direct/direct",
                false,
            ),
            (
                "Channel 03 : 0[1] -> 1[2] via SHM/direct",
                "SHM/direct",
                false,
            ),
            (
                "Channel 00/0 : 1[1] -> 0[0] [send] via NET/Socket/0",
                "NET/Socket",
                false,
            ),
            (
                "Channel 02/0 : 8[0] -> 0[0] [receive] via NET/IB/3/GDRDMA",
                "NET/IB/GDRDMA",
                false,
            ),
            (
                "Channel 02/1 : 0[0] -> 8[0] [send] via NET/IB/0(7)/GDRDMA/Shared",
                "NET/IB/GDRDMA/Shared",
                true,
            ),
            (
                "Channel 01/0 : 3[3] -> 11[3] [send] via NET/Libfabric/1/GDRDMA",
                "NET/Libfabric/GDRDMA",
                false,
            ),
            (
                "Channel 00/0 : 0[0] -> 1[1] [send] via NET/IB/0/GDRDMA(PCI)",
                "NET/IB/GDRDMA(PCI)",
                false,
            ),
            (
                "Ring 00 : 0[0] -> 1[1] via P2P/direct pointer",
                "P2P/direct pointer",
                false,
            ),
            ("Ring 01 : 3 -> 0 [send] via NET/IB/0", "NET/IB", false),
            (
                "Channel 00 : 0[1b000] -> 1[1c000] via P2P/IPC/read",
                "P2P/IPC/read",
                false,
            ),
            (
                "Channel 01/0 : 0[0] -> 2[2] via P2P/indirect/1[1]",
                "P2P/indirect",
                false,
            ),
            (
                "Channel 00/1 : 0[0] -> 1[1] via P2P/IPC/CE",
                "P2P/IPC/CE",
                false,
            ),
            (
                "CollNet 00/0 : 0 [send] via COLLNET/SHARP/0/GDRDMA",
                "COLLNET/SHARP/GDRDMA",
                false,
            ),
            // NCCL 2.3-2.5, src/transport/shm.cc:78 at v2.5.6-1.
            (
                "Ring 00 : 0[1b000] -> 1[3d000] via direct shared memory",
                "SHM/direct",
                false,
            ),
            (
                "Ring 02 : 1[1] -> 0[0] via direct shared memory",
                "SHM/direct",
                false,
            ),
        ];
        for (line, want, proxied) in cases {
            assert_eq!(norm(line), Some((want.to_string(), proxied)), "{line}");
        }
    }

    #[test]
    fn terminal_frame_and_padding_after_the_transport_are_dropped() {
        let framed = format!(
            "Channel 02/0 : 8[0] -> 0[0] [receive] via NET/IB/3/GDRDMA{}\u{2502}",
            " ".repeat(230)
        );
        assert_eq!(norm(&framed), Some(("NET/IB/GDRDMA".to_string(), false)));
        assert_eq!(
            norm("Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read   | node-1  |"),
            Some(("P2P/CUMEM/read".to_string(), false))
        );
        assert_eq!(
            norm("Channel 00/0 : 0[0] -> 1[1] via SHM/direct/direct\r"),
            Some(("SHM/direct/direct".to_string(), false))
        );
        assert_eq!(norm("Channel 00 : 0 -> 1 via \u{2502}"), None);
    }

    #[test]
    fn non_connections_are_ignored() {
        assert_eq!(norm("Channel 00/24 : 0 1"), None);
        assert_eq!(norm("Connected all rings, use ring PXN 0 GDR 1"), None);
        assert_eq!(norm("Channel 00 : 0 -> 1 via "), None);
        assert_eq!(norm("Channel 00 : via 0/1/2"), None);
        assert_eq!(family("NET/IB/GDRDMA"), "NET");
    }
}
