"""Auth, the error model and the OpenAPI document of a real router, checked on the wire."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any

import msgpack
import pytest

from grove.core.errors import Unauthorized
from router.app import create_app
from router.settings import RouterSettings
from router.ui import UI_ROUTES
from tests.support.executor_fixtures import MSGPACK
from tests.support.router_fixtures import RouterProcess, error_of

SOME_ID = "sb-0123456789abcdef"


@pytest.fixture(scope="module")
def router(any_router: RouterProcess) -> RouterProcess:
    """This module runs against both backends (local and the Knative stand-in)."""
    return any_router


def _spec_routes(router: RouterProcess) -> list[tuple[str, str, bool]]:
    """(METHOD, path template, public) for every operation in the served OpenAPI document."""
    reply = router.http("GET", "/v1/openapi.json", auth=False)
    assert reply.status == 200
    spec = reply.json()
    assert spec["openapi"].startswith("3.")
    return [
        (method.upper(), path, "security" not in op)
        for path, ops in spec["paths"].items()
        for method, op in ops.items()
    ]


def _concrete(path: str) -> str:
    return re.sub(r"{\w+}", SOME_ID, path)


def test_openapi_lists_exactly_the_served_routes(router: RouterProcess) -> None:
    documented = {(m, p) for m, p, _ in _spec_routes(router)}
    # What the application really registers (built here on a scratch state dir, never started).
    with tempfile.TemporaryDirectory(prefix="gt-") as scratch:
        app = create_app(RouterSettings(state_dir=Path(scratch), api_keys=("x",)))
        served = {
            (route.method, route.resource.canonical)
            for route in app.router.routes()
            if route.resource is not None and route.method != "HEAD"
        } - {(method, path) for method, path, _ in UI_ROUTES}  # the viewer's pages are no API
        assert not [p for _, p in served if p.startswith("/ui")]
    assert documented == served
    for must in (("POST", "/v1/sandboxes"), ("POST", "/v1/sandboxes/{id}/exec"), ("GET", "/healthz"),
                 ("PUT", "/v1/sandboxes/{id}/archive"), ("GET", "/v1/sandboxes/{id}/files/list")):
        assert must in documented
    # And from outside: every documented operation exists (with a key, none is an unknown endpoint).
    for method, path in documented:
        # A body with an unknown field: the route answers, and nothing gets made.
        reply = router.http(method, _concrete(path), json_body={"probe": 1} if method in ("POST", "PUT") else None)
        if reply.status in (404, 405):
            assert "no such endpoint" not in _message(path, reply), (method, path)
            assert reply.status != 405, (method, path)


def _message(path: str, reply: Any) -> str:
    """An error's message; E2B's routes answer in E2B's shape (its SDK parses ``{"code", "message"}``)."""
    if path.startswith("/e2b"):
        body = reply.json()
        return str(body.get("message", body))
    return error_of(reply)["message"]


def test_create_request_schema_is_documented(router: RouterProcess) -> None:
    spec = router.http("GET", "/v1/openapi.json", auth=False).json()
    schema = spec["paths"]["/v1/sandboxes"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert schema["additionalProperties"] is False
    props = schema["properties"]
    for name in ("image", "cpu", "memory_mb", "pids_max", "env", "workdir", "network", "ttl_s", "idle_timeout_s",
                 "heartbeat_timeout_s", "metadata", "wait", "request_id"):
        assert props[name]["description"], name
    assert props["network"]["properties"]["egress"]["enum"] == ["deny", "allow"]


@pytest.mark.parametrize("headers", [
    {},
    {"Authorization": "Bearer wrong-key"},
    {"Authorization": "Basic dXNlcjpwYXNz"},
    {"Authorization": "Bearer "},
], ids=["none", "wrong", "basic", "empty"])
def test_every_non_public_route_needs_the_key(router: RouterProcess, headers: dict[str, str]) -> None:
    routes = _spec_routes(router)
    assert any(not public for _, _, public in routes)
    for method, path, public in routes:
        reply = router.http(method, _concrete(path), json_body={} if method in ("POST", "PUT") else None,
                            headers=headers, auth=False)
        if public:
            assert reply.status == 200, (method, path, reply.status)
        else:
            assert reply.status == 401, (method, path, reply.status, reply.body[:200])
            if path.startswith("/e2b"):
                assert reply.json() == {"code": 401, "message": reply.json()["message"]}
            else:
                assert error_of(reply)["code"] == "unauthorized"
    # Unknown paths too: nothing is learned without a key.
    assert router.http("GET", "/v1/nope", headers=headers, auth=False).status == 401


def test_public_routes_and_the_sdk_with_a_bad_key(router: RouterProcess) -> None:
    assert router.http("GET", "/healthz", auth=False).status == 200
    assert router.http("GET", "/v1/openapi.json", auth=False).status == 200
    with router.client(key="not-the-key") as bad, pytest.raises(Unauthorized, match="not valid"):
        bad.list()
    reply = router.http("GET", "/v1/sandboxes", headers={"Authorization": f"bearer {router.key}"}, auth=False)
    assert reply.status == 200  # the scheme is case-insensitive


def _create(router: RouterProcess, body: Any) -> tuple[int, dict[str, str]]:
    reply = router.http("POST", "/v1/sandboxes", json_body=body)
    return reply.status, error_of(reply)


@pytest.mark.parametrize(("body", "status", "needle"), [
    ({"cpu": "lots"}, 400, "cpu"),
    ({"memory_mb": 1.5}, 400, "memory_mb"),
    ({"memory_mb": 1}, 422, "memory_mb"),
    ({"pids_max": True}, 400, "pids_max"),
    ({"ttl_s": -5}, 422, "ttl_s"),
    ({"idle_timeout_s": 0}, 422, "idle_timeout_s"),
    ({"heartbeat_timeout_s": -1}, 422, "heartbeat_timeout_s"),
    ({"env": ["A=1"]}, 400, "env"),
    ({"env": {"A": 1}}, 400, "env"),
    ({"wait": "yes"}, 400, "wait"),
    ({"network": {"egress": "maybe"}}, 422, "network.egress"),
    ({"network": {"egress": "deny", "extra": 1}}, 400, "extra"),
    ({"metadata": {"labels": {"k": 5}}}, 400, "labels"),
    ({"metadata": {"owner": "x"}}, 400, "owner"),
    ({"bogus": 1, "other": 2}, 400, "bogus"),
    ({"workdir": "relative/dir"}, 422, "workdir"),
    ({"image": 7}, 400, "image"),
    ({"request_id": "x" * 500}, 422, "request_id"),
    ([1, 2], 400, "object"),
])
def test_bad_create_bodies(router: RouterProcess, body: Any, status: int, needle: str) -> None:
    got_status, err = _create(router, body)
    assert got_status == status, err
    assert needle in err["message"], err
    assert err["code"] == {400: "bad_request", 422: "invalid"}[status]


def test_malformed_egress_allow_entry_is_refused_by_name(router: RouterProcess) -> None:
    """On every backend, at create, before anything is made (tests/security/test_egress.py has more)."""
    status, err = _create(router, {"network": {"egress": "allow", "allow": ["10.0.0.0/8", "10.0.0.0/8:99999"]}})
    assert status == 422 and err["code"] == "invalid", err
    assert "'10.0.0.0/8:99999'" in err["message"], err


def test_bad_encodings_and_sizes(router: RouterProcess) -> None:
    reply = router.http("POST", "/v1/sandboxes", b"{not json", headers={"Content-Type": "application/json"})
    assert reply.status == 400 and "JSON" in error_of(reply)["message"]
    reply = router.http("POST", "/v1/sandboxes", b"\xc1", headers={"Content-Type": MSGPACK})
    assert reply.status == 400 and "msgpack" in error_of(reply)["message"]
    big = b'{"env": {"A": "' + b"x" * (17 * 1024 * 1024) + b'"}}'
    reply = router.http("POST", "/v1/sandboxes", big, headers={"Content-Type": "application/json"})
    assert reply.status == 413 and error_of(reply)["code"] == "too_large"
    # Errors follow Accept: msgpack in, msgpack out.
    reply = router.http("POST", "/v1/sandboxes", msgpack_body={"cpu": "x"}, headers={"Accept": MSGPACK})
    assert reply.status == 400 and reply.headers["Content-Type"].startswith(MSGPACK)
    assert set(msgpack.unpackb(reply.body, raw=False)["error"]) == {"code", "message"}
    assert router.http("GET", "/v1/sandboxes").json()["sandboxes"] == []  # nothing was made


def test_unknown_endpoints_and_methods(router: RouterProcess) -> None:
    reply = router.http("GET", "/v1/nothing-here")
    assert reply.status == 404 and "no such endpoint" in error_of(reply)["message"]
    reply = router.http("PATCH", "/v1/sandboxes")
    assert reply.status == 405 and error_of(reply)["code"] == "method_not_allowed"
    reply = router.http("PUT", f"/v1/sandboxes/{SOME_ID}")
    assert reply.status == 405


def test_a_bad_request_leaves_other_sandboxes_alone(router: RouterProcess) -> None:
    with router.client() as client, client.create(heartbeat=False) as sb:
        for body in ({"command": None}, {"command": "x", "env": "y"}, {"command": ["a", 1]}):
            reply = router.http("POST", f"/v1/sandboxes/{sb.id}/exec", json_body=body)
            assert reply.status == 400, reply.body
        assert router.http("GET", f"/v1/sandboxes/{sb.id}/files?path=../../etc").status in (400, 403, 404)
        assert sb.exec("echo fine").stdout == b"fine\n"
        assert sb.status()["status"] == "ready"
