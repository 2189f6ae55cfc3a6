"""Structural validation of custom resources against a CRD's ``openAPIV3Schema``, as the API server does it.

Kubernetes validates a custom resource against its structural schema: types, required fields, enums,
patterns, int-or-string, and — with ``fieldValidation=Strict``, which the Knative backend sends —
no field the schema does not declare, unless ``x-kubernetes-preserve-unknown-fields`` allows it. The
stand-in API server runs this on every Knative Service, and the manifest tests on what grove generates.

The schema is the in-repo copy ``knative/schema/service-v1.schema.yaml`` (Knative Serving's
``services.serving.knative.dev`` CRD, version v1, descriptions stripped). ``python -m tests.support.crd_schema
CRD.yaml`` regenerates it from a full CRD file; ``GROVE_KNATIVE_CRD`` points the freshness test at one.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent.parent
SCHEMA_COPY = REPO / "knative" / "schema" / "service-v1.schema.yaml"
SHARED_CRD = REPO.parent / "shared" / "knative" / "service-crd.yaml"
_HEADER = """\
# The openAPIV3Schema of Knative Serving's Service CRD (services.serving.knative.dev, version v1),
# descriptions stripped; taken from the CRD file this project was built against (shared/knative/
# service-crd.yaml in the project's workspace, as installed by Knative Serving's serving-crds.yaml).
# Copyright 2019 The Knative Authors, Apache License 2.0 (http://www.apache.org/licenses/LICENSE-2.0).
# Regenerate: python -m tests.support.crd_schema path/to/service-crd.yaml > knative/schema/service-v1.schema.yaml
"""
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def extract(crd: dict[str, Any], version: str = "v1") -> dict[str, Any]:
    """The version's ``openAPIV3Schema`` without descriptions."""
    for item in crd["spec"]["versions"]:
        if item["name"] == version:
            return _strip(item["schema"]["openAPIV3Schema"])
    raise KeyError(f"the CRD has no version {version}")


def _strip(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _strip(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [_strip(v) for v in node]
    return node


def load_schema() -> dict[str, Any]:
    """The in-repo copy of the Service schema."""
    data = yaml.safe_load(SCHEMA_COPY.read_text())
    assert isinstance(data, dict)
    return data


def validate(obj: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Every way ``obj`` breaks ``schema``, as ``path: problem`` strings (empty: valid)."""
    errors: list[str] = []
    where = path or "<root>"
    if obj is None:
        if not schema.get("nullable"):
            errors.append(f"{where}: null is not allowed")
        return errors
    if schema.get("x-kubernetes-int-or-string"):
        if not isinstance(obj, int | str) or isinstance(obj, bool):
            errors.append(f"{where}: must be an integer or a string")
    elif "anyOf" in schema and "type" not in schema:
        if all(validate(obj, alt, path) for alt in schema["anyOf"]):
            errors.append(f"{where}: matches none of the allowed forms")
    elif (kind := schema.get("type")) is not None and not _is_type(obj, kind):
        return [f"{where}: must be {kind}, got {type(obj).__name__}"]
    if "enum" in schema and obj not in schema["enum"]:
        errors.append(f"{where}: {obj!r} is not one of {schema['enum']}")
    if isinstance(obj, str) and "pattern" in schema and not re.search(schema["pattern"], obj):
        errors.append(f"{where}: {obj!r} does not match {schema['pattern']}")
    if isinstance(obj, dict):
        errors += _object(obj, schema, path)
    elif isinstance(obj, list) and "items" in schema:
        for i, item in enumerate(obj):
            errors += validate(item, schema["items"], f"{path}[{i}]")
    return errors


def _object(obj: dict[str, Any], schema: dict[str, Any], path: str) -> list[str]:
    errors = [f"{path or '<root>'}: missing required field {name!r}" for name in schema.get("required", [])
              if name not in obj]
    props = schema.get("properties")
    extra = schema.get("additionalProperties")
    for key, value in obj.items():
        child = f"{path}.{key}" if path else key
        if not path and key == "metadata":
            errors += _object_meta(value)
        elif props is not None and key in props:
            errors += validate(value, props[key], child)
        elif isinstance(extra, dict):
            errors += validate(value, extra, child)
        elif not (schema.get("x-kubernetes-preserve-unknown-fields") or extra is True):
            errors.append(f'{child}: unknown field "{key}"')
    return errors


def _object_meta(meta: Any) -> list[str]:
    """What the API server checks of a Knative Service's ObjectMeta (name, labels, annotations)."""
    from router.backends.knative.labels import is_valid_value

    if not isinstance(meta, dict):
        return ["metadata: must be an object"]
    errors = []
    name = meta.get("name", "")
    if not isinstance(name, str) or len(name) > 63 or not _DNS1035.match(name):
        errors.append(f"metadata.name: {name!r} must be a DNS-1035 label of at most 63 characters")
    for key, value in (meta.get("labels") or {}).items():
        if not is_valid_key(key) or not isinstance(value, str) or not is_valid_value(value):
            errors.append(f"metadata.labels: {key}={value!r} is not a valid label")
    for key, value in (meta.get("annotations") or {}).items():
        if not is_valid_key(key) or not isinstance(value, str):
            errors.append(f"metadata.annotations: {key!r} is not a valid annotation")
    return errors


def _is_type(obj: Any, kind: str) -> bool:
    return {
        "object": isinstance(obj, dict),
        "array": isinstance(obj, list),
        "string": isinstance(obj, str),
        "boolean": isinstance(obj, bool),
        "integer": isinstance(obj, int) and not isinstance(obj, bool),
        "number": isinstance(obj, int | float) and not isinstance(obj, bool),
    }.get(kind, True)


if __name__ == "__main__":
    source = yaml.safe_load(Path(sys.argv[1]).read_text())
    sys.stdout.write(_HEADER + yaml.safe_dump(extract(source), sort_keys=True))


_LABEL_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def is_valid_key(key: str) -> bool:
    """Whether ``key`` is a valid label or annotation key (``[prefix/]name``), as the API server checks it."""
    from router.backends.knative.labels import is_valid_value

    prefix, sep, name = key.rpartition("/")
    if sep and (not prefix or len(prefix) > 253 or not _LABEL_PREFIX.match(prefix)):
        return False
    return bool(name) and is_valid_value(name)
