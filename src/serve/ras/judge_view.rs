//! The judgement read out at a moment: the state, the named ranks and communicators,
//! the numbers for /metrics.

use super::judge::{JobView, Parts, State, Watch};
use super::reply::{Comm, JobStatus, Member};
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

/// `hung at collective 241 (AllReduce): rank 1 (pid 637 on 192.0.2.2, GPU 1) not answering behind`.
fn hung_line(c: &Comm) -> String {
    let top = c.mismatch.iter().max_by_key(|g| g.count);
    let (op, n) = match top {
        Some(g) => (g.op.clone(), g.count),
        None => c
            .ranks
            .iter()
            .flat_map(|r| r.counts.iter())
            .max_by_key(|(_, n)| **n)
            .map(|(op, n)| (op.clone(), *n))
            .unwrap_or_else(|| ("collective".into(), 0)),
    };
    let mut behind = Vec::new();
    for g in c.mismatch.iter().filter(|g| g.op == op && g.count < n) {
        for m in &g.members {
            behind.push(format!("{m} at {op} {}", g.count));
        }
        let unnamed = (g.ranks as usize).saturating_sub(g.members.len());
        if unnamed > 0 {
            behind.push(format!("{unnamed} more rank(s) at {op} {}", g.count));
        }
    }
    for m in &c.missing {
        let how = if m.dead {
            "considered dead"
        } else {
            "not answering"
        };
        behind.push(format!("{} {how}", m.member));
    }
    let size = c.size.map(|s| format!(" ({s} ranks)")).unwrap_or_default();
    format!(
        "communicator {}{size} hung at collective {n} ({op} {n}): behind: {}",
        c.hash,
        behind.join("; ")
    )
}

/// The communicators hung at `now`: counts that disagree or a missing rank, unmoved
/// for at least `hang_after`; with how long they have not moved.
fn hung(p: &Parts<'_>, last: &JobStatus, now: Instant) -> Vec<(String, Duration)> {
    last.comms
        .iter()
        .filter(|c| !c.mismatch.is_empty() || !c.missing.is_empty())
        .filter_map(|c| {
            let since = *p.tracks.get(c.hash.as_str())?;
            let stalled = now.saturating_duration_since(since);
            (stalled >= p.hang_after).then(|| (hung_line(c), stalled))
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
        events: p.events.to_vec(),
        last_reply: p.last.cloned(),
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

/// The state and the named ranks from the last reply.
fn judge_reply(p: &Parts<'_>, last: &JobStatus, now: Instant, v: &mut JobView) {
    let dead = dead_members(last, p.dead_events);
    let mut all = BTreeSet::new();
    for c in &last.comms {
        all.extend(c.ranks.iter().map(|r| key(&r.member)));
        all.extend(c.missing.iter().map(|m| key(&m.member)));
    }
    let missing: Vec<&Member> = {
        let mut seen = BTreeSet::new();
        last.comms
            .iter()
            .flat_map(|c| c.missing.iter().filter(|m| !m.dead).map(|m| &m.member))
            .filter(|m| seen.insert(key(m)))
            .collect()
    };
    let errors: Vec<&String> = last.comms.iter().flat_map(|c| &c.errors).collect();
    let hung = hung(p, last, now);
    v.ranks = (all.len() as u64).max(last.ranks_in_table);
    v.ranks_dead = dead.len() as u64;
    v.ranks_missing = missing.len() as u64;
    v.communicators = last.communicators.max(last.comms.len() as u64);
    v.communicators_hung = hung.len() as u64;
    let mut headline = Vec::new();
    for m in &dead {
        headline.push(format!("dead: {m} (RAS considers it dead)"));
    }
    for (line, stalled) in &hung {
        headline.push(format!("hung: {line}"));
        v.details.push(format!(
            "{line}; no progress for {:.0} s (--hang-after {:.0} s)",
            stalled.as_secs_f64(),
            p.hang_after.as_secs_f64()
        ));
    }
    for e in &errors {
        headline.push(format!("error: {e}"));
    }
    for m in &missing {
        v.details.push(format!(
            "{m}: RAS cannot reach it (unresponsive, not yet dead)"
        ));
    }
    v.state = if !dead.is_empty() {
        State::Dead
    } else if !hung.is_empty() {
        State::Hung
    } else if !errors.is_empty() {
        State::Error
    } else if v.communicators == 0 {
        // RAS opens at the first communicator's init, before the communicator shows
        // (seen on 2x H100 with 2.28.9: one reply with none), and outlives the last one.
        State::Waiting
    } else {
        State::Healthy
    };
    settle(p, now, v, headline, &missing);
}

/// The state where the last reply is not the whole story: the job gone, queries failing,
/// a rank unresponsive.
fn settle(p: &Parts<'_>, now: Instant, v: &mut JobView, named: Vec<String>, missing: &[&Member]) {
    let ago = v.seconds_since_reply.unwrap_or(0.0);
    if p.refused {
        v.state = State::Gone;
        v.details.insert(
            0,
            format!("the last reply, {ago:.0} s ago: {}", summary(v, &named)),
        );
        v.headline = "gone: no NCCL process answers RAS on this pod any more (the job's processes here ended: a crash, a kill, a restart or the end)".into();
        return;
    }
    let failing = p.failing_since.map(|t| now.saturating_duration_since(t));
    if let Some(f) = failing.filter(|f| *f >= p.hang_after) {
        if v.state < State::Hung {
            v.state = State::Hung;
        }
        v.details.push(format!(
            "RAS accepts connections but answered no query for {:.0} s: a process of the job on this pod is stopped or hung",
            f.as_secs_f64()
        ));
        v.headline = format!("hung: RAS answers no query ({})", summary(v, &named));
        return;
    }
    if v.state <= State::Healthy && (!missing.is_empty() || failing.is_some()) {
        v.state = State::Suspect;
    }
    if v.state == State::Waiting {
        v.headline = "waiting: NCCL RAS answers, with no communicator yet (or none left)".into();
        return;
    }
    // Named ranks and communicators carry their own `dead:`/`hung:`/`error:` prefix.
    v.headline = if named.is_empty() {
        format!("{}: {}", v.state.label(), summary(v, &named))
    } else {
        named.join("; ")
    };
}

fn summary(v: &JobView, named: &[String]) -> String {
    if named.is_empty() {
        let missing = if v.ranks_missing > 0 {
            format!(", {} not answering", v.ranks_missing)
        } else {
            String::new()
        };
        format!(
            "{} rank(s) in {} communicator(s){missing}",
            v.ranks, v.communicators
        )
    } else {
        named.join("; ")
    }
}

#[cfg(test)]
mod tests {
    use super::super::judge::{Outcome, Watch};
    use super::super::reply::{parse_json, parse_text};
    use super::*;

    const HEALTHY: &str = include_str!("../../../tests/data/ras/2.28.9/healthy.json");
    const UNRESPONSIVE: &str =
        include_str!("../../../tests/data/ras/2.28.9/stopped-unresponsive.json");
    const DEAD: &str = include_str!("../../../tests/data/ras/2.28.9/stopped-dead.json");

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
            "hung: communicator 0x74e4f22091e41071 (2 ranks) hung at collective 241 (AllReduce 241): behind: rank 1 (pid 637 on 192.0.2.2, GPU 1) not answering"
        );
        assert!(
            v.details[0].ends_with("no progress for 61 s (--hang-after 60 s)"),
            "{:?}",
            v.details
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
        assert!(v.headline.ends_with(
            "hung at collective 236 (AllReduce 236): behind: rank 1 (pid 637 on 192.0.2.2, GPU 1) at AllReduce 235"
        ), "{}", v.headline);
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
            v.headline
                .contains("behind: rank 1 (pid 956 on 192.0.2.2, GPU 1) not answering"),
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
                .ends_with("behind: rank 3 (pid 916 on 10.10.1.1, GPU 1) not answering"),
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
        w.event("[2026-11-26 07:28:04] PEER_DEAD: Process 637 on node 192.0.2.2 managing GPU 1");
        let v = view(&w, t0);
        assert_eq!(v.state, State::Dead);
        assert_eq!(v.events.len(), 1);
    }
}
