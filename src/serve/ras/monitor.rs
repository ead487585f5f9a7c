//! RAS's monitoring mode (NCCL 2.29+, ras.rst "Monitoring Mode"; `MONITOR` in
//! client_support.cc at v2.29.2-1): one connection kept open on which NCCL pushes peer
//! events as they happen (`PEER_DEAD`, `PEER_UNRESPONSIVE`, `PEER_RECOVERED`, ...). Text
//! format, one event a line (`[time] EVENT: Process P on node H managing GPU G details`,
//! rasClientsNotifyEvent). Each event wakes the watcher for an immediate STATUS.
//!
//! Bounded however fast NCCL pushes: reads are buffered (64 KiB at a time, never a byte a
//! call), a line is at most 4 KiB, and what the events leave is deduplicated and capped
//! where they are kept (watch.rs, judge.rs), so a flood of dead-peer events while a
//! STATUS query hangs grows nothing.

use super::client::{self, Session};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The event groups asked for: peer deaths (LIFECYCLE) and unresponsive peers (TRACE).
const GROUPS: &str = "lifecycle,trace";
/// How often a blocked read looks at the stop flag.
const TICK: Duration = Duration::from_millis(500);
/// The longest wait between reconnects.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

fn open(addr: &str) -> Result<Session, String> {
    let mut session = client::connect(addr).map_err(|e| e.unwrap_or_else(|| "refused".into()))?;
    session.handshake()?;
    let answer = session.ask(&format!("MONITOR {GROUPS}"))?;
    if !answer.to_ascii_uppercase().starts_with("OK") {
        return Err(format!("MONITOR: {:?}", super::reply::safe(&answer)));
    }
    Ok(session)
}

/// Reads events until the connection ends or `stop`; each line goes to `event`. A line
/// the tick cut in two is completed by the next read.
fn follow(session: &mut Session, stop: &AtomicBool, event: &mut dyn FnMut(String)) {
    let mut partial = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        match session.line_into(TICK, &mut partial) {
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
        if let Ok(mut session) = open(addr) {
            backoff = Duration::from_secs(1);
            follow(&mut session, stop, event);
        }
        let until = Instant::now() + backoff;
        while !stop.load(Ordering::Relaxed) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(100));
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}
