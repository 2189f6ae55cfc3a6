"""Finding 9 of issue 18: a sandbox id in a route is checked once, on every route, before any handler.

``GET /v1/trajectories/..%2F..%2Fx`` used to decode to a file name and read any ``*.msgpack`` the router
could read. Every id-bearing route now answers 404 naming the malformed id, whatever its shape.
"""

from __future__ import annotations

import msgpack
import pytest

from tests.support.router_fixtures import RouterProcess, error_of

# A trajectory-looking file outside the journals directory: what the traversal used to read.
_PLANTED = {"sandbox": {"id": "planted"}, "secret": "the router must not serve this"}

_SHAPES = [
    "..%2F..%2Fplanted",
    "..%2Fplanted",
    "%2E%2E%2F%2E%2E%2Fplanted",
    "sb-0123456789abcdef%2F..%2F..%2F..%2Fplanted",
    "sb-0123456789ABCDEF",
    "sb-" + "a" * 65,
    "sb-%00123456789abcde",
    "x" * 300,
]

_ROUTES = [
    ("GET", "/v1/trajectories/{}"),
    ("GET", "/v1/sandboxes/{}"),
    ("DELETE", "/v1/sandboxes/{}"),
    ("POST", "/v1/sandboxes/{}/heartbeat"),
    ("POST", "/v1/sandboxes/{}/exec"),
    ("POST", "/v1/sandboxes/{}/commit"),
    ("GET", "/v1/sandboxes/{}/files?path=/"),
    ("PUT", "/v1/sandboxes/{}/files?path=/tmp/x"),
    ("DELETE", "/v1/sandboxes/{}/files?path=/tmp/x"),
    ("GET", "/v1/sandboxes/{}/files/list?path=/"),
    ("GET", "/v1/sandboxes/{}/archive?path=/"),
    ("PUT", "/v1/sandboxes/{}/archive?path=/tmp"),
    ("POST", "/v1/sandboxes/{}/artifacts"),
    ("POST", "/v1/sandboxes/{}/events"),
    ("GET", "/v1/sandboxes/{}/trajectory"),
    ("GET", "/v1/sandboxes/{}/swerex/is_alive"),
    ("POST", "/v1/sandboxes/{}/swerex/execute"),
    ("POST", "/v1/sandboxes/{}/processes"),
    ("GET", "/v1/sandboxes/{}/processes/1/logs"),
]


@pytest.mark.parametrize("shape", _SHAPES)
def test_malformed_ids_are_404_on_every_route(router: RouterProcess, shape: str) -> None:
    for target in (router.state_dir / "planted.msgpack", router.state_dir.parent / "planted.msgpack"):
        target.write_bytes(msgpack.packb(_PLANTED))
    try:
        for method, template in _ROUTES:
            reply = router.http(method, template.format(shape), json_body={} if method in ("POST", "PUT") else None)
            assert reply.status == 404, (method, template, shape, reply.status, reply.body[:300])
            assert b"the router must not serve this" not in reply.body
            assert "not a sandbox id" in error_of(reply)["message"], reply.body[:300]
    finally:
        for target in (router.state_dir / "planted.msgpack", router.state_dir.parent / "planted.msgpack"):
            target.unlink(missing_ok=True)
