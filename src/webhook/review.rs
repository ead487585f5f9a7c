//! The AdmissionReview exchange (admission.k8s.io/v1, kubernetes.io/docs/reference/
//! access-authn-authz/extensible-admission-controllers): the request's uid, kind,
//! operation and object in; the same uid, `allowed: true` and a base64 JSON patch out.
//! The webhook never refuses a pod: whatever goes wrong, the answer allows it unchanged
//! (it fails open, as `failurePolicy: Ignore` does when it cannot answer at all).

use serde_json::{Value, json};

/// What the webhook needs from one review.
#[derive(Debug)]
pub struct Review {
    pub uid: String,
    /// The review's apiVersion, echoed in the answer (v1; v1beta1 reads the same).
    pub api_version: String,
    pub namespace: String,
    /// A Pod being created, or None (anything else is allowed unchanged).
    pub pod: Option<Value>,
}

/// Parses a review; an error says why it is not one.
pub fn parse(body: &[u8]) -> Result<Review, String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| format!("not JSON: {e}"))?;
    if v["kind"] != "AdmissionReview" {
        return Err("not an AdmissionReview".into());
    }
    let request = &v["request"];
    let uid = request["uid"]
        .as_str()
        .ok_or("an AdmissionReview without request.uid")?
        .to_string();
    let is_pod_create = request["kind"]["kind"] == "Pod"
        && request["kind"]["group"].as_str().unwrap_or("").is_empty()
        && request["operation"] == "CREATE"
        && request["subResource"].as_str().unwrap_or("").is_empty();
    Ok(Review {
        uid,
        api_version: v["apiVersion"]
            .as_str()
            .unwrap_or("admission.k8s.io/v1")
            .to_string(),
        namespace: request["namespace"].as_str().unwrap_or("").to_string(),
        pod: is_pod_create.then(|| request["object"].clone()),
    })
}

/// A name for the pod in log lines: `namespace/name`, `namespace/generateName*`,
/// and the controller that owns it (`PyTorchJob/llm-train`).
pub fn pod_label(namespace: &str, pod: &Value) -> String {
    let meta = &pod["metadata"];
    let name = match (meta["name"].as_str(), meta["generateName"].as_str()) {
        (Some(n), _) if !n.is_empty() => n.to_string(),
        (_, Some(g)) => format!("{g}*"),
        _ => "?".into(),
    };
    let owner = meta["ownerReferences"].as_array().and_then(|o| {
        o.iter().find(|r| r["controller"] == true).map(|r| {
            format!(
                " ({}/{})",
                r["kind"].as_str().unwrap_or("?"),
                r["name"].as_str().unwrap_or("?")
            )
        })
    });
    format!("{namespace}/{name}{}", owner.unwrap_or_default())
}

/// The MPIJob whose worker this pod is, as mpi-operator makes them: controlled by a
/// kubeflow.org MPIJob and labelled `training.kubeflow.org/job-role: worker`
/// (kubeflow/mpi-operator pkg/controller/mpi_job_controller.go newWorker, defaultLabels).
pub fn mpi_job_owner(pod: &Value) -> Option<(String, String)> {
    let meta = &pod["metadata"];
    if meta["labels"]["training.kubeflow.org/job-role"] != "worker" {
        return None;
    }
    let owner = meta["ownerReferences"].as_array()?.iter().find(|r| {
        r["controller"] == true
            && r["kind"] == "MPIJob"
            && r["apiVersion"]
                .as_str()
                .is_some_and(|v| v.starts_with("kubeflow.org/"))
    })?;
    Some((
        owner["apiVersion"].as_str()?.to_string(),
        owner["name"].as_str()?.to_string(),
    ))
}

/// The workers an MPIJob asks for (`spec.mpiReplicaSpecs.Worker.replicas`, 1 when unset
/// as the CRD's default says).
pub fn mpi_workers(job: &Value) -> Option<u64> {
    let worker = &job["spec"]["mpiReplicaSpecs"]["Worker"];
    if worker.is_null() {
        return None;
    }
    Some(worker["replicas"].as_u64().unwrap_or(1))
}

/// The answer: allowed, with the patch when there is one.
pub fn answer(review: &Review, patch: Option<&[Value]>) -> String {
    let mut response = json!({"uid": review.uid, "allowed": true});
    if let Some(ops) = patch {
        let text = Value::Array(ops.to_vec()).to_string();
        response["patchType"] = json!("JSONPatch");
        response["patch"] = json!(base64(text.as_bytes()));
    }
    json!({"apiVersion": review.api_version, "kind": "AdmissionReview", "response": response})
        .to_string()
}

/// Standard base64 with padding (RFC 4648 section 4), as the API's `[]byte` fields are.
fn base64(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> shift) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc_4648_test_vectors() {
        for (plain, coded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(plain.as_bytes()), coded);
        }
    }

    #[test]
    fn only_a_pod_creation_carries_a_pod_and_the_uid_comes_back() {
        let review = |kind: &str, op: &str| {
            format!(
                r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{{"uid":"u-1","kind":{{"group":"","version":"v1","kind":"{kind}"}},"operation":"{op}","namespace":"ml","object":{{"metadata":{{"generateName":"w-"}}}}}}}}"#
            )
        };
        let r = parse(review("Pod", "CREATE").as_bytes()).unwrap();
        assert!(r.pod.is_some());
        assert_eq!(pod_label(&r.namespace, r.pod.as_ref().unwrap()), "ml/w-*");
        for (kind, op) in [("Pod", "UPDATE"), ("Service", "CREATE")] {
            assert!(parse(review(kind, op).as_bytes()).unwrap().pod.is_none());
        }
        let a: Value = serde_json::from_str(&answer(&r, None)).unwrap();
        assert_eq!(a["response"], json!({"uid": "u-1", "allowed": true}));
        for bad in [
            &b"{"[..],
            br#"{"kind":"Pod"}"#,
            br#"{"kind":"AdmissionReview","request":{}}"#,
        ] {
            assert!(parse(bad).is_err());
        }
    }
}
