//! A pod's side of the session (every rank but 0): reach rank 0, say hello, take
//! the table; while NCCL runs, beat and listen for why to stop; then send this
//! pod's outcome and take everyone's.

use super::admission::refusal;
use super::{BEAT_EVERY, Beat, Failure, Gone, How, Live, Meeting, Outcomes, wait};
use crate::gang::wire::{self, Conn, Kind, Table};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

/// Between connection attempts while rank 0 is not listening yet.
const RETRY: Duration = Duration::from_millis(200);

pub struct Member {
    conn: Conn,
    job: u64,
    rank: u64,
    nodes: u64,
}

/// Connects to `root`, retrying until `by`.
fn connect(root: SocketAddr, by: Instant) -> Result<TcpStream, Failure> {
    let mut last = String::from("no attempt");
    loop {
        let left = by.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Failure::Unreachable(format!("{root}: {last}")));
        }
        match TcpStream::connect_timeout(&root, left.min(Duration::from_secs(2))) {
            Ok(s) => return Ok(s),
            Err(e) => last = e.to_string(),
        }
        std::thread::sleep(RETRY.min(by.saturating_duration_since(Instant::now())));
    }
}

/// What one attempt at the rendezvous gave.
enum Attempt {
    Done(Box<(Member, Table)>),
    /// Closed before rank 0 said anything (dropped unread, or rank 0 restarting): try again.
    Again(String),
    Failed(Failure),
}

impl Member {
    /// Reaches rank 0 (trying again, within the deadline, when a connection is
    /// closed before any answer), sends this pod's record and waits up to
    /// `table_within` after connecting for the table.
    pub fn meet(m: &Meeting<'_>) -> Result<(Member, Table), Failure> {
        loop {
            let stream = connect(m.root, m.deadline)?;
            match Member::attempt(m, stream) {
                Attempt::Done(done) => return Ok(*done),
                Attempt::Failed(f) => return Err(f),
                Attempt::Again(why) if Instant::now() >= m.deadline => {
                    return Err(Failure::NoTable(why));
                }
                Attempt::Again(_) => std::thread::sleep(RETRY),
            }
        }
    }

    fn attempt(m: &Meeting<'_>, stream: TcpStream) -> Attempt {
        let from = stream.peer_addr().unwrap_or(m.root);
        let mut conn = match Conn::new(stream, from) {
            Ok(c) => c,
            Err(e) => return Attempt::Again(e.to_string()),
        };
        conn.push(Kind::Hello, m.job, m.rank as u32, m.record);
        let by = Instant::now() + m.table_within;
        let cap = wire::HEADER + wire::limit(Kind::Table, m.nodes);
        while Instant::now() < by {
            wait(&[(conn.stream().as_fd(), conn.sending())]);
            // A frame that came before the connection closed is read first: a
            // refusal is followed by rank 0 closing.
            let broken = conn.pull(cap).and_then(|_| conn.flush().map(|_| ())).err();
            let frame = match conn.frame(|k| wire::limit(k, m.nodes)) {
                Ok(Some(f)) => f,
                Ok(None) => match broken {
                    None => continue,
                    Some(e) if conn.received == 0 => return Attempt::Again(e),
                    Some(e) => return Attempt::Failed(Failure::NoTable(e)),
                },
                Err(e) => return Attempt::Failed(Failure::NoTable(e)),
            };
            return match frame {
                // A refusal carries rank 0's own key, which is the point when ours is stale.
                (h, body) if h.kind == Kind::Refused => {
                    let (blame, why) = refusal(&body);
                    Attempt::Failed(Failure::Refused { why, blame })
                }
                (h, _) if h.job != m.job => {
                    Attempt::Failed(Failure::NoTable("a reply with another job key".into()))
                }
                (h, body) if h.kind == Kind::Table => match Table::decode(&body, m.nodes) {
                    Ok(t) => Attempt::Done(Box::new((
                        Member {
                            conn,
                            job: m.job,
                            rank: m.rank,
                            nodes: m.nodes,
                        },
                        t,
                    ))),
                    Err(e) => Attempt::Failed(Failure::NoTable(e)),
                },
                (h, _) => Attempt::Failed(Failure::NoTable(format!("a {:?} frame", h.kind))),
            };
        }
        Attempt::Failed(Failure::NoTable(format!(
            "nothing within {:.0} s",
            m.table_within.as_secs_f64()
        )))
    }

    /// While NCCL runs: beats to rank 0 (at once when this pod's run ended early),
    /// rank 0's beats in (its stop stops this pod's run), this pod's outcome once
    /// `live` has it, and everyone's outcomes back. Rank 0 closing or falling silent
    /// stops this pod's run and names rank 0 gone; the outcomes are then this pod's own.
    pub fn follow(&mut self, live: &Live, silence: Duration, deadline: Instant) -> Outcomes {
        let started = Instant::now();
        let (mut heard, mut beat_at, mut sent) = (Instant::now(), Instant::now(), false);
        let mut root_beat = Beat::default();
        let cap = wire::HEADER + wire::limit(Kind::Outcomes, self.nodes);
        while Instant::now() < deadline {
            wait(&[(self.conn.stream().as_fd(), self.conn.sending())]);
            let before = self.conn.received;
            let broken = self.conn.pull(cap).and_then(|_| self.conn.flush()).is_err();
            if self.conn.received > before {
                heard = Instant::now();
            }
            while let Ok(Some((head, body))) = self.conn.frame(|k| wire::limit(k, self.nodes)) {
                match head.kind {
                    Kind::Outcomes => return self.outcomes(&body, live),
                    Kind::Beat => {
                        if let Ok(b) = serde_json::from_slice::<Beat>(&body) {
                            if let Some(why) = &b.stop {
                                live.stop(why);
                            }
                            root_beat = b;
                        }
                    }
                    _ => {}
                }
            }
            let how = match (broken, heard.elapsed() > silence) {
                (true, _) => Some(How::Closed),
                (false, true) => Some(How::Silent(silence.as_secs_f64())),
                _ => None,
            };
            if let Some(how) = how {
                live.stop("rank 0 left the gang");
                return self.root_gone(live, root_beat, how, started);
            }
            let (beat, urgent) = live.beat();
            if urgent || Instant::now() >= beat_at {
                let body = serde_json::to_vec(&beat).unwrap_or_default();
                self.conn
                    .push(Kind::Beat, self.job, self.rank as u32, &body);
                beat_at = Instant::now() + BEAT_EVERY;
            }
            if let (false, Some(mine)) = (sent, live.outcome()) {
                let body = serde_json::to_vec(&mine).unwrap_or_default();
                self.conn
                    .push(Kind::Outcome, self.job, self.rank as u32, &body);
                sent = true;
            }
        }
        self.own_only(live, root_beat.gone)
    }

    /// Rank 0's outcomes, this pod's own outcome in its place.
    fn outcomes(&self, body: &[u8], live: &Live) -> Outcomes {
        let mut all = serde_json::from_slice::<Outcomes>(body)
            .map(|o| o.checked(self.nodes as usize))
            .unwrap_or_default();
        all.outcomes.resize(self.nodes as usize, None);
        all.outcomes[self.rank as usize] = live.outcome();
        all
    }

    /// Only this pod's outcome, with the pods rank 0 had named gone so far.
    fn own_only(&self, live: &Live, gone: Vec<Gone>) -> Outcomes {
        let mut outcomes = vec![None; self.nodes as usize];
        outcomes[self.rank as usize] = live.outcome();
        Outcomes {
            outcomes,
            gone: gone
                .into_iter()
                .map(Gone::checked)
                .filter(|g| g.node < self.nodes)
                .collect(),
            ..Outcomes::default()
        }
    }

    /// Rank 0 is gone: named with its last stage and this pod's time since NCCL began.
    fn root_gone(&self, live: &Live, last: Beat, how: How, started: Instant) -> Outcomes {
        let stage = crate::render::visible(&last.stage).into_owned();
        let mut out = self.own_only(live, last.gone);
        out.gone.retain(|g| g.node != 0);
        out.gone.insert(
            0,
            Gone {
                node: 0,
                seconds: Some(started.elapsed().as_secs_f64()),
                stage,
                how,
            },
        );
        out
    }
}
