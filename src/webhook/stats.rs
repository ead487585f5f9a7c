//! The webhook's counts for /metrics, and its one API lookup (an MPIJob's workers),
//! cached so that a job's workers cost one call.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: String,
}

/// Counts since the webhook started.
pub struct Stats {
    reviews: Family<OutcomeLabels, Counter>,
    refused: Counter,
    seconds: Histogram,
}

impl Default for Stats {
    fn default() -> Self {
        let reviews = Family::<OutcomeLabels, Counter>::default();
        // Every outcome from the start, so a rate over them is defined before the first.
        for outcome in ["injected", "skipped", "failed_open"] {
            let _ = reviews.get_or_create(&OutcomeLabels {
                outcome: outcome.into(),
            });
        }
        Stats {
            reviews,
            refused: Counter::default(),
            // 0.5 ms to 1 s: a review is answered in well under a millisecond unless an
            // MPIJob lookup waits on the API server (at most LOOKUP_TIME).
            seconds: Histogram::new([0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.25, 1.0, 2.5]),
        }
    }
}

impl Stats {
    pub fn review(&self, outcome: &str, took: Duration) {
        self.reviews
            .get_or_create(&OutcomeLabels {
                outcome: outcome.into(),
            })
            .inc();
        self.seconds.observe(took.as_secs_f64());
    }

    /// A connection closed unanswered (over the limit) or a request refused as malformed.
    pub fn refused(&self) {
        self.refused.inc();
    }

    pub fn render(&self) -> String {
        let mut registry = Registry::with_prefix("nccl_preflight");
        crate::serve::metrics::build_info(&mut registry);
        registry.register(
            "webhook_reviews",
            "AdmissionReviews answered, by outcome: injected, skipped, failed_open (allowed unchanged after an error)",
            self.reviews.clone(),
        );
        registry.register(
            "webhook_refused_requests",
            "Connections or requests refused before a review: over the connection limit, malformed, too large, too slow",
            self.refused.clone(),
        );
        registry.register(
            "webhook_review_duration_seconds",
            "Time from a review's arrival to its answer",
            self.seconds.clone(),
        );
        crate::serve::metrics::encode_stable(&registry)
    }
}

/// How long a looked-up worker count is trusted, and how many are kept.
const OWNER_TTL: Duration = Duration::from_secs(60);
const OWNERS_KEPT: usize = 1024;

/// Worker counts by (namespace, MPIJob), with when each was read.
type Counts = HashMap<(String, String), (Instant, Option<u64>)>;

/// MPIJob worker counts from the API server.
pub struct Owners {
    api: crate::kube::ApiServer,
    within: Duration,
    cache: Mutex<Counts>,
}

impl Owners {
    pub fn new(api: crate::kube::ApiServer, within: Duration) -> Self {
        Owners {
            api,
            within,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// The Worker replicas of the MPIJob that owns `pod`, where it is one's worker; a
    /// lookup that fails is logged (naming `who`) and gives None.
    pub fn mpi_workers(&self, namespace: &str, pod: &serde_json::Value, who: &str) -> Option<u64> {
        let (api_version, name) = super::review::mpi_job_owner(pod)?;
        let key = (namespace.to_string(), name.clone());
        if let Some((at, n)) = self.lock().get(&key)
            && at.elapsed() < OWNER_TTL
        {
            return *n;
        }
        let found = self.look_up(namespace, &api_version, &name);
        if let Err(e) = &found {
            crate::diagnostic::line(format_args!(
                "nccl-preflight: webhook: {who}: the MPIJob's workers could not be read, no --nodes: {}",
                crate::render::visible(e)
            ));
        }
        let n = found.ok().flatten();
        let mut cache = self.lock();
        if cache.len() >= OWNERS_KEPT {
            cache.clear();
        }
        cache.insert(key, (Instant::now(), n));
        n
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn look_up(
        &self,
        namespace: &str,
        api_version: &str,
        name: &str,
    ) -> Result<Option<u64>, String> {
        let version_ok = api_version
            .split_once('/')
            .is_some_and(|(g, v)| g == "kubeflow.org" && crate::kube::client::is_object_name(v));
        if !version_ok
            || !crate::kube::client::is_object_name(namespace)
            || !crate::kube::client::is_object_name(name)
        {
            return Err(format!(
                "{api_version} {namespace}/{name}: not names the API takes"
            ));
        }
        let path = format!("/apis/{api_version}/namespaces/{namespace}/mpijobs/{name}");
        let reply = self.api.call_within("GET", &path, None, self.within)?;
        if reply.status != 200 {
            return Err(format!("GET {path}: HTTP {}", reply.status));
        }
        let job: serde_json::Value =
            serde_json::from_slice(&reply.body).map_err(|e| format!("GET {path}: {e}"))?;
        Ok(super::review::mpi_workers(&job))
    }
}
