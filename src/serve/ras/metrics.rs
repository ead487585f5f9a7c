//! `nccl_preflight_job_*`: the job as RAS shows it, on /metrics when watching.

use super::diagnosis::{Blame, Kind};
use super::judge::{JobView, State};
use crate::serve::metrics::{counter, float_gauge, int_gauge};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BlameLabels {
    blame: String,
}

/// A gauge family with one series per label value, 1 for the values `on` says.
fn one_hot<
    L: EncodeLabelSet + Clone + std::hash::Hash + Eq + std::fmt::Debug + Send + Sync + 'static,
>(
    registry: &mut Registry,
    name: &str,
    help: &str,
    series: impl Iterator<Item = (L, i64)>,
) {
    let family = Family::<L, Gauge>::default();
    for (labels, value) in series {
        family.get_or_create(&labels).set(value);
    }
    registry.register(name, help, family);
}

const STATES: [State; 8] = [
    State::Waiting,
    State::Healthy,
    State::Gone,
    State::Unwatchable,
    State::Suspect,
    State::Error,
    State::Hung,
    State::Dead,
];
const KINDS: [Kind; 9] = [
    Kind::Dead,
    Kind::Error,
    Kind::Stopped,
    Kind::Divergent,
    Kind::Finalized,
    Kind::Initializing,
    Kind::Behind,
    Kind::Ahead,
    Kind::RemoteError,
];

/// The state, the causes by kind and the report's blame: what a dashboard plots.
fn register_diagnosis(registry: &mut Registry, view: &JobView) {
    one_hot(
        registry,
        "job_state",
        "1 for the job's state as the watcher judges it (waiting, healthy, gone, unwatchable, suspect, error, hung, dead), 0 for the others",
        STATES.iter().map(|s| {
            (
                StateLabels {
                    state: s.label().into(),
                },
                i64::from(view.state == *s),
            )
        }),
    );
    one_hot(
        registry,
        "job_causes",
        "Causes the diagnosis names, per kind (dead, error, stopped, divergent, finalized, initializing, behind, ahead, remote-error)",
        KINDS.iter().map(|k| {
            let n = view.causes.iter().filter(|c| c.kind == *k).count();
            (
                KindLabels {
                    kind: k.label().into(),
                },
                i64::try_from(n).unwrap_or(i64::MAX),
            )
        }),
    );
    let blame = view.report.as_ref().map(|r| r.blame);
    one_hot(
        registry,
        "job_blame",
        "1 for who the hang report blames (job, node, unknown) while the job is in trouble; all 0 otherwise",
        [Blame::Job, Blame::Node, Blame::Unknown].iter().map(|b| {
            (
                BlameLabels {
                    blame: b.label().into(),
                },
                i64::from(blame == Some(*b)),
            )
        }),
    );
}

fn gauge_u64(registry: &mut Registry, name: &str, help: &str, value: u64) {
    int_gauge(
        registry,
        name,
        help,
        i64::try_from(value).unwrap_or(i64::MAX),
    );
}

/// Registers the job's gauges and counters from `view`.
pub fn register(registry: &mut Registry, view: &JobView) {
    int_gauge(
        registry,
        "job_live",
        "1 while /job/livez answers 200 (the job is not hung, no rank dead, no NCCL error)",
        i64::from(!view.state.fails_liveness()),
    );
    int_gauge(
        registry,
        "job_ras_up",
        "1 when the last RAS query got a reply",
        i64::from(
            view.seconds_since_reply.is_some()
                && view.state != State::Gone
                && view.last_error.is_none(),
        ),
    );
    gauge_u64(
        registry,
        "job_ranks",
        "Ranks (GPU processes) in the last RAS reply",
        view.ranks,
    );
    gauge_u64(
        registry,
        "job_ranks_dead",
        "Ranks RAS considers dead",
        view.ranks_dead,
    );
    gauge_u64(
        registry,
        "job_ranks_missing",
        "Ranks RAS could not reach (unresponsive, not yet dead)",
        view.ranks_missing,
    );
    gauge_u64(
        registry,
        "job_communicators",
        "NCCL communicators in the last RAS reply",
        view.communicators,
    );
    gauge_u64(
        registry,
        "job_communicators_hung",
        "Communicators whose ranks disagree or miss a rank, unmoved for --hang-after",
        view.communicators_hung,
    );
    float_gauge(
        registry,
        "job_seconds_since_progress",
        "Seconds since any communicator's collective counts last moved (NaN before a reply)",
        view.seconds_since_progress.unwrap_or(f64::NAN),
    );
    counter(
        registry,
        "job_ras_queries",
        "RAS STATUS queries sent",
        view.queries,
    );
    counter(
        registry,
        "job_ras_failed_queries",
        "RAS queries that got no usable reply (deadline, cut, malformed)",
        view.failed_queries,
    );
    register_diagnosis(registry, view);
}

#[cfg(test)]
mod tests {
    use super::super::judge::{Outcome, Watch};
    use super::super::judge_view::view;
    use super::super::reply::parse_json;
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn a_dead_rank_shows_in_the_gauges() {
        let mut w = Watch::new(Duration::from_secs(60));
        let dead = include_str!("../../../tests/data/ras/2.28.9/stopped-dead.json");
        w.observe(
            Instant::now(),
            Outcome::Reply(Box::new(parse_json(dead).unwrap())),
        );
        let mut registry = Registry::with_prefix("nccl_preflight");
        register(&mut registry, &view(&w, Instant::now()));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for needle in [
            "nccl_preflight_job_live 0",
            "nccl_preflight_job_ranks 2",
            "nccl_preflight_job_ranks_dead 1",
            "nccl_preflight_job_communicators 1",
            "nccl_preflight_job_ras_queries_total 1",
            "nccl_preflight_job_ras_up 1",
            "nccl_preflight_job_state{state=\"dead\"} 1",
            "nccl_preflight_job_state{state=\"healthy\"} 0",
            "nccl_preflight_job_causes{kind=\"dead\"} 1",
            "nccl_preflight_job_blame{blame=\"node\"} 0",
        ] {
            assert!(text.contains(needle), "{needle} not in\n{text}");
        }
    }
}
