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

/// The segments NCCL itself writes after a family (src/transport/p2p.cc,
/// shm.cc, net.cc, coll_net.cc at v2.30.7-1: `P2P/CUMEM/read`, `SHM/direct/CE`,
/// `NET/<net name>/<dev>[(proxy)]/GDRDMA(PCI)/Shared`). Anything else a build
/// appends is not part of the transport's name.
fn is_nccl_segment(family: &str, index: usize, seg: &str) -> bool {
    match family {
        "P2P" => {
            matches!(
                seg,
                "direct pointer" | "direct" | "IPC" | "CUMEM" | "indirect" | "read" | "CE"
            )
        }
        "SHM" => matches!(seg, "direct" | "CE"),
        // The second segment is the net plugin's own name (`IB`, `AWS Libfabric`, `IBext_v8`).
        "NET" | "COLLNET" => index == 1 || matches!(seg, "GDRDMA" | "GDRDMA(PCI)" | "Shared"),
        _ => true,
    }
}

/// Writes the normalized transport of a connection line into `out`; returns
/// `Some(proxied)` when the line is a connection, `None` otherwise. Text a
/// vendor build appends after NCCL's own segments is left out of `out`; see
/// `appended`.
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
        // Judged before `out` grows, without copying the family.
        let (own, word) = {
            let family = out.split('/').next().unwrap_or("");
            let index = out.matches('/').count() + 1;
            let own = out.is_empty() || is_nccl_segment(family, index, seg);
            // A word NCCL writes, then a build's text after a space: keep the word.
            let word = seg
                .split_once(' ')
                .map(|(w, _)| w)
                .filter(|w| !own && is_nccl_segment(family, index, w));
            (own, word)
        };
        if !own {
            if let Some(word) = word {
                out.push('/');
                out.push_str(word);
            }
            break;
        }
        if !out.is_empty() {
            out.push('/');
        }
        out.push_str(seg);
    }
    (!out.is_empty()).then_some(proxied)
}

/// The text after NCCL's own transport name on a connection line (what a
/// vendor build appended), or `None` when there is none.
pub fn appended<'a>(message: &'a str, normalized: &str) -> Option<&'a str> {
    let last = normalized.rsplit('/').next()?;
    // Most lines end with NCCL's last segment (or a device number): nothing appended.
    let tail = message
        .trim_end()
        .trim_end_matches(|c: char| c.is_ascii_digit() || c == '/');
    if tail.ends_with(last) {
        return None;
    }
    let at = message.find(" via ")? + 5;
    let raw = transport_text(&message[at..]);
    // The last NCCL segment of the key, found again in the raw text.
    let end = raw.rfind(last).map(|i| i + last.len())?;
    let rest = raw[end..]
        .trim_start_matches(|c: char| c.is_ascii_digit() || c == '(' || c == ')' || c == '/');
    let rest = rest.trim();
    (!rest.is_empty()).then_some(rest)
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

    /// Issue 26: text a vendor build appends stayed in the transport key.
    #[test]
    fn text_a_build_appends_is_not_the_transport() {
        for (line, key, extra) in [
            (
                "Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read/VendorX",
                "P2P/CUMEM/read",
                "VendorX",
            ),
            (
                "Channel 00/0 : 0[0] -> 1[1] via P2P/IPC/read hw-accel",
                "P2P/IPC/read",
                "hw-accel",
            ),
            (
                "Channel 00 : 0[0] -> 1[1] via SHM/direct/direct/extra",
                "SHM/direct/direct",
                "extra",
            ),
            (
                "Channel 00/0 : 1[1] -> 0[0] [send] via NET/IB/0/GDRDMA/Shared/rail2",
                "NET/IB/GDRDMA/Shared",
                "rail2",
            ),
        ] {
            assert_eq!(norm(line), Some((key.to_string(), false)), "{line}");
            assert_eq!(appended(line, key), Some(extra), "{line}");
        }
        // NCCL's own names, the net plugin's name included, are kept whole.
        for line in [
            "Channel 01/0 : 3[3] -> 11[3] [send] via NET/AWS Libfabric/1/GDRDMA",
            "Channel 00/0 : 0[0] -> 1[1] [send] via NET/IB/0/GDRDMA(PCI)",
            "Ring 00 : 0[0] -> 1[1] via P2P/direct pointer",
        ] {
            let (key, _) = norm(line).unwrap();
            assert_eq!(appended(line, &key), None, "{line}");
        }
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
