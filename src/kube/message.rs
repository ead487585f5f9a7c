//! One HTTP/1.1 message read under a deadline and size limits: the request the webhook
//! receives, the response the API client receives. httparse reads the head (at most
//! `MAX_HEAD` bytes, `MAX_HEADERS` lines); the body is `Content-Length` bytes, or for a
//! response also chunked (Go's net/http chunks a body it did not measure first,
//! net/http/server.go) or delimited by the server closing. Every read waits only for
//! what is left of the message's deadline.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Instant;

const MAX_HEAD: usize = 16 * 1024;
const MAX_HEADERS: usize = 64;

/// A stream whose reads and writes a socket timeout can bound.
pub trait Timed: Read + Write {
    fn socket(&self) -> &TcpStream;
}

impl Timed for TcpStream {
    fn socket(&self) -> &TcpStream {
        self
    }
}

impl Timed for rustls::StreamOwned<rustls::ServerConnection, TcpStream> {
    fn socket(&self) -> &TcpStream {
        &self.sock
    }
}

impl Timed for rustls::StreamOwned<rustls::ClientConnection, TcpStream> {
    fn socket(&self) -> &TcpStream {
        &self.sock
    }
}

/// Why a message could not be read, each with the HTTP status a server answers it with.
#[derive(Debug)]
pub enum Refusal {
    /// The deadline passed (408).
    Timeout,
    /// The head or the body is over its limit (431 or 413).
    TooLarge(&'static str),
    /// Not HTTP/1.1 as read here (400).
    Malformed(String),
    /// A request with a body but no Content-Length (411).
    NoLength,
    /// The peer closed or the connection failed before the message ended.
    Closed(String),
}

impl Refusal {
    pub fn status(&self) -> u16 {
        match self {
            Refusal::Timeout => 408,
            Refusal::TooLarge("head") => 431,
            Refusal::TooLarge(_) => 413,
            Refusal::Malformed(_) | Refusal::Closed(_) => 400,
            Refusal::NoLength => 411,
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Timeout => write!(f, "the message did not arrive in time"),
            Refusal::TooLarge(what) => write!(f, "the {what} is over its size limit"),
            Refusal::Malformed(why) => write!(f, "malformed HTTP: {why}"),
            Refusal::NoLength => write!(f, "a body without Content-Length"),
            Refusal::Closed(why) => write!(f, "the connection ended early: {why}"),
        }
    }
}

/// A message read whole.
#[derive(Debug, Default)]
pub struct Message {
    /// A request's method and path (without the query).
    pub method: String,
    pub path: String,
    /// A response's status.
    pub status: u16,
    pub content_type: String,
    pub body: Vec<u8>,
}

/// How the head says the body ends.
enum Framing {
    Length(usize),
    Chunked,
    UntilClose,
}

/// Reads more bytes into `buf`, waiting until `until` at most; false at the end of the
/// stream.
fn read_more(stream: &mut impl Timed, buf: &mut Vec<u8>, until: Instant) -> Result<bool, Refusal> {
    let mut chunk = [0u8; 16 * 1024];
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Refusal::Timeout);
        }
        let _ = stream.socket().set_read_timeout(Some(left));
        match stream.read(&mut chunk) {
            Ok(0) => return Ok(false),
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                return Ok(true);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(Refusal::Timeout);
            }
            Err(e) => return Err(Refusal::Closed(e.to_string())),
        }
    }
}

/// The head's fields, its length and how the body ends; None while incomplete.
fn parse_head(buf: &[u8], request: bool) -> Result<Option<(Message, usize, Framing)>, Refusal> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut message = Message::default();
    let parsed = if request {
        let mut r = httparse::Request::new(&mut headers);
        let status = r.parse(buf);
        if let Ok(httparse::Status::Complete(_)) = status {
            message.method = r.method.unwrap_or_default().to_string();
            let target = r.path.unwrap_or_default();
            message.path = target.split('?').next().unwrap_or(target).to_string();
        }
        status
    } else {
        let mut r = httparse::Response::new(&mut headers);
        let status = r.parse(buf);
        if let Ok(httparse::Status::Complete(_)) = status {
            message.status = r.code.unwrap_or_default();
        }
        status
    };
    let len = match parsed {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(Refusal::TooLarge("head")),
        Err(e) => return Err(Refusal::Malformed(e.to_string())),
    };
    let mut framing = if request {
        Framing::Length(0)
    } else {
        Framing::UntilClose
    };
    for h in headers.iter().take_while(|h| !h.name.is_empty()) {
        let value = String::from_utf8_lossy(h.value).trim().to_string();
        if h.name.eq_ignore_ascii_case("content-length") {
            let n = value
                .parse()
                .map_err(|_| Refusal::Malformed(format!("Content-Length {value:?}")))?;
            framing = Framing::Length(n);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            if request {
                return Err(Refusal::NoLength);
            }
            if !value.eq_ignore_ascii_case("chunked") {
                return Err(Refusal::Malformed(format!("Transfer-Encoding {value:?}")));
            }
            framing = Framing::Chunked;
        } else if h.name.eq_ignore_ascii_case("content-type") {
            message.content_type = value;
        }
    }
    Ok(Some((message, len, framing)))
}

/// Reads one message: a request (`request`) or a response, whose body may be at most
/// `max_body` bytes, all of it before `until`.
pub fn read(
    stream: &mut impl Timed,
    request: bool,
    max_body: usize,
    until: Instant,
) -> Result<Message, Refusal> {
    let mut buf = Vec::with_capacity(4096);
    let (mut message, head_len, framing) = loop {
        if let Some(parsed) = parse_head(&buf, request)? {
            break parsed;
        }
        if buf.len() > MAX_HEAD {
            return Err(Refusal::TooLarge("head"));
        }
        if !read_more(stream, &mut buf, until)? {
            return Err(Refusal::Closed("before the end of the head".into()));
        }
    };
    if head_len > MAX_HEAD {
        return Err(Refusal::TooLarge("head"));
    }
    buf.drain(..head_len);
    message.body = match framing {
        Framing::Length(n) if n > max_body => return Err(Refusal::TooLarge("body")),
        Framing::Length(n) => {
            while buf.len() < n {
                if !read_more(stream, &mut buf, until)? {
                    return Err(Refusal::Closed("before the end of the body".into()));
                }
            }
            buf.truncate(n);
            buf
        }
        Framing::UntilClose => {
            while read_more(stream, &mut buf, until)? {
                if buf.len() > max_body {
                    return Err(Refusal::TooLarge("body"));
                }
            }
            buf
        }
        Framing::Chunked => dechunk(stream, buf, max_body, until)?,
    };
    Ok(message)
}

/// A chunked body (RFC 9112 section 7.1), chunk extensions and trailers ignored.
fn dechunk(
    stream: &mut impl Timed,
    mut buf: Vec<u8>,
    max_body: usize,
    until: Instant,
) -> Result<Vec<u8>, Refusal> {
    let mut body = Vec::new();
    loop {
        let line_end = loop {
            if let Some(i) = buf.windows(2).position(|w| w == b"\r\n") {
                break i;
            }
            if buf.len() > MAX_HEAD {
                return Err(Refusal::Malformed("a chunk size line too long".into()));
            }
            if !read_more(stream, &mut buf, until)? {
                return Err(Refusal::Closed("inside a chunked body".into()));
            }
        };
        let line = String::from_utf8_lossy(&buf[..line_end]).to_string();
        let size_text = line.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_text, 16)
            .map_err(|_| Refusal::Malformed(format!("chunk size {size_text:?}")))?;
        if body.len().saturating_add(size) > max_body {
            return Err(Refusal::TooLarge("body"));
        }
        buf.drain(..line_end + 2);
        if size == 0 {
            return Ok(body);
        }
        while buf.len() < size + 2 {
            if !read_more(stream, &mut buf, until)? {
                return Err(Refusal::Closed("inside a chunk".into()));
            }
        }
        body.extend_from_slice(&buf[..size]);
        buf.drain(..size + 2);
    }
}

/// Writes all of `data` before `until`.
pub fn write_all(stream: &mut impl Timed, data: &[u8], until: Instant) -> std::io::Result<()> {
    let mut rest = data;
    while !rest.is_empty() {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        stream.socket().set_write_timeout(Some(left))?;
        match stream.write(rest) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => rest = &rest[n..],
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let left = until.saturating_duration_since(Instant::now());
    stream
        .socket()
        .set_write_timeout(Some(left.max(std::time::Duration::from_millis(1))))?;
    stream.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A loopback pair: what `peer` writes arrives on the returned stream.
    fn pair(data: &'static [u8]) -> TcpStream {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            s.write_all(data).unwrap();
        });
        TcpStream::connect(addr).unwrap()
    }

    fn soon() -> Instant {
        Instant::now() + std::time::Duration::from_secs(5)
    }

    #[test]
    fn a_chunked_response_is_joined_and_a_length_body_cut_at_its_length() {
        let mut s = pair(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n4;x=1\r\n{\"a\"\r\n3\r\n:1}\r\n0\r\n\r\n");
        let m = read(&mut s, false, 100, soon()).unwrap();
        assert_eq!((m.status, m.body.as_slice()), (200, &b"{\"a\":1}"[..]));
        assert_eq!(m.content_type, "application/json");
        let mut s = pair(b"POST /mutate?timeout=5s HTTP/1.1\r\nContent-Length: 3\r\n\r\nabcdef");
        let m = read(&mut s, true, 100, soon()).unwrap();
        assert_eq!((m.method.as_str(), m.path.as_str()), ("POST", "/mutate"));
        assert_eq!(m.body, b"abc");
    }

    #[test]
    fn over_the_limits_or_without_a_length_is_refused_with_its_status() {
        let cases: [(&'static [u8], bool, u16); 5] = [
            (b"POST / HTTP/1.1\r\nContent-Length: 101\r\n\r\n", true, 413),
            (
                b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
                true,
                411,
            ),
            (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n65\r\n",
                false,
                413,
            ),
            (b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n", false, 400),
            (b"POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\nab", true, 400),
        ];
        for (data, request, status) in cases {
            let mut s = pair(data);
            let refusal = read(&mut s, request, 100, soon()).unwrap_err();
            assert_eq!(
                refusal.status(),
                status,
                "{}",
                String::from_utf8_lossy(data)
            );
        }
        let head = format!("GET / HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(MAX_HEAD));
        let mut s = pair(Box::leak(head.into_bytes().into_boxed_slice()));
        assert_eq!(read(&mut s, true, 100, soon()).unwrap_err().status(), 431);
    }

    #[test]
    fn a_peer_that_sends_nothing_is_cut_at_the_deadline() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut s = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let _held = listener.accept().unwrap();
        let until = Instant::now() + std::time::Duration::from_millis(200);
        assert!(matches!(
            read(&mut s, true, 100, until),
            Err(Refusal::Timeout)
        ));
    }
}
