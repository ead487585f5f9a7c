//! Deployment: `install` into a shared volume, and the example manifests.

use crate::support::{BIN, command, repo, require, require_tools, scratch, stderr, stdout};
use std::os::unix::fs::PermissionsExt;

#[test]
fn install_copies_this_binary_whole_and_replaces_an_old_copy() {
    let dir = scratch("install");
    std::fs::write(dir.join("nccl-preflight"), "old").unwrap();
    let out = command(&["install", dir.to_str().unwrap()], &[])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let installed = dir.join("nccl-preflight");
    assert_eq!(
        std::fs::read(&installed).unwrap(),
        std::fs::read(BIN).unwrap()
    );
    let mode = std::fs::metadata(&installed).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o755);
    // Only the binary: no temp file left beside it.
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
    let v = std::process::Command::new(&installed)
        .arg("--version")
        .output()
        .unwrap();
    assert!(stdout(&v).starts_with("nccl-preflight "), "{}", stdout(&v));
    // Another name, then bad destinations: exit 2 naming them, nothing written.
    let out = command(&["install", dir.to_str().unwrap(), "--name", "np"], &[])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(dir.join("np").exists());
    for (args, word) in [
        (
            vec![
                "install".to_string(),
                dir.join("missing").display().to_string(),
            ],
            "missing",
        ),
        (
            vec!["install".to_string(), installed.display().to_string()],
            "not a directory",
        ),
        (
            vec![
                "install".into(),
                dir.display().to_string(),
                "--name".into(),
                "../x".into(),
            ],
            "plain file name",
        ),
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = command(&args, &[]).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(stderr(&out).contains(word), "{args:?}: {}", stderr(&out));
    }
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 2);
}

/// Runs tests/manifests/validate.py on `dir` (files, kustomizations rendered): its
/// whole JSON answer. It exits 0 without errors and 1 with them; never anything else.
fn validate_json(python: &std::path::Path, dir: &std::path::Path) -> serde_json::Value {
    let out = std::process::Command::new(python)
        .arg(crate::support::repo().join("tests/manifests/validate.py"))
        .arg("--json")
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "validate.py: {}",
        stderr(&out)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let clean = v["errors"].as_array().is_some_and(Vec::is_empty);
    assert_eq!(out.status.code(), Some(if clean { 0 } else { 1 }));
    v
}

/// The test venv's Python with the validator's packages; None (the test skips, or fails
/// under NCCL_PREFLIGHT_TEST_STRICT) without. The CRDs are the repository's.
fn validator_python(test: &str) -> Option<std::path::PathBuf> {
    crate::support::require_python(test, "kubernetes_validate, jsonschema, yaml")
}

/// A file under examples/manifests.
fn manifest_text(rel: &str) -> String {
    std::fs::read_to_string(manifests().join(rel)).unwrap()
}

/// The manifests under examples/manifests.
fn manifests() -> std::path::PathBuf {
    crate::support::repo().join("examples/manifests")
}

/// `kubectl kustomize DIR` under examples/manifests, with the `# node:` line of its
/// kustomization.yaml on top, as a file the validator reads alone.
fn rendered(dir: &str) -> String {
    let path = manifests().join(dir);
    let out = std::process::Command::new("kubectl")
        .arg("kustomize")
        .arg(&path)
        .output()
        .expect("kubectl (scripts/setup.sh test)");
    assert!(out.status.success(), "{dir}: {}", stderr(&out));
    let kustomization = std::fs::read_to_string(path.join("kustomization.yaml")).unwrap();
    let node: String = kustomization
        .lines()
        .filter(|l| l.starts_with("# node:") || l.starts_with("# admission:"))
        .map(|l| format!("{l}\n"))
        .collect();
    node + &stdout(&out)
}

/// Runs tests/manifests/validate.py on `dir`: (documents, errors, command lines).
fn validate(
    python: &std::path::Path,
    dir: &std::path::Path,
) -> (u64, Vec<String>, Vec<Vec<String>>) {
    let v = validate_json(python, dir);
    let strings = |v: &serde_json::Value| -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap().to_string())
            .collect()
    };
    let commands = v["commands"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| strings(&c["argv"]))
        .collect();
    (
        v["documents"].as_u64().unwrap(),
        strings(&v["errors"]),
        commands,
    )
}

/// Parses a command line with the current CLI, as the binary does (`cli::parse`): a
/// flag the mode does not read is refused too.
fn parses(argv: &[String]) -> Result<(), String> {
    let full: Vec<std::ffi::OsString> = std::iter::once("nccl-preflight".to_string())
        .chain(argv.iter().cloned())
        .map(Into::into)
        .collect();
    nccl_preflight::cli::parse(&full)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

#[test]
fn example_manifests_match_the_real_schemas_and_every_command_parses() {
    let test = "example_manifests_match_the_real_schemas_and_every_command_parses";
    let Some(python) = validator_python(test) else {
        return;
    };
    let dir = manifests();
    let v = validate_json(&python, &dir);
    let (documents, errors, commands) = validate(&python, &dir);
    assert!(errors.is_empty(), "{errors:#?}");
    // Every kustomization (bases, overlays, node pieces, recipes) was rendered and
    // validated; the image component renders only inside them.
    let sources: Vec<&str> = v["sources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    let mut kustomizations = Vec::new();
    let mut stack = vec![dir.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let path = e.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.ends_with("kustomization.yaml") {
                let text = std::fs::read_to_string(&path).unwrap();
                if !text.contains("kind: Component") {
                    let rel = d.strip_prefix(&dir).unwrap().display().to_string();
                    kustomizations.push(rel);
                }
            }
        }
    }
    assert!(kustomizations.len() >= 13, "{kustomizations:?}");
    for k in &kustomizations {
        assert!(
            sources.contains(&k.as_str()),
            "{k} not validated: {sources:?}"
        );
    }
    assert!(documents as usize >= kustomizations.len());
    for argv in &commands {
        parses(argv).unwrap_or_else(|e| panic!("{argv:?} does not parse: {e}"));
    }
    let subcommands: std::collections::BTreeSet<&str> =
        commands.iter().map(|a| a[0].as_str()).collect();
    for mode in ["init", "install", "exec", "serve", "gang"] {
        assert!(
            subcommands.contains(mode),
            "no manifest runs {mode}: {subcommands:?}"
        );
    }

    // The same validation catches what it must: an undeclared field, a wrong type, a
    // kind without a CRD; and a flag the CLI does not have fails to parse.
    let bad = scratch("bad-manifests");
    let text = std::fs::read_to_string(dir.join("base/mpijob/mpijob-nccl-tests.yaml")).unwrap();
    std::fs::write(
        bad.join("mpijob.yaml"),
        text.replace("slotsPerWorker: 8", "slotsPerWorker: eight")
            .replace("volumeMounts:", "volumeMount:")
            .replace("cleanPodPolicy: Running", "cleanPodPolicyy: Running"),
    )
    .unwrap();
    std::fs::write(
        bad.join("thing.yaml"),
        "apiVersion: example.com/v1\nkind: Thing\nmetadata: {name: t}\n",
    )
    .unwrap();
    let (_, errors, _) = validate(&python, &bad);
    let all = errors.join("\n");
    assert!(all.contains("'eight' is not of type 'integer'"), "{all}");
    // In a pod template: Kubernetes' own Pod schema, strictly (the vendored CRDs leave
    // pod templates open for it); elsewhere: the CRD's schema, pruning included.
    assert!(all.contains("('volumeMount' was unexpected)"), "{all}");
    assert!(
        all.contains("runPolicy.cleanPodPolicyy: field not declared in the schema"),
        "{all}"
    );
    assert!(all.contains("no CRD for example.com/v1 Thing"), "{all}");
    assert!(parses(&["init".into(), "--nccl-config=/x".into()]).is_err());
    // A flag the mode does not read fails a manifest as the binary would refuse it.
    let probe_cuda = parses(&["probe".into(), "--cuda=on".into()]);
    assert!(probe_cuda.is_err_and(|e| e.contains("--cuda")));
}

/// The effective request validate.py computed for the pod templates of `file`.
fn effective<'a>(v: &'a serde_json::Value, file: &str) -> Vec<&'a serde_json::Value> {
    v["pods"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["file"] == file)
        .map(|p| &p["effective"])
        .collect()
}

#[test]
fn every_manifest_pod_fits_its_node_as_the_scheduler_counts_it() {
    let test = "every_manifest_pod_fits_its_node_as_the_scheduler_counts_it";
    let Some(python) = validator_python(test) else {
        return;
    };
    let v = validate_json(&python, &manifests());
    assert_eq!(v["errors"], serde_json::json!([]), "{:#}", v["errors"]);
    // Every pod that asks for a device names the node it must fit, and fits it. The
    // two-step pattern's second init container asks for what the trainer asks for,
    // and init containers run one at a time: the pod asks for it once.
    let with_devices: Vec<&serde_json::Value> = v["pods"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["effective"].as_object().is_some_and(|e| !e.is_empty()))
        .collect();
    assert!(with_devices.len() >= 8, "{with_devices:#?}");
    assert!(with_devices.iter().all(|p| p["node"].is_string()));
    assert_eq!(
        effective(&v, "overlays/eks-p5-efa"),
        [&serde_json::json!({"nvidia.com/gpu": 8, "vpc.amazonaws.com/efa": 32})]
    );
    assert_eq!(
        effective(&v, "overlays/openshift-roce"),
        [&serde_json::json!({"nvidia.com/gpu": 8, "rdma/rdma_shared_device_eth": 1})]
    );
    // The node DaemonSet asks for no GPU: it would take them from the jobs.
    assert_eq!(effective(&v, "node/serve"), [&serde_json::json!({})]);
    assert_eq!(
        effective(&v, "base/pytorchjob-sidecar"),
        [&serde_json::json!({"nvidia.com/gpu": 8})]
    );
    // issue 17: the MPIJob's workers ask for the RDMA device their check requires.
    assert!(
        effective(&v, "base/mpijob")
            .iter()
            .any(|e| e["rdma/rdma_shared_device_a"] == 1),
        "{:#?}",
        effective(&v, "base/mpijob")
    );
}

#[test]
fn sidecar_asking_for_the_trainers_gpus_again_makes_the_pod_unschedulable() {
    let test = "sidecar_asking_for_the_trainers_gpus_again_makes_the_pod_unschedulable";
    let Some(python) = validator_python(test) else {
        return;
    };
    let bad = scratch("sidecar-gpus");
    // The shipped sidecar as it was (issue 16): the sidecar also asks for 8 GPUs.
    let shipped = std::fs::read_to_string(
        manifests().join("base/pytorchjob-sidecar/pytorchjob-sidecar.yaml"),
    )
    .unwrap();
    // The node line lives in the base's kustomization.yaml; a loose file carries its own.
    let shipped = format!("# node: 8-gpu nvidia.com/gpu=8\n{shipped}");
    let old = shipped.replace(
        "                  memory: 64Mi\n",
        "                  memory: 64Mi\n                  nvidia.com/gpu: 8\n",
    );
    assert_ne!(old, shipped, "the sidecar's limits moved: update this test");
    std::fs::write(bad.join("sidecar.yaml"), old).unwrap();
    // KEP-753's other cases, as a plain Pod: a sidecar started before a plain init
    // container adds to it (9 GPUs while it runs, beside a trainer asking for only 4:
    // 4 + 1 once running), two plain init containers do not
    // add to each other or to the app containers (max, not sum), and a pod asking for
    // devices without naming its node is an error too.
    let pod = |name: &str, node: &str, init: &str, trainer: u32| {
        format!(
            "{node}apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  initContainers:\n{init}  containers:\n  - name: trainer\n    image: trainer\n    command: [/tools/nccl-preflight, exec, --, torchrun]\n    resources: {{limits: {{nvidia.com/gpu: {trainer}}}}}\n"
        )
    };
    let container = |name: &str, gpus: u32, sidecar: bool| {
        let policy = if sidecar {
            "    restartPolicy: Always\n"
        } else {
            ""
        };
        format!(
            "  - name: {name}\n    image: ghcr.io/example/nccl-preflight:0.1.0\n{policy}    args: [probe]\n    resources: {{limits: {{nvidia.com/gpu: {gpus}}}}}\n"
        )
    };
    let node = "# node: 8-gpu nvidia.com/gpu=8\n";
    std::fs::write(
        bad.join("sidecar-before-init.yaml"),
        pod(
            "before",
            node,
            &(container("watch", 1, true) + &container("check", 8, false)),
            4,
        ),
    )
    .unwrap();
    std::fs::write(
        bad.join("two-inits.yaml"),
        pod(
            "inits",
            node,
            &(container("a", 8, false) + &container("b", 8, false)),
            8,
        ),
    )
    .unwrap();
    std::fs::write(
        bad.join("no-node.yaml"),
        pod("nonode", "", &container("a", 8, false), 8),
    )
    .unwrap();
    let v = validate_json(&python, &bad);
    let errors: Vec<&str> = v["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    let about = |file: &str| -> Vec<&str> {
        errors
            .iter()
            .copied()
            .filter(|e| e.starts_with(file))
            .collect()
    };
    assert_eq!(
        about("sidecar.yaml"),
        [
            "sidecar.yaml PyTorchJob/llm-pretrain-watched: spec.pytorchReplicaSpecs.Worker.template: \
          the pod needs nvidia.com/gpu 16 (effective request), node 8-gpu has 8: it stays Pending"
        ]
    );
    assert_eq!(
        effective(&v, "sidecar-before-init.yaml"),
        [&serde_json::json!({"nvidia.com/gpu": 9})]
    );
    assert_eq!(about("sidecar-before-init.yaml").len(), 1, "{errors:#?}");
    assert_eq!(
        effective(&v, "two-inits.yaml"),
        [&serde_json::json!({"nvidia.com/gpu": 8})]
    );
    assert!(about("two-inits.yaml").is_empty(), "{errors:#?}");
    let no_node = about("no-node.yaml");
    assert!(
        no_node.len() == 1 && no_node[0].contains("no single '# node: NAME"),
        "{errors:#?}"
    );
}

#[test]
fn a_check_in_the_training_image_sees_the_trainers_devices_and_the_jobs_node_count() {
    let test = "a_check_in_the_training_image_sees_the_trainers_devices_and_the_jobs_node_count";
    let Some(python) = validator_python(test) else {
        return;
    };
    let bad = scratch("two-step");
    // The overlays as kubectl renders them: the trainer (containers) comes before the
    // init containers, so the last occurrence is the check's, the first the trainer's.
    let edit = |file: &str, text: String, edits: &[(&str, &str, bool)]| {
        let mut text = text;
        for (from, to, last) in edits {
            let at = if *last {
                text.rfind(from)
            } else {
                text.find(from)
            };
            let at =
                at.unwrap_or_else(|| panic!("{file} no longer has {from:?}: update this test"));
            text.replace_range(at..at + from.len(), to);
        }
        std::fs::write(bad.join(file), text).unwrap();
    };
    let eks = rendered("overlays/eks-p5-efa");
    edit(
        "eks-p5-efa.yaml",
        eks.clone(),
        &[
            ("            - --nodes=16\n", "", true),
            ("                vpc.amazonaws.com/efa: 32\n", "", true),
        ],
    );
    // --nodes follows the replicas: an overlay that changes one must change the other.
    edit(
        "eks-replicas.yaml",
        eks,
        &[("      replicas: 16\n", "      replicas: 8\n", false)],
    );
    edit(
        "openshift-roce.yaml",
        rendered("overlays/openshift-roce"),
        &[
            (
                "            - mountPath: /dev/shm\n              name: dshm\n",
                "",
                true,
            ),
            (
                "              capabilities:\n                drop:\n",
                "              capabilities:\n                add:\n                - IPC_LOCK\n                drop:\n",
                false,
            ),
        ],
    );
    let text =
        std::fs::read_to_string(manifests().join("base/mpijob/mpijob-nccl-tests.yaml")).unwrap();
    std::fs::write(
        bad.join("mpijob-nccl-tests.yaml"),
        format!("# node: 8-gpu-ib nvidia.com/gpu=8 rdma/rdma_shared_device_a=63\n{text}")
            .replace("--nodes=2", "--nodes=3"),
    )
    .unwrap();
    let (_, errors, _) = validate(&python, &bad);
    let all = errors.join("\n");
    for expected in [
        "eks-p5-efa.yaml PyTorchJob/llm-pretrain-p5: nccl-preflight: no --nodes in an init container of a 16-node job",
        "eks-p5-efa.yaml PyTorchJob/llm-pretrain-p5: nccl-preflight: asks for {'nvidia.com/gpu': 8}, the trainer for {'nvidia.com/gpu': 8, 'vpc.amazonaws.com/efa': 32}",
        "eks-replicas.yaml PyTorchJob/llm-pretrain-p5: nccl-preflight: --nodes 16, but the job has 8 GPU pods",
        "openshift-roce.yaml PyTorchJob/llm-train-roce: nccl-preflight: the trainer mounts /dev/shm, the check does not",
        "openshift-roce.yaml PyTorchJob/llm-train-roce: nccl-preflight: the trainer adds capabilities ['IPC_LOCK'] the check does not",
        "openshift-roce.yaml PyTorchJob/llm-train-roce: spec.pytorchReplicaSpecs.Worker.template: pytorch: adds ['IPC_LOCK']: restricted allows adding only NET_BIND_SERVICE: not admitted by Pod Security restricted",
        "mpijob-nccl-tests.yaml MPIJob/nccl-tests-allreduce: nccl-preflight: --nodes 3, but the job has 2 GPU pods",
    ] {
        assert!(all.contains(expected), "{expected}\nnot in:\n{all}");
    }
    assert_eq!(errors.len(), 7, "{all}");
}

#[test]
fn a_gang_only_where_the_job_kind_lets_it_form() {
    let test = "a_gang_only_where_the_job_kind_lets_it_form";
    let Some(python) = validator_python(test) else {
        return;
    };
    let dir = manifests();
    // A base's file with the `# node:` line of its kustomization.yaml on top.
    let read = |base: &str| {
        let base = dir.join("base").join(base);
        let node = std::fs::read_to_string(base.join("kustomization.yaml"))
            .unwrap()
            .lines()
            .filter(|l| l.starts_with("# node:"))
            .map(|l| format!("{l}\n"))
            .collect::<String>();
        let file = std::fs::read_dir(&base)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| !p.ends_with("kustomization.yaml"))
            .unwrap();
        node + &std::fs::read_to_string(file).unwrap()
    };
    let edit = |text: String, from: &str, to: &str| {
        assert!(text.contains(from), "{from:?} is gone: update this test");
        text.replacen(from, to, 1)
    };

    // The launcher's script is read line by line: the gang under mpirun is found
    // and parsed like any other command line.
    let (_, errors, commands) = validate(&python, &dir);
    assert!(errors.is_empty(), "{errors:#?}");
    assert!(
        commands.iter().any(|a| a == &["gang".to_string()]),
        "{commands:?}"
    );

    let bad = scratch("gang-placement");
    // PyTorchJob: a gang in the master's init container, and one without a Master.
    std::fs::write(
        bad.join("pytorchjob-init-gang.yaml"),
        "apiVersion: kubeflow.org/v1\nkind: PyTorchJob\nmetadata: {name: init-gang}\nspec:\n  \
         pytorchReplicaSpecs:\n    Master:\n      replicas: 1\n      template:\n        spec:\n          \
         initContainers:\n            - name: gang\n              image: ghcr.io/example/nccl-preflight:0.1.0\n              \
         args: [init, --gang]\n          containers:\n            - name: pytorch\n              \
         image: nvcr.io/nvidia/pytorch:24.10-py3\n",
    )
    .unwrap();
    std::fs::write(
        bad.join("pytorchjob-no-master.yaml"),
        "apiVersion: kubeflow.org/v1\nkind: PyTorchJob\nmetadata: {name: no-master}\nspec:\n  \
         pytorchReplicaSpecs:\n    Worker:\n      replicas: 2\n      template:\n        spec:\n          \
         containers:\n            - name: pytorch\n              image: nvcr.io/nvidia/pytorch:24.10-py3\n              \
         command: [/tools/nccl-preflight, exec, --gang, --, torchrun, train.py]\n",
    )
    .unwrap();
    // MPIJob: the launcher may start before the workers are Ready.
    std::fs::write(
        bad.join("mpijob-at-startup.yaml"),
        edit(
            read("mpijob"),
            "\n  launcherCreationPolicy: WaitForWorkersReady\n",
            "\n  launcherCreationPolicy: AtStartup\n",
        ),
    )
    .unwrap();
    // TrainingRuntime: `init --gang` in an init container forms (the JobSet Service
    // publishes not-ready addresses by default) unless the runtime turns that off.
    // The CRD copy in tests/manifests/crds (2025-02) predates `network.publishNotReadyAddresses`
    // (kubeflow/trainer v2.3.0's CRD declares it), so that file also gets an
    // undeclared-field error.
    let gang_init = "                  initContainers:\n\
                     \x20                   - name: gang\n\
                     \x20                     image: ghcr.io/example/nccl-preflight:0.1.0\n\
                     \x20                     args: [init, --gang]\n";
    let runtime = edit(
        read("trainjob"),
        "                  initContainers:\n",
        gang_init,
    );
    std::fs::write(bad.join("trainjob-init-gang.yaml"), &runtime).unwrap();
    std::fs::write(
        bad.join("trainjob-ready-only.yaml"),
        edit(
            runtime.replace("name: torch-nccl-preflight", "name: ready-only"),
            "      replicatedJobs:\n",
            "      network:\n        publishNotReadyAddresses: false\n      replicatedJobs:\n",
        ),
    )
    .unwrap();

    let (_, errors, _) = validate(&python, &bad);
    let all = errors.join("\n");
    for expected in [
        "pytorchjob-init-gang.yaml PyTorchJob/init-gang: spec.pytorchReplicaSpecs.Master.template: gang: a gang in an init container of a PyTorchJob deadlocks",
        "pytorchjob-no-master.yaml PyTorchJob/no-master: a gang in a PyTorchJob without a Master replica",
        "mpijob-at-startup.yaml MPIJob/nccl-tests-allreduce: a gang through mpirun without launcherCreationPolicy: WaitForWorkersReady",
        "trainjob-ready-only.yaml TrainingRuntime/ready-only: spec.template.spec.replicatedJobs[0].template.spec.template: gang: a gang in an init container of a TrainingRuntime deadlocks",
        "trainjob-ready-only.yaml TrainingRuntime/ready-only: .spec.template.spec.network.publishNotReadyAddresses: field not declared in the schema",
    ] {
        assert!(all.contains(expected), "{expected}\nnot in:\n{all}");
    }
    assert!(!all.contains("trainjob-init-gang.yaml"), "{all}");
    assert_eq!(errors.len(), 5, "{all}");
}

#[test]
fn probe_answers_in_one_line_and_never_touches_cuda_or_nvlink_counters() {
    use crate::support::fixture_command;
    // --min-shm 1GiB: the 64 MiB /dev/shm fails a requirement given (issue 36).
    let out = fixture_command("runtime-defaults", "probe", &["--min-shm", "1GiB"], &[])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = stdout(&out);
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(
        text.starts_with("fail: dev-shm: /dev/shm is 64 MiB"),
        "{text}"
    );
    // A driver whose cuInit hangs: check fails on the deadline, probe never calls it.
    let dir = scratch("probe-hung-cuda");
    let base = crate::support::repo().join("tests/fixtures/gpu-h100-nv18/gpu.scenario");
    let scenario = dir.join("gpu.scenario");
    let text = std::fs::read_to_string(base).unwrap();
    std::fs::write(&scenario, format!("{text}hang cuInit\n")).unwrap();
    let env = [("FAKE_GPU_SCENARIO", scenario.to_str().unwrap())];
    let out = fixture_command("gpu-h100-nv18", "probe", &["--timeout", "300ms"], &env)
        .output()
        .unwrap();
    let line = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{line}{}", stderr(&out));
    assert!(
        line.starts_with("ok: ") && line.lines().count() == 1,
        "{line}"
    );
    let out = fixture_command("gpu-h100-nv18", "check", &["--timeout", "300ms"], &env)
        .output()
        .unwrap();
    // A hung driver is the node's.
    assert_eq!(out.status.code(), Some(3));
    assert!(
        stdout(&out).contains("cuInit: did not return within"),
        "{}",
        stdout(&out)
    );
    // What no check judges and only per-call NVML gives, the NVLink CRC data counters
    // (~1 ms a link on the H200) and the NUMA affinity: the gates skip them (the other
    // counters come with the one field-values call), doctor reads them.
    std::fs::write(
        &scenario,
        format!("{text}hang nvmlDeviceGetNvLinkErrorCounter\nhang nvmlDeviceGetMemoryAffinity\n"),
    )
    .unwrap();
    let out = fixture_command("gpu-h100-nv18", "probe", &["--timeout", "300ms"], &env)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    let gate = |sub: &str| {
        fixture_command(
            "gpu-h100-nv18",
            sub,
            &["--timeout", "300ms", "--cuda", "off"],
            &env,
        )
        .output()
        .unwrap()
    };
    let out = gate("check");
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    let out = gate("doctor");
    assert_ne!(out.status.code(), Some(0));
    assert!(
        stdout(&out).contains("nvmlDeviceGetNvLinkErrorCounter(GPU 0, link 0, crc_data)"),
        "{}",
        stdout(&out)
    );
}

/// The release workflow passes actionlint (installed by scripts/setup.sh test), and names
/// the image once: from the repository, never a placeholder registry.
#[test]
fn the_release_workflow_passes_actionlint() {
    let test = "the_release_workflow_passes_actionlint";
    let actionlint = repo().join("target/test-venv/bin/actionlint");
    if !require(
        test,
        actionlint.is_file(),
        "actionlint (run scripts/setup.sh test)",
    ) {
        return;
    }
    let workflow = repo().join(".github/workflows/release.yml");
    let out = std::process::Command::new(&actionlint)
        .arg(&workflow)
        .current_dir(repo())
        .output()
        .expect("run actionlint");
    assert!(
        out.status.success(),
        "actionlint: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&workflow).unwrap();
    assert!(
        text.contains("IMAGE: ghcr.io/${{ github.repository }}"),
        "{text}"
    );
    // No placeholder registry (the manifests' own directory, examples/, is no registry).
    assert!(
        !text.contains("ghcr.io/example") && !text.contains("example.com"),
        "a placeholder in the release workflow"
    );
}

/// A base's file with the `# node:` line of its kustomization.yaml on top, as a loose file.
fn base_file(dir: &str, file: &str) -> String {
    let base = manifests().join(dir);
    let node: String = std::fs::read_to_string(base.join("kustomization.yaml"))
        .unwrap()
        .lines()
        .filter(|l| l.starts_with("# node:"))
        .map(|l| format!("{l}\n"))
        .collect();
    node + &std::fs::read_to_string(base.join(file)).unwrap()
}

#[test]
fn the_validator_fails_endless_restarts_policies_against_the_exit_codes_and_what_restricted_v2_rejects()
 {
    let test = "the_validator_fails_endless_restarts_policies_against_the_exit_codes_and_what_restricted_v2_rejects";
    let Some(python) = validator_python(test) else {
        return;
    };
    let bad = scratch("policies");
    let write = |file: &str, text: String, from: &str, to: &str| {
        assert!(text.contains(from), "{from:?} is gone: update this test");
        std::fs::write(bad.join(file), text.replacen(from, to, 1)).unwrap();
    };
    // The init-container gate restarting in place (Init:CrashLoopBackOff for ever), and
    // the exec gate restarting without a backoff limit.
    write(
        "init-onfailure.yaml",
        base_file("base/pytorchjob-init", "pytorchjob-init.yaml").replace(
            "      restartPolicy: Never\n",
            "      restartPolicy: OnFailure\n",
        ),
        "      restartPolicy: OnFailure\n",
        "      restartPolicy: OnFailure\n",
    );
    write(
        "exec-unbounded.yaml",
        base_file("base/pytorchjob-exec", "pytorchjob-exec.yaml"),
        "  runPolicy:\n    backoffLimit: 3\n",
        "",
    );
    // podFailurePolicy against the exit codes: 2 no longer fails the job, 3 does.
    let job = base_file("failure-policy", "job.yaml");
    let job = job.replacen("values: [1, 2]", "values: [1]", 1);
    write(
        "job-policy.yaml",
        job,
        "      - action: Count",
        "      - action: FailJob",
    );
    // A CNI configuration that is not JSON; a CRI-O drop-in that is not TOML.
    let nad = manifest_text("overlays/openshift-roce/network-attachment-definition.yaml");
    write(
        "nad.yaml",
        nad,
        "\"mode\": \"bridge\",",
        "\"mode\": bridge,",
    );
    let mc = manifest_text("admin/openshift-memlock/machineconfig-memlock.yaml");
    write("machineconfig.yaml", mc, "%5D%0A", "%0A");
    // A pod restricted-v2 would not admit: running as root, privileged.
    let os = rendered("overlays/openshift-roce");
    let os = os.replacen("runAsNonRoot: true", "runAsUser: 0", 1);
    write(
        "openshift-root.yaml",
        os,
        "              allowPrivilegeEscalation: false\n",
        "              privileged: true\n",
    );
    let v = validate_json(&python, &bad);
    let all = v["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect::<Vec<_>>()
        .join("\n");
    for expected in [
        "init-onfailure.yaml PyTorchJob/llm-pretrain: Master: restartPolicy OnFailure with the check in init container nccl-preflight: a failed check restarts it on the same node in Init:CrashLoopBackOff for ever",
        "exec-unbounded.yaml PyTorchJob/llm-finetune: Master: restartPolicy OnFailure with the check in container pytorch and no runPolicy.backoffLimit",
        "job-policy.yaml Job/train-gated: spec.podFailurePolicy: exit code 2 (a tool error) does not fail the job",
        "job-policy.yaml Job/train-gated: spec.podFailurePolicy: exit code 3 (a node fault) fails the job",
        "nad.yaml NetworkAttachmentDefinition/roce-net: spec.config: not JSON",
        "machineconfig.yaml MachineConfig/99-worker-nccl-preflight-memlock: /etc/crio/crio.conf.d/99-nccl-preflight-memlock.conf: not TOML",
        "openshift-root.yaml PyTorchJob/llm-train-roce: spec.pytorchReplicaSpecs.Worker.template: pytorch: runs as UID 0",
        "openshift-root.yaml PyTorchJob/llm-train-roce: spec.pytorchReplicaSpecs.Worker.template: pytorch: runAsNonRoot is not true",
        "openshift-root.yaml PyTorchJob/llm-train-roce: spec.pytorchReplicaSpecs.Worker.template: pytorch: allowPrivilegeEscalation is not false",
        "openshift-root.yaml PyTorchJob/llm-train-roce: spec.pytorchReplicaSpecs.Worker.template: pytorch: privileged",
    ] {
        assert!(all.contains(expected), "{expected}\nnot in:\n{all}");
    }
    // Master and Worker each for the two restart cases; 3 containers x 2 for runAsUser
    // and runAsNonRoot; the rest once.
    assert_eq!(v["errors"].as_array().unwrap().len(), 16, "{all}");
}

#[test]
fn validate_manifests_is_a_command_with_one_line_per_error_and_an_exit_code() {
    let test = "validate_manifests_is_a_command_with_one_line_per_error_and_an_exit_code";
    if validator_python(test).is_none() {
        return;
    }
    let script = repo().join("scripts/validate-manifests");
    let run = |args: &[&std::path::Path]| {
        std::process::Command::new(&script)
            .args(args)
            .output()
            .unwrap()
    };
    // The shipped tree, kustomizations rendered: no error, a summary line.
    let out = run(&[&manifests()]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    let text = stdout(&out);
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(text.starts_with("ok: 0 error(s) in "), "{text}");
    // A broken one: one line per error naming the source and resource, control
    // characters from the file escaped, exit 1.
    let bad = scratch("validate-command");
    std::fs::write(
        bad.join("pod.yaml"),
        "apiVersion: v1\nkind: Pod\nmetadata: {name: \"x\\e[2Jy\"}\nspec:\n  containers:\n  - name: c\n    image: nccl-preflight\n    args: [probe]\n    resourcez: {}\n",
    )
    .unwrap();
    let out = run(&[&bad]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("pod.yaml Pod/x\\x1b[2Jy: "), "{text}");
    assert!(!text.contains('\x1b'), "{text:?}");
    assert!(lines.last().unwrap().starts_with("FAILED: "), "{text}");
    assert_eq!(
        lines.len() - 1,
        lines
            .last()
            .unwrap()
            .trim_start_matches("FAILED: ")
            .split(' ')
            .next()
            .unwrap()
            .parse::<usize>()
            .unwrap()
    );
    // A path that is not there: exit 2, said on standard error.
    let out = run(&[&bad.join("missing")]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("missing: no such file or directory"));
}

/// The image is named in one place, the kustomize component, which the release
/// workflow checks against the tag it builds; every manifest says `image: nccl-preflight`.
#[test]
fn the_image_is_named_once_and_every_rendered_manifest_gets_it() {
    let component = std::fs::read_to_string(manifests().join("image/kustomization.yaml")).unwrap();
    let field = |key: &str| -> String {
        component
            .lines()
            .find_map(|l| l.trim().strip_prefix(&format!("{key}: ")))
            .unwrap_or_else(|| panic!("no {key} in the image component"))
            .to_string()
    };
    let (name, tag) = (field("newName"), field("newTag"));
    assert_eq!(tag, env!("CARGO_PKG_VERSION"));
    assert!(name.ends_with("/nccl-preflight") && !name.contains("example"));
    let mut stack = vec![manifests()];
    let mut images = 0;
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let path = e.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            for line in text.lines().filter(|l| l.contains("nccl-preflight:")) {
                assert!(
                    !line.contains("image:"),
                    "{}: {line}: name the image `nccl-preflight`; the component sets it",
                    path.display()
                );
            }
            images += text.matches("image: nccl-preflight\n").count();
        }
    }
    assert!(images >= 12, "{images}");
    let out = std::process::Command::new("kubectl")
        .args(["kustomize"])
        .arg(manifests().join("overlays/openshift-roce"))
        .output()
        .expect("kubectl (scripts/setup.sh test)");
    let text = stdout(&out);
    assert!(text.contains(&format!("image: {name}:{tag}\n")), "{text}");
    assert!(!text.contains("image: nccl-preflight\n"));
    // The README and the docs name the same image, and no other.
    let mut pages = vec![repo().join("README.md"), manifests().join("README.md")];
    for e in std::fs::read_dir(repo().join("docs")).unwrap() {
        pages.push(e.unwrap().path());
    }
    let mut named = 0;
    for page in pages
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
    {
        let text = std::fs::read_to_string(page).unwrap();
        for word in text.split(|c: char| c.is_whitespace() || "`'\"()[]|,".contains(c)) {
            // A registry host (it has a dot) before a path ending in nccl-preflight:TAG.
            let Some((path, _)) = word.split_once(":") else {
                continue;
            };
            if path.ends_with("/nccl-preflight")
                && path.split('/').next().is_some_and(|h| h.contains('.'))
            {
                named += 1;
                assert_eq!(
                    word.trim_end_matches('.'),
                    format!("{name}:{tag}"),
                    "{}",
                    page.display()
                );
            }
        }
    }
    assert!(named >= 2, "{named}");
    let workflow = std::fs::read_to_string(repo().join(".github/workflows/release.yml")).unwrap();
    assert!(
        workflow.contains("examples/manifests/image/kustomization.yaml"),
        "the release workflow does not check the image component"
    );
}

/// The configuration file the manifests ship (examples/manifests/config).
fn shipped_config() -> std::path::PathBuf {
    manifests().join("config/config")
}

/// A YAML or JSON file as JSON, through the test venv's PyYAML.
fn yaml_file(python: &std::path::Path, path: &std::path::Path) -> serde_json::Value {
    let out = std::process::Command::new(python)
        .args([
            "-c",
            "import json, sys, yaml; json.dump(yaml.safe_load(open(sys.argv[1])), sys.stdout)",
        ])
        .arg(path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// node-problem-detector runs the rule's command line from the shipped config: its exit
/// code must be NPD's status (0 OK, 1 NonOK, else Unknown) and its one line must fit
/// max_output_length, whatever the node (docs/custom_plugin_monitor.md).
#[test]
fn the_npd_plugin_command_follows_the_plugin_contract() {
    let config = manifests().join("node/npd/nccl-preflight-monitor.json");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
    let max = v["pluginConfig"]["max_output_length"].as_u64().unwrap() as usize;
    let rules = v["rules"].as_array().unwrap();
    assert_eq!(rules.len(), 1);
    let rule = &rules[0];
    assert_eq!(rule["condition"], v["conditions"][0]["type"]);
    assert!(rule["path"].as_str().unwrap().ends_with("/nccl-preflight"));
    let args: Vec<&str> = rule["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(args[..2], ["probe", "--npd"]);
    assert!(args.contains(&format!("--max-output={max}").as_str()));
    // probe's own bound on a driver call leaves NPD's timeout room: a hung driver is a
    // failed check (NonOK), not a plugin NPD killed (Unknown).
    let seconds = |s: &str| s.trim_end_matches('s').parse::<f64>().unwrap();
    let probe_timeout = args
        .iter()
        .find_map(|a| a.strip_prefix("--timeout="))
        .map(seconds)
        .unwrap();
    assert!(seconds(rule["timeout"].as_str().unwrap()) >= 2.0 * probe_timeout);
    assert!(
        seconds(v["pluginConfig"]["timeout"].as_str().unwrap())
            >= seconds(rule["timeout"].as_str().unwrap())
    );
    // NPD's container sets NCCL_PREFLIGHT_CONFIG to the shipped file: its [probe]
    // section holds --require=gpus=8 and --ignore=dev-shm.
    let config_path = shipped_config();
    let config = [("NCCL_PREFLIGHT_CONFIG", config_path.to_str().unwrap())];
    let answer = |out: &std::process::Output| {
        let text = stdout(out);
        assert!(
            text.ends_with('\n') && text.lines().count() == 1,
            "{text:?}"
        );
        assert!(
            text.trim_end().len() <= max,
            "{} > {max}: {text}",
            text.len()
        );
        text.trim_end().to_string()
    };
    // A healthy 8-GPU node: OK.
    let out = crate::support::fixture_command("gpu-h100-nv18", args[0], &args[1..], &config)
        .output()
        .unwrap();
    let line = answer(&out);
    assert_eq!(out.status.code(), Some(0), "{line}");
    assert!(line.starts_with("ok: "), "{line}");
    // A node whose fabric manager is down, and one with a GPU short: NonOK, naming the
    // checks. (An NVLink down warns: NCCL runs over the links left, issue 36.)
    for (fixture, check) in [
        ("gpu-fabric-manager-down", "gpu-devices"),
        ("gpu-one-of-eight", "gpu-devices"),
    ] {
        let out = crate::support::fixture_command(fixture, args[0], &args[1..], &config)
            .output()
            .unwrap();
        let line = answer(&out);
        assert_eq!(out.status.code(), Some(1), "{fixture}: {line}");
        assert!(
            line.starts_with("fail: ") && line.contains(check),
            "{fixture}: {line}"
        );
    }
    // The tool could not run: Unknown, still one line that says why.
    // (--timeout left out: with --facts nothing is gathered, and probe refuses it.)
    let mut all: Vec<&str> = args
        .iter()
        .copied()
        .filter(|a| !a.starts_with("--timeout"))
        .collect();
    all.extend(["--facts", "/nonexistent/facts.json"]);
    let out = command(&all, &config).output().unwrap();
    let line = answer(&out);
    assert_eq!(out.status.code(), Some(2), "{line}");
    assert!(line.starts_with("unknown: ") && line.contains("/nonexistent/facts.json"));
    // --max-output belongs to --npd, and a line too short to name a check is refused.
    for bad in [
        &["probe", "--max-output=80"][..],
        &["probe", "--npd", "--max-output=8"][..],
    ] {
        let out = command(bad, &[]).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
        assert!(stderr(&out).contains("--max-output"), "{}", stderr(&out));
    }
}

/// The DaemonSet's `serve` command line on a fake healthy 8-GPU node (an XID, NVLink
/// errors) is ready, and every metric and label an alert of the PrometheusRule names is
/// in its /metrics, so no alert waits on a series that never exists.
#[test]
fn the_daemonsets_serve_is_ready_and_every_metric_an_alert_names_is_in_its_metrics() {
    let test = "the_daemonsets_serve_is_ready_and_every_metric_an_alert_names_is_in_its_metrics";
    let Some(python) = crate::support::require_python(test, "yaml") else {
        return;
    };
    let rule = yaml_file(&python, &manifests().join("node/serve/prometheusrule.yaml"));
    // The DaemonSet's own command line, on a loopback port instead of 0.0.0.0:9464.
    let daemonset = yaml_file(&python, &manifests().join("node/serve/daemonset.yaml"));
    let args: Vec<&str> = daemonset["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(args[0], "serve");
    // With the shipped configuration file, as the DaemonSet mounts it: its [serve]
    // section holds --require=gpus=8, --interval and --ignore=dev-shm.
    let config = format!("--config={}", shipped_config().display());
    let mut args: Vec<&str> = args[1..]
        .iter()
        .copied()
        .filter(|a| !a.starts_with("--listen"))
        .collect();
    args.push(&config);
    let server = crate::serve::start_gpu(
        "deploy-alerts",
        "xid 0 13 100\nnvlink_errors 0 1 2 3\n",
        &args,
    );
    let metrics = crate::serve::wait_for(&server, "/metrics", |_, m| {
        m.contains("nccl_preflight_gpu_xid_events_total{")
    });
    // A healthy 8-GPU node is ready with the DaemonSet's flags (its own small /dev/shm
    // ignored), an XID that needs no reset counted, not judged.
    assert_eq!(crate::serve::get(&server, "/readyz").0, 200, "{metrics}");
    let mut named = 0;
    for alert in rule["spec"]["groups"][0]["rules"].as_array().unwrap() {
        let expr = alert["expr"].as_str().unwrap();
        named += expr.matches("nccl_preflight_").count();
        let problems =
            crate::serve::promql_problems(expr, &alert["annotations"].to_string(), &metrics);
        assert!(
            problems.is_empty(),
            "{}: {problems:?}\n{metrics}",
            alert["alert"]
        );
    }
    assert!(named >= 6, "{named}");
    // Every alert says what it means and where its runbook is (docs/alerts.md).
    let runbooks = std::fs::read_to_string(repo().join("docs/alerts.md")).unwrap();
    for alert in rule["spec"]["groups"][0]["rules"].as_array().unwrap() {
        let name = alert["alert"].as_str().unwrap();
        let annotations = &alert["annotations"];
        assert!(
            annotations["description"]
                .as_str()
                .is_some_and(|d| d.len() > 40),
            "{name}"
        );
        let url = annotations["runbook_url"].as_str().unwrap_or_default();
        assert!(
            url.ends_with(&format!("docs/alerts.md#{}", name.to_lowercase())),
            "{name}: {url}"
        );
        assert!(
            runbooks.contains(&format!("\n## {name}\n")),
            "docs/alerts.md has no section {name}"
        );
    }
    for needle in [
        "counter=\"replay\"",
        "counter=\"recovery\"",
        "counter=\"crc_data\"",
    ] {
        assert!(metrics.contains(needle), "{needle} not in\n{metrics}");
    }
}

/// The OpenShift overlay's memlock story on the real kernel: a process the runtime starts
/// as a random non-root UID (restricted-v2's) with IPC_LOCK "added" the way Kubernetes
/// adds it (inheritable, no ambient set) still has no effective CAP_IPC_LOCK, so only
/// the RLIMIT_MEMLOCK it inherits counts: the limit CRI-O's default_ulimits sets passes,
/// a low one fails whatever the capability says. (This machine's root cannot raise the
/// limit above its own 8 MiB, so 8 MiB stands for the MachineConfig's unlimited.)
#[test]
fn a_non_root_pod_gets_memlock_from_the_runtimes_rlimit_not_from_ipc_lock() {
    if !crate::support::require_root("non_root_memlock")
        || !crate::support::require_tools("non_root_memlock", &["prlimit", "setpriv"])
    {
        return;
    }
    let run = |limit: u64| {
        let limit = format!("--memlock={limit}:{limit}");
        let out = std::process::Command::new("prlimit")
            .arg(&limit)
            .args(["setpriv", "--reuid=1000770000", "--regid=1000770000"])
            .args([
                "--clear-groups",
                "--inh-caps=+ipc_lock",
                "--ambient-caps=-all",
            ])
            .arg(crate::support::BIN)
            .args([
                "check",
                "--cuda",
                "off",
                "--format",
                "json",
                "--min-memlock",
                "8MiB",
            ])
            .output()
            .unwrap();
        let r = crate::support::report(&out);
        assert_eq!(
            r["facts"]["memlock"]["cap_ipc_lock"]["value"], false,
            "{limit}"
        );
        crate::support::finding(&r, "memlock")["status"].clone()
    };
    assert_eq!(run(8 << 20), "pass");
    assert_eq!(run(64 << 10), "fail");
}

/// Issue 39 row 3: the validator is bounded. A "billion laughs" Job (nine levels of
/// `&a [*a, ...]`, under 600 bytes) took past 120 s and a 20 MB ConfigMap 29 s and 377
/// MB; now each gets one error line naming the bound, and a manifest with a few honest
/// anchors still validates. The wait is bounded (`timeout 60`) so a regression fails
/// rather than hangs; speed itself is the benchmark's, not asserted here.
#[test]
fn validate_manifests_refuses_a_yaml_bomb_and_an_oversized_file_with_a_clear_error() {
    let test = "validate_manifests_refuses_a_yaml_bomb_and_an_oversized_file_with_a_clear_error";
    if validator_python(test).is_none() || !require_tools(test, &["timeout"]) {
        return;
    }
    let dir = scratch("validate-bounds");
    let mut bomb = String::from(
        "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: lol\n  annotations:\n    a0: &a0 [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n",
    );
    for i in 1..9 {
        let p = format!("*a{}", i - 1);
        bomb += &format!("    a{i}: &a{i} [{}]\n", [p.as_str(); 9].join(","));
    }
    bomb += "spec:\n  template:\n    spec:\n      restartPolicy: Never\n      containers: [{name: c, image: x, command: *a8}]\n";
    assert!(bomb.len() < 1024, "{}", bomb.len());
    std::fs::write(dir.join("bomb.yaml"), &bomb).unwrap();
    let big = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: big}}\ndata:\n  k: \"{}\"\n",
        "x".repeat(20 << 20)
    );
    std::fs::write(dir.join("big.yaml"), big).unwrap();
    // Honest anchors: a container's env shared by two containers (9 nodes, not a bomb).
    std::fs::write(
        dir.join("anchors.yaml"),
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n  - name: a\n    image: nccl-preflight\n    args: [probe]\n    env: &env [{name: X, value: \"1\"}]\n  - name: b\n    image: nccl-preflight\n    args: [probe]\n    env: *env\n",
    )
    .unwrap();
    let run = |file: &str| {
        std::process::Command::new("timeout")
            .arg("60")
            .arg(repo().join("scripts/validate-manifests"))
            .arg(dir.join(file))
            .output()
            .unwrap()
    };
    for (file, word) in [
        ("bomb.yaml", "expands to more than 1000000 YAML nodes"),
        ("big.yaml", "larger than 4 MiB"),
    ] {
        let out = run(file);
        assert_eq!(
            out.status.code(),
            Some(1),
            "{file}: {}{}",
            stdout(&out),
            stderr(&out)
        );
        let text = stdout(&out);
        assert_eq!(text.lines().count(), 2, "{file}: {text}");
        assert!(text.starts_with(&format!("{file}: refused: ")), "{text}");
        assert!(text.contains(word), "{file}: {text}");
    }
    let out = run("anchors.yaml");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
}
