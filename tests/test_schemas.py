"""One schema per call: what ``/v1/openapi.json`` publishes is what the router and the executor enforce."""

from __future__ import annotations

from typing import Any

import pytest

from executor.models import ExecRequest
from executor.settings import ExecutorSettings
from grove.core.api import EXEC_FIELDS, ExecBody
from grove.core.errors import BadRequest, GroveError
from grove.core.schema import check_field, json_schema, parse
from router.api.openapi import build_spec, canonical_path
from router.api.routes import ROUTES
from router.models import CreateRequest

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
        schema = body_schema(spec, canonical_path(route.path), route.method.lower())
        assert schema.get("type") == "object" and "properties" in schema, route.path


def test_every_query_route_publishes_its_parameters() -> None:
    from grove.core.schema import parse_query
    from router.models import ArtifactQuery

    spec = build_spec(ROUTES)
    routes = [r for r in ROUTES if r.query is not None]
    assert {r.path for r in routes} >= {"/v1/artifacts", "/v1/sandboxes/{id}/artifacts"}
    for route in routes:
        path = route.path.replace("{path:.+}", "{path}")
        params = [p for p in spec["paths"][path][route.method.lower()]["parameters"] if p["in"] == "query"]
        assert {p["name"] for p in params} == set(json_schema(route.query)["properties"]), route.path
        assert all(p["description"] and p["required"] is False for p in params), route.path
    # Query text becomes the published types; anything else is refused naming the parameter.
    assert parse_query(ArtifactQuery, {"limit": "5", "run_id": "r"}) == ArtifactQuery(run_id="r", limit=5)
    with pytest.raises(BadRequest, match="limit"):
        parse_query(ArtifactQuery, {"limit": "five"})
    with pytest.raises(BadRequest, match="color"):
        parse_query(ArtifactQuery, {"color": "red"})


@pytest.mark.parametrize("value", [None, "r-1", "", 7, "x" * 200, "x" * 201, "a\x00b", ["r"]])
def test_one_field_checked_alone_is_what_parse_makes_of_it(value: Any) -> None:
    # A batch parses the first of its alike items and checks only the request id of the others.
    where = "sandboxes[3]"
    try:
        expected: Any = parse(CreateRequest, {"pool": "p", "request_id": value}, where).request_id
    except GroveError as exc:
        with pytest.raises(type(exc)) as raised:
            check_field(CreateRequest, "request_id", value, where)
        assert str(raised.value) == str(exc)
    else:
        assert check_field(CreateRequest, "request_id", value, where) == expected
    with pytest.raises(BadRequest, match=r"'sandboxes\[3\]\.env' must be an object"):
        check_field(CreateRequest, "env", None, where)  # null is no value for a field that is not optional
