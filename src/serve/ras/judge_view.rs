//! The judgement read out at a moment: the state, the causes (diagnosis.rs) with the
//! first one in the headline, the numbers for /metrics, and the last reply summarized.

use super::diagnosis::{self, Cause};
use super::judge::{JobView, Parts, State, Watch};
use super::reply::{Comm, JobStatus, Member};
use serde_json::json;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

fn secs(d: Duration) -> f64 {
    (d.as_secs_f64() * 10.0).round() / 10.0
}

/// A process and GPU, the identity of a rank across communicators.
fn key(m: &Member) -> (Option<String>, Option<i64>, Option<i64>) {
    (m.host.clone(), m.pid, m.gpu)
}

/// The ranks RAS considers dead: missing ranks marked so, the text's DEAD processes,
/// and the peers MONITOR reported dead since the last reply.
fn dead_members(last: &JobStatus, events: &[Member]) -> Vec<Member> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    let missing = last
        .comms
        .iter()
        .flat_map(|c| c.missing.iter().filter(|m| m.dead).map(|m| &m.member));
    for m in missing.chain(&last.dead).chain(events) {
        if seen.insert(key(m)) {
            out.push(m.clone());
        }
    }
    out
}

/// Communicators whose counts disagree or that miss a rank, with how long they have
/// not moved.
fn stalled<'a>(p: &Parts<'_>, last: &'a JobStatus, now: Instant) -> Vec<(&'a Comm, Duration)> {
    last.comms
        .iter()
        .filter(|c| c.disagrees() || !c.missing.is_empty())
        .filter_map(|c| {
            let since = *p.tracks.get(c.hash.as_str())?;
            Some((c, now.saturating_duration_since(since)))
        })
        .collect()
}

/// The judgement at `now`.
pub fn view(w: &Watch, now: Instant) -> JobView {
    let p = w.parts();
    let mut v = JobView {
        state: State::Waiting,
        headline: String::new(),
        details: Vec::new(),
        nccl_version: p.last.and_then(|l| l.version.clone()),
        format: p.last.map(|l| l.format),
        warnings: p.warnings.to_vec(),
        ranks: 0,
        ranks_missing: 0,
        ranks_dead: 0,
        communicators: 0,
        communicators_hung: 0,
        seconds_since_progress: p
            .last_progress
            .map(|t| secs(now.saturating_duration_since(t))),
        seconds_since_reply: p.last_reply.map(|t| secs(now.saturating_duration_since(t))),
        queries: p.queries,
        failed_queries: p.failed,
        last_error: p.last_error.map(str::to_string),
        events: p.events.clone(),
        last_reply: p.last.map(summary),
        causes: Vec::new(),
        report: None,
        troubled: false,
        diagnostics: None,
    };
    if let Some(why) = p.unwatchable {
        v.state = State::Unwatchable;
        v.headline = why.to_string();
        return v;
    }
    let Some(last) = p.last else {
        v.headline = match p.last_error {
            Some(e) if !p.refused => format!("waiting for the trainer's NCCL RAS: {e}"),
            _ => "waiting for the trainer's NCCL RAS (it opens when the first communicator initialises)".into(),
        };
        return v;
    };
    judge_reply(&p, last, now, &mut v);
    v
}

/// The state, the causes and the numbers from the last reply.
fn judge_reply(p: &Parts<'_>, last: &JobStatus, now: Instant, v: &mut JobView) {
    let dead = dead_members(last, p.dead_events);
    let stalled = stalled(p, last, now);
    let hung: Vec<&Comm> = stalled
        .iter()
        .filter(|(_, s)| *s >= p.hang_after)
        .map(|(c, _)| *c)
        .collect();
    v.troubled = stalled.iter().any(|(_, s)| *s >= p.hang_after / 2);
    let missing: BTreeSet<_> = last
        .comms
        .iter()
        .flat_map(|c| c.missing.iter().filter(|m| !m.dead).map(|m| key(&m.member)))
        .collect();
    let errors = last.comms.iter().any(|c| !c.errors.is_empty());
    v.causes = diagnosis::causes(last, &hung, &dead, p.gone_events);
    v.ranks = last
        .comms
        .iter()
        .map(|c| c.groups.iter().map(|g| u64::from(g.ranks)).sum::<u64>() + c.missing.len() as u64)
        .max()
        .unwrap_or(0)
        .max(last.ranks_in_table);
    v.ranks_dead = dead.len() as u64;
    v.ranks_missing = missing.len() as u64;
    v.communicators = last.communicators.max(last.comms.len() as u64);
    v.communicators_hung = hung.len() as u64;
    v.details = v.causes.iter().map(|c| c.line.clone()).collect();
    for (c, s) in stalled.iter().filter(|(_, s)| *s >= p.hang_after) {
        v.details.push(format!(
            "communicator {}{}: counts unmoved for {:.0} s (--hang-after {:.0} s)",
            c.hash,
            c.size.map(|n| format!(" ({n} ranks)")).unwrap_or_default(),
            s.as_secs_f64(),
            p.hang_after.as_secs_f64()
        ));
    }
    for (c, _) in stalled.iter().filter(|(_, s)| *s < p.hang_after) {
        for m in c.missing.iter().filter(|m| !m.dead).take(diagnosis_named()) {
            v.details.push(format!(
                "{}: RAS cannot reach it (unresponsive, not yet dead)",
                m.member
            ));
        }
    }
    v.state = if !dead.is_empty() {
        State::Dead
    } else if !hung.is_empty() {
        State::Hung
    } else if errors {
        State::Error
    } else if v.communicators == 0 {
        // RAS opens at the first communicator's init, before the communicator shows
        // (seen on 2x H100 with 2.28.9: one reply with none), and outlives the last one.
        State::Waiting
    } else {
        State::Healthy
    };
    settle(p, now, v, !missing.is_empty());
}

fn diagnosis_named() -> usize {
    super::reply::NAMED
}

/// The state where the last reply is not the whole story: the job gone, queries failing,
/// a rank unresponsive; and the headline.
fn settle(p: &Parts<'_>, now: Instant, v: &mut JobView, missing: bool) {
    let ago = v.seconds_since_reply.unwrap_or(0.0);
    if p.refused {
        v.state = State::Gone;
        v.details.insert(
            0,
            format!("the last reply, {ago:.0} s ago: {}", summary_line(v)),
        );
        v.headline = "gone: no NCCL process answers RAS on this pod any more (the job's processes here ended: a crash, a kill, a restart or the end)".into();
        return;
    }
    let failing = p.failing_since.map(|t| now.saturating_duration_since(t));
    if let Some(f) = failing.filter(|f| *f >= p.hang_after) {
        if v.state < State::Hung {
            v.state = State::Hung;
        }
        let line = format!(
            "stopped: RAS accepts connections on this pod but answered no query for {:.0} s: a process of the job here is stopped or stuck (its flight recorder dump, if any, names it)",
            f.as_secs_f64()
        );
        v.causes.insert(
            0,
            Cause {
                kind: diagnosis::Kind::Stopped,
                line: line.clone(),
                blame: diagnosis::Blame::Unknown,
                suspects: Vec::new(),
            },
        );
        v.details.insert(0, line);
        v.headline = format!("hung: RAS answers no query ({})", summary_line(v));
        return;
    }
    if v.state <= State::Healthy && (missing || failing.is_some()) {
        v.state = State::Suspect;
    }
    if v.state == State::Waiting {
        v.headline = "waiting: NCCL RAS answers, with no communicator yet (or none left)".into();
        return;
    }
    v.headline = match v.causes.first() {
        Some(first) if v.state.fails_liveness() => {
            let more = v.causes.len() - 1;
            let more = if more > 0 {
                format!(" (and {more} more cause(s) in /job)")
            } else {
                String::new()
            };
            // `dead: dead: ...` once.
            match first.line.starts_with(&format!("{}:", v.state.label())) {
                true => format!("{}{more}", first.line),
                false => format!("{}: {}{more}", v.state.label(), first.line),
            }
        }
        _ => format!("{}: {}", v.state.label(), summary_line(v)),
    };
}

fn summary_line(v: &JobView) -> String {
    if let Some(first) = v.causes.first() {
        return first.line.clone();
    }
    let missing = if v.ranks_missing > 0 {
        format!(", {} not answering", v.ranks_missing)
    } else {
        String::new()
    };
    format!(
        "{} rank(s) in {} communicator(s){missing}",
        v.ranks, v.communicators
    )
}

/// Communicators shown in /job's `last_reply`, the troubled ones first.
const SHOWN_COMMS: usize = 32;
/// Groups, names and missing ranks shown per communicator.
const SHOWN_PER_COMM: usize = 8;

/// The last reply as /job shows it: bounded whatever the job's size.
fn summary(s: &JobStatus) -> serde_json::Value {
    let mut comms: Vec<&Comm> = s.comms.iter().collect();
    comms.sort_by_key(|c| !(c.disagrees() || !c.missing.is_empty() || !c.errors.is_empty()));
    let shown: Vec<serde_json::Value> = comms
        .iter()
        .take(SHOWN_COMMS)
        .map(|c| comm_summary(c))
        .collect();
    json!({
        "nccl_version": s.version,
        "format": s.format,
        "repaired": s.repaired,
        "timeouts": s.timeouts,
        "collection_secs": s.collection_secs,
        "initializing": s.initializing,
        "communicators": s.communicators.max(s.comms.len() as u64),
        "comms": shown,
        "comms_not_shown": s.comms.len().saturating_sub(SHOWN_COMMS),
        "dead": s.dead.iter().take(SHOWN_PER_COMM).map(|m| m.to_string()).collect::<Vec<_>>(),
        "unreachable": s.unreachable.iter().take(SHOWN_PER_COMM).map(|m| m.to_string()).collect::<Vec<_>>(),
    })
}

fn comm_summary(c: &Comm) -> serde_json::Value {
    let groups: Vec<serde_json::Value> = c
        .groups
        .iter()
        .take(SHOWN_PER_COMM)
        .map(|g| {
            let counts: serde_json::Map<String, serde_json::Value> = c
                .ops
                .iter()
                .enumerate()
                .map(|(i, op)| (op.clone(), json!(g.count(i))))
                .collect();
            json!({
                "counts": counts,
                "ranks": g.ranks,
                "named": g.members.iter().take(SHOWN_PER_COMM).map(|m| m.to_string()).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({
        "hash": c.hash,
        "size": c.size,
        "answered": c.groups.iter().map(|g| u64::from(g.ranks)).sum::<u64>(),
        "groups": groups,
        "groups_not_shown": c.groups.len().saturating_sub(SHOWN_PER_COMM),
        "missing": c.missing.iter().take(SHOWN_PER_COMM).map(|m| json!({
            "rank": m.member.to_string(),
            "unresponsive": m.unresponsive,
            "dead": m.dead,
        })).collect::<Vec<_>>(),
        "missing_count": c.missing.len(),
        "errors": c.errors.iter().map(|e| e.to_string()).collect::<Vec<_>>(),
        "errors_not_shown": c.errors_more,
        "finalized": c.finalized.iter().map(|m| m.to_string()).collect::<Vec<_>>(),
        "initializing": c.initializing,
    })
}

#[cfg(test)]
mod tests {
    use super::super::judge::{Events, Outcome, Watch};
    use super::super::reply::{parse_json, parse_text};
    use super::*;

    const HEALTHY: &str = include_str!("../../../tests/data/ras/2.28.9/healthy.json");
    const UNRESPONSIVE: &str =
        include_str!("../../../tests/data/ras/2.28.9/stopped-unresponsive.json");
    const DEAD: &str = include_str!("../../../tests/data/ras/2.28.9/stopped-dead.json");

    /// MONITOR's lines as the monitor thread keeps them between two queries.
    fn events(lines: &[String]) -> Events {
        let mut e = Events::new(64);
        for l in lines {
            e.push(l, 1);
        }
        e
    }

    fn dead_peer(pid: u32) -> String {
        format!(
            "[2026-11-26 07:28:04] PEER_DEAD: Process {pid} on node 10.0.{}.{} managing GPU 0",
            pid / 250 % 250,
            pid % 250
        )
    }

    fn reply(text: &str) -> Outcome {
        Outcome::Reply(Box::new(parse_json(text).unwrap()))
    }

    #[test]
    fn a_stopped_rank_is_suspect_then_hung_after_hang_after_then_dead() {
        let t0 = Instant::now();
        let s = |n: u64| t0 + Duration::from_secs(n);
        let mut w = Watch::new(Duration::from_secs(60));
        assert_eq!(view(&w, t0).state, State::Waiting);
        w.observe(s(0), reply(HEALTHY));
        let v = view(&w, s(0));
        assert_eq!((v.state, v.ranks, v.communicators), (State::Healthy, 2, 1));
        assert_eq!(v.headline, "healthy: 2 rank(s) in 1 communicator(s)");
        w.observe(s(10), reply(UNRESPONSIVE));
        let v = view(&w, s(10));
        assert_eq!((v.state, v.ranks_missing), (State::Suspect, 1));
        // A query that got no reply (as 2.28.9 did 30 s after the stop) keeps the judgement.
        w.observe(s(45), Outcome::Failed("no reply within 12 s".into()));
        assert_eq!(view(&w, s(45)).state, State::Suspect);
        w.observe(s(71), reply(UNRESPONSIVE));
        let v = view(&w, s(71));
        assert_eq!(v.state, State::Hung, "{v:?}");
        assert_eq!(
            v.headline,
            "hung: stopped: rank 1 (pid 637 on 192.0.2.2, GPU 1) does not answer RAS while 1 rank(s) of communicator 0x74e4f22091e41071 (2 ranks) wait, which launched AllReduce 241: the process is stopped (a signal, a debugger) or stuck (its host, its GPU), or gone"
        );
        assert_eq!(
            v.details[1],
            "communicator 0x74e4f22091e41071 (2 ranks): counts unmoved for 61 s (--hang-after 60 s)"
        );
        w.observe(s(80), reply(DEAD));
        let v = view(&w, s(80));
        assert_eq!((v.state, v.ranks_dead), (State::Dead, 1));
        assert!(v.state.fails_liveness());
        assert!(
            v.headline
                .starts_with("dead: rank 1 (pid 637 on 192.0.2.2, GPU 1)"),
            "{}",
            v.headline
        );
        // The trainer restarted: healthy again, nothing carried over.
        w.observe(s(90), Outcome::Refused);
        let v = view(&w, s(90));
        assert_eq!(v.state, State::Gone);
        assert!(!v.state.fails_liveness());
        assert!(v.details[0].contains("dead: rank 1"), "{:?}", v.details);
        w.observe(s(100), reply(HEALTHY));
        assert_eq!(view(&w, s(100)).state, State::Healthy);
    }

    #[test]
    fn counts_that_disagree_and_do_not_move_are_hung_and_moving_counts_are_not() {
        let behind = HEALTHY.replacen("\"AllReduce\": 235", "\"AllReduce\": 236", 1);
        let t0 = Instant::now();
        let mut w = Watch::new(Duration::from_secs(30));
        w.observe(t0, reply(&behind));
        assert_eq!(view(&w, t0 + Duration::from_secs(29)).state, State::Healthy);
        let v = view(&w, t0 + Duration::from_secs(31));
        assert_eq!(v.state, State::Hung);
        assert!(v.headline.starts_with(
            "hung: behind: rank 1 (pid 637 on 192.0.2.2, GPU 1) (at AllReduce 235) have not launched AllReduce 236, which rank 0 (pid 636 on 192.0.2.2, GPU 0) wait in"
        ), "{}", v.headline);
        assert!(v.troubled);
        // Counts that move (a normal outpacing, ras.rst) are never hung.
        let moved = behind.replace("236", "300").replace("235", "299");
        w.observe(t0 + Duration::from_secs(40), reply(&moved));
        assert_eq!(view(&w, t0 + Duration::from_secs(60)).state, State::Healthy);
        assert_eq!(
            view(&w, t0 + Duration::from_secs(60)).seconds_since_progress,
            Some(20.0)
        );
    }

    #[test]
    fn queries_that_never_get_an_answer_become_hung_and_refusals_before_any_reply_wait() {
        let t0 = Instant::now();
        let mut w = Watch::new(Duration::from_secs(30));
        w.observe(t0, Outcome::Refused);
        assert_eq!(view(&w, t0).state, State::Waiting);
        w.observe(t0, reply(HEALTHY));
        w.observe(
            t0 + Duration::from_secs(5),
            Outcome::Failed("no reply".into()),
        );
        assert_eq!(view(&w, t0 + Duration::from_secs(5)).state, State::Suspect);
        let v = view(&w, t0 + Duration::from_secs(40));
        assert_eq!(v.state, State::Hung);
        assert!(
            v.headline.starts_with("hung: RAS answers no query"),
            "{}",
            v.headline
        );
    }

    /// The replies scripts/ras-gpu.sh recorded from real NCCL 2.28.9 on 2x H100, judged
    /// as the watcher judged them there (tests/data/ras/gpu-h100x4-2.28.9/summary.txt).
    #[test]
    fn the_replies_recorded_on_the_gpu_machine_give_the_verdicts_seen_there() {
        let recorded = |name: &str| {
            let path = format!(
                "{}/tests/data/ras/gpu-h100x4-2.28.9/{name}",
                env!("CARGO_MANIFEST_DIR")
            );
            let text = std::fs::read_to_string(path).unwrap();
            // The recorder's own first line.
            text.split_once('\n').unwrap().1.to_string()
        };
        let t0 = Instant::now();
        let mut w = Watch::new(Duration::from_secs(20));
        w.observe(t0, reply(&recorded("healthy.json")));
        assert_eq!(view(&w, t0).state, State::Healthy);
        w.observe(t0, reply(&recorded("killed-5s.json")));
        assert_eq!(view(&w, t0).state, State::Suspect);
        let v = view(&w, t0 + Duration::from_secs(21));
        assert_eq!(v.state, State::Hung);
        assert!(
            v.headline.starts_with(
                "hung: stopped: rank 1 (pid 956 on 192.0.2.2, GPU 1) does not answer RAS"
            ),
            "{}",
            v.headline
        );
        let dead = parse_json(&recorded("killed-dead.json")).unwrap();
        assert!(dead.repaired, "2.28.9's missing comma, recorded again");
        w.observe(t0, Outcome::Reply(Box::new(dead)));
        assert_eq!(view(&w, t0).state, State::Dead);
        // Across two hosts (two network namespaces): node0's watcher names node1's rank.
        let mut w = Watch::new(Duration::from_secs(10));
        w.observe(t0, reply(&recorded("nodes-healthy.json")));
        assert_eq!(
            (view(&w, t0).state, view(&w, t0).ranks),
            (State::Healthy, 4)
        );
        w.observe(t0, reply(&recorded("nodes-stopped-hung.json")));
        let v = view(&w, t0 + Duration::from_secs(11));
        assert!(
            v.headline
                .starts_with("hung: stopped: rank 3 (pid 916 on 10.10.1.1, GPU 1) does not answer RAS while 3 rank(s)"),
            "{}",
            v.headline
        );
        for (name, state) in [
            ("healthy.text", State::Healthy),
            ("killed-5s.text", State::Suspect),
            ("killed-dead.text", State::Dead),
        ] {
            let mut w = Watch::new(Duration::from_secs(20));
            w.observe(
                t0,
                Outcome::Reply(Box::new(parse_text(&recorded(name)).unwrap())),
            );
            let v = view(&w, t0);
            assert_eq!(v.state, state, "{name}: {v:?}");
        }
    }

    #[test]
    fn a_version_without_ras_is_unwatchable_and_never_fails_the_trainer() {
        let mut w = Watch::new(Duration::from_secs(60));
        let why = super::super::version::plan(super::super::version::Version::parse("2.21.5"))
            .unwrap_err();
        w.observe(Instant::now(), Outcome::Unwatchable(why));
        let v = view(&w, Instant::now());
        assert_eq!(v.state, State::Unwatchable);
        assert!(
            v.headline.starts_with("NCCL 2.21.5 has no RAS"),
            "{}",
            v.headline
        );
        assert!(!v.state.fails_liveness());
    }

    #[test]
    fn text_replies_name_dead_processes_and_errors() {
        let mut w = Watch::new(Duration::from_secs(60));
        let t0 = Instant::now();
        let dead = parse_text(include_str!("../../../tests/data/ras/2.26/dead.txt")).unwrap();
        w.observe(t0, Outcome::Reply(Box::new(dead)));
        let v = view(&w, t0);
        assert_eq!(v.state, State::Dead);
        assert!(
            v.headline
                .contains("process pid 3487984 on 172.16.64.213, GPU 5"),
            "{}",
            v.headline
        );
        let errored = HEALTHY.replacen("\"async_error\": 0", "\"async_error\": 6", 1);
        w.observe(t0, reply(&errored));
        let v = view(&w, t0);
        assert_eq!(v.state, State::Error);
        assert!(v.headline.contains("asynchronous error 6 (remote error)"));
        // A MONITOR PEER_DEAD names the process before the next reply does.
        w.observe(t0, reply(HEALTHY));
        let event = "[2026-11-26 07:28:04] PEER_DEAD: Process 637 on node 192.0.2.2 managing GPU 1";
        w.events(events(&[event.to_string()]));
        let v = view(&w, t0);
        assert_eq!(v.state, State::Dead);
        assert_eq!(v.events.len(), 1);
        // The same event again, at another time, a thousand times: one line, counted,
        // one dead rank.
        let again = event.replace("07:28:04", "07:28:05");
        w.events(events(&vec![again; 1000]));
        let v = view(&w, t0);
        assert_eq!(
            v.events,
            [format!("{} (x1001)", event.replace("07:28:04", "07:28:05"))]
        );
        assert_eq!(v.ranks_dead, 1);
    }

    /// A flood of distinct dead peers while STATUS hangs (issue 39's MONITOR row): the
    /// events kept, the dead named in the headline and the view's size stay bounded.
    #[test]
    fn a_flood_of_monitor_events_stays_bounded() {
        let mut w = Watch::new(Duration::from_secs(60));
        let t0 = Instant::now();
        w.observe(t0, reply(HEALTHY));
        // As the watcher takes them: the lines the monitor thread kept between two
        // queries (64), with every peer they named.
        let flood: Vec<String> = (0..100_000).map(dead_peer).collect();
        for batch in flood.chunks(30_000) {
            let pending = events(batch);
            assert_eq!(pending.log.lines().len(), 64);
            w.events(pending);
        }
        w.observe(t0, Outcome::Failed("no answer in time".into()));
        let v = view(&w, t0);
        assert_eq!(v.state, State::Dead);
        assert_eq!(v.events.len(), 16);
        assert_eq!(v.ranks_dead, 16_384);
        assert!(v.headline.len() < 1024, "{}", v.headline);
        assert!(serde_json::to_string(&v).unwrap().len() < 64 * 1024);
    }
}
