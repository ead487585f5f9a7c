//! The gang's own rendezvous, before NCCL is touched: rank 0 listens on the
//! gang port, every pod connects (retrying while rank 0 starts), sends its
//! fingerprint record and gets the whole table back, so every pod judges the
//! same table, and the odd pod is named even when the stacks are too different
//! for NCCL to form a communicator (as torchrun's c10d TCPStore and MPI's PMI
//! exchange what they need before the collective library starts).
//!
//! Wire format, both ways: a 24-byte header `NPGR` | protocol (u16 LE) | kind
//! (u16 LE: 1 hello, 2 table, 3 refused) | job key (u64 LE) | rank (u32 LE) |
//! body length (u32 LE), then the body. A hello's body is the sender's record
//! (at most `FINGERPRINT_BYTES`), a table's is every rank's record (see
//! [`Table::encode`]), a refusal's a reason of at most 512 bytes.
//!
//! Bounds: a body over its kind's limit is refused before it is read; every
//! read and write runs under a deadline (a hello within `HELLO_WITHIN` of the
//! connection, the table within the gang's timeout); at most `MAX_READERS`
//! connections are read at once; at most one record per rank is kept, a second
//! claim is refused and reported (a duplicate rank is itself a finding). The
//! job key (`handle::magic`) is derived from the job's identity (root, port,
//! pod count, attempt): a stale pod of an earlier attempt, or of another job,
//! is refused with a reason it prints. Every string a peer sends is escaped
//! before it is shown (`Fingerprint::decode`, `render::visible`).
//!
//! It is not a security boundary: anyone who can reach the port and knows the
//! job's identity can claim a rank, as with NCCL's own bootstrap.

use super::fingerprint::FINGERPRINT_BYTES;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::time::{Duration, Instant};

const WIRE: &[u8; 4] = b"NPGR";
/// The protocol's version; a peer speaking another is refused by name.
pub const PROTOCOL: u16 = 1;
const HEADER: usize = 24;
const HELLO: u16 = 1;
const TABLE: u16 = 2;
const REFUSED: u16 = 3;
/// A connection must deliver its hello within this.
pub const HELLO_WITHIN: Duration = Duration::from_secs(5);
/// Sending the table to one pod may take this long.
const SEND_WITHIN: Duration = Duration::from_secs(10);
/// Connections read at once; more are closed unread.
const MAX_READERS: usize = 256;
/// A refusal's reason, bytes.
const MAX_REASON: usize = 512;
/// Refused connections kept as evidence (the rest are counted).
const MAX_REFUSALS_KEPT: usize = 16;
/// Between connection attempts while rank 0 is not listening yet.
const RETRY: Duration = Duration::from_millis(200);

/// Two claims of one rank.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
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
    refused_count: u64,
}

/// Why a pod got no table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// Rank 0 could not listen on the gang port.
    Listen(String),
    /// Nothing accepted a connection before the deadline.
    Unreachable(String),
    /// Rank 0 refused this pod, saying why.
    Refused(String),
    /// Connected, then no table came (closed, timed out or malformed).
    NoTable(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Listen(e) => write!(f, "rank 0 could not listen on the gang port: {e}"),
            Failure::Unreachable(e) => write!(f, "no connection to rank 0: {e}"),
            Failure::Refused(why) => write!(f, "rank 0 refused this pod: {why}"),
            Failure::NoTable(e) => write!(f, "rank 0 sent no table: {e}"),
        }
    }
}

fn header(kind: u16, job: u64, rank: u32, len: usize) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[..4].copy_from_slice(WIRE);
    h[4..6].copy_from_slice(&PROTOCOL.to_le_bytes());
    h[6..8].copy_from_slice(&kind.to_le_bytes());
    h[8..16].copy_from_slice(&job.to_le_bytes());
    h[16..20].copy_from_slice(&rank.to_le_bytes());
    h[20..24].copy_from_slice(&(len as u32).to_le_bytes());
    h
}

/// Writes one frame within `within`.
fn send(stream: &mut TcpStream, kind: u16, job: u64, rank: u32, body: &[u8], within: Duration) {
    let _ = stream.set_write_timeout(Some(within));
    let mut frame = header(kind, job, rank, body.len()).to_vec();
    frame.extend_from_slice(body);
    let _ = stream.write_all(&frame);
}

/// Fills `buf` from `stream` before `deadline`.
fn read_full(stream: &mut TcpStream, buf: &mut [u8], deadline: Instant) -> Result<(), String> {
    let mut got = 0;
    while got < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!(
                "nothing more within the deadline ({got} of {} bytes)",
                buf.len()
            ));
        }
        let _ = stream.set_read_timeout(Some(left));
        match stream.read(&mut buf[got..]) {
            Ok(0) => {
                return Err(format!(
                    "the connection closed after {got} of {} bytes",
                    buf.len()
                ));
            }
            Ok(n) => got += n,
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(e.to_string()),
        }
    }
    Ok(())
}

/// A frame's header fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Head {
    kind: u16,
    job: u64,
    rank: u32,
    len: usize,
}

/// Reads and checks one header: ours, our protocol.
fn read_head(stream: &mut TcpStream, deadline: Instant) -> Result<Head, String> {
    let mut h = [0u8; HEADER];
    read_full(stream, &mut h, deadline)?;
    if &h[..4] != WIRE {
        return Err("not a gang peer (no NPGR header)".into());
    }
    let protocol = u16::from_le_bytes([h[4], h[5]]);
    if protocol != PROTOCOL {
        return Err(format!(
            "gang protocol {protocol}, this nccl-preflight speaks {PROTOCOL}: run the same nccl-preflight in every pod"
        ));
    }
    let word = |a: usize| u32::from_le_bytes([h[a], h[a + 1], h[a + 2], h[a + 3]]);
    Ok(Head {
        kind: u16::from_le_bytes([h[6], h[7]]),
        job: u64::from_le_bytes([h[8], h[9], h[10], h[11], h[12], h[13], h[14], h[15]]),
        rank: word(16),
        len: word(20) as usize,
    })
}

/// Reads a body of `len` bytes, refused past `max`.
fn read_body(
    stream: &mut TcpStream,
    len: usize,
    max: usize,
    deadline: Instant,
) -> Result<Vec<u8>, String> {
    if len > max {
        return Err(format!(
            "a body of {len} bytes, more than the {max} allowed"
        ));
    }
    let mut body = vec![0u8; len];
    read_full(stream, &mut body, deadline)?;
    Ok(body)
}

/// The largest table body for `nodes` ranks.
fn table_limit(nodes: u64) -> usize {
    (nodes as usize)
        .saturating_mul(FINGERPRINT_BYTES + 4)
        .saturating_add(64 * 1024)
}

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

fn text(bytes: &[u8]) -> String {
    crate::render::visible(&String::from_utf8_lossy(bytes)).into_owned()
}

impl Table {
    /// Body: the rank count, each rank's record (empty: none), the duplicates
    /// (rank, kept, refused), the refusals kept and their total; lengths u32 LE.
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
        out
    }

    /// Reads a table for `nodes` ranks; every string in it escaped.
    pub fn decode(body: &[u8], nodes: u64) -> Result<Table, String> {
        let mut at = 0;
        let count = |b: &[u8]| -> Result<usize, String> {
            b.try_into()
                .map(|a: [u8; 4]| u32::from_le_bytes(a) as usize)
                .map_err(|_| "a malformed count".to_string())
        };
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
            let rank = take(body, &mut at, 8)?;
            let rank = rank
                .try_into()
                .map(u64::from_le_bytes)
                .map_err(|_| "a malformed rank")?;
            t.duplicates.push(Duplicate {
                rank,
                kept: text(take(body, &mut at, 64)?),
                refused: text(take(body, &mut at, 64)?),
            });
        }
        let kept = count(take(body, &mut at, 4)?)?.min(MAX_REFUSALS_KEPT);
        for _ in 0..kept {
            t.refused.push(text(take(body, &mut at, MAX_REASON + 64)?));
        }
        let total = take(body, &mut at, 8)?;
        t.refused_count = total
            .try_into()
            .map(u64::from_le_bytes)
            .map_err(|_| "a malformed total")?;
        Ok(t)
    }

    /// Ranks with no record.
    pub fn missing(&self) -> Vec<usize> {
        (0..self.records.len())
            .filter(|&i| self.records[i].is_none())
            .collect()
    }
}

/// What a reader thread learnt from one connection.
enum Arrival {
    Hello {
        rank: u64,
        record: Vec<u8>,
        stream: TcpStream,
        from: SocketAddr,
    },
    Refused {
        from: SocketAddr,
        reason: String,
    },
}

/// Reads one connection's hello and checks it; a stale or foreign peer is told why.
fn read_hello(
    mut stream: TcpStream,
    from: SocketAddr,
    job: u64,
    nodes: u64,
    deadline: Instant,
) -> Arrival {
    let refuse = |reason: String| Arrival::Refused { from, reason };
    let head = match read_head(&mut stream, deadline) {
        Ok(h) => h,
        Err(e) => return refuse(e),
    };
    if head.job != job {
        let why = "its job key differs from rank 0's: a pod of an earlier attempt of this job, or of another job (root, port, pod count or --gang-attempt differ)";
        send(
            &mut stream,
            REFUSED,
            job,
            head.rank,
            why.as_bytes(),
            HELLO_WITHIN,
        );
        return refuse(why.to_string());
    }
    if head.kind != HELLO || u64::from(head.rank) >= nodes {
        let why = format!(
            "a frame of kind {} for rank {} (the gang has {nodes} pods)",
            head.kind, head.rank
        );
        send(
            &mut stream,
            REFUSED,
            job,
            head.rank,
            why.as_bytes(),
            HELLO_WITHIN,
        );
        return refuse(why);
    }
    match read_body(&mut stream, head.len, FINGERPRINT_BYTES, deadline) {
        Ok(record) => Arrival::Hello {
            rank: u64::from(head.rank),
            record,
            stream,
            from,
        },
        Err(e) => refuse(e),
    }
}

/// A rank's record as rank 0 holds it: the record, the connection to answer on
/// (none for rank 0's own) and the address it came from.
type Held = (Vec<u8>, Option<TcpStream>, String);

/// Rank 0's side while it collects records.
struct Collector {
    job: u64,
    records: Vec<Option<Held>>,
    table: Table,
}

impl Collector {
    fn arrive(&mut self, arrival: Arrival) {
        match arrival {
            Arrival::Refused { from, reason } => {
                self.table.refused_count += 1;
                if self.table.refused.len() < MAX_REFUSALS_KEPT {
                    self.table
                        .refused
                        .push(format!("{from}: {}", crate::render::visible(&reason)));
                }
            }
            Arrival::Hello {
                rank,
                record,
                mut stream,
                from,
            } => {
                let slot = &mut self.records[rank as usize];
                if let Some((_, _, kept)) = slot {
                    let why = format!("rank {rank} is already taken by {kept}");
                    send(
                        &mut stream,
                        REFUSED,
                        self.job,
                        rank as u32,
                        why.as_bytes(),
                        HELLO_WITHIN,
                    );
                    self.table.duplicates.push(Duplicate {
                        rank,
                        kept: kept.clone(),
                        refused: from.ip().to_string(),
                    });
                } else {
                    *slot = Some((record, Some(stream), from.ip().to_string()));
                }
            }
        }
    }

    /// Every rank reported, or every pod that exists did (a duplicate stands for a missing one).
    fn complete(&self) -> bool {
        let present = self.records.iter().filter(|r| r.is_some()).count();
        present + self.table.duplicates.len() >= self.records.len()
    }
}

/// Rank 0: listens at `at`, collects every rank's record until all have come
/// or `deadline`, and sends the table to every pod that reported. `own` is
/// rank 0's record.
pub fn serve(
    at: SocketAddr,
    job: u64,
    nodes: u64,
    own: &[u8],
    deadline: Instant,
) -> Result<Table, Failure> {
    let listener = TcpListener::bind(at).map_err(|e| Failure::Listen(format!("{at}: {e}")))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| Failure::Listen(e.to_string()))?;
    let mut c = Collector {
        job,
        records: (0..nodes).map(|_| None).collect(),
        table: Table::default(),
    };
    c.records[0] = Some((own.to_vec(), None, at.ip().to_string()));
    let (tx, rx): (Sender<Arrival>, Receiver<Arrival>) = channel();
    let readers = Arc::new(AtomicUsize::new(0));
    while !c.complete() && Instant::now() < deadline {
        match listener.accept() {
            Ok((stream, from)) => accept(stream, from, &c, nodes, deadline, &tx, &readers),
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
        while let Ok(a) = rx.try_recv() {
            c.arrive(a);
        }
    }
    // NCCL's root binds this port next: the listener goes first. Measured on 4x H100 with
    // NCCL 2.28.9 (tests/data/h100x4): the root bound it at once after the table went out.
    drop(listener);
    Ok(broadcast(c))
}

/// Hands a new connection to a reader thread (at most MAX_READERS at once).
fn accept(
    stream: TcpStream,
    from: SocketAddr,
    c: &Collector,
    nodes: u64,
    deadline: Instant,
    tx: &Sender<Arrival>,
    readers: &Arc<AtomicUsize>,
) {
    if readers.load(Ordering::SeqCst) >= MAX_READERS || stream.set_nonblocking(false).is_err() {
        return;
    }
    readers.fetch_add(1, Ordering::SeqCst);
    let (tx, count, job) = (tx.clone(), Arc::clone(readers), c.job);
    let by = deadline.min(Instant::now() + HELLO_WITHIN);
    let spawned = std::thread::Builder::new()
        .name("gang-hello".into())
        .spawn(move || {
            let _ = tx.send(read_hello(stream, from, job, nodes, by));
            count.fetch_sub(1, Ordering::SeqCst);
        });
    if spawned.is_err() {
        readers.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Sends the table to every pod that reported, 64 at a time, each within SEND_WITHIN.
fn broadcast(c: Collector) -> Table {
    let mut table = c.table;
    let mut streams = Vec::new();
    table.records = c
        .records
        .into_iter()
        .enumerate()
        .map(|(rank, r)| {
            r.map(|(record, stream, _)| {
                if let Some(s) = stream {
                    streams.push((rank, s));
                }
                record
            })
        })
        .collect();
    let body = table.encode();
    let job = c.job;
    for chunk in streams.chunks_mut(64) {
        std::thread::scope(|scope| {
            for (rank, s) in chunk.iter_mut() {
                let body = &body;
                scope.spawn(move || send(s, TABLE, job, *rank as u32, body, SEND_WITHIN));
            }
        });
    }
    table
}

/// Connects to `root`, retrying until `connect_by`.
fn connect(root: SocketAddr, connect_by: Instant) -> Result<TcpStream, Failure> {
    let mut last = String::from("no attempt");
    loop {
        let left = connect_by.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Failure::Unreachable(format!("{root}: {last}")));
        }
        match TcpStream::connect_timeout(&root, left.min(Duration::from_secs(2))) {
            Ok(s) => return Ok(s),
            Err(e) => last = e.to_string(),
        }
        std::thread::sleep(RETRY.min(connect_by.saturating_duration_since(Instant::now())));
    }
}

/// A non-root rank: connects to rank 0 at `root` (retrying until `connect_by`),
/// sends `own` and waits up to `table_within` after connecting for the table.
pub fn join(
    root: SocketAddr,
    job: u64,
    rank: u64,
    nodes: u64,
    own: &[u8],
    connect_by: Instant,
    table_within: Duration,
) -> Result<Table, Failure> {
    let mut stream = connect(root, connect_by)?;
    let deadline = Instant::now() + table_within;
    send(&mut stream, HELLO, job, rank as u32, own, HELLO_WITHIN);
    let head = read_head(&mut stream, deadline).map_err(Failure::NoTable)?;
    // A refusal carries rank 0's own key, which is the point when ours is stale.
    if head.job != job && head.kind != REFUSED {
        return Err(Failure::NoTable("a reply with another job key".into()));
    }
    match head.kind {
        REFUSED => {
            let why =
                read_body(&mut stream, head.len, MAX_REASON, deadline).map_err(Failure::NoTable)?;
            Err(Failure::Refused(text(&why)))
        }
        TABLE => {
            let body = read_body(&mut stream, head.len, table_limit(nodes), deadline)
                .map_err(Failure::NoTable)?;
            Table::decode(&body, nodes).map_err(Failure::NoTable)
        }
        k => Err(Failure::NoTable(format!("a frame of kind {k}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    }

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
        };
        let body = t.encode();
        let back = Table::decode(&body, 3).unwrap();
        assert_eq!(back.records, t.records);
        assert_eq!(back.duplicates, t.duplicates);
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
    fn three_ranks_meet_and_each_gets_every_record() {
        let at = port();
        let deadline = Instant::now() + Duration::from_secs(10);
        let joins: Vec<_> = (1..3u64)
            .map(|r| {
                std::thread::spawn(move || {
                    join(
                        at,
                        42,
                        r,
                        3,
                        format!("rec{r}").as_bytes(),
                        deadline,
                        Duration::from_secs(10),
                    )
                })
            })
            .collect();
        let root = serve(at, 42, 3, b"rec0", deadline).unwrap();
        let want: Vec<Option<Vec<u8>>> = (0..3)
            .map(|r| Some(format!("rec{r}").into_bytes()))
            .collect();
        assert_eq!(root.records, want);
        for j in joins {
            assert_eq!(j.join().unwrap().unwrap().records, want);
        }
    }

    #[test]
    fn a_stale_pod_a_duplicate_rank_and_garbage_are_refused_and_reported() {
        let at = port();
        let deadline = Instant::now() + Duration::from_secs(10);
        let within = Duration::from_secs(10);
        let stale = std::thread::spawn(move || join(at, 41, 1, 3, b"old", deadline, within));
        let garbage = std::thread::spawn(move || {
            let mut s = connect(at, deadline).unwrap();
            let _ = s.write_all(b"GET / HTTP/1.0\r\n\r\n........");
        });
        let first = std::thread::spawn(move || join(at, 42, 1, 3, b"one", deadline, within));
        let root = std::thread::spawn(move || serve(at, 42, 3, b"zero", deadline));
        // The duplicate comes once rank 1's record is in.
        std::thread::sleep(Duration::from_millis(700));
        let dup = join(at, 42, 1, 3, b"two", deadline, within);
        let started = Instant::now();
        let table = root.join().unwrap().unwrap();
        // A duplicate stands for the missing rank: no wait for rank 2 until the deadline.
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(
            matches!(dup, Err(Failure::Refused(ref w)) if w.contains("rank 1 is already taken")),
            "{dup:?}"
        );
        assert!(
            matches!(stale.join().unwrap(), Err(Failure::Refused(ref w)) if w.contains("earlier attempt"))
        );
        garbage.join().unwrap();
        assert_eq!(table.duplicates.len(), 1);
        assert_eq!(table.missing(), [2]);
        assert_eq!(table.refused_count, 2, "{table:?}");
        assert!(
            table.refused.iter().any(|r| r.contains("not a gang peer")),
            "{table:?}"
        );
        assert_eq!(first.join().unwrap().unwrap().duplicates, table.duplicates);
    }

    #[test]
    fn a_silent_connection_is_dropped_within_the_hello_bound_and_a_missing_rank_ends_at_the_deadline()
     {
        let at = port();
        let deadline = Instant::now() + Duration::from_secs(2);
        let silent = std::thread::spawn(move || {
            let s = connect(at, deadline).unwrap();
            std::thread::sleep(Duration::from_secs(3));
            drop(s);
        });
        let started = Instant::now();
        let table = serve(at, 42, 2, b"zero", deadline).unwrap();
        assert!(started.elapsed() < Duration::from_secs(3));
        assert_eq!(table.missing(), [1]);
        silent.join().unwrap();
        // Nobody listening: a bounded failure naming the address.
        let gone = join(
            at,
            42,
            1,
            2,
            b"x",
            Instant::now() + Duration::from_millis(500),
            Duration::from_secs(1),
        );
        assert!(
            matches!(gone, Err(Failure::Unreachable(ref e)) if e.contains(&at.to_string())),
            "{gone:?}"
        );
    }
}
