//! The gang session's wire format, and a non-blocking framed connection.
//!
//! Every frame, both ways: a 24-byte header `NPGR` | protocol (u16 LE) | kind
//! (u16 LE) | job key (u64 LE) | rank (u32 LE) | body length (u32 LE), then the
//! body. Kinds: a pod's hello (its record, at most `FINGERPRINT_BYTES`), rank 0's
//! table ([`Table::encode`]), a refusal (a blame byte, then a reason of at most 512
//! bytes), a beat (JSON, at most `BEAT_BYTES`: a pod's stage, or rank 0's stage and
//! the pods it lost), a pod's outcome and rank 0's outcomes (JSON). A body over its
//! kind's limit is refused before any of it is read, and a connection buffers at
//! most one frame of the largest kind it takes.

use super::fingerprint::FINGERPRINT_BYTES;
use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;

const WIRE: &[u8; 4] = b"NPGR";
/// The protocol's version; a peer speaking another is refused by name. 2: the
/// session stays open through NCCL's run (beats, outcomes), NCCL's root port in the table.
pub const PROTOCOL: u16 = 2;
pub const HEADER: usize = 24;

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Hello = 1,
    Table = 2,
    Refused = 3,
    Beat = 4,
    Outcome = 5,
    Outcomes = 6,
}

impl Kind {
    fn of(code: u16) -> Option<Kind> {
        [
            Kind::Hello,
            Kind::Table,
            Kind::Refused,
            Kind::Beat,
            Kind::Outcome,
            Kind::Outcomes,
        ]
        .into_iter()
        .find(|k| *k as u16 == code)
    }
}

/// A refusal's reason, bytes.
pub const MAX_REASON: usize = 512;
/// A beat's body, bytes, per pod it may name (rank 0's lists the pods it lost).
const BEAT_BYTES: usize = 1024;
/// A pod's outcome, bytes.
pub const OUTCOME_BYTES: usize = 4096;

/// The largest body of `kind` in a gang of `nodes` pods.
pub fn limit(kind: Kind, nodes: u64) -> usize {
    let n = nodes as usize;
    match kind {
        Kind::Hello => FINGERPRINT_BYTES,
        Kind::Table => n
            .saturating_mul(FINGERPRINT_BYTES + 4)
            .saturating_add(64 << 10),
        Kind::Refused => MAX_REASON + 1,
        Kind::Beat => n.saturating_mul(BEAT_BYTES).saturating_add(BEAT_BYTES),
        Kind::Outcome => OUTCOME_BYTES,
        Kind::Outcomes => n
            .saturating_mul(OUTCOME_BYTES + BEAT_BYTES)
            .saturating_add(64 << 10),
    }
}

/// A frame's header fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    pub kind: Kind,
    pub job: u64,
    pub rank: u32,
    pub len: usize,
}

pub fn header(kind: Kind, job: u64, rank: u32, len: usize) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[..4].copy_from_slice(WIRE);
    h[4..6].copy_from_slice(&PROTOCOL.to_le_bytes());
    h[6..8].copy_from_slice(&(kind as u16).to_le_bytes());
    h[8..16].copy_from_slice(&job.to_le_bytes());
    h[16..20].copy_from_slice(&rank.to_le_bytes());
    h[20..24].copy_from_slice(&(len as u32).to_le_bytes());
    h
}

/// Reads and checks one header: ours, our protocol, a kind we know.
pub fn parse_head(h: &[u8]) -> Result<Head, String> {
    if h.len() < HEADER || &h[..4] != WIRE {
        return Err("not a gang peer (no NPGR header)".into());
    }
    let protocol = u16::from_le_bytes([h[4], h[5]]);
    if protocol != PROTOCOL {
        return Err(format!(
            "gang protocol {protocol}, this nccl-preflight speaks {PROTOCOL}: run the same nccl-preflight in every pod"
        ));
    }
    let code = u16::from_le_bytes([h[6], h[7]]);
    let word = |a: usize| u32::from_le_bytes([h[a], h[a + 1], h[a + 2], h[a + 3]]);
    Ok(Head {
        kind: Kind::of(code).ok_or_else(|| format!("a frame of kind {code}"))?,
        job: u64::from_le_bytes([h[8], h[9], h[10], h[11], h[12], h[13], h[14], h[15]]),
        rank: word(16),
        len: word(20) as usize,
    })
}

/// A TCP connection read and written without blocking: what arrives is kept until
/// a whole frame is there, what is sent waits in an outbox until the socket takes it
/// (pieces, each with how much of it is written; a body sent to every pod is one
/// piece they all share, so rank 0 holds the table once, not once per pod).
pub struct Conn {
    stream: TcpStream,
    pub from: SocketAddr,
    inbox: Vec<u8>,
    outbox: VecDeque<(Arc<[u8]>, usize)>,
    /// Bytes received so far (0: the peer has said nothing yet).
    pub received: usize,
}

impl Conn {
    pub fn new(stream: TcpStream, from: SocketAddr) -> std::io::Result<Conn> {
        stream.set_nonblocking(true)?;
        let _ = stream.set_nodelay(true);
        Ok(Conn {
            stream,
            from,
            inbox: Vec::new(),
            outbox: VecDeque::new(),
            received: 0,
        })
    }

    pub fn stream(&self) -> &TcpStream {
        &self.stream
    }

    /// Reads what has arrived, keeping at most `cap` bytes buffered (the rest
    /// waits in the kernel). Err: the peer closed or the connection broke.
    pub fn pull(&mut self, cap: usize) -> Result<(), String> {
        let mut chunk = [0u8; 16 << 10];
        while self.inbox.len() < cap {
            let room = (cap - self.inbox.len()).min(chunk.len());
            match self.stream.read(&mut chunk[..room]) {
                Ok(0) => return Err("the connection closed".into()),
                Ok(n) => {
                    self.inbox.extend_from_slice(&chunk[..n]);
                    self.received += n;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e.to_string()),
            }
        }
        Ok(())
    }

    /// The header at the front of the inbox, once its 24 bytes are there.
    pub fn head(&self) -> Option<Result<Head, String>> {
        (self.inbox.len() >= HEADER).then(|| parse_head(&self.inbox[..HEADER]))
    }

    /// The next whole frame, if one is there; Err when its header is not ours or its
    /// body is over `limit` for its kind (nothing of the body is kept).
    pub fn frame(
        &mut self,
        limit: impl Fn(Kind) -> usize,
    ) -> Result<Option<(Head, Vec<u8>)>, String> {
        let head = match self.head() {
            None => return Ok(None),
            Some(h) => h?,
        };
        if head.len > limit(head.kind) {
            return Err(format!(
                "a {:?} body of {} bytes, more than the {} allowed",
                head.kind,
                head.len,
                limit(head.kind)
            ));
        }
        if self.inbox.len() < HEADER + head.len {
            return Ok(None);
        }
        // The frame leaves the inbox without a copy of its body (a table is megabytes).
        let rest = self.inbox.split_off(HEADER + head.len);
        let mut body = std::mem::replace(&mut self.inbox, rest);
        body.drain(..HEADER);
        Ok(Some((head, body)))
    }

    /// Queues a frame.
    pub fn push(&mut self, kind: Kind, job: u64, rank: u32, body: &[u8]) {
        self.push_shared(kind, job, rank, Arc::from(body));
    }

    /// Queues a frame whose body other connections share.
    pub fn push_shared(&mut self, kind: Kind, job: u64, rank: u32, body: Arc<[u8]>) {
        let head: Arc<[u8]> = Arc::from(&header(kind, job, rank, body.len())[..]);
        self.outbox.push_back((head, 0));
        self.outbox.push_back((body, 0));
    }

    /// Writes what the socket takes now; Ok(true) once the outbox is empty.
    pub fn flush(&mut self) -> Result<bool, String> {
        while let Some((piece, done)) = self.outbox.front_mut() {
            if *done >= piece.len() {
                self.outbox.pop_front();
                continue;
            }
            match self.stream.write(&piece[*done..]) {
                Ok(0) => return Err("the connection closed".into()),
                Ok(n) => *done += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e.to_string()),
            }
        }
        Ok(true)
    }

    /// Whether something waits to be written.
    pub fn sending(&self) -> bool {
        !self.outbox.is_empty()
    }
}

/// Two claims of one rank.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Duplicate {
    pub rank: u64,
    /// The address whose record was kept, and the one refused.
    pub kept: String,
    pub refused: String,
}

/// What rank 0 gathered and every pod judges.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Table {
    /// Each rank's record, as sent; None for a rank that never reported.
    pub records: Vec<Option<Vec<u8>>>,
    pub duplicates: Vec<Duplicate>,
    /// Connections refused (another job, an earlier attempt, not a gang peer):
    /// `address: reason`, the first MAX_REFUSALS_KEPT of `refused_count`.
    pub refused: Vec<String>,
    pub refused_count: u64,
    /// The port rank 0's NCCL root listens on (0: none, NCCL does not run).
    pub nccl_port: u16,
}

/// Refused connections kept as evidence (the rest are counted).
pub const MAX_REFUSALS_KEPT: usize = 16;

/// Appends `bytes` with a u32 length.
fn put(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(bytes);
}

/// Reads what [`put`] wrote, bounded by `max`.
fn take<'a>(body: &'a [u8], at: &mut usize, max: usize) -> Result<&'a [u8], String> {
    let len = body
        .get(*at..*at + 4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
        .ok_or("the table ends early")?;
    if len > max {
        return Err(format!("a table entry of {len} bytes, more than {max}"));
    }
    let item = body
        .get(*at + 4..*at + 4 + len)
        .ok_or("the table ends early")?;
    *at += 4 + len;
    Ok(item)
}

/// A peer's text, made printable.
pub fn text(bytes: &[u8]) -> String {
    crate::render::visible(&String::from_utf8_lossy(bytes)).into_owned()
}

fn number<const N: usize>(b: &[u8]) -> Result<[u8; N], String> {
    b.try_into().map_err(|_| "a malformed number".to_string())
}

impl Table {
    /// Body: the rank count, each rank's record (empty: none), the duplicates
    /// (rank, kept, refused), the refusals kept and their total, NCCL's root port;
    /// lengths u32 LE.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        put(&mut out, &(self.records.len() as u32).to_le_bytes());
        for r in &self.records {
            put(&mut out, r.as_deref().unwrap_or(&[]));
        }
        put(&mut out, &(self.duplicates.len() as u32).to_le_bytes());
        for d in &self.duplicates {
            put(&mut out, &d.rank.to_le_bytes());
            put(&mut out, d.kept.as_bytes());
            put(&mut out, d.refused.as_bytes());
        }
        put(&mut out, &(self.refused.len() as u32).to_le_bytes());
        for r in &self.refused {
            put(&mut out, r.as_bytes());
        }
        put(&mut out, &self.refused_count.to_le_bytes());
        put(&mut out, &self.nccl_port.to_le_bytes());
        out
    }

    /// Reads a table for `nodes` ranks; every string in it escaped.
    pub fn decode(body: &[u8], nodes: u64) -> Result<Table, String> {
        let mut at = 0;
        let count = |b: &[u8]| number::<4>(b).map(|a| u32::from_le_bytes(a) as usize);
        let n = count(take(body, &mut at, 4)?)?;
        if n as u64 != nodes {
            return Err(format!("a table of {n} ranks, this gang has {nodes}"));
        }
        let mut t = Table::default();
        for _ in 0..n {
            let r = take(body, &mut at, FINGERPRINT_BYTES)?;
            t.records.push((!r.is_empty()).then(|| r.to_vec()));
        }
        let dups = count(take(body, &mut at, 4)?)?.min(n);
        for _ in 0..dups {
            t.duplicates.push(Duplicate {
                rank: u64::from_le_bytes(number(take(body, &mut at, 8)?)?),
                kept: text(take(body, &mut at, 64)?),
                refused: text(take(body, &mut at, 64)?),
            });
        }
        let kept = count(take(body, &mut at, 4)?)?.min(MAX_REFUSALS_KEPT);
        for _ in 0..kept {
            t.refused.push(text(take(body, &mut at, MAX_REASON + 64)?));
        }
        t.refused_count = u64::from_le_bytes(number(take(body, &mut at, 8)?)?);
        t.nccl_port = u16::from_le_bytes(number(take(body, &mut at, 2)?)?);
        Ok(t)
    }

    /// Ranks with no record.
    pub fn missing(&self) -> Vec<usize> {
        (0..self.records.len())
            .filter(|&i| self.records[i].is_none())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_round_trips_and_refuses_bad_bodies() {
        let t = Table {
            records: vec![Some(b"a".to_vec()), None, Some(vec![7; 100])],
            duplicates: vec![Duplicate {
                rank: 2,
                kept: "10.0.0.3".into(),
                refused: "10.0.0.9".into(),
            }],
            refused: vec!["10.0.0.7:1: stale\n".into()],
            refused_count: 3,
            nccl_port: 40123,
        };
        let body = t.encode();
        let back = Table::decode(&body, 3).unwrap();
        assert_eq!(back.records, t.records);
        assert_eq!(back.duplicates, t.duplicates);
        assert_eq!(back.nccl_port, 40123);
        // Escaped on the way in.
        assert_eq!(back.refused, ["10.0.0.7:1: stale\\x0a"]);
        assert_eq!(back.missing(), [1]);
        assert!(Table::decode(&body, 4).unwrap_err().contains("3 ranks"));
        assert!(Table::decode(&body[..body.len() - 1], 3).is_err());
        let mut huge = Vec::new();
        put(&mut huge, &1u32.to_le_bytes());
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(Table::decode(&huge, 1).unwrap_err().contains("more than"));
    }

    #[test]
    fn headers_refuse_strangers_other_protocols_and_unknown_kinds() {
        let h = header(Kind::Beat, 42, 3, 10);
        assert_eq!(
            parse_head(&h).unwrap(),
            Head {
                kind: Kind::Beat,
                job: 42,
                rank: 3,
                len: 10
            }
        );
        assert!(
            parse_head(b"GET / HTTP/1.0\r\n\r\n......")
                .unwrap_err()
                .contains("not a gang peer")
        );
        let mut old = h;
        old[4] = 1;
        assert!(parse_head(&old).unwrap_err().contains("protocol 1"));
        let mut odd = h;
        odd[6] = 99;
        assert!(parse_head(&odd).unwrap_err().contains("kind 99"));
    }

    #[test]
    fn a_connection_yields_whole_frames_and_refuses_an_oversized_body_unread() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut peer = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, from) = l.accept().unwrap();
        let mut c = Conn::new(s, from).unwrap();
        let mut bytes = header(Kind::Hello, 1, 0, 5).to_vec();
        bytes.extend_from_slice(b"hello");
        // Sent in two pieces: no frame until the whole body is there.
        peer.write_all(&bytes[..10]).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        c.pull(1 << 20).unwrap();
        assert_eq!(c.frame(|_| 100).unwrap(), None);
        peer.write_all(&bytes[10..]).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        c.pull(1 << 20).unwrap();
        let (head, body) = c.frame(|_| 100).unwrap().unwrap();
        assert_eq!((head.kind, body.as_slice()), (Kind::Hello, &b"hello"[..]));
        assert_eq!(c.received, 29);
        peer.write_all(&header(Kind::Hello, 1, 0, 1 << 30)).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        c.pull(1 << 20).unwrap();
        assert!(c.frame(|_| 100).unwrap_err().contains("more than the 100"));
        drop(peer);
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(c.pull(1 << 20).is_err());
    }
}
