#!/usr/bin/env python3
"""Makes the small copy of a CustomResourceDefinition that tests/manifests/crds keeps:
only what validate.py reads (spec.group, spec.names.kind, each version's name and
openAPIV3Schema), without descriptions, and with every pod template's schema replaced
by an open object: validate.py validates each pod template as a Pod with
kubernetes-validate, strictly, so the CRD's own copy of the Pod schema (most of a
Kubeflow CRD's megabyte) adds nothing.

Usage: trim_crd.py SOURCE-CRD.yaml "where it came from" > tests/manifests/crds/NAME.yaml
"""
import sys

import yaml

OPEN_POD_TEMPLATE = {
    "type": "object",
    "x-kubernetes-preserve-unknown-fields": True,
}


def is_pod_template(schema):
    """A PodTemplateSpec: {metadata, spec: {containers, ...}}."""
    props = schema.get("properties") or {}
    spec = props.get("spec") or {}
    return "metadata" in props and "containers" in (spec.get("properties") or {})


def trim(schema):
    if isinstance(schema, list):
        return [trim(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    if is_pod_template(schema):
        return dict(OPEN_POD_TEMPLATE)
    out = {}
    for key, value in schema.items():
        if key == "description":
            continue
        if key in ("properties", "patternProperties", "definitions"):
            out[key] = {name: trim(s) for name, s in value.items()}
        else:
            out[key] = trim(value)
    return out


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    source, origin = sys.argv[1], sys.argv[2]
    with open(source) as f:
        crds = [d for d in yaml.safe_load_all(f) if d and d.get("kind") == "CustomResourceDefinition"]
    print(f"# Trimmed by tests/manifests/trim_crd.py from {origin}:")
    print("# descriptions dropped, pod templates open (validate.py checks them as Pods).")
    for crd in crds:
        spec = crd["spec"]
        small = {
            "apiVersion": crd["apiVersion"],
            "kind": "CustomResourceDefinition",
            "metadata": {"name": crd["metadata"]["name"]},
            "spec": {
                "group": spec["group"],
                "names": {"kind": spec["names"]["kind"], "plural": spec["names"]["plural"]},
                "scope": spec.get("scope", "Namespaced"),
                "versions": [
                    {
                        "name": v["name"],
                        "served": v.get("served", True),
                        "storage": v.get("storage", False),
                        "schema": {"openAPIV3Schema": trim(v["schema"]["openAPIV3Schema"])},
                    }
                    for v in spec["versions"]
                ],
            },
        }
        print("---")
        sys.stdout.write(yaml.safe_dump(small, sort_keys=True, width=120))


if __name__ == "__main__":
    main()
