//! `serve --watch-nccl`: the running job seen through NCCL's RAS (localhost:28028 by
//! default, the trainer's `NCCL_RAS_ADDR`), which a sidecar sharing the pod's network
//! namespace reaches with no change to the trainer. A thread polls STATUS every
//! `--watch-interval` (and keeps a MONITOR connection on NCCL 2.29+); the judgement
//! names a hung collective, a dead or unresponsive rank, an asynchronous error; /job
//! shows it, /job/livez answers 503 on a hang, a dead rank or an error (for the
//! trainer container's own livenessProbe), /metrics carries `nccl_preflight_job_*`.
//! Nothing here is on /healthz's path: requests read the last view under a lock held
//! only to copy it.

pub mod client;
pub mod diagnose;
pub mod diagnosis;
pub mod flight;
pub mod judge;
pub mod judge_view;
pub mod metrics;
pub mod monitor;
pub mod node;
pub mod pickle;
pub mod pods;
pub mod reply;
pub mod reply_text;
pub mod report;
pub mod version;
pub mod watch;

pub use judge::{JobView, State};
pub use watch::{Config, NodeHooks, Watching};

/// The lines a hung trainer's livenessProbe answers with (the kubelet puts the start of
/// the body in the pod's events): the headline, the blame, the causes, this pod's ranks.
fn report_lines(v: &JobView) -> Vec<String> {
    let mut lines = Vec::new();
    match &v.report {
        Some(r) => {
            lines.push(format!("blame: {}: {}", r.blame.label(), r.why));
            // The first cause is the headline's.
            lines.extend(r.causes.iter().skip(1).cloned());
            lines.extend(
                r.flight_recorder
                    .iter()
                    .map(|l| format!("flight recorder: {l}")),
            );
            lines.extend(r.node.iter().map(|l| format!("node: {l}")));
        }
        None => lines.extend(v.details.iter().cloned()),
    }
    lines
}

/// /job: the view as JSON, or why there is none.
pub fn job_response(view: Option<&JobView>) -> super::http::Response {
    match view {
        None => super::http::Response::text(
            404,
            "not watching the job: start serve with --watch-nccl (NCCL_PREFLIGHT_WATCH_NCCL=1)\n",
        ),
        Some(v) => super::http::Response {
            status: 200,
            content_type: "application/json",
            body: serde_json::to_string_pretty(v).unwrap_or_default() + "\n",
        },
    }
}

/// /job/livez, for the trainer container's livenessProbe: 503 once the job is hung, a
/// rank is dead or reported an error; 200 otherwise, also while not watching (a probe
/// pointed here by mistake must not restart a healthy trainer).
pub fn liveness_response(view: Option<&JobView>) -> super::http::Response {
    match view {
        None => super::http::Response::text(200, "ok: not watching the job (no --watch-nccl)\n"),
        Some(v) if v.state.fails_liveness() => {
            let mut body = format!("{}\n", v.headline);
            for line in report_lines(v) {
                body.push_str(&format!("  {line}\n"));
            }
            super::http::Response::text(503, body)
        }
        Some(v) => super::http::Response::text(200, format!("ok: {}\n", v.headline)),
    }
}

/// The `nccl-job` finding for /report: pass, warn (waiting, suspect, gone, too old) or
/// fail (hung, dead, error), with the named ranks as evidence.
pub fn finding(view: &JobView) -> crate::finding::Finding {
    use crate::finding::Finding;
    let id = crate::finding::ids::NCCL_JOB;
    let remediation = match view.report.as_ref().map(|r| r.blame) {
        Some(diagnosis::Blame::Job) => {
            "the job's code: the causes name the ranks, collectives and (with the flight recorder) the lines of Python; fix the code path, then restart the job"
        }
        Some(diagnosis::Blame::Node) => {
            "the node: drain it and restart the job elsewhere (the node lines say what failed); the trainer's livenessProbe on /job/livez restarts a hung trainer"
        }
        _ => {
            "look at the named ranks' processes and hosts (py-spy dump, the node's XIDs and logs); the trainer's livenessProbe on /job/livez restarts a hung trainer"
        }
    };
    let mut f = match view.state {
        State::Healthy => Finding::pass(id, view.headline.clone()),
        s if s.fails_liveness() => Finding::fail(id, view.headline.clone(), remediation),
        _ => Finding::warn(id, view.headline.clone(), remediation),
    };
    for line in report_lines(view).iter().chain(&view.warnings) {
        f = f.evidence(line.clone());
    }
    f
}
