//! Rank 0's side of the session: the door (`admission`), one connection per pod,
//! the table, the watch while NCCL runs and the outcomes.

use super::admission::{Arrival, Door, refuse};
use super::{BEAT_EVERY, Beat, Failure, Gone, How, Live, Meeting, Outcomes, wait};
use crate::finding::Blame;
use crate::gang::outcome::Outcome;
use crate::gang::wire::{self, Conn, Duplicate, Kind, MAX_REFUSALS_KEPT, Table};
use std::net::{SocketAddr, TcpListener};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

/// Sending the table to every pod may take this long.
const SEND_WITHIN: Duration = Duration::from_secs(10);

/// One pod of the gang as rank 0 holds it.
struct Member {
    conn: Conn,
    /// Its connection closed or broke.
    closed: bool,
    heard: Instant,
    beat: Beat,
    outcome: Option<Outcome>,
}

pub struct Root {
    door: Door,
    job: u64,
    nodes: u64,
    members: Vec<Option<Member>>,
    /// Every rank's record as it came (rank 0's own included).
    records: Vec<Option<Vec<u8>>>,
    table: Table,
    /// The port NCCL's root gets, held (bound, not listening) until its worker starts.
    nccl_port: Option<std::os::fd::OwnedFd>,
    /// Pods that came after the gang went on: duplicates of a taken rank, latecomers.
    late_duplicates: Vec<Duplicate>,
    late: Vec<String>,
}

impl Root {
    /// Listens at the root address, collects every rank's record until all came (a
    /// duplicate stands for a missing one) or the deadline, and sends the table.
    pub fn meet(m: &Meeting<'_>) -> Result<(Root, Table), Failure> {
        let listener = listen(m.root).map_err(|e| Failure::Listen(format!("{}: {e}", m.root)))?;
        let mut root = Root {
            door: Door::new(listener, m.job, m.nodes),
            job: m.job,
            nodes: m.nodes,
            members: (0..m.nodes).map(|_| None).collect(),
            records: (0..m.nodes).map(|_| None).collect(),
            table: Table::default(),
            nccl_port: None,
            late_duplicates: Vec::new(),
            late: Vec::new(),
        };
        root.records[0] = Some(m.record.to_vec());
        while !root.complete() && Instant::now() < m.deadline {
            let fds = root.door.fds();
            wait(&fds);
            drop(fds);
            for a in root.door.admit() {
                root.arrive(a, false);
            }
        }
        root.table.records = root.records.clone();
        let root = root.send_table(m.root);
        let table = root.table.clone();
        Ok((root, table))
    }

    /// Every rank reported, or every pod that exists did (a duplicate stands for a missing one).
    fn complete(&self) -> bool {
        let present = self.records.iter().filter(|r| r.is_some()).count();
        present + self.table.duplicates.len() >= self.records.len()
    }

    /// Takes what a connection turned out to be. `started`: the gang already went on,
    /// so a newcomer is refused (its claim still counts, in the outcomes).
    fn arrive(&mut self, a: Arrival, started: bool) {
        match a {
            Arrival::Refused(why) => self.refused(why),
            Arrival::Hello {
                rank, record, conn, ..
            } => self.hello(rank, record, conn, started),
        }
    }

    fn refused(&mut self, why: String) {
        self.table.refused_count += 1;
        if self.table.refused.len() < MAX_REFUSALS_KEPT {
            self.table
                .refused
                .push(crate::render::visible(&why).into_owned());
        }
    }

    fn hello(&mut self, rank: u64, record: Vec<u8>, mut conn: Conn, started: bool) {
        let from = conn.from.ip().to_string();
        let slot = rank as usize;
        let holder = match &self.members[slot] {
            Some(m) => Some(m.conn.from.ip().to_string()),
            None if slot == 0 => Some("rank 0 itself".to_string()),
            None => None,
        };
        if let Some(kept) = holder {
            let why = format!("rank {rank} is already taken by {kept}");
            refuse(&mut conn, self.job, Blame::Job, &why);
            let dup = Duplicate {
                rank,
                kept,
                refused: from,
            };
            if started {
                self.late_duplicates.push(dup);
            } else {
                self.table.duplicates.push(dup);
            }
            return;
        }
        if started {
            let why =
                format!("the gang went on without rank {rank}: this pod came after --gang-timeout");
            // The other pods name this rank as never reached (its node's, as theirs).
            refuse(&mut conn, self.job, Blame::Node, &why);
            self.late.push(format!("{}: rank {rank}", conn.from));
            return;
        }
        self.records[slot] = Some(record);
        self.members[slot] = Some(Member {
            conn,
            closed: false,
            heard: Instant::now(),
            beat: Beat::default(),
            outcome: None,
        });
    }

    /// Picks NCCL's root port, sends the table to every pod that reported (each
    /// within SEND_WITHIN, all at once), and returns with the table kept.
    fn send_table(mut self, at: SocketAddr) -> Root {
        // NCCL's root listens on a port of its own (the session keeps the gang port):
        // one the kernel picks now, held until NCCL's worker starts.
        if let Some((fd, port)) = reserve_port(at) {
            self.nccl_port = Some(fd);
            self.table.nccl_port = port;
        }
        let body: std::sync::Arc<[u8]> = std::sync::Arc::from(self.table.encode());
        let job = self.job;
        for (rank, m) in self.members.iter_mut().enumerate() {
            if let Some(m) = m {
                m.conn
                    .push_shared(Kind::Table, job, rank as u32, std::sync::Arc::clone(&body));
            }
        }
        let by = Instant::now() + SEND_WITHIN;
        while Instant::now() < by
            && self
                .members
                .iter()
                .flatten()
                .any(|m| !m.closed && m.conn.sending())
        {
            let fds: Vec<_> = self
                .members
                .iter()
                .flatten()
                .map(|m| (m.conn.stream().as_fd(), m.conn.sending()))
                .collect();
            wait(&fds);
            for m in self.members.iter_mut().flatten() {
                // A pod that cannot take the table is found gone in the watch.
                m.closed |= m.conn.flush().is_err();
            }
        }
        self
    }

    /// Lets NCCL's root take its port.
    pub fn release_nccl_port(&mut self) {
        self.nccl_port = None;
    }
}

/// The gang port's listener: non-blocking, SO_REUSEADDR (as std's: a gang of an
/// earlier attempt leaves TIME_WAIT connections), and the longest accept queue the
/// kernel allows (net.core.somaxconn, 4096 by default since Linux 5.4): a gang's pods
/// all connect within moments, and a queue of 128 (std's) made the rest resend SYNs
/// a second later.
fn listen(at: SocketAddr) -> std::io::Result<TcpListener> {
    use nix::sys::socket::{
        AddressFamily, Backlog, SockFlag, SockType, SockaddrStorage, bind, listen, setsockopt,
        socket, sockopt,
    };
    use std::os::fd::AsRawFd;
    let family = if at.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    };
    let flags = SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK;
    let fd = socket(family, SockType::Stream, flags, None)?;
    setsockopt(&fd, sockopt::ReuseAddr, &true)?;
    bind(fd.as_raw_fd(), &SockaddrStorage::from(at))?;
    listen(&fd, Backlog::MAXALLOWABLE)?;
    Ok(TcpListener::from(fd))
}

/// A port on `at`'s address that the kernel picks, held by a socket bound to it but
/// not listening: a peer whose NCCL connects early is refused and retries
/// (NCCL_SOCKET_RETRY_CNT, src/misc/socket.cc `socketConnectCheck`) instead of
/// landing in a backlog nobody serves. The port is in the ephemeral range NCCL's
/// other listeners use (port 0), so it needs no more of the network than NCCL does.
fn reserve_port(at: SocketAddr) -> Option<(std::os::fd::OwnedFd, u16)> {
    use nix::sys::socket::{
        AddressFamily, SockFlag, SockType, SockaddrStorage, bind, getsockname, socket,
    };
    use std::os::fd::AsRawFd;
    let family = if at.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    };
    let fd = socket(family, SockType::Stream, SockFlag::SOCK_CLOEXEC, None).ok()?;
    let addr = SockaddrStorage::from(SocketAddr::new(at.ip(), 0));
    bind(fd.as_raw_fd(), &addr).ok()?;
    let bound: SockaddrStorage = getsockname(fd.as_raw_fd()).ok()?;
    let port = bound
        .as_sockaddr_in()
        .map(|a| a.port())
        .or_else(|| bound.as_sockaddr_in6().map(|a| a.port()))?;
    Some((fd, port))
}

impl Root {
    /// While NCCL runs, until every pod still there sent its outcome (this pod's own
    /// from `live`) or `deadline`: beats both ways, pods that close or fall silent
    /// or whose run ends early stop every pod; then the outcomes to every pod.
    pub fn follow(&mut self, live: &Live, silence: Duration, deadline: Instant) -> Outcomes {
        let started = Instant::now();
        let mut gone: Vec<Gone> = Vec::new();
        let mut stop: Option<String> = None;
        let mut beat_at = Instant::now();
        loop {
            self.serve_once();
            self.missed(started, silence, &mut gone);
            if stop.is_none() {
                stop = self.stop_reason(live, &gone);
                if let Some(why) = &stop {
                    live.stop(why);
                    beat_at = Instant::now();
                }
            }
            let mine = live.outcome();
            let all_in = mine.is_some()
                && self.members.iter().enumerate().all(|(i, m)| {
                    m.as_ref().is_none_or(|m| m.outcome.is_some())
                        || gone.iter().any(|g| g.node == i as u64)
                });
            if all_in || Instant::now() >= deadline {
                return self.finish(mine, gone);
            }
            if Instant::now() >= beat_at {
                self.beat_all(live, &stop, &gone);
                beat_at = Instant::now() + BEAT_EVERY;
            }
        }
    }

    /// One wait, then the door, every pod's frames and what waits to be sent.
    fn serve_once(&mut self) {
        let mut fds = self.door.fds();
        fds.extend(
            self.members
                .iter()
                .flatten()
                .map(|m| (m.conn.stream().as_fd(), m.conn.sending())),
        );
        wait(&fds);
        drop(fds);
        for a in self.door.admit() {
            self.arrive(a, true);
        }
        let nodes = self.nodes;
        for m in self.members.iter_mut().flatten() {
            let before = m.conn.received;
            if m.conn.pull(wire::HEADER + wire::OUTCOME_BYTES).is_err() || m.conn.flush().is_err() {
                m.closed = true;
            }
            if m.conn.received > before {
                m.heard = Instant::now();
            }
            while let Ok(Some((head, body))) = m.conn.frame(|k| wire::limit(k, nodes)) {
                match head.kind {
                    Kind::Beat => {
                        if let Ok(b) = serde_json::from_slice::<Beat>(&body) {
                            m.beat = b;
                        }
                    }
                    Kind::Outcome => {
                        m.outcome = serde_json::from_slice::<Outcome>(&body)
                            .ok()
                            .map(Outcome::checked);
                    }
                    _ => {}
                }
            }
        }
    }

    /// Adds to `gone` every pod whose connection closed or that said nothing for `silence`.
    fn missed(&mut self, started: Instant, silence: Duration, gone: &mut Vec<Gone>) {
        for (i, m) in self.members.iter_mut().enumerate() {
            let Some(m) = m else { continue };
            if gone.iter().any(|g| g.node == i as u64) || m.outcome.is_some() {
                continue;
            }
            let how = if m.closed {
                Some(How::Closed)
            } else if m.heard.elapsed() > silence {
                Some(How::Silent(silence.as_secs_f64()))
            } else {
                None
            };
            if let Some(how) = how {
                gone.push(Gone {
                    node: i as u64,
                    seconds: Some(started.elapsed().as_secs_f64()),
                    stage: crate::render::visible(&m.beat.stage).into_owned(),
                    how,
                });
            }
        }
    }

    /// Why every pod must stop now: a pod left, or a pod's (this one's included) NCCL
    /// run ended early.
    fn stop_reason(&self, live: &Live, gone: &[Gone]) -> Option<String> {
        if let Some(g) = gone.first() {
            return Some(format!("node {} left the gang", g.node));
        }
        if let Some(why) = live.beat().0.ended {
            return Some(format!("node 0's NCCL run ended early: {why}"));
        }
        self.members.iter().enumerate().find_map(|(i, m)| {
            let why = m.as_ref()?.beat.ended.as_ref()?;
            Some(format!(
                "node {i}'s NCCL run ended early: {}",
                crate::render::visible(why)
            ))
        })
    }

    /// Sends every pod rank 0's beat: its stage, why to stop, the pods gone.
    fn beat_all(&mut self, live: &Live, stop: &Option<String>, gone: &[Gone]) {
        let beat = Beat {
            stage: live.beat().0.stage,
            ended: None,
            stop: stop.clone(),
            gone: gone.to_vec(),
        };
        let body: std::sync::Arc<[u8]> =
            std::sync::Arc::from(serde_json::to_vec(&beat).unwrap_or_default());
        let job = self.job;
        for (rank, m) in self.members.iter_mut().enumerate() {
            if let Some(m) = m {
                m.conn
                    .push_shared(Kind::Beat, job, rank as u32, std::sync::Arc::clone(&body));
                let _ = m.conn.flush();
            }
        }
    }

    /// Sends every pod the outcomes (each within SEND_WITHIN, all at once) and returns them.
    fn finish(&mut self, mine: Option<Outcome>, gone: Vec<Gone>) -> Outcomes {
        let mut outcomes: Vec<Option<Outcome>> = self
            .members
            .iter()
            .map(|m| m.as_ref().and_then(|m| m.outcome.clone()))
            .collect();
        outcomes[0] = mine;
        let all = Outcomes {
            outcomes,
            gone,
            duplicates: self.late_duplicates.clone(),
            late: self.late.clone(),
        };
        let body: std::sync::Arc<[u8]> =
            std::sync::Arc::from(serde_json::to_vec(&all).unwrap_or_default());
        let job = self.job;
        for (rank, m) in self.members.iter_mut().enumerate() {
            if let Some(m) = m {
                m.conn.push_shared(
                    Kind::Outcomes,
                    job,
                    rank as u32,
                    std::sync::Arc::clone(&body),
                );
            }
        }
        let by = Instant::now() + SEND_WITHIN;
        while Instant::now() < by {
            let mut open = false;
            for m in self.members.iter_mut().flatten() {
                open |= matches!(m.conn.flush(), Ok(false));
            }
            if !open {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        all
    }
}
