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

Usage: validate.py MANIFEST_DIR CRD_DIR  -> JSON on stdout:
  {"documents": N, "errors": ["file: message", ...],
   "commands": [{"file": F, "container": C, "argv": [...]}],
   "pods": [{"file": F, "template": PATH, "node": NAME, "effective": {resource: n}}]}
"""
import json
import pathlib
import re
import shlex
import sys

import jsonschema
import kubernetes_validate
import yaml

K8S_VERSION = "1.32.0"


def crd_schemas(crd_dir):
    out = {}
    for path in sorted(pathlib.Path(crd_dir).glob("*.yaml")):
        for crd in yaml.safe_load_all(path.read_text()):
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


def check_fit(path, text, templates, errors):
    """Each pod template's effective request against the node the file names."""
    pods = []
    node = node_capacity(text)
    for where, spec in templates:
        effective = effective_requests(spec, where, errors)
        pods.append({"file": path.name, "template": where,
                     "node": node[0] if node else None, "effective": effective})
        if not effective:
            continue
        if node is None:
            errors.append(f"{where}: asks for {effective} but the file has no single "
                          "'# node: NAME resource=N ...' line naming the node's capacity")
            continue
        name, capacity = node
        for resource, n in effective.items():
            if n > capacity.get(resource, 0):
                errors.append(f"{where}: the pod needs {resource} {n} (effective request), "
                              f"node {name} has {capacity.get(resource, 0)}: it stays Pending")
    return pods


def replica_specs(value):
    """Every {replicas, template} inside a job (PyTorchJob and MPIJob replica specs)."""
    if isinstance(value, dict):
        if isinstance(value.get("replicas"), int) and isinstance(value.get("template"), dict):
            yield value["replicas"], value["template"]
        for item in value.values():
            yield from replica_specs(item)
    elif isinstance(value, list):
        for item in value:
            yield from replica_specs(item)


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
            if not in_training_image(c):
                continue
            name = f"{where}: {c.get('name')}"
            argv = (c.get("command") or [])[1:] + (c.get("args") or [])
            nodes = flag(argv, "--nodes")
            if nodes is None and gpu_nodes > 1:
                errors.append(f"{name}: no --nodes in an init container of a {gpu_nodes}-node job "
                              "(the launcher's variables are not in init containers)")
            elif nodes is not None and nodes != str(gpu_nodes):
                errors.append(f"{name}: --nodes {nodes}, but the job has {gpu_nodes} GPU pods")
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


def validate_file(path, schemas, errors):
    text = path.read_text()
    docs = [d for d in yaml.safe_load_all(text) if d]
    found, templates = [], []
    for doc in docs:
        key = (doc.get("apiVersion"), doc.get("kind"))
        where = f"{path.name} {key[1]}/{doc.get('metadata', {}).get('name')}"
        templates.extend((f"{where}: {tpath.removeprefix('spec.')}", t["spec"])
                         for tpath, t in pod_templates(doc))
        if key in schemas:
            for e in jsonschema.Draft7Validator(schemas[key]).iter_errors(doc):
                loc = ".".join(str(p) for p in e.absolute_path)
                errors.append(f"{where}: {loc}: {e.message}")
            local = []
            undeclared(doc, schemas[key], "", local)
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
            errors.append(f"{where}: no CRD for {key[0]} {key[1]} in the CRD directory")
        else:
            try:
                kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
            except kubernetes_validate.ValidationError as e:
                errors.append(f"{where}: {e.message} at {'.'.join(map(str, e.path))}")
            except kubernetes_validate.utils.SchemaNotFoundError as e:
                errors.append(f"{where}: {e}")
        check_two_step(doc, where, errors)
        check_gang_placement(doc, where, errors)
        check_job_probe(doc, where, errors)
        for container, argv in commands(doc):
            found.append({"file": path.name, "container": container, "argv": argv})
    if not found:
        errors.append(f"{path.name}: no nccl-preflight command line")
    return len(docs), found, check_fit(path, text, templates, errors)


def main():
    manifest_dir, crd_dir = sys.argv[1], sys.argv[2]
    schemas = crd_schemas(crd_dir)
    errors, found, pods, count = [], [], [], 0
    files = sorted(pathlib.Path(manifest_dir).glob("*.yaml"))
    if not files:
        errors.append(f"{manifest_dir}: no manifests")
    for path in files:
        try:
            n, cmds, fits = validate_file(path, schemas, errors)
        except yaml.YAMLError as e:
            errors.append(f"{path.name}: not YAML: {e}")
            continue
        count += n
        found.extend(cmds)
        pods.extend(fits)
    json.dump({"documents": count, "errors": errors, "commands": found, "pods": pods},
              sys.stdout, indent=1)


if __name__ == "__main__":
    main()
