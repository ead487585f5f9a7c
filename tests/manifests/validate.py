#!/usr/bin/env python3
"""Validates Kubernetes manifests against the real schemas and lists the
nccl-preflight command lines in them, for tests/integration/deploy.rs.

Built-in kinds: the kubernetes-validate package (strict: unknown fields fail).
Kubeflow kinds: the CRDs' openAPIV3Schema with jsonschema, plus a walk that fails on
fields the schema does not declare (the API server would silently drop them), and
every pod template inside them validated as a Pod with kubernetes-validate.

It also computes every pod template's effective request for each extended resource
(nvidia.com/gpu, vpc.amazonaws.com/efa, rdma/...) as the scheduler does, and fails
a pod that does not fit the node its file names in a comment line
  # node: p5.48xlarge nvidia.com/gpu=8 vpc.amazonaws.com/efa=32
An init container that runs the installed binary in the training image (/tools/...)
must ask for the trainer's extended resources, mount /dev/shm and add the trainer's
capabilities where the trainer does, and state --nodes as the job's GPU pod count.

Command lines are found in a container's command/args, after a launcher word
(`mpirun ... /tools/nccl-preflight gang`) and in the lines of a `sh -c` / `bash -c`
script. A job-wide check (`gang`, `--gang`) must sit where the job kind lets it form
(check_gang_placement).

A Kubeflow job whose check fails must end rather than restart on the same node for
ever (check_restarts). A directory holding kustomization.yaml is rendered with
`kubectl kustomize` (or `kustomize build`) and its output validated; its `# node:` line
is read from the kustomization.yaml.

Usage (scripts/validate-manifests runs it in a venv of its own):
  validate.py [--crds DIR]... [--json] [PATH...]    (default PATH: examples/manifests)
One line per error (SOURCE KIND/NAME: where: what), then a summary line; exit 0 when
there is no error, 1 when there is, 2 when a PATH or --crds does not exist. --json prints
  {"documents": N, "errors": ["source: message", ...], "sources": [...],
   "commands": [{"file": F, "container": C, "argv": [...]}],
   "pods": [{"file": F, "template": PATH, "node": NAME, "effective": {resource: n}}]}
"""
import argparse
import json
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import urllib.parse

try:
    import jsonschema
    import kubernetes_validate
    import yaml
except ImportError as missing:
    sys.exit(f"validate-manifests: {missing.name} is not installed: run scripts/validate-manifests, "
             "which makes a venv with kubernetes-validate, jsonschema and pyyaml")

K8S_VERSION = "1.32.0"

# Bounds on what one source may cost (issue 39 row 3: a 491-byte "billion laughs" Job, nine
# levels of `&a [*a, ...]`, ran past 120 s; a 20 MB ConfigMap took 29 s and 377 MB).
# A source (a file, a kustomization's output, a CRD file) over MAX_SOURCE_BYTES is refused
# before it is parsed: the API server itself takes no request body over 3 MiB
# (k8s.io/apiserver pkg/server/config.go MaxRequestBodyBytes), so one object never needs
# more, and a bundle that does can be split. Aliases are expanded under a node budget
# counted on the parser's events, before anything is built: PyYAML builds an alias as a
# shared reference, cheap to load, but every walk here visits each reference again.
MAX_SOURCE_BYTES = 4 << 20
MAX_EXPANDED_NODES = 1_000_000
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class TooBig(ValueError):
    """A source over the bounds above; its message names the bound."""


def read_bounded(path):
    """The text of `path`, refused (TooBig) over MAX_SOURCE_BYTES without reading it all."""
    with open(path, "rb") as f:
        data = f.read(MAX_SOURCE_BYTES + 1)
    if len(data) > MAX_SOURCE_BYTES:
        raise TooBig(f"larger than {MAX_SOURCE_BYTES >> 20} MiB: split it (the API server "
                     "takes no object over 3 MiB)")
    return data.decode("utf-8", errors="replace")


def expanded_nodes(text):
    """How many nodes the YAML stream holds once every alias is expanded, counted on the
    parser's events (aliases are never expanded here); TooBig past MAX_EXPANDED_NODES."""
    sizes, stack, total = {}, [], 0
    for event in yaml.parse(text, Loader=LOADER):
        if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            stack.append([event.anchor, 1])
            continue
        if isinstance(event, yaml.AliasEvent):
            if event.anchor not in sizes:
                raise yaml.YAMLError(f"alias *{event.anchor} names no anchor before it")
            size, anchor = sizes[event.anchor], None
        elif isinstance(event, yaml.ScalarEvent):
            size, anchor = 1, event.anchor
        elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            anchor, size = stack.pop()
        else:
            continue
        if anchor is not None:
            sizes[anchor] = size
        if stack:
            stack[-1][1] += size
        else:
            total += size
        if total + sum(s for _, s in stack) > MAX_EXPANDED_NODES:
            raise TooBig(f"expands to more than {MAX_EXPANDED_NODES} YAML nodes through its "
                         "aliases (*name): a YAML bomb, or a manifest to write without them")
    return total


def load_all(text):
    """The documents of a YAML stream, within the bounds above."""
    if len(text.encode()) > MAX_SOURCE_BYTES:
        raise TooBig(f"larger than {MAX_SOURCE_BYTES >> 20} MiB: split it (the API server "
                     "takes no object over 3 MiB)")
    expanded_nodes(text)
    return list(yaml.load_all(text, Loader=LOADER))


def crd_schemas(crd_dir):
    out = {}
    for path in sorted(pathlib.Path(crd_dir).glob("*.yaml")):
        try:
            crds = load_all(read_bounded(path))
        except (TooBig, yaml.YAMLError) as e:
            raise TooBig(f"{path}: {e}") from None
        for crd in crds:
            if not crd or crd.get("kind") != "CustomResourceDefinition":
                continue
            group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
            for v in crd["spec"]["versions"]:
                out[(f"{group}/{v['name']}", kind)] = v["schema"]["openAPIV3Schema"]
    return out


def undeclared(value, schema, path, errors):
    """Fields the schema does not declare, as the API server would prune them."""
    if not isinstance(schema, dict):
        return
    if isinstance(value, dict):
        if schema.get("x-kubernetes-preserve-unknown-fields"):
            return
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            if props is not None and key in props:
                undeclared(item, props[key], f"{path}.{key}", errors)
            elif isinstance(extra, dict):
                undeclared(item, extra, f"{path}.{key}", errors)
            elif props is not None:
                errors.append(f"{path}.{key}: field not declared in the schema")
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            undeclared(item, schema["items"], f"{path}[{i}]", errors)


def pod_templates(value, path="spec"):
    """Every {metadata?, spec: {containers: [...]}} pod template inside a resource."""
    if isinstance(value, dict):
        spec = value.get("spec")
        if isinstance(spec, dict) and isinstance(spec.get("containers"), list):
            yield path, value
        for key, item in value.items():
            yield from pod_templates(item, f"{path}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from pod_templates(item, f"{path}[{i}]")


NODE_LINE = re.compile(r"^# node: (\S+)((?: [\w./-]+=\d+)+)\s*$", re.M)


def node_capacity(text):
    """The node a manifest targets, from its `# node: NAME resource=N ...` line."""
    found = NODE_LINE.findall(text)
    if len(found) != 1:
        return None
    name, pairs = found[0]
    return name, {k: int(v) for k, v in (p.split("=") for p in pairs.split())}


def is_extended(resource):
    """Extended resources are the device plugins' (vendor.example/thing): a domain
    other than kubernetes.io's own (cpu, memory, hugepages-*, ephemeral-storage)."""
    return "/" in resource and not resource.split("/")[0].endswith("kubernetes.io")


def extended_requests(container, where, errors):
    """A container's extended-resource requests. Extended resources cannot be
    overcommitted: a limit alone sets the request to the same value, and a request
    must equal its limit (kubernetes.io/docs/concepts/configuration/manage-resources-containers)."""
    resources = container.get("resources") or {}
    limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
    out = {}
    for name in sorted(set(limits) | set(requests)):
        if not is_extended(name):
            continue
        value = requests.get(name, limits.get(name))
        try:
            out[name] = int(str(value))
        except ValueError:
            errors.append(f"{where}: {container.get('name')}: {name}: {value!r} is not a whole number")
    return out


def effective_requests(spec, where, errors):
    """The pod's effective request per extended resource, by KEP-753's rule (the
    scheduler's, kubernetes.io/docs/concepts/workloads/pods/sidecar-containers and
    k8s.io/component-helpers resource.PodRequests): init containers run one at a time,
    each beside the sidecars (restartPolicy: Always) started before it; sidecars keep
    running, so they add to the app containers, which run together:
      init = max over init containers of (its request + the sidecars before it),
             a sidecar counting with the sidecars before it and itself
      pod  = max(init, sum(app containers) + sum(sidecars))"""
    sidecars, init, apps = {}, {}, {}
    add = lambda total, more: {k: total.get(k, 0) + more.get(k, 0) for k in set(total) | set(more)}
    peak = lambda a, b: {k: max(a.get(k, 0), b.get(k, 0)) for k in set(a) | set(b)}
    for c in spec.get("initContainers") or []:
        req = extended_requests(c, where, errors)
        if c.get("restartPolicy") == "Always":
            sidecars = add(sidecars, req)
            init = peak(init, sidecars)
        else:
            init = peak(init, add(req, sidecars))
    for c in spec.get("containers") or []:
        apps = add(apps, extended_requests(c, where, errors))
    return {k: v for k, v in sorted(peak(init, add(apps, sidecars)).items()) if v}


def check_fit(label, text, templates, errors):
    """Each pod template's effective request against the node the file (or the
    kustomization.yaml of a rendered directory) names."""
    pods = []
    node = node_capacity(text)
    for where, spec in templates:
        effective = effective_requests(spec, where, errors)
        pods.append({"file": label, "template": where,
                     "node": node[0] if node else None, "effective": effective})
        if not effective:
            continue
        if node is None:
            errors.append(f"{where}: asks for {effective} but the file has no single "
                          "'# node: NAME resource=N ...' line (in the file, or in the "
                          "kustomization.yaml of a rendered directory) naming the node's capacity")
            continue
        name, capacity = node
        for resource, n in effective.items():
            if n > capacity.get(resource, 0):
                errors.append(f"{where}: the pod needs {resource} {n} (effective request), "
                              f"node {name} has {capacity.get(resource, 0)}: it stays Pending")
    return pods


def replica_specs(value):
    """(pods, pod template) for every group of pods a job runs, one pod per node:
    Kubeflow replica specs ({replicas, template}: PyTorchJob, MPIJob), a batch Job's
    parallelism, a JobSet's replicatedJobs (replicas x the Job's parallelism)."""
    if not isinstance(value, dict):
        return
    kind, spec = value.get("kind"), value.get("spec") or {}
    if kind == "Job" and isinstance(spec.get("template"), dict):
        yield spec.get("parallelism", 1), spec["template"]
        return
    if kind == "JobSet":
        for rj in spec.get("replicatedJobs") or []:
            job = ((rj.get("template") or {}).get("spec")) or {}
            if isinstance(job.get("template"), dict):
                yield rj.get("replicas", 1) * job.get("parallelism", 1), job["template"]
        return
    yield from kubeflow_replicas(value)


def kubeflow_replicas(value):
    if isinstance(value, dict):
        template = value.get("template")
        if (isinstance(value.get("replicas"), int) and isinstance(template, dict)
                and isinstance((template.get("spec") or {}).get("containers"), list)):
            yield value["replicas"], template
        for item in value.values():
            yield from kubeflow_replicas(item)
    elif isinstance(value, list):
        for item in value:
            yield from kubeflow_replicas(item)


def flag(argv, name):
    """The value of `--name=V` or `--name V` in argv, or None."""
    for i, arg in enumerate(argv):
        if arg.startswith(f"{name}="):
            return arg.split("=", 1)[1]
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
    return None


def in_training_image(container):
    """A check run by the installed binary in another image (the two-step pattern)."""
    command = container.get("command") or []
    return bool(command) and command[0].startswith("/tools/") and "nccl-preflight" not in container.get("image", "")


def check_two_step(doc, where, errors):
    """The two-step pattern's check must see what the trainer gets, and know the job's
    span: an init container has neither the trainer's devices (it sees only what it
    requests) nor the launcher's PET_NNODES / WORLD_SIZE."""
    specs = list(replica_specs(doc))
    # One pod per node for every replica that asks for GPUs (the manifests' pods take a node each).
    gpu_nodes = sum(r for r, t in specs
                    if extended_requests(next(iter(t["spec"]["containers"]), {}), where, []).get("nvidia.com/gpu"))
    for _, template in specs:
        spec = template["spec"]
        trainer = (spec.get("containers") or [{}])[0]
        for c in spec.get("initContainers") or []:
            argv = next((a for a in container_commands(c) if a and a[0] in ("init", "check")), None)
            if argv is None or c.get("restartPolicy") == "Always":
                continue
            name = f"{where}: {c.get('name')}"
            nodes = flag(argv, "--nodes")
            if nodes is None and gpu_nodes > 1:
                errors.append(f"{name}: no --nodes in an init container of a {gpu_nodes}-node job "
                              "(the launcher's variables are not in init containers)")
            elif nodes is not None and gpu_nodes and nodes != str(gpu_nodes):
                errors.append(f"{name}: --nodes {nodes}, but the job has {gpu_nodes} GPU pods")
            if not in_training_image(c):
                continue
            mine, theirs = extended_requests(c, name, errors), extended_requests(trainer, name, errors)
            if mine != theirs:
                errors.append(f"{name}: asks for {mine}, the trainer for {theirs}: "
                              "the check must see the devices the trainer gets")
            mounts = lambda x: {m.get("mountPath") for m in x.get("volumeMounts") or []}
            if "/dev/shm" in mounts(trainer) and "/dev/shm" not in mounts(c):
                errors.append(f"{name}: the trainer mounts /dev/shm, the check does not")
            caps = lambda x: set((((x.get("securityContext") or {}).get("capabilities") or {})
                                  .get("add")) or [])
            if not caps(trainer) <= caps(c):
                errors.append(f"{name}: the trainer adds capabilities {sorted(caps(trainer) - caps(c))} "
                              "the check does not")


SHELLS = {"sh", "bash", "dash", "ash"}
OPERATORS = {";", "&&", "||", "|", "&", "(", ")", ";;"}


def shell_commands(script):
    """The simple commands of a shell script, as argv lists: lines joined at
    backslash-newlines, then split at ; && || | & ( ). Enough for the manifests'
    launcher scripts (no here-documents, no control flow spanning lines)."""
    for line in script.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|()")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        argv = []
        for token in lexer:
            if token in OPERATORS:
                if argv:
                    yield argv
                argv = []
            else:
                argv.append(token)
        if argv:
            yield argv


def preflight_tail(argv):
    """What follows the first nccl-preflight word of an argv (under mpirun, env, ...)."""
    for i, word in enumerate(argv):
        if pathlib.PurePath(word).name == "nccl-preflight":
            return argv[i + 1:]
    return None


def container_commands(c):
    """Every nccl-preflight command line a container runs: its command, a command
    that starts it (mpirun ... nccl-preflight gang), or the lines of a `sh -c` script."""
    command, args = c.get("command") or [], c.get("args") or []
    argv = command + args
    if not command and "nccl-preflight" in c.get("image", ""):
        # The image's entrypoint is the binary.
        yield args
        return
    if argv and pathlib.PurePath(argv[0]).name in SHELLS:
        flags = [a for a in argv[1:] if a.startswith("-")]
        script = next((a for a in argv[1:] if not a.startswith("-")), None)
        if script is not None and any("c" in f for f in flags):
            for simple in shell_commands(script):
                tail = preflight_tail(simple)
                if tail is not None:
                    yield tail
        return
    tail = preflight_tail(argv)
    if tail is not None:
        yield tail


def runs_gang(argv):
    """`gang`, or `--gang` before the `--` that starts a wrapped command."""
    own = argv[:argv.index("--")] if "--" in argv else argv
    return bool(own) and (own[0] == "gang" or "--gang" in own)


def commands(doc):
    for _, template in pod_templates(doc):
        spec = template["spec"]
        for c in spec.get("initContainers", []) + spec.get("containers", []):
            for argv in container_commands(c):
                yield c.get("name"), argv


def check_gang_placement(doc, where, errors):
    """Where a job-wide check can form (docs/gang.md, "Multi-node: gang"; examples/manifests/README.md):
    not in the init containers of a job whose Service publishes Ready pods only
    (PyTorchJob: one headless Service per replica without publishNotReadyAddresses,
    kubeflow/trainer v1.9.4 pkg/controller.v1/common/service.go; MPIJob: unless
    runLauncherAsWorker, kubeflow/mpi-operator pkg/controller/mpi_job_controller.go
    newJobService; a JobSet or TrainingRuntime that turns publishNotReadyAddresses off);
    in a PyTorchJob only with a Master replica (MASTER_ADDR and RANK exist only then,
    pkg/controller.v1/pytorch/envvar.go); in an MPIJob only once the workers are Ready."""
    kind, spec = doc.get("kind"), doc.get("spec") or {}
    network = (((spec.get("template") or {}).get("spec") or {}).get("network")
               or spec.get("network") or {})
    ready_only = (kind == "PyTorchJob"
                  or (kind == "MPIJob" and not spec.get("runLauncherAsWorker"))
                  or network.get("publishNotReadyAddresses") is False)
    gang_anywhere = False
    for tpath, template in pod_templates(doc):
        tpath, tspec = tpath.removeprefix("spec."), template["spec"]
        for c in tspec.get("initContainers") or []:
            for argv in container_commands(c):
                if runs_gang(argv):
                    gang_anywhere = True
                    if ready_only and c.get("restartPolicy") != "Always":
                        errors.append(
                            f"{where}: {tpath}: {c.get('name')}: a gang in an init container of a "
                            f"{kind} deadlocks: its Service publishes Ready pods only, and no pod "
                            "is Ready while its init containers run (use exec --gang in the "
                            "training container, or gang through mpirun)")
        for c in tspec.get("containers") or []:
            gang_anywhere |= any(runs_gang(argv) for argv in container_commands(c))
    if not gang_anywhere:
        return
    if kind == "PyTorchJob" and "Master" not in (spec.get("pytorchReplicaSpecs") or {}):
        errors.append(f"{where}: a gang in a PyTorchJob without a Master replica: the operator "
                      "sets MASTER_ADDR and RANK only when a Master exists")
    if kind == "MPIJob" and spec.get("launcherCreationPolicy") != "WaitForWorkersReady":
        errors.append(f"{where}: a gang through mpirun without launcherCreationPolicy: "
                      "WaitForWorkersReady: the launcher may start before the workers' names resolve")


def serve_watch_ports(tspec):
    """Ports on which a container of the pod runs `serve --watch-nccl` (a native sidecar,
    restartPolicy Always, or a plain container): the only ones answering /job/livez."""
    ports = set()
    for c in (tspec.get("initContainers") or []) + (tspec.get("containers") or []):
        sidecar = c in (tspec.get("containers") or []) or c.get("restartPolicy") == "Always"
        for argv in container_commands(c):
            if not argv or argv[0] != "serve" or not sidecar:
                continue
            flags = " ".join(argv)
            if "--watch-nccl" not in flags:
                continue
            listen = next((a.split("=", 1)[1] for a in argv if a.startswith("--listen=")),
                          "0.0.0.0:9464")
            ports.add(int(listen.rsplit(":", 1)[1]))
            ports.update(p.get("name") for p in c.get("ports") or [])
    return ports


def check_job_probe(doc, where, errors):
    """A livenessProbe on /job/livez (docs/serve.md, "Watching the running job") needs, in the same
    pod, `serve --watch-nccl` running beside it on that port, and tolerance for a sidecar
    restart: periodSeconds x failureThreshold of at least 60 s, else a restarting sidecar
    (connection refused) restarts the trainer."""
    for tpath, template in pod_templates(doc):
        tspec = template["spec"]
        for c in tspec.get("containers") or []:
            probe = c.get("livenessProbe") or {}
            get = probe.get("httpGet") or {}
            if get.get("path") != "/job/livez":
                continue
            name = f"{where}: {tpath.removeprefix('spec.')}: {c.get('name')}"
            if get.get("port") not in serve_watch_ports(tspec):
                errors.append(f"{name}: livenessProbe on /job/livez port {get.get('port')}, "
                              "but no serve --watch-nccl listens there in this pod")
            tolerance = probe.get("periodSeconds", 10) * probe.get("failureThreshold", 3)
            if tolerance < 60:
                errors.append(f"{name}: /job/livez probe tolerates {tolerance} s: a sidecar "
                              "restart would restart the trainer (periodSeconds x failureThreshold >= 60)")


def is_custom(api_version):
    """Groups with a dot are CRDs, except Kubernetes' own (*.k8s.io)."""
    group = (api_version or "").rpartition("/")[0]
    return "." in group and not group.endswith(".k8s.io")


def check_restarts(doc, where, errors):
    """A Kubeflow job whose gate fails must end, not loop on the same node. The operator
    counts container restarts toward runPolicy.backoffLimit only in Running pods
    (kubeflow/trainer pkg/core/job.go PastBackoffLimit), and a pod whose init container
    keeps failing stays Pending in Init:CrashLoopBackOff: so a replica that checks in an
    init container must not restart (restartPolicy Never), and one that checks in its
    main container (`exec`) and restarts on failure needs runPolicy.backoffLimit."""
    spec = doc.get("spec") or {}
    replicas = spec.get("pytorchReplicaSpecs") or spec.get("mpiReplicaSpecs") or {}
    limited = (spec.get("runPolicy") or {}).get("backoffLimit") is not None
    for rtype, rspec in replicas.items():
        if not isinstance(rspec, dict) or rspec.get("restartPolicy") not in ("OnFailure", "Always"):
            continue
        pod = ((rspec.get("template") or {}).get("spec")) or {}
        gates = [c.get("name") for c in pod.get("initContainers") or []
                 if c.get("restartPolicy") != "Always"
                 and any(argv and argv[0] not in ("install", "version") for argv in container_commands(c))]
        if gates:
            errors.append(f"{where}: {rtype}: restartPolicy {rspec['restartPolicy']} with the check in "
                          f"init container {gates[0]}: a failed check restarts it on the same node in "
                          "Init:CrashLoopBackOff for ever (the pod stays Pending, so runPolicy.backoffLimit "
                          "never counts it); use restartPolicy: Never")
        wraps = [c.get("name") for c in pod.get("containers") or []
                 if any(argv and argv[0] in ("exec", "check", "init") for argv in container_commands(c))]
        if wraps and not limited:
            errors.append(f"{where}: {rtype}: restartPolicy {rspec['restartPolicy']} with the check in "
                          f"container {wraps[0]} and no runPolicy.backoffLimit: a failed check restarts "
                          "on the same node for ever")


ADMISSION_LINE = re.compile(r"^# admission: (baseline|restricted)\s*$", re.M)

# Pod Security Standards (kubernetes.io/docs/concepts/security/pod-security-standards,
# the policies of k8s.io/pod-security-admission policy/*.go as of 1.32).
BASELINE_CAPABILITIES = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                         "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
                "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
                "net.ipv4.tcp_keepalive_probes"}
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}


def pod_security(spec, level):
    """What the Pod Security `level` (baseline or restricted) refuses in a pod spec, one
    message per violation, in the policies' terms. `restricted` includes `baseline`."""
    out = []
    pod_sc = spec.get("securityContext") or {}
    containers = [c for k in ("initContainers", "containers", "ephemeralContainers")
                  for c in spec.get(k) or []]
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            out.append(f"{key}: host namespaces")
    for v in spec.get("volumes") or []:
        kind = next((k for k in v if k != "name"), None)
        if kind == "hostPath":
            out.append(f"volume {v.get('name')}: hostPath volumes")
        elif level == "restricted" and kind not in RESTRICTED_VOLUMES:
            out.append(f"volume {v.get('name')}: {kind} is not a restricted volume type")
    for s in pod_sc.get("sysctls") or []:
        if s.get("name") not in SAFE_SYSCTLS:
            out.append(f"sysctl {s.get('name')}: not a safe sysctl")
    for c in containers:
        sc, label = c.get("securityContext") or {}, c.get("name")
        caps = sc.get("capabilities") or {}
        if sc.get("privileged"):
            out.append(f"{label}: privileged")
        if ((sc.get("windowsOptions") or {}).get("hostProcess")
                or (pod_sc.get("windowsOptions") or {}).get("hostProcess")):
            out.append(f"{label}: hostProcess")
        if any(p.get("hostPort") for p in c.get("ports") or []):
            out.append(f"{label}: hostPort")
        if sc.get("procMount", "Default") != "Default":
            out.append(f"{label}: procMount {sc.get('procMount')}")
        for where in (sc, pod_sc):
            se = where.get("seLinuxOptions") or {}
            if se.get("type", "") not in SELINUX_TYPES or se.get("user") or se.get("role"):
                out.append(f"{label}: seLinuxOptions {se}")
            if (where.get("appArmorProfile") or {}).get("type") == "Unconfined":
                out.append(f"{label}: AppArmor Unconfined")
        seccomp = (sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get("type")
        if seccomp == "Unconfined":
            out.append(f"{label}: seccomp Unconfined")
        added = set(caps.get("add") or [])
        if level == "baseline":
            extra = sorted(added - BASELINE_CAPABILITIES)
            if extra:
                out.append(f"{label}: adds {extra}: baseline allows only {sorted(BASELINE_CAPABILITIES)}")
            continue
        extra = sorted(added - {"NET_BIND_SERVICE"})
        if extra:
            out.append(f"{label}: adds {extra}: restricted allows adding only NET_BIND_SERVICE")
        if "ALL" not in (caps.get("drop") or []):
            out.append(f"{label}: does not drop ALL capabilities")
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{label}: allowPrivilegeEscalation is not false")
        if not sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")):
            out.append(f"{label}: runAsNonRoot is not true (in the pod or the container)")
        if 0 in (sc.get("runAsUser"), pod_sc.get("runAsUser")):
            out.append(f"{label}: runs as UID 0")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{label}: no RuntimeDefault or Localhost seccomp profile")
    for key in ("annotations",):
        for k, v in ((spec.get("metadata") or {}).get(key) or {}).items():
            if k.startswith("container.apparmor.security.beta.kubernetes.io/") and v == "unconfined":
                out.append(f"{k}: AppArmor unconfined")
    return out


def check_restricted(doc, where, errors, level="restricted"):
    """Every pod template must be admitted by the Pod Security `level`; `restricted` also
    stands for OpenShift's restricted-v2 SCC, whose rules for a pod that fixes no UID are
    the same (drop ALL, add only NET_BIND_SERVICE, no privilege escalation, no host
    namespaces or paths): kubernetes.io/docs/concepts/security/pod-security-standards."""
    for tpath, template in pod_templates(doc):
        name = f"{where}: {tpath.removeprefix('spec.')}"
        spec = dict(template["spec"], metadata=template.get("metadata") or {})
        for message in pod_security(spec, level):
            errors.append(f"{name}: {message}: not admitted by Pod Security {level}")


def job_specs(doc):
    """(path, batch Job spec) for a Job and for every Job template of a JobSet."""
    spec = doc.get("spec") or {}
    if doc.get("kind") == "Job":
        yield "spec", spec
    elif doc.get("kind") == "JobSet":
        for i, rj in enumerate(spec.get("replicatedJobs") or []):
            yield f"spec.replicatedJobs[{i}]", ((rj.get("template") or {}).get("spec")) or {}


def check_pod_failure_policy(doc, where, errors):
    """A podFailurePolicy over nccl-preflight's exit codes follows the project's contract
    (docs/failure-policy.md): 1 (the job's configuration) and 2 (the tool) fail the job,
    3 (this node) never does, since another node may pass."""
    for jpath, spec in job_specs(doc):
        policy = spec.get("podFailurePolicy")
        if not policy:
            continue
        pod = ((spec.get("template") or {}).get("spec")) or {}
        gates = {c.get("name") for c in (pod.get("initContainers") or []) + (pod.get("containers") or [])
                 if any(argv and argv[0] in ("init", "check", "exec", "gang") for argv in container_commands(c))}
        if not gates:
            continue

        def action(code):
            for rule in policy.get("rules") or []:
                on = rule.get("onExitCodes") or {}
                if on.get("containerName") not in (None, *gates):
                    continue
                hit = code in (on.get("values") or [])
                if (on.get("operator") == "In") == hit and on.get("values") is not None:
                    return rule.get("action")
            return None

        for code, what in ((1, "the job's configuration"), (2, "a tool error")):
            if action(code) not in ("FailJob", "FailIndex"):
                errors.append(f"{where}: {jpath}.podFailurePolicy: exit code {code} ({what}) does not "
                              "fail the job: retrying on another node will not help")
        if action(3) in ("FailJob", "FailIndex"):
            errors.append(f"{where}: {jpath}.podFailurePolicy: exit code 3 (a node fault) fails the "
                          "job: count or ignore it so a pod on another node can run")


def check_network_attachment(doc, where, errors):
    """A NetworkAttachmentDefinition's spec.config is a CNI configuration: JSON with a
    cniVersion and a type or a plugins list (containernetworking/cni SPEC.md)."""
    if doc.get("kind") != "NetworkAttachmentDefinition":
        return
    text = (doc.get("spec") or {}).get("config")
    if text is None:
        return
    try:
        config = json.loads(text)
    except ValueError as e:
        errors.append(f"{where}: spec.config: not JSON: {e}")
        return
    if not isinstance(config, dict) or "cniVersion" not in config or not ("type" in config or "plugins" in config):
        errors.append(f"{where}: spec.config: a CNI configuration needs cniVersion and type (or plugins)")


def check_machine_config(doc, where, errors):
    """A MachineConfig's files written from `data:` URLs (Ignition) decode, and a CRI-O
    drop-in among them parses as TOML: a bad one stops CRI-O on every node of the pool."""
    if doc.get("kind") != "MachineConfig":
        return
    files = ((((doc.get("spec") or {}).get("config") or {}).get("storage") or {}).get("files")) or []
    for f in files:
        source = ((f.get("contents") or {}).get("source")) or ""
        if not source.startswith("data:,"):
            continue
        text = urllib.parse.unquote(source.removeprefix("data:,"))
        if "/crio/" in f.get("path", ""):
            try:
                tomllib.loads(text)
            except tomllib.TOMLDecodeError as e:
                errors.append(f"{where}: {f.get('path')}: not TOML: {e}")


def validate_doc(doc, where, schemas, errors):
    """Schema checks for one document: a CRD's schema, or the built-in kinds'."""
    key = (doc.get("apiVersion"), doc.get("kind"))
    if key in schemas:
        for e in jsonschema.Draft7Validator(schemas[key]).iter_errors(doc):
            loc = ".".join(str(p) for p in e.absolute_path)
            errors.append(f"{where}: {loc}: {e.message}")
        local = []
        # The API server keeps apiVersion, kind and metadata whatever the schema says.
        top = {k: v for k, v in doc.items() if k not in ("apiVersion", "kind", "metadata")}
        undeclared(top, schemas[key], "", local)
        errors.extend(f"{where}: {m}" for m in local)
        for tpath, template in pod_templates(doc):
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": dict(template.get("metadata") or {}, name="template"),
                "spec": template["spec"],
            }
            try:
                kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
            except kubernetes_validate.ValidationError as e:
                errors.append(f"{where}: {tpath}: {e.message} at {'.'.join(map(str, e.path))}")
    elif is_custom(key[0]):
        errors.append(f"{where}: no CRD for {key[0]} {key[1]} in the CRD directories "
                      "(pass --crds DIR with its definition: kubectl get crd NAME -o yaml)")
    else:
        try:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            errors.append(f"{where}: {e.message} at {'.'.join(map(str, e.path))}")
        except kubernetes_validate.utils.SchemaNotFoundError as e:
            errors.append(f"{where}: {e}")


def validate_text(label, text, node_text, schemas, errors):
    """Validates the YAML documents of one source: a file, or a kustomization's output.
    `node_text` holds the `# node:` line (the file itself, or the kustomization.yaml)."""
    docs = [d for d in load_all(text) if d]
    found, templates = [], []
    for doc in docs:
        if not isinstance(doc, dict):
            errors.append(f"{label}: a document that is not a mapping")
            continue
        where = f"{label} {doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}"
        templates.extend((f"{where}: {tpath.removeprefix('spec.')}", t["spec"])
                         for tpath, t in pod_templates(doc))
        validate_doc(doc, where, schemas, errors)
        check_two_step(doc, where, errors)
        check_gang_placement(doc, where, errors)
        check_job_probe(doc, where, errors)
        check_restarts(doc, where, errors)
        check_network_attachment(doc, where, errors)
        check_pod_failure_policy(doc, where, errors)
        check_machine_config(doc, where, errors)
        admission = ADMISSION_LINE.search(node_text)
        if admission:
            check_restricted(doc, where, errors, admission.group(1))
        for container, argv in commands(doc):
            found.append({"file": label, "container": container, "argv": argv})
    if templates and not found:
        errors.append(f"{label}: no nccl-preflight command line")
    return len(docs), found, check_fit(label, node_text, templates, errors)


def kustomize_command():
    """`kubectl kustomize` or `kustomize build`, whichever is on PATH (or beside this
    Python, as the test venv's kubectl is), or None."""
    here = pathlib.Path(sys.executable).parent
    for name, args in (("kubectl", ["kustomize"]), ("kustomize", ["build"])):
        found = shutil.which(name) or (str(here / name) if (here / name).is_file() else None)
        if found:
            return [found, *args]
    return None


# kustomize renders every shipped directory in well under a second; go-yaml, which it
# parses with, bounds alias expansion itself (gopkg.in/yaml.v3 decode.go allowedAliasRatio).
RENDER_SECONDS = 30


def render(directory):
    """The output of a kustomization directory, or an error message."""
    command = kustomize_command()
    if command is None:
        return None, (f"{directory}: cannot render: neither kubectl nor kustomize is on PATH "
                      "(scripts/setup.sh test installs kubectl)")
    try:
        out = subprocess.run([*command, str(directory)], capture_output=True, text=True,
                             timeout=RENDER_SECONDS)
    except subprocess.TimeoutExpired:
        return None, f"{directory}: {' '.join(command)} did not finish within {RENDER_SECONDS} s"
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no message"])[-1]
        return None, f"{directory}: {' '.join(command[1:])} failed: {last}"
    return out.stdout, None


def is_component(directory):
    try:
        k = (load_all(read_bounded(directory / "kustomization.yaml")) or [{}])[0] or {}
    except (TooBig, yaml.YAMLError):
        return False
    return isinstance(k, dict) and k.get("kind") == "Component"


def sources(path, root=None):
    """(label, kind, path) for what PATH holds: a YAML file; a kustomization directory
    (rendered); a directory whose *.yaml files are validated one by one and whose
    subdirectories are searched for kustomizations (components are left out: they
    render only inside a kustomization). A kustomization found below PATH is labelled
    with its path from PATH, one given as PATH with its last two path components."""
    root = root or path
    if path.is_file():
        yield path.name, "file", path
        return
    if (path / "kustomization.yaml").is_file():
        if not is_component(path):
            label = (str(path.relative_to(root)) if path != root
                     else "/".join(path.resolve().parts[-2:]))
            yield label, "kustomization", path
        return
    for f in sorted(path.glob("*.yaml")):
        yield f.name, "file", f
    for d in sorted(p for p in path.iterdir() if p.is_dir()):
        yield from sources(d, root)


def validate_path(path, schemas, report):
    """Validates everything under `path` into `report`."""
    any_source = False
    for label, kind, where in sources(path):
        any_source = True
        errors = report["errors"]
        try:
            if kind == "kustomization":
                text, problem = render(where)
                node_text = read_bounded(where / "kustomization.yaml")
                if problem:
                    errors.append(problem)
                    continue
            else:
                text = read_bounded(where)
                node_text = text
            n, cmds, fits = validate_text(label, text, node_text, schemas, errors)
        except TooBig as e:
            errors.append(f"{label}: refused: {e}")
            continue
        except yaml.YAMLError as e:
            errors.append(f"{label}: not YAML: {e}")
            continue
        report["documents"] += n
        report["commands"].extend(cmds)
        report["pods"].extend(fits)
        report["sources"].append(label)
    if not any_source:
        report["errors"].append(f"{path}: no manifests")


def default_crd_dirs():
    """The CRDs shipped here (tests/manifests/crds: the Kubeflow ones trimmed by trim_crd.py)."""
    here = pathlib.Path(__file__).resolve().parent
    return [d for d in [here / "crds"] if d.is_dir()]


def main():
    parser = argparse.ArgumentParser(
        description="Validate Kubernetes manifests (files, directories, kustomizations) against "
                    "the real schemas and the rules of examples/manifests/README.md.")
    parser.add_argument("paths", nargs="*", type=pathlib.Path,
                        help="YAML files, directories of them, or kustomization directories "
                             "(default: examples/manifests)")
    parser.add_argument("--crds", action="append", type=pathlib.Path,
                        help="a directory of CustomResourceDefinitions, added to the repository's "
                             "(tests/manifests/crds); repeatable")
    parser.add_argument("--json", action="store_true",
                        help="print the whole result as JSON (documents, errors, commands, pods)")
    args = parser.parse_args()
    root = pathlib.Path(__file__).resolve().parent.parent.parent
    paths = args.paths or [root / "examples" / "manifests"]
    for p in [*paths, *(args.crds or [])]:
        if not p.exists():
            print(f"validate-manifests: {p}: no such file or directory", file=sys.stderr)
            return 2
    schemas = {}
    try:
        # --crds adds to the repository's CRDs; a later definition of a kind wins.
        for d in [*default_crd_dirs(), *(args.crds or [])]:
            schemas.update(crd_schemas(d))
    except TooBig as e:
        print(f"validate-manifests: --crds: {escape(str(e))}", file=sys.stderr)
        return 2
    report = {"documents": 0, "errors": [], "commands": [], "pods": [], "sources": []}
    for p in paths:
        validate_path(p, schemas, report)
    if args.json:
        json.dump(report, sys.stdout, indent=1)
        print()
    else:
        for e in report["errors"]:
            print(escape(e))
        print(f"{'FAILED' if report['errors'] else 'ok'}: {len(report['errors'])} error(s) in "
              f"{report['documents']} documents from {len(report['sources'])} sources, "
              f"{len(report['commands'])} nccl-preflight command lines")
    return 1 if report["errors"] else 0


def escape(text):
    """A message for a terminal: control characters from the manifests shown as escapes."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


if __name__ == "__main__":
    sys.exit(main())
