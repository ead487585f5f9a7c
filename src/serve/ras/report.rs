//! The hang report: RAS's causes (diagnosis.rs), what this pod's ranks' flight
//! recorders say (flight.rs), the node at that moment (node.rs), and the blame said
//! plainly: `node` (a fault on the stuck rank's node), `job` (ranks in different
//! collectives, a rank in user code, a collective some ranks skip), or `unknown`. Every
//! pod's sidecar sees the same RAS view; each adds its own ranks and its own node, so
//! the pod of the stuck rank is the one whose report can say `node`. Pure.

use super::diagnosis::{Blame, Cause, Kind};
use super::flight::Answer;
use super::reply::Member;
use serde::Serialize;
use std::collections::BTreeMap;

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HangReport {
    pub blame: Blame,
    /// Why that blame, in one line.
    pub why: String,
    /// The causes, the first cause first.
    pub causes: Vec<String>,
    /// This pod's ranks as their flight recorders show them, one line each.
    pub flight_recorder: Vec<String>,
    /// This node since the job started: XIDs, NVLink and RDMA ports, failing checks.
    pub node: Vec<String>,
}

/// What the flight recorder gave this episode.
#[derive(Clone, Debug, Default)]
pub struct Flight {
    /// Where the dumps are (`--flight-recorder DIR`); none: not read.
    pub dir: Option<String>,
    /// Seconds since the dumps were asked for, once they were.
    pub asked_secs_ago: Option<f64>,
    pub ranks: BTreeMap<u32, Answer>,
    /// Why no rank could be asked.
    pub error: Option<String>,
}

impl Flight {
    pub fn lines(&self) -> Vec<String> {
        let Some(dir) = &self.dir else {
            return vec!["not read: start serve with --flight-recorder DIR and the trainer with the settings `init --flight-recorder DIR` writes (docs/job-watch.md)".into()];
        };
        if let Some(e) = &self.error {
            return vec![format!(
                "not read from {}: {}",
                super::reply::safe(dir),
                super::reply::safe(e)
            )];
        }
        let Some(ago) = self.asked_secs_ago else {
            return vec!["not asked yet".into()];
        };
        self.ranks
            .iter()
            .map(|(rank, a)| match a {
                Answer::Waiting => format!("rank {rank}: asked {ago:.0} s ago, no dump yet"),
                Answer::Dumped(d) => format!("rank {rank}: {}", d.line()),
                Answer::Failed(why) => format!("rank {rank}: no dump: {}", super::reply::safe(why)),
            })
            .collect()
    }
}

/// The report for `causes`, with this pod's flight recorder answers, the node's lines
/// and whether they hold a fault, and which members run on this pod.
pub fn assemble(
    causes: &[Cause],
    flight: &Flight,
    node: (Vec<String>, bool),
    local: &dyn Fn(&Member) -> bool,
) -> HangReport {
    let (node_lines, node_fault) = node;
    let (blame, why) = blame(causes, flight, &node_lines, node_fault, local);
    HangReport {
        blame,
        why,
        causes: causes.iter().map(|c| c.line.clone()).collect(),
        flight_recorder: flight.lines(),
        node: node_lines,
    }
}

fn blame(
    causes: &[Cause],
    flight: &Flight,
    node_lines: &[String],
    node_fault: bool,
    local: &dyn Fn(&Member) -> bool,
) -> (Blame, String) {
    let Some(first) = causes.first() else {
        return (Blame::Unknown, "RAS names no cause yet".into());
    };
    if first.blame == Blame::Job {
        return (
            Blame::Job,
            format!(
                "{}: the job's code (see the first cause)",
                first.kind.label()
            ),
        );
    }
    let here: Vec<&Member> = first.suspects.iter().filter(|m| local(m)).collect();
    // A stopped process that RAS cannot place (no query answered on this pod) is here.
    let on_this_node = !here.is_empty() || first.suspects.is_empty();
    if node_fault && on_this_node {
        return (
            Blame::Node,
            format!(
                "a fault on the stuck rank's node (this one): {}",
                node_lines.first().map(String::as_str).unwrap_or_default()
            ),
        );
    }
    for m in &here {
        let dumped = m.rank.and_then(|r| flight.ranks.get(&r));
        if let Some(Answer::Dumped(d)) = dumped
            && d.waiting.is_none()
            && first.kind != Kind::Dead
        {
            return (
                Blame::Job,
                format!("{m} is in the job's own code: every collective it issued completed"),
            );
        }
    }
    if !on_this_node {
        let hosts: Vec<String> = first
            .suspects
            .iter()
            .filter_map(|m| m.host.clone())
            .collect();
        return (
            Blame::Unknown,
            format!(
                "the stuck rank runs on {}: the sidecar of its pod reports that node and its flight recorder",
                if hosts.is_empty() {
                    "another node".into()
                } else {
                    hosts.join(", ")
                }
            ),
        );
    }
    (
        Blame::Unknown,
        "no fault seen on this node since the job started, and nothing in RAS that only the job's code explains".into(),
    )
}

#[cfg(test)]
mod tests {
    use super::super::flight::{Dump, Entry};
    use super::*;

    fn member(rank: u32, host: &str) -> Member {
        Member {
            rank: Some(rank),
            host: Some(host.into()),
            pid: Some(100 + i64::from(rank)),
            gpu: Some(i64::from(rank)),
            pod: None,
        }
    }

    fn stopped(m: Member) -> Vec<Cause> {
        vec![Cause {
            kind: Kind::Stopped,
            line: format!("stopped: {m} does not answer RAS"),
            blame: Blame::Unknown,
            suspects: vec![m],
        }]
    }

    fn here(m: &Member) -> bool {
        m.host.as_deref() == Some("10.0.0.1")
    }

    /// Written from the rule before the code: a stuck rank on this node with an XID
    /// since the job started is the node's; on another node, not this sidecar's to say.
    #[test]
    fn a_fault_on_the_stuck_ranks_node_blames_the_node() {
        let flight = Flight::default();
        let xid = (
            vec!["GPU 1: XID 79 (1 event(s) since the job started)".to_string()],
            true,
        );
        let r = assemble(&stopped(member(1, "10.0.0.1")), &flight, xid.clone(), &here);
        assert_eq!(r.blame, Blame::Node);
        assert!(
            r.why.ends_with("XID 79 (1 event(s) since the job started)"),
            "{}",
            r.why
        );
        let r = assemble(&stopped(member(3, "10.0.1.1")), &flight, xid, &here);
        assert_eq!(r.blame, Blame::Unknown);
        assert!(
            r.why.starts_with("the stuck rank runs on 10.0.1.1"),
            "{}",
            r.why
        );
        let r = assemble(
            &stopped(member(1, "10.0.0.1")),
            &flight,
            (Vec::new(), false),
            &here,
        );
        assert_eq!(r.blame, Blame::Unknown);
        assert_eq!(r.flight_recorder[0].split_once(':').unwrap().0, "not read");
    }

    /// A rank behind whose flight recorder shows every collective completed is in the
    /// job's own code; the RAS cause alone already says so for divergent ranks.
    #[test]
    fn a_local_rank_whose_collectives_all_completed_is_in_user_code() {
        let mut last = Entry::default();
        last.profiling_name = "nccl:all_reduce".into();
        last.collective_seq_id = 351;
        last.state = "completed".into();
        let flight = Flight {
            dir: Some("/fr".into()),
            asked_secs_ago: Some(2.0),
            ranks: [(
                1,
                Answer::Dumped(Box::new(Dump {
                    last: Some(last),
                    entries: 351,
                    ..Dump::default()
                })),
            )]
            .into_iter()
            .collect(),
            error: None,
        };
        let r = assemble(
            &stopped(member(1, "10.0.0.1")),
            &flight,
            (Vec::new(), false),
            &here,
        );
        assert_eq!(r.blame, Blame::Job, "{r:?}");
        assert!(
            r.flight_recorder[0].starts_with("rank 1: not in a collective"),
            "{:?}",
            r.flight_recorder
        );
    }
}

/// What scripts/ras-hang-gpu.sh brings back (one folder per situation: the RAS reply at
/// the report, each rank's flight recorder dump), replayed through the judgement: the
/// first cause and each dump's collective and line of Python are the situation's, as
/// written down from the trainer (scripts/ras_hang_train.py) before any run.
#[cfg(test)]
mod replay {
    use super::super::diagnosis::Kind;
    use super::super::flight::Dump;
    use super::super::judge::{Outcome, Watch};
    use super::super::judge_view::view;
    use super::super::{pickle, reply};
    use std::path::Path;
    use std::time::{Duration, Instant};

    /// Per situation: the first cause's kind, the rank whose dump must wait in a
    /// gather (divergent) or show every collective completed (sleep), if any.
    const EXPECTED: &[(&str, Kind)] = &[
        ("divergent", Kind::Divergent),
        ("sleep", Kind::Behind),
        ("sigstop", Kind::Stopped),
        ("kill9", Kind::Stopped),
        ("nodes", Kind::Divergent),
    ];

    /// The folders of recorded runs: the dry run's fakes, and the GPU machine's once
    /// they are in (tests/data/ras/README.md).
    fn runs() -> Vec<std::path::PathBuf> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/ras");
        let mut out: Vec<_> = std::fs::read_dir(&root)
            .unwrap()
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("hang-"))
            })
            .collect();
        out.sort();
        out
    }

    fn first_cause(dir: &Path) -> Kind {
        let text = std::fs::read_to_string(dir.join("reply.json")).unwrap();
        // ras_record.py's first line is its own note.
        let json = &text[text.find('{').unwrap()..];
        let status = reply::parse_json(json).unwrap();
        let t0 = Instant::now();
        let mut w = Watch::new(Duration::from_secs(10));
        w.observe(t0, Outcome::Reply(Box::new(status)));
        let v = view(&w, t0 + Duration::from_secs(11));
        v.causes
            .first()
            .unwrap_or_else(|| panic!("{}: no cause: {v:?}", dir.display()))
            .kind
    }

    #[test]
    fn recorded_hangs_give_their_situations_cause_and_python_lines() {
        let runs = runs();
        assert!(!runs.is_empty(), "tests/data/ras/hang-dry is committed");
        for run in runs {
            // The trainer whose lines the dumps must name: the real one on the GPU
            // machine, scripts/fr_dump.py's in the dry run.
            let (file, gather_line, reduce_line) = if run.ends_with("hang-dry") {
                ("train3.py", 10, 12)
            } else {
                ("ras_hang_train.py", 37, 42)
            };
            for (situation, kind) in EXPECTED {
                let dir = run.join(situation);
                if !dir.join("reply.json").exists() {
                    continue;
                }
                assert_eq!(first_cause(&dir), *kind, "{}", dir.display());
                let dumps = std::fs::read_dir(dir.join("dumps")).into_iter().flatten();
                for d in dumps.filter_map(|e| e.ok()) {
                    let data = std::fs::read(d.path()).unwrap();
                    let dump = Dump::from_pickle(&pickle::parse(&data).unwrap()).unwrap();
                    let line = dump.line();
                    let rank: u32 = d
                        .file_name()
                        .to_str()
                        .unwrap()
                        .trim_start_matches("dump_")
                        .parse()
                        .unwrap();
                    let faulty = rank == if *situation == "nodes" { 3 } else { 1 };
                    let expect = match (*situation, faulty) {
                        ("divergent" | "nodes", true) => "gather".to_string(),
                        ("sleep", true) => "not in a collective".to_string(),
                        _ => format!("{file}:{reduce_line} in step"),
                    };
                    assert!(
                        line.contains(&expect),
                        "{}: rank {rank}: {line}",
                        dir.display()
                    );
                    if matches!(*situation, "divergent" | "nodes") && faulty {
                        assert!(
                            line.contains(&format!("{file}:{gather_line} in step")),
                            "{line}"
                        );
                    }
                }
            }
        }
    }
}
