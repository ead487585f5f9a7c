//! `serve --taint-node`: the node DaemonSet keeps new pods off its own node while a node
//! fault holds, and lets them back once the node is healthy again. A run is a node
//! fault when every failed check is the node's (exit 3, docs/failure-policy.md),
//! healthy when none failed; after `--taint-after` runs in a row of one kind the Node
//! gets (or loses) the taint `nccl-preflight.io/node-fault=<failed checks>:NoSchedule`.
//! Anything else (a failure the job's configuration owns, a run that could not judge)
//! breaks the streak and changes nothing. NoSchedule keeps running pods where they are:
//! what to do with them is the job's failure policy's call.
//!
//! The Node is read and written through the API server with the pod's service account
//! (kube::ApiServer): GET the Node, then one JSON patch that replaces `spec.taints` with
//! the same list plus or minus ours, guarded by a `test` of the resourceVersion read,
//! so a change made in between (another controller's taint) is never overwritten: the
//! patch fails and is made again from a fresh read. The RBAC and the
//! ValidatingAdmissionPolicy in examples/manifests/node/taint hold the service account
//! to this one key on its own Node.

use crate::kube::ApiServer;
use crate::kube::client::is_object_name;
use crate::report::Report;
use serde_json::{Value, json};

pub const KEY: &str = "nccl-preflight.io/node-fault";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Run {
    Fault,
    Healthy,
    Other,
}

pub struct Tainter {
    api: ApiServer,
    node: String,
    after: u32,
    /// The kind of the last runs and how many in a row.
    streak: (Run, u32),
    /// What this server last made true of the Node (None: not yet known).
    applied: Option<bool>,
}

impl Tainter {
    /// The tainter `args` ask for (None without --taint-node); an error when the node's
    /// name or the API access is missing, so a DaemonSet asked to act says so at start.
    pub fn new(
        args: &crate::cli::TaintArgs,
        env: &[(std::ffi::OsString, std::ffi::OsString)],
    ) -> Result<Option<Tainter>, String> {
        if !args.taint_node {
            return Ok(None);
        }
        let node = args.node_name.clone().ok_or(
            "--taint-node needs --node-name (NCCL_PREFLIGHT_NODE_NAME from the downward API's spec.nodeName)",
        )?;
        if !is_object_name(&node) {
            return Err(format!(
                "--node-name {}: not a Node name",
                crate::render::visible(&node)
            ));
        }
        let api = ApiServer::in_cluster(env, &args.service_account)?;
        Ok(Some(Tainter {
            api,
            node,
            after: args.taint_after,
            streak: (Run::Other, 0),
            applied: None,
        }))
    }

    /// Takes the verdict of one run (with the live XID finding); sets or removes the
    /// taint when a streak reaches --taint-after. A failed API call is logged and tried
    /// again after the next run.
    pub fn observe(&mut self, report: Option<&Report>) {
        let (run, reason) = match report {
            Some(r) => match crate::run::exit_code(r) {
                crate::run::EXIT_NODE_FAULT => (Run::Fault, failed_ids(r)),
                crate::run::EXIT_OK => (Run::Healthy, String::new()),
                _ => (Run::Other, String::new()),
            },
            None => (Run::Other, String::new()),
        };
        self.streak = match self.streak {
            (kind, n) if kind == run => (kind, n.saturating_add(1)),
            _ => (run, 1),
        };
        let want = match self.streak {
            (Run::Fault, n) if n >= self.after => true,
            (Run::Healthy, n) if n >= self.after => false,
            _ => return,
        };
        if self.applied == Some(want) {
            return;
        }
        match self.ensure(want, &reason) {
            Ok(changed) => {
                self.applied = Some(want);
                if changed {
                    crate::diagnostic::line(format_args!(
                        "nccl-preflight: serve: {} the taint {KEY}{} on node {} after {} runs",
                        if want { "set" } else { "removed" },
                        if want {
                            format!("={reason}:NoSchedule")
                        } else {
                            String::new()
                        },
                        self.node,
                        self.streak.1
                    ));
                }
            }
            Err(e) => crate::diagnostic::line(format_args!(
                "nccl-preflight: serve: could not {} the taint {KEY} on node {} (tried again after the next run): {}",
                if want { "set" } else { "remove" },
                self.node,
                crate::render::visible(&e)
            )),
        }
    }

    /// Makes the Node carry the taint (`want`) with `value`, or not; true when it changed.
    fn ensure(&self, want: bool, value: &str) -> Result<bool, String> {
        let path = format!("/api/v1/nodes/{}", self.node);
        // A conflict (the Node changed between the read and the patch) is retried once.
        for _ in 0..2 {
            let reply = self.api.call("GET", &path, None)?;
            if reply.status != 200 {
                return Err(format!(
                    "GET {path}: HTTP {}: {}",
                    reply.status,
                    excerpt(&reply.body)
                ));
            }
            let node: Value =
                serde_json::from_slice(&reply.body).map_err(|e| format!("GET {path}: {e}"))?;
            let Some(patch) = patch(&node, want, value) else {
                return Ok(false);
            };
            let body = patch.to_string();
            let reply = self.api.call(
                "PATCH",
                &path,
                Some(("application/json-patch+json", body.as_bytes())),
            )?;
            match reply.status {
                200 => return Ok(true),
                409 | 422 => continue,
                s => return Err(format!("PATCH {path}: HTTP {s}: {}", excerpt(&reply.body))),
            }
        }
        Err(format!(
            "PATCH {path}: the Node kept changing between reads"
        ))
    }
}

/// The failed checks' ids as a taint value (a label value: at most 63 characters of
/// `[A-Za-z0-9._-]`, alphanumeric at both ends; kubernetes validation IsValidLabelValue).
fn failed_ids(report: &Report) -> String {
    let ids: Vec<&str> = report
        .checks
        .iter()
        .filter(|c| c.status() == crate::finding::Status::Fail)
        .map(|c| c.id.as_str())
        .collect();
    let mut value: String = ids
        .join(".")
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
        .take(63)
        .collect();
    while value.ends_with(|c: char| !c.is_ascii_alphanumeric()) {
        value.pop();
    }
    value
}

/// The JSON patch that gives `node` the wanted taints, or None when it has them.
fn patch(node: &Value, want: bool, value: &str) -> Option<Value> {
    let taints = node["spec"]["taints"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let ours = taints.iter().find(|t| t["key"] == KEY);
    let in_place = match ours {
        Some(t) => want && t["value"] == value && t["effect"] == "NoSchedule",
        None => !want,
    };
    if in_place {
        return None;
    }
    let mut new: Vec<Value> = taints.into_iter().filter(|t| t["key"] != KEY).collect();
    if want {
        new.push(json!({"key": KEY, "value": value, "effect": "NoSchedule"}));
    }
    Some(json!([
        {"op": "test", "path": "/metadata/resourceVersion", "value": node["metadata"]["resourceVersion"]},
        {"op": "add", "path": "/spec/taints", "value": new},
    ]))
}

/// The start of an error reply, for a log line.
fn excerpt(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned();
    crate::render::visible(&text).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_patch_keeps_other_taints_and_is_none_when_the_node_is_as_wanted() {
        let node = json!({"metadata": {"resourceVersion": "7"}, "spec": {"taints": [
            {"key": "nvidia.com/gpu", "effect": "NoSchedule"}]}});
        let p = patch(&node, true, "nvlink").unwrap();
        assert_eq!(
            p[0],
            json!({"op": "test", "path": "/metadata/resourceVersion", "value": "7"})
        );
        assert_eq!(
            p[1]["value"],
            json!([{"key": "nvidia.com/gpu", "effect": "NoSchedule"},
                   {"key": KEY, "value": "nvlink", "effect": "NoSchedule"}])
        );
        assert!(patch(&node, false, "").is_none());
        let tainted =
            json!({"metadata": {"resourceVersion": "8"}, "spec": {"taints": p[1]["value"]}});
        assert!(patch(&tainted, true, "nvlink").is_none());
        // Another reason: the value follows.
        assert!(patch(&tainted, true, "gpu-health").is_some());
        let removed = patch(&tainted, false, "").unwrap();
        assert_eq!(
            removed[1]["value"],
            json!([{"key": "nvidia.com/gpu", "effect": "NoSchedule"}])
        );
        // A Node with no taints at all gets the list.
        let bare = json!({"metadata": {"resourceVersion": "1"}, "spec": {}});
        assert_eq!(
            patch(&bare, true, "x").unwrap()[1]["value"]
                .as_array()
                .unwrap()
                .len(),
            1
        );
    }
}
