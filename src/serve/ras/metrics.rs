//! `nccl_preflight_job_*`: the job as RAS shows it, on /metrics when watching.

use super::judge::{JobView, State};
use crate::serve::metrics::{counter, float_gauge, int_gauge};
use prometheus_client::registry::Registry;

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
        ] {
            assert!(text.contains(needle), "{needle} not in\n{text}");
        }
    }
}
