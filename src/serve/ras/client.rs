//! Speaking RAS's client protocol as NCCL's own `ncclras` does (src/ras/client.cc,
//! connectToNCCL, setOutputFormat, getNCCLStatus, monitorNCCLEvents; the server side in
//! client_support.cc rasClientEventLoop): `CLIENT PROTOCOL 2` -> `SERVER PROTOCOL 2`,
//! `TIMEOUT <s>` -> `OK`, `SET FORMAT json` -> `OK` (2.28.7+; older servers answer
//! `ERROR: Unknown command`), then `STATUS` (or `VERBOSE STATUS`) and the reply until
//! NCCL closes the connection. One connection per query, as ncclras makes.
//!
//! Every step is bounded: the connect, each line of the handshake, the whole reply (in
//! time and in bytes). ncclras waits 1 s for the handshake and then 1 + TIMEOUT + 5 s
//! for the reply (TIMEOUT_INCREMENT, RAS_COLLECTIVE_LEG_TIMEOUT_SEC and
//! RAS_COLLECTIVE_EXTRA_TIMEOUT_SEC); these bounds follow it.

use super::judge::Outcome;
use super::reply::{parse_json, parse_text};
use super::version::Plan;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// The protocol version ncclras speaks (NCCL_RAS_CLIENT_PROTOCOL in ras_internal.h,
/// 2 at every tag from v2.24.3-1 to v2.30.7-1).
pub const PROTOCOL: u32 = 2;
/// What RAS may spend collecting from its peers (`TIMEOUT`, ncclras's default).
const RAS_TIMEOUT_SECS: u64 = 5;
/// The connect and each handshake line.
const STEP: Duration = Duration::from_secs(2);
/// The whole reply: ncclras's 1 + 5 + 5 s and a second of slack.
const REPLY: Duration = Duration::from_secs(1 + RAS_TIMEOUT_SECS + 5 + 1);
/// A reply larger than this is refused, not buffered: a 512-GPU job's JSON is ~0.5 MB.
const MAX_REPLY: usize = 16 << 20;
/// A handshake answer line is a few bytes; anything longer is not RAS.
const MAX_LINE: usize = 4096;

/// Connects to the first address that accepts, as ncclras walks getaddrinfo's list
/// (`localhost` is 127.0.0.1 and ::1; NCCL listens on one of them). `Err(None)`:
/// every address refused.
pub fn connect(addr: &str) -> Result<TcpStream, Option<String>> {
    let addrs: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|e| Some(format!("resolving {addr}: {e}")))?
        .collect();
    let mut last = None;
    for a in &addrs {
        match TcpStream::connect_timeout(a, STEP) {
            Ok(s) => return Ok(s),
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => {}
            Err(e) => last = Some(format!("connecting to {a}: {e}")),
        }
    }
    Err(last)
}

/// Reads one `\n`-terminated line within `deadline`.
pub fn read_line(stream: &mut TcpStream, deadline: Instant) -> Result<String, String> {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while line.last() != Some(&b'\n') {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err("no answer in time".into());
        }
        let _ = stream.set_read_timeout(Some(left));
        match stream.read(&mut byte) {
            Ok(0) => return Err("NCCL closed the connection".into()),
            Ok(_) => line.push(byte[0]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Err("no answer in time".into());
            }
            Err(e) => return Err(e.to_string()),
        }
        if line.len() > MAX_LINE {
            return Err(format!("an answer line over {MAX_LINE} bytes"));
        }
    }
    Ok(String::from_utf8_lossy(&line).trim_end().to_string())
}

/// Sends `command` and reads its one-line answer.
pub fn ask(stream: &mut TcpStream, command: &str) -> Result<String, String> {
    let _ = stream.set_write_timeout(Some(STEP));
    stream
        .write_all(format!("{command}\n").as_bytes())
        .map_err(|e| format!("sending {command}: {e}"))?;
    read_line(stream, Instant::now() + STEP).map_err(|e| format!("{command}: {e}"))
}

/// The handshake: `CLIENT PROTOCOL 2` and `SERVER PROTOCOL n` back. A different n is
/// tolerated, as ncclras does ("Will try to continue in spite of that").
pub fn handshake(stream: &mut TcpStream) -> Result<(), String> {
    let answer = ask(stream, &format!("CLIENT PROTOCOL {PROTOCOL}"))?;
    if !answer.to_ascii_uppercase().starts_with("SERVER PROTOCOL ") {
        return Err(format!(
            "not a RAS server: it answered {:?} to CLIENT PROTOCOL",
            super::reply::safe(&answer)
        ));
    }
    Ok(())
}

/// Reads until NCCL closes, within `REPLY` and `MAX_REPLY`, or until `done` says what
/// came is whole (a one-line refusal after which NCCL keeps the connection open).
fn read_reply(stream: &mut TcpStream, done: fn(&[u8]) -> bool) -> Result<String, String> {
    let deadline = Instant::now() + REPLY;
    let mut reply = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!(
                "no whole reply within {} s ({} bytes came)",
                REPLY.as_secs(),
                reply.len()
            ));
        }
        let _ = stream.set_read_timeout(Some(left));
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) if reply.len() + n > MAX_REPLY => {
                return Err(format!("a reply over {} MiB: not read", MAX_REPLY >> 20));
            }
            Ok(n) => {
                reply.extend_from_slice(&buf[..n]);
                if done(&reply) {
                    break;
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) => return Err(format!("reading the reply: {e}")),
        }
    }
    if reply.is_empty() {
        return Err("NCCL closed the connection without a reply".into());
    }
    Ok(String::from_utf8_lossy(&reply).into_owned())
}

/// Sends `command` and reads its reply until NCCL closes, bounded as STATUS is, or until
/// `done` says the reply is whole.
pub fn command_reply(
    stream: &mut TcpStream,
    command: &str,
    done: fn(&[u8]) -> bool,
) -> Result<String, String> {
    let _ = stream.set_write_timeout(Some(STEP));
    stream
        .write_all(format!("{command}\n").as_bytes())
        .map_err(|e| format!("sending {command}: {e}"))?;
    read_reply(stream, done)
}

/// One STATUS query. `may_query_text` is asked only where the server refused JSON and
/// the plan carries nccl#1669's init guard: false skips the query.
pub fn query(
    addr: &str,
    plan: &Plan,
    may_query_text: impl FnOnce() -> Result<(), String>,
) -> Outcome {
    let mut stream = match connect(addr) {
        Ok(s) => s,
        Err(None) => return Outcome::Refused,
        Err(Some(e)) => return Outcome::Failed(e),
    };
    match session(&mut stream, plan, may_query_text) {
        Ok(outcome) => outcome,
        Err(e) => Outcome::Failed(e),
    }
}

fn session(
    stream: &mut TcpStream,
    plan: &Plan,
    may_query_text: impl FnOnce() -> Result<(), String>,
) -> Result<Outcome, String> {
    handshake(stream)?;
    let answer = ask(stream, &format!("TIMEOUT {RAS_TIMEOUT_SECS}"))?;
    if !answer.eq_ignore_ascii_case("OK") {
        return Err(format!("TIMEOUT: {:?}", super::reply::safe(&answer)));
    }
    let json = plan.json && ask(stream, "SET FORMAT json")?.eq_ignore_ascii_case("OK");
    if !json
        && plan.init_guard
        && let Err(why) = may_query_text()
    {
        return Ok(Outcome::Guarded(why));
    }
    let command = if plan.verbose && !json {
        "VERBOSE STATUS"
    } else {
        "STATUS"
    };
    let _ = stream.set_write_timeout(Some(STEP));
    stream
        .write_all(format!("{command}\n").as_bytes())
        .map_err(|e| format!("sending {command}: {e}"))?;
    let reply = read_reply(stream, |_| false)?;
    let parsed = if json {
        parse_json(&reply)
    } else {
        parse_text(&reply)
    };
    parsed.map(|s| Outcome::Reply(Box::new(s))).map_err(|m| m.0)
}
