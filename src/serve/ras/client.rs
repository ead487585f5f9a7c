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
//! RAS_COLLECTIVE_EXTRA_TIMEOUT_SEC); these bounds follow it. Reads are buffered (64 KiB
//! at a time), and the reply is parsed as it streams in: what is kept is the parsed
//! model, never the reply's text.

use super::judge::Outcome;
use super::reply::{parse_json_from, parse_text_from};
use super::version::Plan;
use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
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
/// The most a reply may send. It streams into the model, so this bounds the time spent
/// parsing, not memory: a 16,384-rank communicator's JSON is about 9 MiB.
const MAX_REPLY: u64 = 64 << 20;
/// A handshake answer or event line is a few dozen bytes; anything longer is not RAS.
const MAX_LINE: u64 = 4096;

/// A socket read under a deadline and a byte budget: each read waits at most what is
/// left of the deadline, and the reads together may not pass the budget.
struct Bounded {
    stream: TcpStream,
    deadline: Instant,
    budget: u64,
    came: u64,
}

impl Bounded {
    /// A new deadline `within` from now, and the byte budget counted afresh.
    fn restart(&mut self, within: Duration, budget: u64) {
        self.deadline = Instant::now() + within;
        self.budget = budget;
        self.came = 0;
    }
}

impl Read for Bounded {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        let late = |came: u64| {
            std::io::Error::new(
                ErrorKind::TimedOut,
                format!("no answer in time ({came} bytes came)"),
            )
        };
        if left.is_zero() {
            return Err(late(self.came));
        }
        let _ = self.stream.set_read_timeout(Some(left));
        loop {
            match self.stream.read(buf) {
                Ok(n) => {
                    self.came += n as u64;
                    if self.came > self.budget {
                        return Err(std::io::Error::new(
                            ErrorKind::InvalidData,
                            format!("a reply over {} MiB: not read", self.budget >> 20),
                        ));
                    }
                    return Ok(n);
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    return Err(late(self.came));
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// One connection to RAS: buffered reads under `Bounded`, writes straight to the socket.
pub struct Session {
    reader: BufReader<Bounded>,
}

/// Connects to the first address that accepts, as ncclras walks getaddrinfo's list
/// (`localhost` is 127.0.0.1 and ::1; NCCL listens on one of them). `Err(None)`:
/// every address refused.
pub fn connect(addr: &str) -> Result<Session, Option<String>> {
    let addrs: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|e| Some(format!("resolving {addr}: {e}")))?
        .collect();
    let mut last = None;
    for a in &addrs {
        match TcpStream::connect_timeout(a, STEP) {
            Ok(stream) => {
                let bounded = Bounded {
                    stream,
                    deadline: Instant::now() + STEP,
                    budget: MAX_LINE,
                    came: 0,
                };
                return Ok(Session {
                    reader: BufReader::with_capacity(64 << 10, bounded),
                });
            }
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => {}
            Err(e) => last = Some(format!("connecting to {a}: {e}")),
        }
    }
    Err(last)
}

impl Session {
    /// Reads one `\n`-terminated line (at most `MAX_LINE`) within `within`; a line cut
    /// by the deadline is kept in `partial` for the next call.
    pub fn line_into(&mut self, within: Duration, partial: &mut Vec<u8>) -> Result<String, String> {
        self.reader.get_mut().restart(within, u64::MAX);
        let room = (MAX_LINE + 1).saturating_sub(partial.len() as u64);
        match Read::take(&mut self.reader, room).read_until(b'\n', partial) {
            Ok(0) if partial.is_empty() => Err("NCCL closed the connection".into()),
            Ok(_) if partial.last() == Some(&b'\n') => {
                let line = String::from_utf8_lossy(partial).trim_end().to_string();
                partial.clear();
                Ok(line)
            }
            Ok(_) if partial.len() as u64 > MAX_LINE => {
                Err(format!("an answer line over {MAX_LINE} bytes"))
            }
            Ok(_) => Err("NCCL closed the connection".into()),
            Err(e) if e.kind() == ErrorKind::TimedOut => Err("no answer in time".into()),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Sends one command line.
    pub fn send(&mut self, command: &str) -> Result<(), String> {
        let stream = &self.reader.get_ref().stream;
        let _ = stream.set_write_timeout(Some(STEP));
        let mut writer: &TcpStream = stream;
        writer
            .write_all(format!("{command}\n").as_bytes())
            .map_err(|e| format!("sending {command}: {e}"))
    }

    /// Sends `command` and reads its one-line answer.
    pub fn ask(&mut self, command: &str) -> Result<String, String> {
        self.send(command)?;
        self.line_into(STEP, &mut Vec::new())
            .map_err(|e| format!("{command}: {e}"))
    }

    /// The handshake: `CLIENT PROTOCOL 2` and `SERVER PROTOCOL n` back. A different n is
    /// tolerated, as ncclras does ("Will try to continue in spite of that").
    pub fn handshake(&mut self) -> Result<(), String> {
        let answer = self.ask(&format!("CLIENT PROTOCOL {PROTOCOL}"))?;
        if !answer.to_ascii_uppercase().starts_with("SERVER PROTOCOL ") {
            return Err(format!(
                "not a RAS server: it answered {:?} to CLIENT PROTOCOL",
                super::reply::safe(&answer)
            ));
        }
        Ok(())
    }

    /// The reader for a reply, bounded as a reply is (`REPLY`, `MAX_REPLY`).
    fn reply_reader(&mut self) -> &mut BufReader<Bounded> {
        self.reader.get_mut().restart(REPLY, MAX_REPLY);
        &mut self.reader
    }

    /// Sends `command` and reads its reply as text until NCCL closes, or until `done`
    /// says what came is whole (a one-line refusal after which NCCL keeps the connection
    /// open); bounded as STATUS is.
    pub fn command_reply(
        &mut self,
        command: &str,
        done: fn(&[u8]) -> bool,
    ) -> Result<String, String> {
        self.send(command)?;
        let reader = self.reply_reader();
        let mut reply = Vec::new();
        loop {
            let chunk = match reader.fill_buf() {
                Ok(c) => c,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == ErrorKind::TimedOut => {
                    return Err(format!(
                        "no whole reply within {} s ({} bytes came)",
                        REPLY.as_secs(),
                        reply.len()
                    ));
                }
                Err(e) => return Err(format!("reading the reply: {e}")),
            };
            if chunk.is_empty() {
                break;
            }
            reply.extend_from_slice(chunk);
            let n = chunk.len();
            reader.consume(n);
            if done(&reply) {
                break;
            }
        }
        if reply.is_empty() {
            return Err("NCCL closed the connection without a reply".into());
        }
        Ok(String::from_utf8_lossy(&reply).into_owned())
    }
}

/// One STATUS query. `may_query_text` is asked only where the server refused JSON and
/// the plan carries nccl#1669's init guard: false skips the query.
pub fn query(
    addr: &str,
    plan: &Plan,
    may_query_text: impl FnOnce() -> Result<(), String>,
) -> Outcome {
    let mut session = match connect(addr) {
        Ok(s) => s,
        Err(None) => return Outcome::Refused,
        Err(Some(e)) => return Outcome::Failed(e),
    };
    match status(&mut session, plan, may_query_text) {
        Ok(outcome) => outcome,
        Err(e) => Outcome::Failed(e),
    }
}

fn status(
    session: &mut Session,
    plan: &Plan,
    may_query_text: impl FnOnce() -> Result<(), String>,
) -> Result<Outcome, String> {
    session.handshake()?;
    let answer = session.ask(&format!("TIMEOUT {RAS_TIMEOUT_SECS}"))?;
    if !answer.eq_ignore_ascii_case("OK") {
        return Err(format!("TIMEOUT: {:?}", super::reply::safe(&answer)));
    }
    let json = plan.json && session.ask("SET FORMAT json")?.eq_ignore_ascii_case("OK");
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
    session.send(command)?;
    let reader = session.reply_reader();
    let parsed = if json {
        parse_json_from(reader)
    } else {
        parse_text_from(reader)
    };
    parsed.map(|s| Outcome::Reply(Box::new(s))).map_err(|m| {
        // A deadline's own words: the reply did not come whole in time.
        match m.0.strip_prefix("no answer in time") {
            Some(rest) => format!("no whole reply within {} s{rest}", REPLY.as_secs()),
            None => m.0,
        }
    })
}
