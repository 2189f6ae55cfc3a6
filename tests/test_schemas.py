"""One schema per call: what ``/v1/openapi.json`` publishes is what the router and the executor enforce."""

from __future__ import annotations

from typing import Any

import pytest

from executor.models import ExecRequest
from executor.settings import ExecutorSettings
from grove.api import EXEC_FIELDS, ExecBody
from grove.errors import BadRequest
from grove.schema import json_schema
from router.app import ROUTES
from router.openapi import build_spec

pytestmark = pytest.mark.fast  # pure logic: `make test-fast`


def body_schema(spec: dict[str, Any], path: str, method: str) -> dict[str, Any]:
    schema: dict[str, Any] = spec["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"]
    return schema


def test_exec_is_published_with_the_fields_the_executor_takes() -> None:
    spec = build_spec(ROUTES)
    schema = body_schema(spec, "/v1/sandboxes/{id}/exec", "post")
    assert schema == json_schema(ExecBody)
    assert set(schema["properties"]) == EXEC_FIELDS and schema["required"] == ["command"]
    assert schema["additionalProperties"] is False
    assert all(prop.get("description") for prop in schema["properties"].values())


def test_the_executor_refuses_a_field_the_schema_does_not_publish(tmp_path: Any) -> None:
    settings = ExecutorSettings(token="t", root=str(tmp_path))
    assert ExecRequest.parse({"command": "true"}, settings).argv == ["/bin/sh", "-c", "true"]
    with pytest.raises(BadRequest, match="'shell'"):
        ExecRequest.parse({"command": "true", "shell": True}, settings)


def test_every_body_route_publishes_a_schema() -> None:
    spec = build_spec(ROUTES)
    for route in ROUTES:
        if route.body is None:
            continue
        schema = body_schema(spec, route.path.replace("{tail:.*}", "{tail}"), route.method.lower())
        assert schema.get("type") == "object" and "properties" in schema, route.path
