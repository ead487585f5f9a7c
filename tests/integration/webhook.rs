//! `webhook`: AdmissionReviews built from the pods the operators create
//! (tests/data/webhook), posted over HTTPS to the real binary; the patch it answers
//! applied as the API server applies it, and the result held to the manifest validator
//! (schemas, the two-step rules, Pod Security) and parsed by the CLI.

use crate::kube_fake::{self, FakeApi};
use crate::support::{BIN, repo, require_python, require_tools, scratch};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};

const IMAGE: &str = "ghcr.io/nccl-preflight/nccl-preflight:0.1.0";

pub struct Webhook {
    child: Child,
    pub addr: String,
    pub metrics: String,
    pub ca: PathBuf,
    pub log: Arc<Mutex<Vec<String>>>,
}

impl Drop for Webhook {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the webhook on loopback with a fresh certificate under `dir` (tls.crt and
/// tls.key, as cert-manager's Secret mounts them), with `env` and `args` added.
pub fn start(dir: &Path, env: &[(String, String)], args: &[&str]) -> Webhook {
    let (ca, cert, key) = kube_fake::certificates(dir, "first");
    std::fs::copy(&cert, dir.join("tls.crt")).unwrap();
    std::fs::copy(&key, dir.join("tls.key")).unwrap();
    let mut command = std::process::Command::new(BIN);
    command
        .env_clear()
        .args([
            "webhook",
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
        ])
        .arg("--tls-cert")
        .arg(dir.join("tls.crt"))
        .arg("--tls-key")
        .arg(dir.join("tls.key"))
        .args(["--inject-image", IMAGE])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (k, v) in env {
        command.env(k, v);
    }
    let mut child = command.spawn().unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let log = Arc::new(Mutex::new(Vec::new()));
    let (addr, metrics) = loop {
        let mut line = String::new();
        assert!(
            stderr.read_line(&mut line).unwrap() > 0,
            "the webhook exited: {:?}",
            log.lock().unwrap()
        );
        if let Some(rest) = line
            .trim()
            .strip_prefix("nccl-preflight: webhook: serving POST /mutate on https://")
        {
            let (a, m) = rest.split_once(", metrics on http://").unwrap();
            break (a.to_string(), m.to_string());
        }
        log.lock().unwrap().push(line);
    };
    let kept = Arc::clone(&log);
    std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            kept.lock().unwrap().push(line);
        }
    });
    Webhook {
        child,
        addr,
        metrics,
        ca,
        log,
    }
}

/// An AdmissionReview (admission.k8s.io/v1) creating `pod` in namespace `ml`.
pub fn review(pod: &Value, uid: &str) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "ml",
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kubeflow:training-operator"},
            "object": pod,
            "oldObject": null,
            "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}
        }
    })
}

/// Posts a review; the response's `response` object and the patch it carries, decoded.
pub fn mutate(hook: &Webhook, review: &Value) -> (Value, Option<Vec<Value>>) {
    let mut tls = kube_fake::connect(&hook.addr, &hook.ca);
    let (status, body) =
        kube_fake::request(&mut tls, "POST", "/mutate", review.to_string().as_bytes());
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let answer: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(answer["kind"], "AdmissionReview");
    let response = answer["response"].clone();
    let patch = response["patch"].as_str().map(|p| {
        assert_eq!(response["patchType"], "JSONPatch");
        serde_json::from_slice(&base64_decode(p)).unwrap()
    });
    (response, patch)
}

fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        _ => 63,
    };
    let bytes: Vec<u8> = text.bytes().filter(|b| *b != b'=').map(value).collect();
    let mut out = Vec::new();
    for chunk in bytes.chunks(4) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | (u32::from(*b) << (18 - 6 * i)));
        for i in 0..chunk.len() - 1 {
            out.push((n >> (16 - 8 * i)) as u8);
        }
    }
    out
}

fn fixture(name: &str) -> Value {
    let text = std::fs::read_to_string(repo().join("tests/data/webhook").join(name)).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn container<'a>(pod: &'a Value, list: &str, name: &str) -> &'a Value {
    pod["spec"][list]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no {list} {name} in {pod}"))
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect()
}

/// The validator's errors for `pods` (name -> pod), each file headed by the node it
/// targets and the Pod Security level the namespace enforces; file names left out.
fn validator_errors(
    python: &Path,
    dir: &Path,
    level: &str,
    pods: &[(&str, &Value)],
) -> BTreeMap<String, Vec<String>> {
    std::fs::create_dir_all(dir).unwrap();
    for (name, pod) in pods {
        let head = format!(
            "# node: p5.48xlarge nvidia.com/gpu=8 vpc.amazonaws.com/efa=32 rdma/rdma_shared_device_a=63\n# admission: {level}\n"
        );
        std::fs::write(dir.join(format!("{name}.yaml")), format!("{head}{pod}\n")).unwrap();
    }
    let out = std::process::Command::new(python)
        .arg(repo().join("tests/manifests/validate.py"))
        .arg("--json")
        .arg(dir)
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut by_file: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, _) in pods {
        by_file.insert(name.to_string(), Vec::new());
    }
    for e in v["errors"].as_array().unwrap() {
        let e = e.as_str().unwrap();
        let (file, rest) = e.split_once(".yaml").unwrap_or_else(|| panic!("{e}"));
        // An operator's pod has no nccl-preflight in it before the webhook: the one
        // error that is about the file, not a resource.
        if file.starts_with("before-") && rest == ": no nccl-preflight command line" {
            continue;
        }
        let rest = rest.split_once(": ").map_or(rest, |(_, r)| r);
        by_file
            .entry(file.to_string())
            .or_default()
            .push(rest.to_string());
    }
    for c in v["commands"].as_array().unwrap() {
        let argv: Vec<String> = strings(&c["argv"]);
        let full = std::iter::once("nccl-preflight".to_string()).chain(argv.iter().cloned());
        let parsed = nccl_preflight::cli::command().try_get_matches_from(full);
        assert!(parsed.is_ok(), "{argv:?}: {:?}", parsed.err());
    }
    by_file
}

/// The injection for each operator's pod, written down from the operators' source
/// before the webhook ran (tests/data/webhook/README.md):
/// - PyTorchJob Master (restartPolicy Never, restricted template): init in the trainer's
///   image with --nodes=4 (PET_NNODES), the trainer's 8 GPUs, NCCL_CONF_FILE; admitted
///   by restricted as the original is.
/// - PyTorchJob Worker (OnFailure, a command): exec wraps `torchrun ... --epochs 3`,
///   since a failing init container would loop on the node; the operator's
///   init-pytorch keeps the pod out of restricted, and the injection adds no violation.
/// - TrainJob node (JobSet, Never): init with --nodes=4, 8 GPUs and 32 EFA on the check.
/// - MPIJob worker: init; --nodes=2 from the MPIJob (Worker replicas) the webhook reads
///   through the API server; baseline (sshd as root) before and after.
#[test]
fn operator_pods_get_the_check_injected_and_stay_valid_and_admissible() {
    let test = "operator_pods_get_the_check_injected_and_stay_valid_and_admissible";
    if !require_tools(test, &["openssl"]) {
        return;
    }
    let Some(python) = require_python(test, "kubernetes_validate, jsonschema, yaml") else {
        return;
    };
    let dir = scratch("webhook-operators");
    let mpijob = json!({"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob",
        "metadata": {"name": "nccl-tests", "namespace": "ml"},
        "spec": {"mpiReplicaSpecs": {"Launcher": {"replicas": 1}, "Worker": {"replicas": 2}}}});
    let api = FakeApi::start(
        &dir,
        [(
            "/apis/kubeflow.org/v2beta1/namespaces/ml/mpijobs/nccl-tests".to_string(),
            mpijob,
        )]
        .into(),
    );
    let mut env = api.env();
    let account = api.account.display().to_string();
    env.push(("PATH".into(), "/usr/bin:/bin".into()));
    let hook = start(&dir, &env, &["--service-account", &account]);
    let mut patched = BTreeMap::new();
    for (file, mode, nodes) in [
        ("pytorchjob-master.json", "init", Some("4")),
        ("pytorchjob-worker.json", "exec", None),
        ("trainjob-node.json", "init", Some("4")),
        ("mpijob-worker.json", "init", Some("2")),
    ] {
        let pod = fixture(file);
        let (response, patch) = mutate(&hook, &review(&pod, file));
        assert_eq!(
            (response["uid"].as_str(), response["allowed"].as_bool()),
            (Some(file), Some(true))
        );
        let mut mutated = pod.clone();
        kube_fake::apply_patch(&mut mutated, &patch.expect(file)).unwrap();
        let install = container(&mutated, "initContainers", "nccl-preflight-install");
        assert_eq!(install["image"], IMAGE);
        assert_eq!(
            mutated["spec"]["initContainers"][0]["name"], "nccl-preflight-install",
            "{file}: ours first"
        );
        let mark = mutated["metadata"]["annotations"]["nccl-preflight.io/injected"]
            .as_str()
            .unwrap();
        assert!(mark.ends_with(mode), "{file}: {mark}");
        let trainer = mutated["spec"]["containers"][0].clone();
        if mode == "init" {
            let check = container(&mutated, "initContainers", "nccl-preflight");
            let argv = strings(&check["command"]);
            assert_eq!(
                argv[..2],
                [
                    "/nccl-preflight/nccl-preflight".to_string(),
                    "init".to_string()
                ]
            );
            assert_eq!(
                argv.iter().find_map(|a| a.strip_prefix("--nodes=")),
                nodes,
                "{file}: {argv:?}"
            );
            assert_eq!(check["image"], trainer["image"]);
            for r in trainer["resources"]["limits"].as_object().unwrap().keys() {
                assert_eq!(
                    check["resources"]["limits"][r], trainer["resources"]["limits"][r],
                    "{file}: {r}"
                );
            }
            assert_eq!(check["securityContext"], trainer["securityContext"]);
            assert!(trainer["env"].as_array().unwrap().iter().any(|e| e["name"]
                == "NCCL_CONF_FILE"
                && e["value"] == "/nccl-preflight/nccl.conf"));
        } else {
            assert_eq!(
                strings(&trainer["command"]),
                [
                    "/nccl-preflight/nccl-preflight",
                    "exec",
                    "--",
                    "torchrun",
                    "--nproc-per-node=8",
                    "train.py",
                    "--epochs",
                    "3"
                ]
            );
            assert!(trainer.get("args").is_none());
        }
        // Posted again (reinvocation, a re-created pod): left as it is.
        let (again, none) = mutate(&hook, &review(&mutated, "again"));
        assert!(
            none.is_none() && again["allowed"] == true,
            "{file}: {again}"
        );
        patched.insert(file, (pod, mutated));
    }
    let api_calls = api.seen.lock().unwrap().clone();
    assert_eq!(api_calls.len(), 1, "one MPIJob lookup: {api_calls:?}");
    assert_eq!(
        (
            api_calls[0].method.as_str(),
            api_calls[0].authorization.as_str()
        ),
        ("GET", "Bearer test-token")
    );
    // Pod Security and the validator: what the original pod passes, the injected one
    // passes; the two-step rules (devices, /dev/shm, commands) hold for the injection.
    for (level, files) in [
        (
            "restricted",
            &[
                "pytorchjob-master.json",
                "pytorchjob-worker.json",
                "trainjob-node.json",
            ][..],
        ),
        (
            "baseline",
            &["pytorchjob-worker.json", "mpijob-worker.json"][..],
        ),
    ] {
        let pods: Vec<(String, &Value)> = files
            .iter()
            .flat_map(|f| {
                let (before, after) = &patched[f];
                [
                    (format!("before-{f}"), before),
                    (format!("after-{f}"), after),
                ]
            })
            .collect();
        let refs: Vec<(&str, &Value)> = pods
            .iter()
            .map(|(n, p)| (n.trim_end_matches(".json"), *p))
            .collect();
        let errors = validator_errors(&python, &dir.join(level), level, &refs);
        for f in files {
            let f = f.trim_end_matches(".json");
            let (before, after) = (
                &errors[&format!("before-{f}")],
                &errors[&format!("after-{f}")],
            );
            assert_eq!(
                after, before,
                "{level}: {f}: the injection changed what is refused"
            );
            let clean = !(level == "restricted" && f == "pytorchjob-worker");
            assert_eq!(before.is_empty(), clean, "{level}: {f}: {before:?}");
        }
    }
    let log = hook.log.lock().unwrap().join("\n");
    assert!(
        log.contains("ml/llm-train-worker-1 (PyTorchJob/llm-train): injected exec"),
        "{log}"
    );
    assert!(log.contains("restartPolicy is not Never"), "{log}");
}

/// What must never stop a pod: a pod without GPUs, another operation, a body that is
/// no review, an oversized one. Each is allowed unchanged or refused at the HTTP level
/// (the API server then fails open), and counted.
#[test]
fn the_webhook_fails_open_and_bounds_what_it_reads() {
    let test = "the_webhook_fails_open_and_bounds_what_it_reads";
    if !require_tools(test, &["openssl"]) {
        return;
    }
    let dir = scratch("webhook-open");
    let hook = start(&dir, &[], &[]);
    // A pod asking for no GPU, and an update: allowed, no patch.
    let mut cpu = fixture("trainjob-node.json");
    cpu["spec"]["containers"][0]["resources"] = json!({"limits": {"cpu": "4"}});
    let (r, patch) = mutate(&hook, &review(&cpu, "cpu"));
    assert!(patch.is_none() && r["allowed"] == true);
    let mut update = review(&fixture("trainjob-node.json"), "upd");
    update["request"]["operation"] = json!("UPDATE");
    assert!(mutate(&hook, &update).1.is_none());
    // No API access here: the MPIJob worker is injected without --nodes, and the log
    // says why.
    let (_, patch) = mutate(&hook, &review(&fixture("mpijob-worker.json"), "mpi"));
    assert!(!Value::Array(patch.unwrap()).to_string().contains("--nodes"));
    let mut tls = kube_fake::connect(&hook.addr, &hook.ca);
    // Not a review: 400 (no uid to answer), on a connection that stays usable.
    let (status, _) = kube_fake::request(&mut tls, "POST", "/mutate", b"{\"kind\":\"Pod\"}");
    assert_eq!(status, 400);
    let (status, _) = kube_fake::request(&mut tls, "GET", "/healthz", b"");
    assert_eq!(status, 200);
    // Over the 4 MiB bound: 413 from the head alone, before the body is read.
    let head = "POST /mutate HTTP/1.1\r\nHost: t\r\nContent-Length: 5000000\r\n\r\n";
    let mut tls = kube_fake::connect(&hook.addr, &hook.ca);
    std::io::Write::write_all(&mut tls, head.as_bytes()).unwrap();
    assert_eq!(kube_fake::read_response(&mut tls).0, 413);
    let metrics = crate::serve::http_get(&hook.metrics, "/metrics");
    for needle in [
        "nccl_preflight_webhook_reviews_total{outcome=\"skipped\"} 2",
        "nccl_preflight_webhook_reviews_total{outcome=\"injected\"} 1",
        "nccl_preflight_webhook_reviews_total{outcome=\"failed_open\"} 1",
        "nccl_preflight_webhook_refused_requests_total 1",
        "nccl_preflight_build_info{version=\"",
        "nccl_preflight_webhook_review_duration_seconds_count 4",
    ] {
        assert!(metrics.contains(needle), "{needle} not in\n{metrics}");
    }
    let log = hook.log.lock().unwrap().join("\n");
    assert!(log.contains("no API access"), "{log}");
    assert!(
        log.contains("skipped: no container asks for an NVIDIA GPU"),
        "{log}"
    );
    assert!(
        log.contains("not a review, nothing injected (failing open)"),
        "{log}"
    );
}

/// cert-manager renews the certificate in place (the kubelet swaps the Secret's files):
/// the next handshake presents the new one, without a restart; a half-written pair
/// keeps the old one serving.
#[test]
fn a_rotated_certificate_is_served_without_a_restart() {
    let test = "a_rotated_certificate_is_served_without_a_restart";
    if !require_tools(test, &["openssl"]) {
        return;
    }
    let dir = scratch("webhook-rotate");
    let hook = start(&dir, &[], &[]);
    let probe = |ca: &Path| {
        let mut tls = kube_fake::connect(&hook.addr, ca);
        kube_fake::request(&mut tls, "GET", "/healthz", b"").0
    };
    assert_eq!(probe(&hook.ca), 200);
    // A broken key beside a new certificate: still the first certificate.
    let (new_ca, new_cert, new_key) = kube_fake::certificates(&dir, "second");
    std::fs::write(
        dir.join("tls.key.tmp"),
        "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
    )
    .unwrap();
    std::fs::rename(dir.join("tls.key.tmp"), dir.join("tls.key")).unwrap();
    assert_eq!(probe(&hook.ca), 200);
    // The whole new pair: the next connection gets it.
    for (from, to) in [(&new_cert, "tls.crt"), (&new_key, "tls.key")] {
        std::fs::copy(from, dir.join("x.tmp")).unwrap();
        std::fs::rename(dir.join("x.tmp"), dir.join(to)).unwrap();
    }
    assert_eq!(probe(&new_ca), 200);
    let old = std::panic::catch_unwind(|| probe(&hook.ca));
    assert!(
        old.is_err(),
        "the old CA still verifies the served certificate"
    );
    let log = hook.log.lock().unwrap().join("\n");
    assert!(
        log.contains("the changed certificate does not load, still serving the previous one"),
        "{log}"
    );
    assert!(log.contains("loaded the rotated certificate"), "{log}");
}
