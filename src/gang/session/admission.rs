//! Rank 0's door: the gang port's listener and the connections that have not yet
//! shown they belong to this job. A connection counts for nothing until its header
//! (the job key) and its hello are read; until then it is one of at most
//! `PENDING_CAP`. With every place taken, a new connection takes the place of the
//! one that sent the least for the longest, once that one has had `YOUNG` to speak
//! (a pod sends its whole hello at once, so an idle or trickling stranger goes
//! first); while every pending connection is younger, the new ones wait in the
//! kernel's accept queue. A connection that says nothing within
//! `HELLO_WITHIN`, speaks another protocol or carries another job's key is refused
//! and counted, never waited on.

use super::HELLO_WITHIN;
use crate::finding::Blame;
use crate::gang::wire::{self, Conn, Kind, MAX_REASON};
use std::net::TcpListener;
use std::os::fd::AsFd;
use std::time::Instant;

/// Connections read at once before their job key is known.
pub const PENDING_CAP: usize = 128;
/// A pending connection is never dropped for another before this: a pod's hello
/// arrives within a round trip, but 256 pods connect within moments.
const YOUNG: std::time::Duration = std::time::Duration::from_millis(250);

/// A connection whose hello is not read yet.
struct Pending {
    conn: Conn,
    since: Instant,
}

/// What a connection turned out to be.
pub enum Arrival {
    /// A pod of this job: its rank and record.
    Hello {
        rank: u64,
        record: Vec<u8>,
        conn: Conn,
    },
    /// Refused or dropped: `address: why`.
    Refused(String),
}

pub struct Door {
    listener: TcpListener,
    pending: Vec<Pending>,
    job: u64,
    nodes: u64,
}

/// Which pending connection gives way: among those older than YOUNG at `now`, the
/// one that sent the fewest bytes, the oldest among those (`(bytes received, since)`
/// per connection); None when all are young.
fn victim(pending: &[(usize, Instant)], now: Instant) -> Option<usize> {
    (0..pending.len())
        .filter(|&i| now.saturating_duration_since(pending[i].1) >= YOUNG)
        .min_by_key(|&i| pending[i])
}

impl Door {
    pub fn new(listener: TcpListener, job: u64, nodes: u64) -> Door {
        Door {
            listener,
            pending: Vec::new(),
            job,
            nodes,
        }
    }

    /// The listener's and the pending connections' descriptors, for `wait`.
    pub fn fds(&self) -> Vec<(std::os::fd::BorrowedFd<'_>, bool)> {
        let mut fds = vec![(self.listener.as_fd(), false)];
        fds.extend(
            self.pending
                .iter()
                .map(|p| (p.conn.stream().as_fd(), false)),
        );
        fds
    }

    /// Takes every connection waiting at the listener, then reads the pending ones;
    /// returns what each connection that is done turned out to be.
    pub fn admit(&mut self) -> Vec<Arrival> {
        let mut out = Vec::new();
        loop {
            if self.pending.len() >= PENDING_CAP {
                let keys: Vec<(usize, Instant)> = self
                    .pending
                    .iter()
                    .map(|p| (p.conn.received, p.since))
                    .collect();
                // Every place is young: the rest wait in the accept queue.
                let Some(i) = victim(&keys, Instant::now()) else {
                    break;
                };
                let p = self.pending.swap_remove(i);
                out.push(Arrival::Refused(format!(
                    "{}: dropped unread ({PENDING_CAP} connections were waiting)",
                    p.conn.from
                )));
            }
            let Ok((stream, from)) = self.listener.accept() else {
                break;
            };
            let Ok(conn) = Conn::new(stream, from) else {
                continue;
            };
            self.pending.push(Pending {
                conn,
                since: Instant::now(),
            });
            // A pod's hello is usually there already.
            if let Some(a) = self.read(self.pending.len() - 1) {
                out.push(a);
            }
        }
        let mut i = 0;
        while i < self.pending.len() {
            match self.read(i) {
                Some(a) => out.push(a),
                None => i += 1,
            }
        }
        out
    }

    /// Reads pending connection `i`; Some (and removed) once it is decided.
    fn read(&mut self, i: usize) -> Option<Arrival> {
        let p = &mut self.pending[i];
        let cap = wire::HEADER + wire::limit(Kind::Hello, self.nodes);
        let verdict = match p.conn.pull(cap) {
            Err(e) => Some(Err((e, None))),
            Ok(()) => self.check(i),
        };
        let verdict = verdict.or_else(|| {
            (self.pending[i].since.elapsed() > HELLO_WITHIN).then(|| {
                Err((
                    format!("no hello within {} s", HELLO_WITHIN.as_secs()),
                    None,
                ))
            })
        })?;
        let mut p = self.pending.swap_remove(i);
        Some(match verdict {
            Ok((rank, record)) => Arrival::Hello {
                rank,
                record,
                conn: p.conn,
            },
            Err((why, tell)) => {
                if let Some((blame, text)) = tell {
                    refuse(&mut p.conn, self.job, blame, &text);
                }
                Arrival::Refused(format!("{}: {why}", p.conn.from))
            }
        })
    }

    /// A pending connection's hello: Some(Ok) once whole, Some(Err) when it is refused
    /// (with what to tell it), None while more is to come.
    #[allow(clippy::type_complexity)]
    fn check(
        &mut self,
        i: usize,
    ) -> Option<Result<(u64, Vec<u8>), (String, Option<(Blame, String)>)>> {
        let (job, nodes) = (self.job, self.nodes);
        let conn = &mut self.pending[i].conn;
        let head = match conn.head()? {
            Ok(h) => h,
            Err(e) => return Some(Err((e, None))),
        };
        if head.job != job {
            let why = "its job key differs from rank 0's: a pod of an earlier attempt of this job, or of another job (root, port, pod count or --gang-attempt differ)";
            return Some(Err((why.into(), Some((Blame::Job, why.into())))));
        }
        if head.kind != Kind::Hello || u64::from(head.rank) >= nodes {
            let why = format!(
                "a {:?} frame for rank {} (the gang has {nodes} pods)",
                head.kind, head.rank
            );
            return Some(Err((why.clone(), Some((Blame::Job, why)))));
        }
        match conn.frame(|k| wire::limit(k, nodes)) {
            Ok(Some((h, body))) => Some(Ok((u64::from(h.rank), body))),
            Ok(None) => None,
            Err(e) => Some(Err((e.clone(), Some((Blame::Job, e))))),
        }
    }
}

/// Tells a connection why it is refused (best effort: one write, never waited on).
/// The body: the blame (1 job, 2 node), then the reason.
pub fn refuse(conn: &mut Conn, job: u64, blame: Blame, why: &str) {
    let mut body = vec![match blame {
        Blame::Job => 1u8,
        Blame::Node => 2u8,
    }];
    body.extend(why.bytes().take(MAX_REASON));
    conn.push(Kind::Refused, job, 0, &body);
    let _ = conn.flush();
}

/// A refusal's body read back: its blame and reason (escaped).
pub fn refusal(body: &[u8]) -> (Blame, String) {
    let blame = match body.first() {
        Some(2) => Blame::Node,
        _ => Blame::Job,
    };
    (blame, wire::text(body.get(1..).unwrap_or(&[])))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_quietest_oldest_connection_gives_way_never_a_young_one() {
        let t0 = Instant::now();
        let later = t0 + Duration::from_millis(5);
        let now = t0 + Duration::from_secs(1);
        // A pod's whole hello against two strangers that sent nothing: the older stranger.
        assert_eq!(victim(&[(0, later), (4000, t0), (0, t0)], now), Some(2));
        // A trickler that sent a few bytes goes before a whole hello.
        assert_eq!(victim(&[(3, t0), (4000, t0)], now), Some(0));
        // Connections younger than YOUNG keep their place, however quiet.
        assert_eq!(victim(&[(0, now), (0, later)], now), Some(1));
        assert_eq!(victim(&[(0, now)], now), None);
        assert_eq!(victim(&[], now), None);
    }

    #[test]
    fn a_refusal_carries_its_blame() {
        let mut body = vec![2u8];
        body.extend_from_slice(b"late\n");
        assert_eq!(refusal(&body), (Blame::Node, "late\\x0a".to_string()));
        assert_eq!(refusal(b"\x01dup").0, Blame::Job);
        assert_eq!(refusal(b"").0, Blame::Job);
    }
}
