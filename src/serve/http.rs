//! A deliberately small HTTP/1.1 server for four GET endpoints: std's sockets and
//! threads, httparse for the request head, and every bound explicit (no HTTP server
//! crate offered all of them). One request per connection (`Connection: close`);
//! the request head may be at most `MAX_HEAD` bytes and `MAX_HEADERS` lines and
//! must arrive within `REQUEST_TIME`; at most `MAX_CONNECTIONS` are served at
//! once (more get 503 at once); bodies are never read. Handlers only read
//! prepared state, so no request waits on a driver call.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

pub const MAX_HEAD: usize = 8 * 1024;
pub const MAX_HEADERS: usize = 64;
pub const MAX_CONNECTIONS: usize = 32;
pub const REQUEST_TIME: Duration = Duration::from_secs(2);
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

fn send(stream: &mut TcpStream, response: &Response, head_only: bool) {
    let head = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\nCache-Control: no-store\r\n\r\n",
        response.status,
        reason(response.status),
        response.content_type,
        response.body.len()
    );
    let _ = stream.write_all(head.as_bytes());
    if !head_only {
        let _ = stream.write_all(response.body.as_bytes());
    }
    let _ = stream.flush();
}

/// The request's method and path, or the response that refuses the request.
fn read_request(stream: &mut TcpStream) -> Result<(String, String), Response> {
    let started = Instant::now();
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    loop {
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut request = httparse::Request::new(&mut headers);
        match request.parse(&head) {
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
        let _ = stream.set_read_timeout(Some(left));
        match stream.read(&mut buf) {
            Ok(0) => return Err(Response::text(400, "connection closed mid-request\n")),
            Ok(n) => head.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return Err(Response::text(408, "request took too long\n")),
        }
    }
}

fn handle(mut stream: TcpStream, route: &(dyn Fn(&str) -> Response + Sync)) {
    let _ = stream.set_write_timeout(Some(REQUEST_TIME));
    let (method, path) = match read_request(&mut stream) {
        Ok(r) => r,
        Err(refusal) => return send(&mut stream, &refusal, false),
    };
    let head_only = method == "HEAD";
    let response = if method == "GET" || head_only {
        route(&path)
    } else {
        Response::text(405, "only GET and HEAD\n")
    };
    send(&mut stream, &response, head_only);
}

/// Serves until `stop` is set; returns within `POLL` of it (connections in flight
/// finish on their own threads, bounded by `REQUEST_TIME`).
pub fn serve(
    listener: TcpListener,
    stop: &AtomicBool,
    route: Arc<dyn Fn(&str) -> Response + Send + Sync>,
) -> std::io::Result<()> {
    use std::os::fd::AsFd;
    listener.set_nonblocking(true)?;
    let active = Arc::new(AtomicUsize::new(0));
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
        if active.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
            active.fetch_sub(1, Ordering::AcqRel);
            let mut s = stream;
            let _ = s.set_write_timeout(Some(Duration::from_millis(100)));
            send(
                &mut s,
                &Response::text(503, "too many connections\n"),
                false,
            );
            continue;
        }
        let (route, done) = (Arc::clone(&route), Arc::clone(&active));
        let spawned = std::thread::Builder::new()
            .name("http".into())
            .spawn(move || {
                handle(stream, route.as_ref());
                done.fetch_sub(1, Ordering::AcqRel);
            });
        if spawned.is_err() {
            // The closure (and the connection) were dropped unrun.
            active.fetch_sub(1, Ordering::AcqRel);
            std::thread::sleep(POLL);
        }
    }
    Ok(())
}
