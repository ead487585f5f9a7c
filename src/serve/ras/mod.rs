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
pub mod judge;
pub mod judge_view;
pub mod metrics;
pub mod monitor;
pub mod pods;
pub mod reply;
pub mod reply_text;
pub mod version;
pub mod watch;

pub use judge::{JobView, State};
pub use watch::{Config, Watching};

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
            for d in &v.details {
                body.push_str(&format!("  {d}\n"));
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
    let remediation = "look at the named ranks' processes and hosts (py-spy dump, the node's XIDs and logs); the trainer's livenessProbe on /job/livez restarts a hung trainer";
    let mut f = match view.state {
        State::Healthy => Finding::pass(id, view.headline.clone()),
        s if s.fails_liveness() => Finding::fail(id, view.headline.clone(), remediation),
        _ => Finding::warn(id, view.headline.clone(), remediation),
    };
    for line in view.details.iter().chain(&view.warnings) {
        f = f.evidence(line.clone());
    }
    f
}
