#!/usr/bin/env python3
"""Validates Kubernetes manifests against the real schemas and lists the
nccl-preflight command lines in them, for tests/integration/deploy.rs.

Built-in kinds: the kubernetes-validate package (strict: unknown fields fail).
Kubeflow kinds: the CRDs' openAPIV3Schema with jsonschema, plus a walk that fails on
fields the schema does not declare (the API server would silently drop them), and
every pod template inside them validated as a Pod with kubernetes-validate.

Usage: validate.py MANIFEST_DIR CRD_DIR  -> JSON on stdout:
  {"documents": N, "errors": ["file: message", ...],
   "commands": [{"file": F, "container": C, "argv": [...]}]}
"""
import json
import pathlib
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


def commands(doc):
    for _, template in pod_templates(doc):
        spec = template["spec"]
        for c in spec.get("initContainers", []) + spec.get("containers", []):
            command, args = c.get("command") or [], c.get("args") or []
            if command and pathlib.PurePath(command[0]).name == "nccl-preflight":
                yield c.get("name"), command[1:] + args
            elif not command and "nccl-preflight" in c.get("image", ""):
                # The image's entrypoint is the binary.
                yield c.get("name"), args


def is_custom(api_version):
    """Groups with a dot are CRDs, except Kubernetes' own (*.k8s.io)."""
    group = (api_version or "").rpartition("/")[0]
    return "." in group and not group.endswith(".k8s.io")


def validate_file(path, schemas, errors):
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    found = []
    for doc in docs:
        key = (doc.get("apiVersion"), doc.get("kind"))
        where = f"{path.name} {key[1]}/{doc.get('metadata', {}).get('name')}"
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
        for container, argv in commands(doc):
            found.append({"file": path.name, "container": container, "argv": argv})
    if not found:
        errors.append(f"{path.name}: no nccl-preflight command line")
    return len(docs), found


def main():
    manifest_dir, crd_dir = sys.argv[1], sys.argv[2]
    schemas = crd_schemas(crd_dir)
    errors, found, count = [], [], 0
    files = sorted(pathlib.Path(manifest_dir).glob("*.yaml"))
    if not files:
        errors.append(f"{manifest_dir}: no manifests")
    for path in files:
        try:
            n, cmds = validate_file(path, schemas, errors)
        except yaml.YAMLError as e:
            errors.append(f"{path.name}: not YAML: {e}")
            continue
        count += n
        found.extend(cmds)
    json.dump({"documents": count, "errors": errors, "commands": found}, sys.stdout, indent=1)


if __name__ == "__main__":
    main()
