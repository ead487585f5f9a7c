//! How one pod's NCCL run ended, as it tells the others at the end of the session
//! (`session`): every pod names the same pods and the same cause when NCCL's join
//! fails or a pod's run breaks off on some of them.

use super::worker::WorkerResult;
use serde::{Deserialize, Serialize};

/// How one pod's NCCL run ended, as sent to its peers.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    pub joined: bool,
    pub timed_out: bool,
    /// NCCL cannot run there (no libnccl, no GPU).
    pub unavailable: Option<String>,
    pub error: Option<String>,
    pub stage: String,
    /// The NCCL process ended without a result (`exit status 137`, killed past its
    /// deadline): that pod's run died, as opposed to stopping on an error.
    #[serde(default)]
    pub died: Option<String>,
    /// Seconds from the start of that pod's NCCL run to its end.
    #[serde(default)]
    pub seconds: Option<f64>,
    /// The run measured everything it planned.
    #[serde(default)]
    pub done: bool,
}

/// Longest error text an outcome carries, characters.
const TEXT_CHARS: usize = 1000;

impl Outcome {
    pub fn of(r: &WorkerResult, died: Option<String>, seconds: f64) -> Outcome {
        let cut = |s: &Option<String>| s.as_ref().map(|t| t.chars().take(TEXT_CHARS).collect());
        Outcome {
            joined: r.joined,
            timed_out: r.timed_out,
            unavailable: cut(&r.unavailable),
            error: cut(&r.error).or_else(|| cut(&r.last_error)),
            stage: r.stage.chars().take(TEXT_CHARS).collect(),
            died: cut(&died),
            seconds: Some(seconds),
            done: r.done,
        }
    }

    /// A peer's outcome: its strings escaped and cut, its time a number or nothing.
    pub fn checked(self) -> Outcome {
        let v = |s: String| {
            crate::render::visible(&s.chars().take(TEXT_CHARS).collect::<String>()).into_owned()
        };
        Outcome {
            unavailable: self.unavailable.map(v),
            error: self.error.map(v),
            stage: v(self.stage),
            died: self.died.map(v),
            seconds: self.seconds.filter(|s| s.is_finite() && *s >= 0.0),
            ..self
        }
    }

    /// Why the run ended before it measured everything, said at once to the others;
    /// None for a run that finished.
    pub fn early(&self) -> Option<String> {
        if self.done {
            return None;
        }
        Some(match (&self.died, &self.error, &self.unavailable) {
            (Some(d), _, _) => d.clone(),
            (None, Some(e), _) => e.clone(),
            (None, None, Some(u)) => u.clone(),
            // Its watchdog wrote the result at the deadline.
            (None, None, None) if self.timed_out => {
                format!("not done within --gang-timeout, at {}", self.stage)
            }
            (None, None, None) => format!("stopped at {}", self.stage),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 39's re-run: a peer's NaN or infinity reaches the others as JSON null
    /// (serde_json writes non-finite numbers so), which a plain f64 refused, losing
    /// the whole outcome; a negative time is no time either.
    #[test]
    fn regression_a_peers_non_finite_or_negative_time_is_dropped_not_the_outcome() {
        let text = r#"{"joined":true,"timed_out":false,"unavailable":null,"error":"x\u001b[2J","stage":"s","seconds":null,"done":false}"#;
        let o: Outcome = serde_json::from_str(text).unwrap();
        let o = o.checked();
        assert_eq!(o.seconds, None);
        assert_eq!(o.error.as_deref(), Some("x\\x1b[2J"));
        let mut neg = Outcome {
            seconds: Some(-1.0),
            ..Outcome::default()
        };
        neg = neg.checked();
        assert_eq!(neg.seconds, None);
        let back: Outcome = serde_json::from_slice(
            &serde_json::to_vec(&Outcome {
                seconds: Some(f64::NAN),
                ..Outcome::default()
            })
            .unwrap(),
        )
        .unwrap();
        assert_eq!(back.seconds, None);
    }

    #[test]
    fn a_run_that_ended_early_says_why_first_by_death() {
        let mut o = Outcome {
            error: Some("ncclRemoteError".into()),
            died: Some("exit status 137".into()),
            ..Outcome::default()
        };
        assert_eq!(o.early().as_deref(), Some("exit status 137"));
        o.died = None;
        assert_eq!(o.early().as_deref(), Some("ncclRemoteError"));
        o.done = true;
        assert_eq!(o.early(), None);
    }
}
