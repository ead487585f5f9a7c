//! Deployment: `install` into a shared volume, and the example manifests.

use crate::support::{BIN, command, repo, require, scratch, stderr, stdout};
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

/// Runs tests/manifests/validate.py on `dir`: its whole JSON answer.
fn validate_json(python: &std::path::Path, dir: &std::path::Path) -> serde_json::Value {
    let crds = crate::support::repo().join("../shared/data/crds");
    let out = std::process::Command::new(python)
        .arg(crate::support::repo().join("tests/manifests/validate.py"))
        .arg(dir)
        .arg(&crds)
        .output()
        .unwrap();
    assert!(out.status.success(), "validate.py: {}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
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

/// Parses a command line with the current CLI, as the binary would.
fn parses(argv: &[String]) -> Result<(), String> {
    use clap::Parser;
    let full = std::iter::once("nccl-preflight".to_string()).chain(argv.iter().cloned());
    nccl_preflight::cli::Cli::try_parse_from(full)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

#[test]
fn example_manifests_match_the_real_schemas_and_every_command_parses() {
    let test = "example_manifests_match_the_real_schemas_and_every_command_parses";
    if crate::support::require_shared(test, "crds").is_none() {
        return;
    }
    let Some(python) =
        crate::support::require_python(test, "kubernetes_validate, jsonschema, yaml")
    else {
        return;
    };
    let dir = crate::support::repo().join("examples/manifests");
    let (documents, errors, commands) = validate(&python, &dir);
    assert!(errors.is_empty(), "{errors:#?}");
    let files = std::fs::read_dir(&dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "yaml")
        })
        .count();
    assert!(files >= 6, "{files} manifests");
    assert!(documents as usize >= files);
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
    let text = std::fs::read_to_string(dir.join("mpijob-nccl-tests.yaml")).unwrap();
    std::fs::write(
        bad.join("mpijob.yaml"),
        text.replace("slotsPerWorker: 8", "slotsPerWorker: eight")
            .replace("volumeMounts:", "volumeMount:"),
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
    assert!(
        all.contains("volumeMount: field not declared in the schema"),
        "{all}"
    );
    assert!(all.contains("no CRD for example.com/v1 Thing"), "{all}");
    assert!(parses(&["init".into(), "--nccl-config=/x".into()]).is_err());
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
    if crate::support::require_shared(test, "crds").is_none() {
        return;
    }
    let Some(python) =
        crate::support::require_python(test, "kubernetes_validate, jsonschema, yaml")
    else {
        return;
    };
    let dir = crate::support::repo().join("examples/manifests");
    let v = validate_json(&python, &dir);
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
        effective(&v, "eks-p5-efa.yaml"),
        [&serde_json::json!({"nvidia.com/gpu": 8, "vpc.amazonaws.com/efa": 32})]
    );
    assert_eq!(
        effective(&v, "pytorchjob-sidecar.yaml"),
        [&serde_json::json!({"nvidia.com/gpu": 8})]
    );
    // issue 17: the MPIJob's workers ask for the RDMA device their check requires.
    assert!(
        effective(&v, "mpijob-nccl-tests.yaml")
            .iter()
            .any(|e| e["rdma/rdma_shared_device_a"] == 1),
        "{:#?}",
        effective(&v, "mpijob-nccl-tests.yaml")
    );
}

#[test]
fn sidecar_asking_for_the_trainers_gpus_again_makes_the_pod_unschedulable() {
    let test = "sidecar_asking_for_the_trainers_gpus_again_makes_the_pod_unschedulable";
    if crate::support::require_shared(test, "crds").is_none() {
        return;
    }
    let Some(python) =
        crate::support::require_python(test, "kubernetes_validate, jsonschema, yaml")
    else {
        return;
    };
    let bad = scratch("sidecar-gpus");
    // The shipped sidecar as it was (issue 16): the sidecar also asks for 8 GPUs.
    let shipped = std::fs::read_to_string(
        crate::support::repo().join("examples/manifests/pytorchjob-sidecar.yaml"),
    )
    .unwrap();
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
    if crate::support::require_shared(test, "crds").is_none() {
        return;
    }
    let Some(python) =
        crate::support::require_python(test, "kubernetes_validate, jsonschema, yaml")
    else {
        return;
    };
    let dir = crate::support::repo().join("examples/manifests");
    let bad = scratch("two-step");
    // The first occurrence of each is the checking init container's, before the trainer's.
    let without = |file: &str, cuts: &[&str]| {
        let mut text = std::fs::read_to_string(dir.join(file)).unwrap();
        for cut in cuts {
            assert!(
                text.contains(cut),
                "{file} no longer has {cut:?}: update this test"
            );
            text = text.replacen(cut, "", 1);
        }
        std::fs::write(bad.join(file), text).unwrap();
    };
    without(
        "eks-p5-efa.yaml",
        &[
            "                - --nodes=16\n",
            "                  vpc.amazonaws.com/efa: 32\n",
        ],
    );
    without(
        "openshift-roce-multus.yaml",
        &[
            "              securityContext:\n                capabilities:\n                  add: [\"IPC_LOCK\"]\n",
            "                - name: dshm\n                  mountPath: /dev/shm\n",
        ],
    );
    let text = std::fs::read_to_string(dir.join("mpijob-nccl-tests.yaml")).unwrap();
    std::fs::write(
        bad.join("mpijob-nccl-tests.yaml"),
        text.replace("--nodes=2", "--nodes=3"),
    )
    .unwrap();
    let (_, errors, _) = validate(&python, &bad);
    let all = errors.join("\n");
    for expected in [
        "eks-p5-efa.yaml PyTorchJob/llm-pretrain-p5: nccl-preflight: no --nodes in an init container of a 16-node job",
        "eks-p5-efa.yaml PyTorchJob/llm-pretrain-p5: nccl-preflight: asks for {'nvidia.com/gpu': 8}, the trainer for {'nvidia.com/gpu': 8, 'vpc.amazonaws.com/efa': 32}",
        "openshift-roce-multus.yaml PyTorchJob/llm-train-roce: nccl-preflight: the trainer mounts /dev/shm, the check does not",
        "openshift-roce-multus.yaml PyTorchJob/llm-train-roce: nccl-preflight: the trainer adds capabilities ['IPC_LOCK'] the check does not",
        "mpijob-nccl-tests.yaml MPIJob/nccl-tests-allreduce: nccl-preflight: --nodes 3, but the job has 2 GPU pods",
    ] {
        assert!(all.contains(expected), "{expected}\nnot in:\n{all}");
    }
    assert_eq!(errors.len(), 5, "{all}");
}

#[test]
fn a_gang_only_where_the_job_kind_lets_it_form() {
    let test = "a_gang_only_where_the_job_kind_lets_it_form";
    if crate::support::require_shared(test, "crds").is_none() {
        return;
    }
    let Some(python) =
        crate::support::require_python(test, "kubernetes_validate, jsonschema, yaml")
    else {
        return;
    };
    let dir = crate::support::repo().join("examples/manifests");
    let read = |file: &str| std::fs::read_to_string(dir.join(file)).unwrap();
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
            read("mpijob-nccl-tests.yaml"),
            "\n  launcherCreationPolicy: WaitForWorkersReady\n",
            "\n  launcherCreationPolicy: AtStartup\n",
        ),
    )
    .unwrap();
    // TrainingRuntime: `init --gang` in an init container forms (the JobSet Service
    // publishes not-ready addresses by default) unless the runtime turns that off.
    // The CRD copy in ../shared/data/crds (2025-02) predates `network.publishNotReadyAddresses`
    // (kubeflow/trainer v2.3.0's CRD declares it), so that file also gets an
    // undeclared-field error.
    let gang_init = "                  initContainers:\n\
                     \x20                   - name: gang\n\
                     \x20                     image: ghcr.io/example/nccl-preflight:0.1.0\n\
                     \x20                     args: [init, --gang]\n";
    let runtime = edit(
        read("trainjob.yaml"),
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
    let out = fixture_command("runtime-defaults", "probe", &[], &[])
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
    assert!(
        !text.contains("example"),
        "a placeholder in the release workflow"
    );
}
