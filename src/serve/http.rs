//! A deliberately small HTTP/1.1 server for four GET endpoints: std's sockets and
//! threads, httparse for the request head, and every bound explicit (no HTTP server
//! crate offered all of them). One request per connection (`Connection: close`);
//! the request head may be at most `MAX_HEAD` bytes (more gets 431, then the rest
//! is read and dropped, up to a bound, so the client sees the answer rather than
//! a reset) and `MAX_HEADERS` lines, and must arrive within `REQUEST_TIME`;
//! bodies are never read. Handlers only read prepared state, so no request waits
//! on a driver call; POST is routed as "POST /path", and serve's one POST
//! (/job/diagnose) waits on NCCL's RAS within its own bounds (serve/ras/diagnose.rs).
//!
//! Probes must keep answering while anything that can reach the port opens
//! connections and sends nothing (or a byte at a time), or asks for /report and reads
//! the answer slowly or never: the kubelet restarts a sidecar whose /healthz fails.
//! So at most `MAX_CONNECTIONS` are served at once, and when all are taken one is
//! closed to make room for the new one: the oldest still waiting for its request head
//! or closing, else the one that has been answering longest, once it has taken more
//! than `SLOW_ANSWER` (a probe's answer fits the socket buffer and is written in
//! microseconds, so a probe is never that one); only when every slot is answering
//! and none has been at it that long does a new connection get 503. A whole response
//! must be written within `RESPONSE_TIME`, however slowly the client reads. Every
//! endpoint gets the same treatment: the protection is in the slots, not the routes.
//!
//! After the answer the connection is closed without a reset: the server stops
//! sending (FIN) and reads and drops what the client still sends (a request body, a
//! pipelined request), bounded; closing with unread data makes the kernel send RST,
//! and the client may then lose the answer it was sent.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const MAX_HEAD: usize = 8 * 1024;
const MAX_HEADERS: usize = 64;
const MAX_CONNECTIONS: usize = 32;
/// The whole request head must arrive within this. A probe sends its head at once;
/// idle and slow connections do not wait this long for a slot to free, because
/// they are evicted first when the slots run out.
const REQUEST_TIME: Duration = Duration::from_secs(2);
/// The whole response (head and body) must be written within this; a client that
/// reads slower is cut off, its answer incomplete.
const RESPONSE_TIME: Duration = Duration::from_secs(5);
/// A connection still answering after this is slow (its client reads slower than the
/// socket buffers drain), and may be closed to make room for a new one.
const SLOW_ANSWER: Duration = Duration::from_millis(250);
/// After the answer, at most this much of what the client still sends is read and
/// dropped before closing, so the client reads the answer instead of a reset.
const DRAIN_BYTES: usize = 64 * 1024;
/// The longest the accept loop waits before looking at the stop flag again.
const POLL: Duration = Duration::from_millis(100);

pub struct Response {
    pub status: u16,
    pub content_type: &'static str,
    pub body: String,
}

impl Response {
    pub fn text(status: u16, body: impl Into<String>) -> Response {
        Response {
            status,
            content_type: "text/plain; charset=utf-8",
            body: body.into(),
        }
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "Error",
    }
}

/// Writes the response, all of it within `within`: each write may block only for
/// what is left of it (`SO_SNDTIMEO` bounds one call, not the response). False when
/// the client did not take it all in time or went away.
fn send(stream: &mut TcpStream, response: &Response, head_only: bool, within: Duration) -> bool {
    let head = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\nCache-Control: no-store\r\n\r\n",
        response.status,
        reason(response.status),
        response.content_type,
        response.body.len()
    );
    let started = Instant::now();
    let body: &[u8] = if head_only {
        &[]
    } else {
        response.body.as_bytes()
    };
    for part in [head.as_bytes(), body] {
        let mut rest = part;
        while !rest.is_empty() {
            let left = within.saturating_sub(started.elapsed());
            if left.is_zero() || stream.set_write_timeout(Some(left)).is_err() {
                return false;
            }
            match stream.write(rest) {
                Ok(0) => return false,
                Ok(n) => rest = &rest[n..],
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
    }
    true
}

/// Where a request head is read from: a socket, or literal chunks in tests.
trait HeadSource: Read {
    /// The next read gives up after `left`.
    fn set_deadline(&mut self, left: Duration);
}

impl HeadSource for TcpStream {
    fn set_deadline(&mut self, left: Duration) {
        let _ = self.set_read_timeout(Some(left));
    }
}

/// The request's method and path, or the response that refuses the request.
fn read_request(stream: &mut impl HeadSource) -> Result<(String, String), Response> {
    let started = Instant::now();
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    loop {
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut request = httparse::Request::new(&mut headers);
        match request.parse(&head) {
            Ok(httparse::Status::Complete(len)) if len > MAX_HEAD => {
                return Err(Response::text(431, "request head too large\n"));
            }
            Ok(httparse::Status::Complete(_)) => {
                let method = request.method.unwrap_or_default();
                let target = request.path.unwrap_or_default();
                let path = target.split('?').next().unwrap_or(target);
                return Ok((method.to_string(), path.to_string()));
            }
            Ok(httparse::Status::Partial) => {}
            Err(httparse::Error::TooManyHeaders) => {
                return Err(Response::text(431, "too many header lines\n"));
            }
            Err(e) => return Err(Response::text(400, format!("malformed request: {e}\n"))),
        }
        if head.len() > MAX_HEAD {
            return Err(Response::text(431, "request head too large\n"));
        }
        let left = REQUEST_TIME.saturating_sub(started.elapsed());
        if left.is_zero() {
            return Err(Response::text(408, "request took too long\n"));
        }
        stream.set_deadline(left);
        match stream.read(&mut buf) {
            Ok(0) => return Err(Response::text(400, "connection closed mid-request\n")),
            Ok(n) => head.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return Err(Response::text(408, "request took too long\n")),
        }
    }
}

/// Closes after an answer without a TCP reset: closing a socket with unread data
/// makes the kernel send RST, and the client may then lose the response it was
/// sent. So: stop sending (FIN after the response), and read and drop what is
/// still arriving (a body, pipelined requests) until the client closes, bounded in
/// bytes and time.
fn close_gracefully(stream: &mut TcpStream) {
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let started = Instant::now();
    let mut buf = [0u8; 4096];
    let mut drained = 0;
    while drained < DRAIN_BYTES {
        let left = REQUEST_TIME.saturating_sub(started.elapsed());
        if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
            break;
        }
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => drained += n,
        }
    }
}

/// Where a connection is, for eviction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for the request head.
    Reading,
    /// Writing the answer, since then.
    Answering(Instant),
    /// Answered; draining what the client still sends before closing.
    Closing,
}

fn handle(mut stream: TcpStream, route: &(dyn Fn(&str) -> Response + Sync), phase: impl Fn(Phase)) {
    let request = read_request(&mut stream);
    phase(Phase::Answering(Instant::now()));
    let (response, head_only) = match request {
        Err(refusal) => (refusal, false),
        Ok((method, path)) if method == "GET" || method == "HEAD" => {
            (route(&path), method == "HEAD")
        }
        // POST is routed as "POST /path" (serve answers POST /job/diagnose only).
        Ok((method, path)) if method == "POST" => (route(&format!("POST {path}")), false),
        Ok(_) => (Response::text(405, "only GET and HEAD\n"), false),
    };
    if send(&mut stream, &response, head_only, RESPONSE_TIME) {
        phase(Phase::Closing);
        close_gracefully(&mut stream);
    } else {
        // Too slow or gone: drop what is still queued for it (a reset, SO_LINGER 0)
        // rather than let the kernel keep trickling an answer that is cut anyway.
        let off = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        let _ = nix::sys::socket::setsockopt(&stream, nix::sys::socket::sockopt::Linger, &off);
    }
}

/// One connection being served.
struct Slot {
    id: u64,
    accepted: Instant,
    phase: Phase,
    /// A second handle on the socket, to shut it down from the accept loop.
    socket: TcpStream,
}

impl Slot {
    /// Which connection to close first when the slots are full (lowest first): one
    /// waiting for its head or closing, oldest first; then one answering for longer
    /// than `SLOW_ANSWER`, longest first. `None`: this one is not to be closed.
    fn eviction_rank(&self, now: Instant) -> Option<(u8, Instant)> {
        match self.phase {
            Phase::Reading | Phase::Closing => Some((0, self.accepted)),
            Phase::Answering(since) if now.duration_since(since) > SLOW_ANSWER => Some((1, since)),
            Phase::Answering(_) => None,
        }
    }
}

/// The connections being served, at most `MAX_CONNECTIONS`.
#[derive(Default)]
struct Slots {
    inner: Mutex<(u64, Vec<Slot>)>,
}

impl Slots {
    fn lock(&self) -> std::sync::MutexGuard<'_, (u64, Vec<Slot>)> {
        // A poisoned lock only means a handler panicked; the table is still whole.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A slot for `stream`, closing another connection (see `Slot::eviction_rank`)
    /// when all are taken; `None` when none may be closed.
    fn admit(&self, stream: &TcpStream) -> Option<u64> {
        let socket = stream.try_clone().ok()?;
        let mut guard = self.lock();
        let (next, slots) = &mut *guard;
        if slots.len() >= MAX_CONNECTIONS {
            let now = Instant::now();
            let evict = slots
                .iter()
                .enumerate()
                .filter_map(|(i, s)| Some((s.eviction_rank(now)?, i)))
                .min()
                .map(|(_, i)| i)?;
            let evicted = slots.swap_remove(evict);
            // Its handler's read or write returns at once and it ends. Its slot is
            // free now, not when that thread ends.
            let _ = evicted.socket.shutdown(std::net::Shutdown::Both);
        }
        *next += 1;
        slots.push(Slot {
            id: *next,
            accepted: Instant::now(),
            phase: Phase::Reading,
            socket,
        });
        Some(*next)
    }

    fn set_phase(&self, id: u64, phase: Phase) {
        if let Some(s) = self.lock().1.iter_mut().find(|s| s.id == id) {
            s.phase = phase;
        }
    }

    fn release(&self, id: u64) {
        self.lock().1.retain(|s| s.id != id);
    }
}

/// Serves until `stop` is set; returns within `POLL` of it (connections in flight
/// finish on their own threads, bounded by `REQUEST_TIME`, `RESPONSE_TIME` and the drain).
pub fn serve(
    listener: TcpListener,
    stop: &AtomicBool,
    route: Arc<dyn Fn(&str) -> Response + Send + Sync>,
) -> std::io::Result<()> {
    use std::os::fd::AsFd;
    listener.set_nonblocking(true)?;
    let slots = Arc::new(Slots::default());
    while !stop.load(Ordering::Relaxed) {
        // Wait for a connection without spinning; SIGTERM interrupts the wait (the
        // handler is installed without SA_RESTART), and the timeout bounds it anyway.
        let mut fds = [nix::poll::PollFd::new(
            listener.as_fd(),
            nix::poll::PollFlags::POLLIN,
        )];
        let timeout = nix::poll::PollTimeout::try_from(POLL.as_millis() as i32)
            .unwrap_or(nix::poll::PollTimeout::MAX);
        match nix::poll::poll(&mut fds, timeout) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
            Ok(_) => {}
            Err(e) => return Err(e.into()),
        }
        let stream = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            // Out of descriptors and the like: wait instead of spinning.
            Err(_) => {
                std::thread::sleep(POLL);
                continue;
            }
        };
        let _ = stream.set_nonblocking(false);
        let Some(id) = slots.admit(&stream) else {
            // Every slot is answering a request: refuse this one at once.
            let mut s = stream;
            send(
                &mut s,
                &Response::text(503, "too many connections\n"),
                false,
                Duration::from_millis(100),
            );
            continue;
        };
        let (route, slots_for_thread) = (Arc::clone(&route), Arc::clone(&slots));
        let spawned = std::thread::Builder::new()
            .name("http".into())
            .spawn(move || {
                handle(stream, route.as_ref(), |phase| {
                    slots_for_thread.set_phase(id, phase)
                });
                slots_for_thread.release(id);
            });
        if spawned.is_err() {
            // The closure (and the connection) were dropped unrun.
            slots.release(id);
            std::thread::sleep(POLL);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes arriving in chunks of the given sizes, then the peer closing.
    struct Chunks {
        data: Vec<u8>,
        at: usize,
        sizes: Vec<usize>,
    }

    impl Read for Chunks {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let size = self.sizes.pop().unwrap_or(usize::MAX).max(1);
            let n = size.min(buf.len()).min(self.data.len() - self.at);
            buf[..n].copy_from_slice(&self.data[self.at..self.at + n]);
            self.at += n;
            Ok(n)
        }
    }

    impl HeadSource for Chunks {
        fn set_deadline(&mut self, _: Duration) {}
    }

    /// A bounded, seeded fuzz of the request head reader: mutations of real
    /// requests (byte flips, insertions, cuts, repeated header lines, long lines),
    /// arriving in random chunk sizes, get a method and path or one of the
    /// documented refusals (400, 408, 431), never a panic, and heads over 8 KiB are
    /// never accepted.
    #[test]
    fn fuzz_request_heads_with_seeded_mutations() {
        let seeds: [&[u8]; 4] = [
            b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
            b"HEAD /metrics?x=1 HTTP/1.0\n\n",
            b"GET /report HTTP/1.1\r\nAccept: */*\r\nUser-Agent: kube-probe/1.30\r\n\r\n",
            b"POST /readyz HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello",
        ];
        let mut rng = fastrand::Rng::with_seed(crate::test_facts::fuzz_seed(0x5eed));
        let mut next = move |n: usize| rng.usize(..n.max(1));
        let (mut ok, mut refused) = (0, 0);
        for _ in 0..crate::test_facts::fuzz_iterations(3000) {
            let mut data = seeds[next(seeds.len())].to_vec();
            for _ in 0..=next(3) {
                let at = next(data.len() + 1);
                match next(6) {
                    0 if at < data.len() => data[at] = next(256) as u8,
                    1 => data.insert(at, next(256) as u8),
                    2 => data.truncate(at),
                    3 => {
                        let line = b"X-A: b\r\n".repeat(next(100));
                        data.splice(at..at, line);
                    }
                    4 => {
                        data.splice(at..at, vec![b'a'; next(20_000)]);
                    }
                    _ => {
                        data.splice(at..at, b"\r\n".to_vec());
                    }
                };
            }
            let sizes = (0..64).map(|_| 1 + next(2048)).collect();
            let mut source = Chunks {
                data: data.clone(),
                at: 0,
                sizes,
            };
            match read_request(&mut source) {
                Ok((method, _)) => {
                    ok += 1;
                    assert!(!method.is_empty(), "{:?}", String::from_utf8_lossy(&data));
                    let end = data.windows(2).position(|w| w == b"\n\n" || w == b"\r\n");
                    assert!(
                        end.is_some_and(|e| e <= MAX_HEAD),
                        "an over-long head was accepted"
                    );
                }
                Err(r) => {
                    refused += 1;
                    assert!([400, 408, 431].contains(&r.status), "{}", r.status);
                }
            }
        }
        assert!(
            ok > 300 && refused > 300,
            "accepted {ok}, refused {refused}"
        );
    }
}
