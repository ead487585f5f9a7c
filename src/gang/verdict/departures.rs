//! The pods that left the gang while NCCL ran (pure), from the session's outcomes:
//! a pod whose connection closed or that fell silent is gone (its pod ended, its
//! node or its network failed); a pod whose NCCL process died without a result
//! broke the run; a pod that claimed a taken rank after the gang went on makes two
//! claims of one rank. Each is named with the stage it was at and the time, in the
//! same words on every rank that heard it from rank 0.

use super::node_name;
use crate::finding::{Blame, Problem, Severity};
use crate::gang::session::{Gone, How, Outcomes};

/// "3.4 s into NCCL's run" where the time is known.
fn when(seconds: Option<f64>) -> String {
    seconds.map_or(String::new(), |s| format!(" {s:.1} s into NCCL's run"))
}

/// ", at pairwise round 2 with node 1" where the stage is known.
fn at(stage: &str) -> String {
    if stage.is_empty() {
        String::new()
    } else {
        format!(", at {stage}")
    }
}

fn gone(g: &Gone, names: &[String], here: u64) -> Problem {
    let who = node_name(g.node as usize, names);
    let what = match (&g.how, g.node == 0 && here != 0) {
        (How::Closed, true) => "the connection to it closed".to_string(),
        (How::Closed, false) => "its connection to rank 0 closed".to_string(),
        (How::Silent(s), _) => format!("nothing came from it for {s:.0} s"),
    };
    Problem::new(
        Severity::Fail,
        format!("{who} is gone{}{}: {what}", when(g.seconds), at(&g.stage)),
        "Find why that pod ended or lost its network (kubectl describe pod: OOMKilled, Evicted, its node NotReady; the pod's log); the other pods stopped at once, and the job must run without it or on another node",
    )
    .blamed(Blame::Node)
}

/// What the pods that left did to the gang, worst first; empty when none left.
/// `here` is this pod's rank (which words name rank 0).
pub fn problems(o: &Outcomes, names: &[String], here: u64) -> Vec<Problem> {
    let mut out: Vec<Problem> = o.gone.iter().map(|g| gone(g, names, here)).collect();
    // A pod that is gone took its NCCL run along: only where nobody is gone does a
    // dead NCCL process say which pod broke the run (its peers only saw errors).
    if out.is_empty() {
        out.extend(o.outcomes.iter().enumerate().filter_map(|(i, oc)| {
            let oc = oc.as_ref()?;
            let died = oc.died.as_deref()?;
            Some(
                Problem::new(
                    Severity::Fail,
                    format!(
                        "{}'s NCCL run broke off{}{}: {died}",
                        node_name(i, names),
                        when(oc.seconds),
                        at(&oc.stage)
                    ),
                    "Read that pod's log and its node's kernel log (a killed process, an out-of-memory kill, a GPU or driver fault): the other pods' NCCL lost it",
                )
                .blamed(Blame::Node),
            )
        }));
    }
    out.extend(o.duplicates.iter().map(|d| {
        Problem::new(
            Severity::Fail,
            format!(
                "two pods claim {}: {} (kept) and {} (refused after the gang went on)",
                node_name(d.rank as usize, names),
                d.kept,
                d.refused
            ),
            "Give every pod its own rank (PET_NODE_RANK, RANK or --gang-rank): two pods of one rank is a manifest error, or a pod of an earlier attempt still running",
        )
        .blamed(Blame::Job)
    }));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gang::outcome::Outcome;
    use crate::gang::wire::Duplicate;

    fn names() -> Vec<String> {
        ["m", "w0", "w1", "w2"].map(String::from).to_vec()
    }

    /// Issue 37, from the 4-pod GPU run: a pod killed mid-measurement was never
    /// named. Expected before the run: its connection closes, rank 0 names it with
    /// the stage it last reported and the time, on every pod; the node is blamed.
    #[test]
    fn regression_a_pod_killed_mid_measurement_is_named_with_its_stage_and_time() {
        let o = Outcomes {
            gone: vec![Gone {
                node: 2,
                seconds: Some(3.42),
                stage: "pairwise round 2 with node 1".into(),
                how: How::Closed,
            }],
            outcomes: vec![
                Some(Outcome {
                    error: Some("stopped".into()),
                    died: None,
                    ..Outcome::default()
                }),
                None,
                None,
                None,
            ],
            ..Outcomes::default()
        };
        let p = problems(&o, &names(), 1);
        assert_eq!(p.len(), 1);
        assert_eq!(
            p[0].summary,
            "node 2 (w1) is gone 3.4 s into NCCL's run, at pairwise round 2 with node 1: its connection to rank 0 closed"
        );
        assert_eq!(p[0].blame, Some(Blame::Node));
    }

    #[test]
    fn rank_0_gone_silence_a_dead_process_and_a_late_claim_are_named() {
        let root = Outcomes {
            gone: vec![Gone {
                node: 0,
                seconds: None,
                stage: String::new(),
                how: How::Closed,
            }],
            ..Outcomes::default()
        };
        assert_eq!(
            problems(&root, &names(), 3)[0].summary,
            "node 0 (m) is gone: the connection to it closed"
        );
        let silent = Outcomes {
            gone: vec![Gone {
                node: 3,
                seconds: Some(12.0),
                stage: "all-reduce of 1048576 bytes".into(),
                how: How::Silent(5.0),
            }],
            ..Outcomes::default()
        };
        assert_eq!(
            problems(&silent, &names(), 0)[0].summary,
            "node 3 (w2) is gone 12.0 s into NCCL's run, at all-reduce of 1048576 bytes: nothing came from it for 5 s"
        );
        let died = Outcomes {
            outcomes: vec![
                None,
                Some(Outcome {
                    died: Some("the NCCL process ended (exit status: 137) without a result".into()),
                    seconds: Some(0.5),
                    stage: "pairwise round 1 with node 0".into(),
                    ..Outcome::default()
                }),
            ],
            duplicates: vec![Duplicate {
                rank: 1,
                kept: "10.0.0.9".into(),
                refused: "10.0.0.2".into(),
            }],
            ..Outcomes::default()
        };
        let p = problems(&died, &names(), 0);
        assert_eq!(
            p[0].summary,
            "node 1 (w0)'s NCCL run broke off 0.5 s into NCCL's run, at pairwise round 1 with node 0: the NCCL process ended (exit status: 137) without a result"
        );
        assert_eq!(
            p[1].summary,
            "two pods claim node 1 (w0): 10.0.0.9 (kept) and 10.0.0.2 (refused after the gang went on)"
        );
        assert_eq!(p[1].blame, Some(Blame::Job));
        assert!(problems(&Outcomes::default(), &names(), 0).is_empty());
    }
}
