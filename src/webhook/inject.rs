//! What the webhook adds to a pod, as RFC 6902 JSON patch operations: pure, from the
//! pod the API server sent and the cluster's settings.
//!
//! The trainer is the first container that asks for an NVIDIA GPU. Two ways, as the
//! hand-written manifests do (examples/manifests/README.md):
//! - `init` (the default): an init container from nccl-preflight's image copies the
//!   binary into an emptyDir (`install`), then an init container in the TRAINER's image,
//!   with the trainer's extended resources (GPUs, EFA, RDMA: an init container sees only
//!   the devices it requests, and init containers add nothing to the pod's request),
//!   environment, /dev/shm mount and securityContext, runs `init --nodes N` and writes
//!   nccl.conf; the trainer gets `NCCL_CONF_FILE` (NCCL >= 2.23 reads it).
//! - `exec`: the same `install`, and the trainer's command becomes `nccl-preflight exec
//!   -- COMMAND ARGS`; only where the pod names its command (the image's entrypoint is
//!   not in the pod). Chosen for a pod that restarts its containers (restartPolicy not
//!   Never): a failed check in an init container of such a pod restarts in
//!   Init:CrashLoopBackOff on the same node for ever, while the operators count restarts
//!   of a running trainer toward their backoff limit (kubeflow/trainer pkg/core/job.go
//!   PastBackoffLimit).
//!
//! The injected pod is marked (`nccl-preflight.io/injected`): a pod already marked, or
//! one holding a container of ours, is left as it is, so the webhook is idempotent under
//! `reinvocationPolicy: IfNeeded` and for a pod re-created from an injected template.

use serde_json::{Value, json};

/// The shared volume and where every container mounts it.
const VOLUME: &str = "nccl-preflight";
const DIR: &str = "/nccl-preflight";
const INSTALL: &str = "nccl-preflight-install";
const CHECK: &str = "nccl-preflight";
/// Pod annotations: the mark, a per-pod opt-out (`"false"`), a per-pod mode, a pod count.
const INJECTED: &str = "nccl-preflight.io/injected";
const OPT_OUT: &str = "nccl-preflight.io/inject";
const MODE: &str = "nccl-preflight.io/mode";
pub const NODES: &str = "nccl-preflight.io/nodes";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Init,
    Exec,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Init => "init",
            Mode::Exec => "exec",
        }
    }
}

/// The cluster's side of an injection.
#[derive(Debug, Clone)]
pub struct Settings {
    /// nccl-preflight's image, for the install container.
    pub image: String,
    /// The mode where the pod says nothing.
    pub mode: Mode,
    /// Flags from the configuration file for the injected `init` and `exec` commands,
    /// as (flag, variable, value): left out where the trainer's environment sets the
    /// variable, which wins over the file as everywhere else (config.rs).
    pub init_flags: Vec<(String, String, String)>,
    pub exec_flags: Vec<(String, String, String)>,
}

/// What was decided for one pod.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    Inject {
        mode: Mode,
        nodes: Option<u64>,
        patch: Vec<Value>,
        /// Why the mode differs from the one asked for, if it does.
        note: Option<String>,
    },
    Skip(String),
}

/// A JSON pointer segment (RFC 6901: `~` as `~0`, `/` as `~1`).
fn pointer(segment: &str) -> String {
    segment.replace('~', "~0").replace('/', "~1")
}

/// Whether a resource is an extended one (a device plugin's `vendor/name`), as the
/// scheduler counts them: a domain other than Kubernetes' own.
fn is_extended(resource: &str) -> bool {
    resource
        .split_once('/')
        .is_some_and(|(domain, _)| !domain.ends_with("kubernetes.io"))
}

/// Whether a container asks for an NVIDIA GPU (a whole one or a MIG slice).
fn asks_for_gpu(container: &Value) -> bool {
    ["limits", "requests"].iter().any(|k| {
        container["resources"][k].as_object().is_some_and(|m| {
            m.iter().any(|(name, v)| {
                (name == "nvidia.com/gpu" || name.starts_with("nvidia.com/mig-"))
                    && v.as_str().map_or(v.as_u64() != Some(0), |s| s != "0")
            })
        })
    })
}

/// The trainer's extended resources, as its limits (an extended request equals its limit).
fn extended_limits(container: &Value) -> serde_json::Map<String, Value> {
    let mut out = serde_json::Map::new();
    for k in ["requests", "limits"] {
        if let Some(m) = container["resources"][k].as_object() {
            for (name, v) in m.iter().filter(|(n, _)| is_extended(n)) {
                out.insert(name.clone(), v.clone());
            }
        }
    }
    out
}

fn annotation<'a>(pod: &'a Value, key: &str) -> Option<&'a str> {
    pod["metadata"]["annotations"][key].as_str()
}

/// Why the pod is left alone, if it is.
fn skip_reason(pod: &Value) -> Option<String> {
    if annotation(pod, OPT_OUT) == Some("false") {
        return Some(format!("the pod opts out ({OPT_OUT}: \"false\")"));
    }
    if annotation(pod, INJECTED).is_some() {
        return Some("already injected".into());
    }
    let ours = ["initContainers", "containers"].iter().any(|k| {
        pod["spec"][k].as_array().is_some_and(|cs| {
            cs.iter()
                .any(|c| c["name"] == INSTALL || c["name"] == CHECK)
        })
    });
    if ours {
        return Some(format!(
            "it already has a container named {CHECK} or {INSTALL}"
        ));
    }
    None
}

/// The pod count: the pod's own annotation, else the integer `PET_NNODES` the operator
/// set on the trainer (PyTorchJob: kubeflow/trainer v1.9.4
/// pkg/controller.v1/pytorch/envvar.go setPodEnv, on every container, `min:max` when
/// elastic; TrainJob: v2.3.0 pkg/runtime/framework/plugins/torch/torch.go, on the
/// `node` container), else what the caller found in the pod's owner (an MPIJob's
/// Worker replicas: mpi-operator puts no count on its pods).
pub fn nodes(pod: &Value, trainer: &Value, owner: Option<u64>) -> Option<u64> {
    if let Some(n) = annotation(pod, NODES).and_then(|v| v.trim().parse().ok()) {
        return Some(n);
    }
    let pet = trainer["env"].as_array().and_then(|env| {
        env.iter()
            .find(|e| e["name"] == "PET_NNODES")
            .and_then(|e| e["value"].as_str())
            .and_then(|v| v.trim().parse().ok())
    });
    pet.or(owner).filter(|n| *n > 0)
}

/// The index and spec of the trainer container.
pub fn trainer(pod: &Value) -> Option<(usize, &Value)> {
    pod["spec"]["containers"]
        .as_array()?
        .iter()
        .enumerate()
        .find(|(_, c)| asks_for_gpu(c))
}

/// The mode for this pod, and why it is not the one asked for.
fn mode(pod: &Value, trainer: &Value, default: Mode) -> (Mode, Option<String>) {
    let asked = match annotation(pod, MODE) {
        Some("exec") => Mode::Exec,
        Some("init") => Mode::Init,
        _ => default,
    };
    let has_command = trainer["command"].as_array().is_some_and(|c| !c.is_empty());
    let restarts = pod["spec"]["restartPolicy"].as_str().unwrap_or("Always") != "Never";
    match asked {
        Mode::Exec if !has_command => (
            Mode::Init,
            Some("exec asked for, but the trainer's command is the image's entrypoint, which the pod does not name: init instead".into()),
        ),
        Mode::Init if restarts && has_command => (
            Mode::Exec,
            Some("restartPolicy is not Never: a failed check in an init container would restart on the same node for ever; exec instead".into()),
        ),
        Mode::Init if restarts => (
            Mode::Init,
            Some("restartPolicy is not Never and the trainer's command is not in the pod: a failed check restarts in Init:CrashLoopBackOff on this node until the job is deleted".into()),
        ),
        m => (m, None),
    }
}

/// The injected command's own flags: the mode's, the pod count, the file's.
fn flags(mode: Mode, nodes: Option<u64>, trainer: &Value, settings: &Settings) -> Vec<String> {
    let set_in_pod = |var: &str| {
        trainer["env"]
            .as_array()
            .is_some_and(|env| env.iter().any(|e| e["name"] == var))
    };
    let mut out = Vec::new();
    if mode == Mode::Init {
        out.push(format!("--nccl-conf={DIR}/nccl.conf"));
        out.push(format!("--env-file={DIR}/nccl.env"));
        out.push(format!("--report={DIR}/report.json"));
        if let Some(n) = nodes.filter(|_| !set_in_pod("NCCL_PREFLIGHT_NODES")) {
            out.push(format!("--nodes={n}"));
        }
    }
    let from_file = match mode {
        Mode::Init => &settings.init_flags,
        Mode::Exec => &settings.exec_flags,
    };
    for (flag, var, value) in from_file {
        if !set_in_pod(var) {
            out.push(format!("--{flag}={value}"));
        }
    }
    out
}

/// The install container: nccl-preflight's image, as restricted as Pod Security's
/// `restricted` level asks (kubernetes.io/docs/concepts/security/pod-security-standards).
fn install_container(settings: &Settings) -> Value {
    json!({
        "name": INSTALL,
        "image": settings.image,
        "args": ["install", DIR],
        "volumeMounts": [{"name": VOLUME, "mountPath": DIR}],
        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "64Mi"}},
        "securityContext": {
            "allowPrivilegeEscalation": false,
            "readOnlyRootFilesystem": true,
            "runAsNonRoot": true,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    })
}

/// The check in the trainer's image: what the trainer gets, so it judges that.
fn check_container(trainer: &Value, argv: Vec<String>) -> Value {
    let mut mounts = vec![json!({"name": VOLUME, "mountPath": DIR})];
    if let Some(shm) = trainer["volumeMounts"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["mountPath"] == "/dev/shm"))
    {
        mounts.push(shm.clone());
    }
    let mut c = json!({
        "name": CHECK,
        "image": trainer["image"],
        "command": argv,
        "resources": {
            "requests": {"cpu": "100m", "memory": "128Mi"},
            "limits": Value::Object({
                let mut l = extended_limits(trainer);
                l.insert("memory".into(), json!("1Gi"));
                l
            }),
        },
        "volumeMounts": mounts,
    });
    for key in [
        "imagePullPolicy",
        "env",
        "envFrom",
        "securityContext",
        "workingDir",
    ] {
        if !trainer[key].is_null() {
            c[key] = trainer[key].clone();
        }
    }
    // The report names the node it ran on (the downward API's spec.nodeName).
    let node = json!({"name": "NCCL_PREFLIGHT_NODE_NAME",
        "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}});
    match c["env"].as_array_mut() {
        Some(env) if env.iter().all(|e| e["name"] != "NCCL_PREFLIGHT_NODE_NAME") => env.push(node),
        Some(_) => {}
        None => c["env"] = json!([node]),
    }
    c
}

/// `add` of `value` to the array at `path`, or of the array itself where there is none.
fn append(pod_array: &Value, path: &str, value: Value) -> Value {
    if pod_array.is_array() {
        json!({"op": "add", "path": format!("{path}/-"), "value": value})
    } else {
        json!({"op": "add", "path": path, "value": [value]})
    }
}

/// The operations on the trainer for `mode`: `init` adds the check container (to
/// `inits`) and NCCL_CONF_FILE; `exec` makes `argv -- COMMAND ARGS` its command.
fn trainer_ops(
    mode: Mode,
    trainer: &Value,
    tc: &str,
    mut argv: Vec<String>,
    inits: &mut Vec<Value>,
) -> Vec<Value> {
    let mut patch = Vec::new();
    match mode {
        Mode::Init => {
            inits.push(check_container(trainer, argv));
            let has_conf = trainer["env"]
                .as_array()
                .is_some_and(|env| env.iter().any(|e| e["name"] == "NCCL_CONF_FILE"));
            if !has_conf {
                patch.push(append(
                    &trainer["env"],
                    &format!("{tc}/env"),
                    json!({"name": "NCCL_CONF_FILE", "value": format!("{DIR}/nccl.conf")}),
                ));
            }
        }
        Mode::Exec => {
            argv.push("--".into());
            for key in ["command", "args"] {
                argv.extend(
                    trainer[key]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|a| a.as_str().map(str::to_string)),
                );
            }
            patch.push(json!({"op": "add", "path": format!("{tc}/command"), "value": argv}));
            if !trainer["args"].is_null() {
                patch.push(json!({"op": "remove", "path": format!("{tc}/args")}));
            }
        }
    }
    patch
}

/// Decides for one pod; `owner_nodes` is the pod count its owner gives, where the
/// caller looked it up.
pub fn decide(pod: &Value, settings: &Settings, owner_nodes: Option<u64>) -> Decision {
    if let Some(why) = skip_reason(pod) {
        return Decision::Skip(why);
    }
    let Some((i, trainer)) = trainer(pod) else {
        return Decision::Skip("no container asks for an NVIDIA GPU".into());
    };
    let (mode, note) = mode(pod, trainer, settings.mode);
    let nodes = nodes(pod, trainer, owner_nodes);
    let binary = format!("{DIR}/nccl-preflight");
    let spec = &pod["spec"];
    let tc = format!("/spec/containers/{i}");
    let mut patch = Vec::new();
    patch.push(append(
        &spec["volumes"],
        "/spec/volumes",
        json!({"name": VOLUME, "emptyDir": {"sizeLimit": "64Mi"}}),
    ));
    let mut inits = vec![install_container(settings)];
    let mut argv = vec![binary, mode.name().to_string()];
    argv.extend(flags(mode, nodes, trainer, settings));
    patch.extend(trainer_ops(mode, trainer, &tc, argv, &mut inits));
    patch.push(append(
        &trainer["volumeMounts"],
        &format!("{tc}/volumeMounts"),
        json!({"name": VOLUME, "mountPath": DIR, "readOnly": true}),
    ));
    // Ours first: the check needs neither the network nor the operator's own init
    // containers (PyTorchJob's wait for the master's name).
    match spec["initContainers"].as_array() {
        Some(_) => {
            for (at, c) in inits.into_iter().enumerate() {
                patch.push(
                    json!({"op": "add", "path": format!("/spec/initContainers/{at}"), "value": c}),
                );
            }
        }
        None => patch.push(json!({"op": "add", "path": "/spec/initContainers", "value": inits})),
    }
    let mark = format!("{} {}", env!("CARGO_PKG_VERSION"), mode.name());
    if pod["metadata"]["annotations"].is_object() {
        patch.push(json!({"op": "add", "path": format!("/metadata/annotations/{}", pointer(INJECTED)), "value": mark}));
    } else {
        patch
            .push(json!({"op": "add", "path": "/metadata/annotations", "value": {INJECTED: mark}}));
    }
    Decision::Inject {
        mode,
        nodes,
        patch,
        note,
    }
}
