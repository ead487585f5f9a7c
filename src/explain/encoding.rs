//! The log's text encoding: UTF-8 (or anything byte-oriented) is read as is;
//! UTF-16 (Windows PowerShell's `>` and `Out-File` write UTF-16LE with a byte
//! order mark) is recognised from its first bytes and decoded to UTF-8 while
//! streaming, so explain-log reads it instead of finding "no NCCL lines".

use std::io::{self, Read};

/// Bytes looked at to recognise UTF-16 without a byte order mark.
const SNIFF: usize = 512;
/// UTF-16 bytes decoded per read.
const CHUNK: usize = 64 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Utf16 {
    Little,
    Big,
}

impl Utf16 {
    pub fn name(self) -> &'static str {
        match self {
            Utf16::Little => "UTF-16LE",
            Utf16::Big => "UTF-16BE",
        }
    }
}

/// The input again, from its first byte (after a UTF-16 byte order mark).
type Replay<R> = io::Chain<io::Cursor<Vec<u8>>, R>;

/// Reads the first bytes of `input` and says whether it is UTF-16; returns a
/// reader that yields the whole input again (without a UTF-16 byte order mark).
pub fn sniff<R: Read>(mut input: R) -> io::Result<(Option<Utf16>, Replay<R>)> {
    let mut head = vec![0u8; SNIFF];
    let mut len = 0;
    while len < SNIFF {
        match input.read(&mut head[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    head.truncate(len);
    let found = match head.as_slice() {
        [0xff, 0xfe, ..] => Some((Utf16::Little, 2)),
        [0xfe, 0xff, ..] => Some((Utf16::Big, 2)),
        _ => guess(&head).map(|e| (e, 0)),
    };
    let skip = found.map_or(0, |(_, bom)| bom);
    head.drain(..skip);
    Ok((found.map(|(e, _)| e), io::Cursor::new(head).chain(input)))
}

/// UTF-16 without a byte order mark: ASCII text puts a zero in every other
/// byte. Requires most pairs to look like that, so binary data does not pass.
fn guess(head: &[u8]) -> Option<Utf16> {
    let pairs = head.len() / 2;
    if pairs < 8 {
        return None;
    }
    let count = |zero_at: usize| {
        head.chunks_exact(2)
            .filter(|p| p[zero_at] == 0 && p[1 - zero_at] != 0)
            .count()
    };
    let (le, be) = (count(1), count(0));
    if le * 10 >= pairs * 9 {
        Some(Utf16::Little)
    } else if be * 10 >= pairs * 9 {
        Some(Utf16::Big)
    } else {
        None
    }
}

/// Decodes UTF-16 to UTF-8 as it reads; unpaired surrogates become U+FFFD.
pub struct Utf16Reader<R> {
    inner: R,
    order: Utf16,
    raw: Vec<u8>,
    /// An odd byte left from the previous read.
    carry: Option<u8>,
    /// A high surrogate whose partner is in the next read.
    high: Option<u16>,
    out: Vec<u8>,
    at: usize,
    done: bool,
}

impl<R: Read> Utf16Reader<R> {
    pub fn new(inner: R, order: Utf16) -> Self {
        Utf16Reader {
            inner,
            order,
            raw: vec![0; CHUNK],
            carry: None,
            high: None,
            out: Vec::with_capacity(CHUNK * 3 / 2),
            at: 0,
            done: false,
        }
    }

    /// Decodes the next chunk into `out`; false at the end of the input.
    fn fill(&mut self) -> io::Result<bool> {
        if self.done {
            return Ok(false);
        }
        let start = usize::from(self.carry.is_some());
        if let Some(b) = self.carry.take() {
            self.raw[0] = b;
        }
        let n = loop {
            match self.inner.read(&mut self.raw[start..]) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        };
        self.out.clear();
        self.at = 0;
        if n == 0 {
            self.done = true;
            // A lone trailing byte or surrogate: the input ended mid-character.
            if start == 1 || self.high.take().is_some() {
                self.out.extend_from_slice("\u{fffd}".as_bytes());
            }
            return Ok(!self.out.is_empty());
        }
        let total = start + n;
        if total % 2 == 1 {
            self.carry = Some(self.raw[total - 1]);
        }
        let order = self.order;
        let mut units: Vec<u16> = Vec::with_capacity(total / 2 + 1);
        units.extend(self.high.take());
        units.extend(
            self.raw[..total - total % 2]
                .chunks_exact(2)
                .map(|p| match order {
                    Utf16::Little => u16::from_le_bytes([p[0], p[1]]),
                    Utf16::Big => u16::from_be_bytes([p[0], p[1]]),
                }),
        );
        if units.last().is_some_and(|u| (0xd800..0xdc00).contains(u)) {
            self.high = units.pop();
        }
        let mut buf = [0u8; 4];
        for c in char::decode_utf16(units) {
            let c = c.unwrap_or(char::REPLACEMENT_CHARACTER);
            self.out
                .extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
        }
        Ok(true)
    }
}

impl<R: Read> Read for Utf16Reader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.at == self.out.len() {
            if !self.fill()? {
                return Ok(0);
            }
        }
        let n = buf.len().min(self.out.len() - self.at);
        buf[..n].copy_from_slice(&self.out[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader that hands out one byte at a time, to split surrogate pairs
    /// and code units across reads.
    struct Trickle<'a>(&'a [u8]);
    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            match (self.0.split_first(), buf.is_empty()) {
                (Some((b, rest)), false) => {
                    buf[0] = *b;
                    self.0 = rest;
                    Ok(1)
                }
                _ => Ok(0),
            }
        }
    }

    #[test]
    fn decodes_across_read_boundaries() {
        let text = "h:1:1 [0] NCCL INFO 🚀 ok\n";
        let bytes: Vec<u8> = text.encode_utf16().flat_map(u16::to_le_bytes).collect();
        let mut out = String::new();
        Utf16Reader::new(Trickle(&bytes), Utf16::Little)
            .read_to_string(&mut out)
            .unwrap();
        assert_eq!(out, text);
        // Cut mid-character: a replacement character, no panic.
        let mut out = String::new();
        Utf16Reader::new(&bytes[..bytes.len() - 1], Utf16::Little)
            .read_to_string(&mut out)
            .unwrap();
        assert!(out.ends_with('\u{fffd}'));
    }

    #[test]
    fn sniffing_keeps_utf8_and_binary_as_they_are() {
        for input in [
            &b"plain NCCL INFO text\n"[..],
            &[0u8; 100][..],
            &[0x1f, 0x8b, 0, 0][..],
        ] {
            let (found, mut rest) = sniff(input).unwrap();
            assert_eq!(found, None);
            let mut again = Vec::new();
            rest.read_to_end(&mut again).unwrap();
            assert_eq!(again, input);
        }
    }
}
