//! RAS's monitoring mode (NCCL 2.29+, ras.rst "Monitoring Mode"; `MONITOR` in
//! client_support.cc at v2.29.2-1): one connection kept open on which NCCL pushes peer
//! events as they happen (`PEER_DEAD`, `PEER_UNRESPONSIVE`, `PEER_RECOVERED`, ...). Text
//! format, one event a line (`[time] EVENT: Process P on node H managing GPU G details`,
//! rasClientsNotifyEvent). Each event wakes the watcher for an immediate STATUS.

use super::client;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The event groups asked for: peer deaths (LIFECYCLE) and unresponsive peers (TRACE).
const GROUPS: &str = "lifecycle,trace";
/// How often a blocked read looks at the stop flag.
const TICK: Duration = Duration::from_millis(500);
/// The longest wait between reconnects.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

fn open(addr: &str) -> Result<TcpStream, String> {
    let mut stream = client::connect(addr).map_err(|e| e.unwrap_or_else(|| "refused".into()))?;
    client::handshake(&mut stream)?;
    let answer = client::ask(&mut stream, &format!("MONITOR {GROUPS}"))?;
    if !answer.to_ascii_uppercase().starts_with("OK") {
        return Err(format!("MONITOR: {:?}", super::reply::safe(&answer)));
    }
    Ok(stream)
}

/// Reads events until the connection ends or `stop`; each line goes to `event`.
fn follow(stream: &mut TcpStream, stop: &AtomicBool, event: &mut dyn FnMut(String)) {
    while !stop.load(Ordering::Relaxed) {
        match client::read_line(stream, Instant::now() + TICK) {
            Ok(line) if line.trim().is_empty() => {}
            Ok(line) => event(line),
            Err(e) if e == "no answer in time" => {}
            Err(_) => return,
        }
    }
}

/// Keeps a MONITOR connection to `addr` until `stop`, reconnecting with backoff.
pub fn run(addr: &str, stop: &AtomicBool, event: &mut dyn FnMut(String)) {
    let mut backoff = Duration::from_secs(1);
    while !stop.load(Ordering::Relaxed) {
        if let Ok(mut stream) = open(addr) {
            backoff = Duration::from_secs(1);
            follow(&mut stream, stop, event);
        }
        let until = Instant::now() + backoff;
        while !stop.load(Ordering::Relaxed) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(100));
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}
