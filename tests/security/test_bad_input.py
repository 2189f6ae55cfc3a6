"""Targeted bad input on a real router: each is a 4xx naming the problem, never a 5xx, never a hang."""

from __future__ import annotations

import gzip
import io
import tarfile

import pytest

from grove.client import Sandbox
from tests.support.router_fixtures import RouterProcess, error_of


@pytest.fixture(scope="module")
def sb(sandbox: Sandbox) -> Sandbox:
    """One sandbox the bad requests are aimed at (it must outlive them all)."""
    return sandbox


def _4xx(reply_status: int, body: bytes) -> None:
    assert 400 <= reply_status < 500, (reply_status, body[:300])


def test_nul_and_non_utf8_in_paths_and_argv(router: RouterProcess, sb: Sandbox) -> None:
    for path in ("/tmp/a%00b", "/tmp/%00", "/" + "a" * 3000):
        for method in ("GET", "PUT", "DELETE"):
            reply = router.http(method, f"/v1/sandboxes/{sb.id}/files?path={path}", b"x" if method == "PUT" else None)
            _4xx(reply.status, reply.body)
            assert error_of(reply)["message"]
    # A request line beyond aiohttp's limit is refused by its parser, before any handler (so in its own
    # plain-text shape): still a 4xx naming the problem.
    reply = router.http("GET", f"/v1/sandboxes/{sb.id}/files?path=/{'a' * 5000}")
    assert reply.status == 414 and b"too large" in reply.body
    # Non-UTF-8 escapes in a path are decoded as U+FFFD (aiohttp and werkzeug both): never a 5xx.
    reply = router.http("GET", f"/v1/sandboxes/{sb.id}/files?path=/tmp/%ff%fe")
    assert reply.status == 404, reply.body
    for command in (["echo", "a\0b"], "echo a\0b", ["\0"], []):
        reply = router.http("POST", f"/v1/sandboxes/{sb.id}/exec", json_body={"command": command})
        _4xx(reply.status, reply.body)
    # Non-UTF-8 argv is fine as msgpack bytes? Either it runs, or it is refused with a 4xx.
    reply = router.http("POST", f"/v1/sandboxes/{sb.id}/exec", msgpack_body={"command": ["echo", b"\xff\xfe"]})
    assert reply.status < 500, reply.body


@pytest.mark.parametrize("body", [
    {"command": "true", "timeout_s": -1},
    {"command": "true", "timeout_s": 1e308},
    {"command": "true", "timeout_s": float("inf")},
    {"command": "true", "timeout_s": "NaN"},
    {"command": "true", "env": {"A\0": "1"}},
    {"command": "true", "env": {"": "1"}},
    {"command": "true", "cwd": "relative"},
    {"command": "true", "max_output_bytes": -5},
])
def test_absurd_exec_options(router: RouterProcess, sb: Sandbox, body: dict[str, object]) -> None:
    reply = router.http("POST", f"/v1/sandboxes/{sb.id}/exec", json_body=body, timeout=30)
    assert reply.status < 500, (body, reply.status, reply.body[:300])


@pytest.mark.parametrize("body", [
    {"memory_mb": 10**12}, {"cpu": 1e9}, {"pids_max": 2**63}, {"cpu": -1}, {"ttl_s": 1e308},
    {"memory_mb": 0}, {"pids_max": 0}, {"workdir": "/\0"}, {"env": {"A=B": "1"}}, {"image": "../../etc"},
])
def test_absurd_create_options(router: RouterProcess, body: dict[str, object]) -> None:
    before = router.live_ids()
    reply = router.http("POST", "/v1/sandboxes", json_body=body, timeout=60)
    assert reply.status < 500, (body, reply.status, reply.body[:300])
    if reply.status == 201:
        router.http("DELETE", f"/v1/sandboxes/{reply.json()['id']}")
    else:
        assert error_of(reply)["message"] and router.live_ids() == before


@pytest.mark.parametrize("sandbox_id", ["x", "sb-", "sb-" + "0" * 200, "sb-ZZZZZZZZZZZZZZZZ", "..", "%00", "sb-%2e%2e"])
def test_malformed_ids(router: RouterProcess, sandbox_id: str) -> None:
    for method, suffix in (("GET", ""), ("DELETE", ""), ("POST", "/exec"), ("GET", "/files?path=/")):
        reply = router.http(method, f"/v1/sandboxes/{sandbox_id}{suffix}", json_body={"command": "true"}
                            if method == "POST" else None)
        assert reply.status in (400, 404), (sandbox_id, method, reply.status, reply.body[:200])


def test_huge_headers_and_bodies(router: RouterProcess, sb: Sandbox) -> None:
    reply = router.http("GET", "/v1/sandboxes", headers={"X-Big": "x" * 200_000})
    assert reply.status in (400, 431), reply.status
    reply = router.http("GET", "/v1/sandboxes", headers={f"X-H{i}": "v" for i in range(500)})
    assert reply.status in (200, 400, 431), reply.status
    reply = router.http("POST", f"/v1/sandboxes/{sb.id}/events", b"{" + b" " * (17 * 1024 * 1024) + b"}",
                        headers={"Content-Type": "application/json"})
    assert reply.status == 413, reply.status
    assert sb.exec("echo fine").stdout == b"fine\n"


def _bomb_header(size: int) -> bytes:
    info = tarfile.TarInfo("big")
    info.size = size
    return info.tobuf(tarfile.PAX_FORMAT) + b"\0" * 4096  # the data never comes


def test_archive_bombs(router: RouterProcess, sb: Sandbox) -> None:
    for body in (_bomb_header(9 << 30), gzip.compress(_bomb_header(9 << 30))):
        reply = router.http("PUT", f"/v1/sandboxes/{sb.id}/archive?path=/tmp/bomb", body,
                            headers={"Content-Type": "application/x-tar"}, timeout=30)
        assert reply.status == 413 and "expands beyond" in error_of(reply)["message"], reply.body
    # A real gzip bomb: 64 MiB of zeros in ~64 KiB, extracted inside the sandbox's own memory and disk
    # limits (under the executor's byte limit it is just a big file).
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        info = tarfile.TarInfo("zeros")
        info.size = 64 << 20
        tar.addfile(info, io.BytesIO(bytes(info.size)))
    assert len(out.getvalue()) < 200_000
    reply = router.http("PUT", f"/v1/sandboxes/{sb.id}/archive?path=/tmp/bomb", out.getvalue(),
                        headers={"Content-Type": "application/x-tar"}, timeout=60)
    assert reply.status == 201, reply.body
    sb.exec("rm -rf /tmp/bomb")
    assert sb.exec("echo fine").stdout == b"fine\n"
