//! Why the job hangs, from RAS alone: each cause in one line with its ranks, collectives
//! and counts, the first cause first, and who can fix it. Pure.
//!
//! What the fields mean, from NVIDIA/nccl src/ras/ (v2.24.3-1 to v2.30.7-1) and
//! docs/.../troubleshooting/ras.rst: a rank's `collective_counts` are the collectives of
//! each kind it has *launched* (comm->seqNumber, bumped when a kernel plan starts,
//! src/plugin/profiler.cc ncclProfilerStartTaskEvents), not completed (nccl#1730). So,
//! for a communicator whose counts have stopped moving:
//! - a rank that launched collective N of a kind the others have not is waiting in it;
//!   ranks that have not launched it are not inside it: they answer RAS, so their
//!   processes run, outside NCCL (user code, data loading, a checkpoint) or in another
//!   communicator. One group ahead of all the others on every kind is "behind" (the
//!   others, when they are the few) or "ahead" (itself, when it is the few).
//! - two groups each ahead of the other on different kinds (rank 0 launched AllReduce
//!   692 but not AllGather 1, rank 1 AllGather 1 but not AllReduce 692) called different
//!   collectives: the job's code took a different path on different ranks.
//! - a missing rank that is `unresponsive` has a process RAS cannot reach (stopped by a
//!   signal or a debugger, stuck, or gone); `considered_dead` after 60 s without an answer.
//! - `async_error` and `init_state` other than 0 and 7 are ncclResult_t errors; 6
//!   (ncclRemoteError) is a rank's view of another's failure, so it comes last.
//! - `finalize_called`/`destroy_flag` on some ranks: the job ended the communicator there
//!   while the others still use it; `init_state` 7: still in ncclCommInit.
//!
//! What RAS cannot tell: equal, frozen counts (every rank launched the same collective
//! and it never completes: a hang inside the kernel or the network) look like a job busy
//! outside NCCL; point-to-point operations (Send/Recv, PyTorch's all_to_all) and
//! graph-captured collectives are not counted at all.

use super::reply::{Comm, Group, JobStatus, Member, nccl_result};
use serde::Serialize;

/// Who can fix it: the job's code or configuration, the node, or not known.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Blame {
    Job,
    Node,
    Unknown,
}

impl Blame {
    pub fn label(self) -> &'static str {
        match self {
            Blame::Job => "job",
            Blame::Node => "node",
            Blame::Unknown => "unknown",
        }
    }
}

/// The kinds of cause, the first cause first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    Dead,
    Error,
    Stopped,
    Divergent,
    Finalized,
    Initializing,
    Behind,
    Ahead,
    RemoteError,
}

impl Kind {
    pub fn label(self) -> &'static str {
        match self {
            Kind::Dead => "dead",
            Kind::Error => "error",
            Kind::Stopped => "stopped",
            Kind::Divergent => "divergent",
            Kind::Finalized => "finalized",
            Kind::Initializing => "initializing",
            Kind::Behind => "behind",
            Kind::Ahead => "ahead",
            Kind::RemoteError => "remote-error",
        }
    }
}

/// One cause: a line to read, whose fault it is on RAS's evidence, and the ranks to look
/// at (their flight recorder, their node).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Cause {
    pub kind: Kind,
    pub line: String,
    pub blame: Blame,
    #[serde(skip)]
    pub suspects: Vec<Member>,
}

/// Ranks named in a line: the first three, then how many more.
const SHOWN: usize = 3;

/// `rank 1 (pid 637 on 192.0.2.2, GPU 1)`, `rank 0 (...), rank 1 (...) and 510 more ranks`.
pub fn names(members: &[Member], total: u32) -> String {
    let shown: Vec<String> = members.iter().take(SHOWN).map(|m| m.to_string()).collect();
    let more = (total as usize).saturating_sub(shown.len());
    match (shown.is_empty(), more) {
        (true, n) => format!("{n} rank(s)"),
        (false, 0) => shown.join(", "),
        (false, n) => format!("{} and {n} more rank(s)", shown.join(", ")),
    }
}

/// `AllReduce 692, AllGather 1` for the operations `ops` of group `g`.
fn counts_of(c: &Comm, g: &Group, ops: &[usize]) -> String {
    let parts: Vec<String> = ops
        .iter()
        .map(|&i| {
            format!(
                "{} {}",
                c.ops.get(i).map_or("?", String::as_str),
                g.count(i)
            )
        })
        .collect();
    if parts.is_empty() {
        "nothing yet".into()
    } else {
        parts.join(", ")
    }
}

/// ` (2 ranks)` when the size is known.
fn sized(c: &Comm) -> String {
    c.size.map(|s| format!(" ({s} ranks)")).unwrap_or_default()
}

/// Per group: the operations it leads (launched more than some group) and lags.
fn leads_and_lags(c: &Comm) -> Vec<(Vec<usize>, Vec<usize>)> {
    let ops = c.groups.iter().map(|g| g.counts.len()).max().unwrap_or(0);
    let max: Vec<u64> = (0..ops)
        .map(|i| c.groups.iter().map(|g| g.count(i)).max().unwrap_or(0))
        .collect();
    let min: Vec<u64> = (0..ops)
        .map(|i| c.groups.iter().map(|g| g.count(i)).min().unwrap_or(0))
        .collect();
    c.groups
        .iter()
        .map(|g| {
            let leads = (0..ops).filter(|&i| g.count(i) > min[i]).collect();
            let lags = (0..ops).filter(|&i| g.count(i) < max[i]).collect();
            (leads, lags)
        })
        .collect()
}

/// The operations a group has launched at all (its non-zero counts).
fn launched(g: &Group) -> Vec<usize> {
    (0..g.counts.len()).filter(|&i| g.count(i) > 0).collect()
}

/// Every cause in the reply: dead ranks and errors anywhere, and for each communicator
/// in `hung` (disagreeing or missing a rank, unmoved for --hang-after) what its counts
/// and missing ranks say. `dead_events` and `gone_events` are MONITOR's PEER_DEAD and
/// PEER_DISCONNECTED processes since the last reply.
pub fn causes(last: &JobStatus, hung: &[&Comm], dead: &[Member], gone: &[Member]) -> Vec<Cause> {
    let mut out = Vec::new();
    if !dead.is_empty() {
        out.push(Cause {
            kind: Kind::Dead,
            line: format!(
                "dead: {} RAS considers dead (no answer for 60 s): the process exited, was killed, or its host is gone",
                names(dead, dead.len() as u32)
            ),
            blame: Blame::Unknown,
            suspects: dead.iter().take(SHOWN).cloned().collect(),
        });
    }
    errors(last, &mut out);
    for c in hung {
        stopped(c, gone, &mut out);
        positions(last, c, &mut out);
        statuses(c, &mut out);
    }
    out.sort_by_key(|c| c.kind);
    out
}

/// Error lines, one per distinct error text, from every communicator.
fn errors(last: &JobStatus, out: &mut Vec<Cause>) {
    let mut by_what: Vec<(String, i64, Vec<Member>, u32)> = Vec::new();
    for c in &last.comms {
        for e in &c.errors {
            match by_what.iter_mut().find(|(w, ..)| *w == e.what) {
                Some((_, _, members, n)) => {
                    *n += 1;
                    if members.len() < SHOWN
                        && !members.iter().any(|m| m.process() == e.member.process())
                    {
                        members.push(e.member.clone());
                    }
                }
                None => by_what.push((e.what.clone(), e.code, vec![e.member.clone()], 1)),
            }
        }
        if let Some((.., n)) = by_what.last_mut() {
            *n += c.errors_more;
        }
    }
    for (what, code, members, n) in by_what {
        let (kind, blame, why) = match code {
            6 => (Kind::RemoteError, Blame::Unknown, "a peer failed first"),
            4 | 5 => (Kind::Error, Blame::Job, "the job called NCCL wrongly"),
            1 => (
                Kind::Error,
                Blame::Unknown,
                "a CUDA error: the GPU, its driver, or a kernel of the job",
            ),
            2 => (
                Kind::Error,
                Blame::Unknown,
                "a system error: the network, a socket or the OS",
            ),
            _ => (Kind::Error, Blame::Unknown, nccl_result(code)),
        };
        out.push(Cause {
            kind,
            line: format!("error: {} reported {what} ({why})", names(&members, n)),
            blame,
            suspects: members,
        });
    }
}

/// Missing ranks that RAS cannot reach (not yet dead).
fn stopped(c: &Comm, gone: &[Member], out: &mut Vec<Cause>) {
    let missing: Vec<Member> = c
        .missing
        .iter()
        .filter(|m| !m.dead)
        .map(|m| m.member.clone())
        .collect();
    if missing.is_empty() {
        return;
    }
    let answering: u32 = c.groups.iter().map(|g| g.ranks).sum();
    let at = c
        .groups
        .iter()
        .max_by_key(|g| g.ranks)
        .map(|g| format!(", which launched {}", counts_of(c, g, &launched(g))))
        .unwrap_or_default();
    let closed = missing
        .iter()
        .any(|m| gone.iter().any(|g| g.process() == m.process()));
    let how = if closed {
        "its RAS connection closed: the process exited or was killed"
    } else {
        "the process is stopped (a signal, a debugger) or stuck (its host, its GPU), or gone"
    };
    out.push(Cause {
        kind: Kind::Stopped,
        line: format!(
            "stopped: {} does not answer RAS while {answering} rank(s) of communicator {}{} wait{at}: {how}",
            names(&missing, missing.len() as u32),
            c.hash,
            sized(c),
        ),
        blame: Blame::Unknown,
        suspects: missing.into_iter().take(SHOWN).collect(),
    });
}

/// What the groups of counts say: different collectives, a rank behind, a rank ahead.
fn positions(last: &JobStatus, c: &Comm, out: &mut Vec<Cause>) {
    if !c.disagrees() {
        return;
    }
    let rel = leads_and_lags(c);
    let mut order: Vec<usize> = (0..c.groups.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(c.groups[i].ranks));
    if rel
        .iter()
        .any(|(leads, lags)| !leads.is_empty() && !lags.is_empty())
    {
        let parts: Vec<String> = order
            .iter()
            .take(4)
            .map(|&i| {
                let g = &c.groups[i];
                let (leads, lags) = &rel[i];
                let lag: Vec<String> = lags
                    .iter()
                    .map(|&op| {
                        format!(
                            "{} {}",
                            c.ops.get(op).map_or("?", String::as_str),
                            max_count(c, op)
                        )
                    })
                    .collect();
                let not = if lag.is_empty() {
                    String::new()
                } else {
                    format!(" but not {}", lag.join(", "))
                };
                format!(
                    "{} launched {}{not}",
                    names(&g.members, g.ranks),
                    counts_of(c, g, leads)
                )
            })
            .collect();
        out.push(Cause {
            kind: Kind::Divergent,
            line: format!(
                "divergent: the ranks of communicator {}{} called different collectives: {}: the job's code took a different path on different ranks",
                c.hash,
                sized(c),
                parts.join("; ")
            ),
            blame: Blame::Job,
            suspects: order.iter().flat_map(|&i| c.groups[i].members.iter().take(1).cloned()).take(SHOWN).collect(),
        });
        return;
    }
    chain(last, c, &rel, out);
}

fn max_count(c: &Comm, op: usize) -> u64 {
    c.groups.iter().map(|g| g.count(op)).max().unwrap_or(0)
}

/// Counts in a chain: the front group waits in what it leads; the others have not
/// launched it. The fewer side is the suspect: behind when the laggards are fewer (or
/// as many), ahead when the front is.
fn chain(last: &JobStatus, c: &Comm, rel: &[(Vec<usize>, Vec<usize>)], out: &mut Vec<Cause>) {
    let Some(front) = rel.iter().position(|(_, lags)| lags.is_empty()) else {
        return;
    };
    let top = &c.groups[front];
    let waits = counts_of(c, top, &rel[front].0);
    let behind: Vec<&Group> = c
        .groups
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != front)
        .map(|(_, g)| g)
        .collect();
    let behind_ranks: u32 = behind.iter().map(|g| g.ranks).sum();
    let behind_members: Vec<Member> = behind
        .iter()
        .flat_map(|g| g.members.iter().cloned())
        .take(SHOWN)
        .collect();
    let behind_at: Vec<String> = behind
        .iter()
        .take(3)
        .map(|g| counts_of(c, g, &rel[front].0))
        .collect();
    if top.ranks < behind_ranks {
        out.push(Cause {
            kind: Kind::Ahead,
            line: format!(
                "ahead: {} launched {waits} in communicator {}{}, which the other {behind_ranks} rank(s) have not (they are at {}): a collective only some ranks call, or the others busy outside NCCL",
                names(&top.members, top.ranks),
                c.hash,
                sized(c),
                behind_at.join("; ")
            ),
            blame: Blame::Job,
            suspects: top.members.iter().take(SHOWN).cloned().collect(),
        });
        return;
    }
    let line = format!(
        "behind: {} (at {}) have not launched {waits}, which {} wait in (communicator {}{}): they answer RAS, so their processes run outside NCCL (user code, data loading, a checkpoint) or in another communicator",
        names(&behind_members, behind_ranks),
        behind_at.join("; "),
        names(&top.members, top.ranks),
        c.hash,
        sized(c),
    );
    let cause = match elsewhere(last, c, &behind_members) {
        Some(other) => Cause {
            kind: Kind::Divergent,
            line: format!(
                "divergent: {other}, while {} wait for it in {waits} (communicator {}): the ranks called collectives of different communicators in a different order",
                names(&top.members, top.ranks),
                c.hash
            ),
            blame: Blame::Job,
            suspects: behind_members,
        },
        None => Cause {
            kind: Kind::Behind,
            line,
            blame: Blame::Job,
            suspects: behind_members,
        },
    };
    out.push(cause);
}

/// Where one of `members` waits in another communicator (is in a group there that
/// launched what others there have not): `rank 1 (...) waits in AllGather 5 of
/// communicator 0x...`.
fn elsewhere(last: &JobStatus, here: &Comm, members: &[Member]) -> Option<String> {
    for other in last
        .comms
        .iter()
        .filter(|o| o.hash != here.hash && o.disagrees())
    {
        let rel = leads_and_lags(other);
        for m in members {
            let Some(g) = other.group_of(m) else { continue };
            let Some(i) = other.groups.iter().position(|x| std::ptr::eq(x, g)) else {
                continue;
            };
            if !rel[i].0.is_empty() {
                return Some(format!(
                    "{m} waits in {} of communicator {}",
                    counts_of(other, g, &rel[i].0),
                    other.hash
                ));
            }
        }
    }
    None
}

/// Ranks that ended or have not finished setting up a communicator the others use.
fn statuses(c: &Comm, out: &mut Vec<Cause>) {
    let all: u32 = c.groups.iter().map(|g| g.ranks).sum();
    let finalized = c.finalized.len() as u32 + c.finalized_more;
    if finalized > 0 && finalized < all {
        out.push(Cause {
            kind: Kind::Finalized,
            line: format!(
                "finalized: {} finalized or destroyed communicator {}{} while {} other rank(s) still use it: the job ended it on some ranks only",
                names(&c.finalized, finalized),
                c.hash,
                sized(c),
                all - finalized
            ),
            blame: Blame::Job,
            suspects: c.finalized.iter().take(SHOWN).cloned().collect(),
        });
    }
    let init: Vec<Member> = c
        .ranks
        .iter()
        .filter(|r| r.init_state == 7)
        .map(|r| r.member.clone())
        .collect();
    if !init.is_empty() && init.len() < c.ranks.len() {
        out.push(Cause {
            kind: Kind::Initializing,
            line: format!(
                "initializing: {} still in ncclCommInit of communicator {}{}, which the other rank(s) already use: a peer that never joined, or the job creating communicators in a different order",
                names(&init, init.len() as u32),
                c.hash,
                sized(c),
            ),
            blame: Blame::Unknown,
            suspects: init.into_iter().take(SHOWN).collect(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::super::reply::parse_json;
    use super::*;

    const HEALTHY: &str = include_str!("../../../tests/data/ras/2.28.9/healthy.json");

    /// The 2-rank reply with rank 0's and rank 1's counts set: `(AllGather, AllReduce)`.
    fn two_ranks(r0: (u64, u64), r1: (u64, u64)) -> JobStatus {
        let mut text = HEALTHY.to_string();
        for (n, (ag, ar)) in [r0, r1].into_iter().enumerate() {
            let _ = n;
            text = text
                .replacen("\"AllGather\": 0,", &format!("\"AllGather\": x{ag},"), 1)
                .replacen("\"AllReduce\": 235", &format!("\"AllReduce\": x{ar}"), 1);
        }
        parse_json(&text.replace(": x", ": ")).unwrap()
    }

    fn run(s: &JobStatus) -> Vec<Cause> {
        let hung: Vec<&Comm> = s.comms.iter().collect();
        causes(s, &hung, &[], &[])
    }

    /// Written from the counts' meaning before the code ran: rank 0 launched AllReduce
    /// 692 and not AllGather 1, rank 1 the reverse: divergent, the job's.
    #[test]
    fn ranks_in_different_collectives_are_divergent_and_the_jobs() {
        let s = two_ranks((0, 692), (1, 691));
        let c = run(&s);
        assert_eq!(c.len(), 1, "{c:?}");
        assert_eq!((c[0].kind, c[0].blame), (Kind::Divergent, Blame::Job));
        assert!(
            c[0].line.contains("rank 0 (pid 636 on 192.0.2.2, GPU 0) launched AllReduce 692 but not AllGather 1; rank 1 (pid 637 on 192.0.2.2, GPU 1) launched AllGather 1 but not AllReduce 692"),
            "{}",
            c[0].line
        );
    }

    #[test]
    fn one_rank_behind_while_the_other_waits_is_behind() {
        let s = two_ranks((0, 692), (0, 691));
        let c = run(&s);
        assert_eq!((c[0].kind, c[0].blame), (Kind::Behind, Blame::Job));
        assert!(
            c[0].line.starts_with("behind: rank 1 (pid 637 on 192.0.2.2, GPU 1) (at AllReduce 691) have not launched AllReduce 692, which rank 0 (pid 636 on 192.0.2.2, GPU 0) wait in"),
            "{}",
            c[0].line
        );
    }

    /// One rank of many ahead: it is the odd one (a collective only it calls).
    #[test]
    fn one_rank_ahead_of_many_is_ahead() {
        let mut s = two_ranks((0, 692), (0, 692));
        let c = &mut s.comms[0];
        c.groups = vec![
            Group {
                counts: vec![0, 0, 0, 0, 693],
                ranks: 1,
                members: vec![c.ranks[0].member.clone()],
            },
            Group {
                counts: vec![0, 0, 0, 0, 692],
                ranks: 1023,
                members: vec![c.ranks[1].member.clone()],
            },
        ];
        let causes = run(&s);
        assert_eq!(causes[0].kind, Kind::Ahead);
        assert!(
            causes[0]
                .line
                .starts_with("ahead: rank 0 (pid 636 on 192.0.2.2, GPU 0) launched AllReduce 693"),
            "{}",
            causes[0].line
        );
        assert!(
            causes[0]
                .line
                .contains("the other 1023 rank(s) have not (they are at AllReduce 692)"),
            "{}",
            causes[0].line
        );
    }

    /// A rank behind in one communicator that waits in another is a deadlock between
    /// communicators, not a rank in user code.
    #[test]
    fn behind_here_and_waiting_elsewhere_is_divergent_across_communicators() {
        let world = two_ranks((0, 692), (0, 691));
        let mut sub = two_ranks((0, 10), (0, 9)).comms.remove(0);
        sub.hash = "0xbeef".into();
        // In `sub`, rank 1's process (pid 637) leads.
        sub.groups[0].members[0].pid = Some(637);
        sub.groups[1].members[0].pid = Some(636);
        sub.ranks.clear();
        let mut s = world;
        s.comms.push(sub);
        let first = &run(&s)[0];
        assert_eq!(first.kind, Kind::Divergent, "{first:?}");
        assert!(
            first
                .line
                .contains("waits in AllReduce 10 of communicator 0xbeef"),
            "{}",
            first.line
        );
    }

    #[test]
    fn dead_errors_and_missing_ranks_come_first_and_remote_errors_last() {
        let text = include_str!("../../../tests/data/ras/2.28.9/stopped-unresponsive.json")
            .replacen("\"async_error\": 0", "\"async_error\": 6", 1);
        let s = super::super::reply::parse_json(&text).unwrap();
        let dead = vec![Member {
            rank: Some(3),
            pid: Some(9),
            ..Member::default()
        }];
        let hung: Vec<&Comm> = s.comms.iter().collect();
        let c = causes(&s, &hung, &dead, &[]);
        let kinds: Vec<Kind> = c.iter().map(|c| c.kind).collect();
        assert_eq!(kinds, [Kind::Dead, Kind::Stopped, Kind::RemoteError]);
        assert!(c[1].line.starts_with("stopped: rank 1 (pid 637 on 192.0.2.2, GPU 1) does not answer RAS while 1 rank(s) of communicator 0x74e4f22091e41071 (2 ranks) wait, which launched AllReduce 241"), "{}", c[1].line);
        // MONITOR said its connection closed: gone, not stopped.
        let gone = vec![s.comms[0].missing[0].member.clone()];
        let c = causes(&s, &hung, &[], &gone);
        assert!(
            c[0].line
                .ends_with("its RAS connection closed: the process exited or was killed"),
            "{}",
            c[0].line
        );
    }

    #[test]
    fn names_show_three_and_count_the_rest() {
        let m = |r| Member {
            rank: Some(r),
            ..Member::default()
        };
        assert_eq!(names(&[m(0)], 1), "rank 0");
        assert_eq!(
            names(&[m(0), m(1), m(2), m(3)], 512),
            "rank 0, rank 1, rank 2 and 509 more rank(s)"
        );
        assert_eq!(names(&[], 4), "4 rank(s)");
    }
}
