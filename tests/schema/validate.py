"""Validates JSON documents against the schemas in schema/.

usage: validate.py SCHEMA_DIR FILE...   (each FILE holds one JSON document; its
"schema" field picks report-v1.json or explain-log-v1.json). Prints one line per
document that fails, and exits 1 if any does; a document with an unknown schema
field fails too.
"""
import json
import pathlib
import sys

import jsonschema
from referencing import Registry, Resource

schema_dir = pathlib.Path(sys.argv[1])
schemas = {}
registry = Registry()
for path in sorted(schema_dir.glob("*.json")):
    doc = json.loads(path.read_text())
    jsonschema.Draft202012Validator.check_schema(doc)
    schemas[doc["title"]] = doc
    resource = Resource.from_contents(doc)
    registry = registry.with_resources([(doc["$id"], resource), (path.name, resource)])

failed = 0
for name in sys.argv[2:]:
    doc = json.loads(pathlib.Path(name).read_text())
    schema = schemas.get(doc.get("schema"))
    if schema is None:
        print(f"{name}: no schema for {doc.get('schema')!r}")
        failed += 1
        continue
    validator = jsonschema.Draft202012Validator(schema, registry=registry)
    for error in validator.iter_errors(doc):
        print(f"{name}: {'/'.join(map(str, error.absolute_path))}: {error.message}")
        failed += 1
print(f"checked {len(sys.argv) - 2} document(s), {failed} error(s)")
sys.exit(1 if failed else 0)
