"""The port proxy with real clients: aiohttp through the router, through the sandbox's executor, to a real aiohttp
server listening on the sandbox's loopback."""

from __future__ import annotations

import asyncio
import hashlib
import socket
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest
from aiohttp.abc import AbstractResolver, ResolveResult

from grove.client import Sandbox
from tests.support.router_fixtures import RouterProcess, error_of, wait_for
from tests.support.sandbox_servers import AIOHTTP_SERVER, drop_libs_dirs, start_server

PORT = 8000
MB = 1024 * 1024
AIOHTTP = ("aiohttp",)


class LocalhostNames(AbstractResolver):
    """What browsers do: every ``*.localhost`` name is loopback."""

    async def resolve(self, host: str, port: int = 0, family: int = socket.AF_INET) -> list[ResolveResult]:
        assert host.endswith(".localhost"), host
        return [ResolveResult(hostname=host, host="127.0.0.1", port=port, family=socket.AF_INET, proto=0,
                              flags=socket.AI_NUMERICHOST)]

    async def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def served(router: RouterProcess, sandbox: Sandbox) -> Iterator[Sandbox]:
    """The module's sandbox with the aiohttp server listening on PORT."""
    start_server(sandbox, AIOHTTP_SERVER, PORT, AIOHTTP)
    yield sandbox
    drop_libs_dirs()


def base(router: RouterProcess, sandbox_id: str, port: int = PORT) -> str:
    return f"{router.url}/v1/sandboxes/{sandbox_id}/ports/{port}"


def auth(router: RouterProcess, key: str | None = None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key or router.key}"}


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_an_http_server_in_the_sandbox_answers_through_the_proxy(router: RouterProcess, served: Sandbox) -> None:
    async def go() -> tuple[int, dict[str, Any], str | None]:
        async with aiohttp.ClientSession(headers=auth(router)) as http, \
                http.get(f"{base(router, served.id)}/hello/a%20b?x=1&y=2", headers={"X-Custom": "kept"}) as resp:
            return resp.status, await resp.json(), resp.headers.get("Content-Security-Policy")

    status, seen, policy = run(go())
    assert status == 200, seen
    assert policy == "sandbox"  # on the API's origin a page gets an opaque origin of its own
    assert seen["path"] == "/hello/a%20b?x=1&y=2"
    assert seen["host"] == f"127.0.0.1:{PORT}"
    assert seen["headers"]["X-Custom"] == "kept"
    assert "Authorization" not in seen["headers"]  # the API key never reaches the sandbox


def test_100_mb_streamed_both_ways(router: RouterProcess, served: Sandbox) -> None:
    size = 100 * MB
    block = bytes(range(256)) * 256

    async def upload() -> AsyncIterator[bytes]:
        for _ in range(size // len(block)):
            yield block

    async def go() -> tuple[dict[str, Any], str, int]:
        async with aiohttp.ClientSession(headers=auth(router)) as http:
            async with http.post(f"{base(router, served.id)}/sha", data=upload()) as resp:
                assert resp.status == 200, await resp.text()
                up = await resp.json()
            digest, got = hashlib.sha256(), 0
            async with http.get(f"{base(router, served.id)}/stream", params={"bytes": str(size)}) as resp:
                assert resp.status == 200
                async for chunk in resp.content.iter_chunked(MB):
                    digest.update(chunk)
                    got += len(chunk)
            return up, digest.hexdigest(), got

    up, down, got = run(go())
    expected = hashlib.sha256(block * (size // len(block))).hexdigest()
    assert up == {"sha256": expected, "size": size}
    assert (down, got) == (expected, size)


def test_websocket_echo(router: RouterProcess, served: Sandbox) -> None:
    async def go() -> tuple[str | None, str, bytes]:
        async with aiohttp.ClientSession(headers=auth(router)) as http, \
                http.ws_connect(f"{base(router, served.id)}/ws", protocols=("echo",)) as ws:
            await ws.send_str("hello sandbox")
            text = await ws.receive_str(timeout=30)
            await ws.send_bytes(b"\x00\x01" * 50_000)
            data = await ws.receive_bytes(timeout=30)
            return ws.protocol, text, data

    protocol, text, data = run(go())
    assert (protocol, text, data) == ("echo", "hello sandbox", b"\x00\x01" * 50_000)
    record = wait_for(lambda: steps_of(router, served.id, "port_websocket"), 30, what="the WebSocket session's step")
    assert record[-1]["messages_in"] == 2 and record[-1]["bytes_out"] == len("hello sandbox") + 100_000


def steps_of(router: RouterProcess, sandbox_id: str, kind: str) -> list[dict[str, Any]]:
    reply = router.http("GET", f"/v1/sandboxes/{sandbox_id}/trajectory")
    assert reply.status == 200, reply.body[:300]
    return [s for s in reply.json()["steps"] if s.get("type") == kind]


def test_traffic_is_summarized_in_the_trajectory(router: RouterProcess, served: Sandbox) -> None:
    reply = router.http("GET", f"/v1/sandboxes/{served.id}/ports/{PORT}/hello/counted")
    assert reply.status == 200
    summaries = wait_for(lambda: steps_of(router, served.id, "port_traffic"), 30, what="a port_traffic step")
    assert all(s["port"] == PORT for s in summaries)
    assert sum(s["requests"] for s in summaries) >= 1
    assert sum(s["statuses"].get("200", 0) for s in summaries) >= 1
    assert sum(s["bytes_out"] for s in summaries) > 0


def test_a_port_nobody_listens_on_is_a_clear_502(router: RouterProcess, served: Sandbox) -> None:
    reply = router.http("GET", f"/v1/sandboxes/{served.id}/ports/8999/anything", timeout=30)
    assert reply.status == 502
    assert "nothing listens on port 8999" in error_of(reply)["message"]
    bad = router.http("GET", f"/v1/sandboxes/{served.id}/ports/70000/")
    assert bad.status == 400 and "65535" in error_of(bad)["message"]


def test_refused_without_a_key_and_for_another_projects_sandbox(router: RouterProcess, served: Sandbox) -> None:
    path = f"/v1/sandboxes/{served.id}/ports/{PORT}/hello"
    assert router.http("GET", path, auth=False).status == 401
    added = router.cli("key", "add", "outsider", "--project", "other")
    assert added.returncode == 0, added.stderr
    outsider = added.stdout.decode().strip()
    wait_for(lambda: router.http("GET", "/v1/sandboxes", key=outsider).status == 200, 5, what="the new key")
    reply = router.http("GET", path, key=outsider)
    assert reply.status == 404 and served.id in error_of(reply)["message"]
    minted = router.http("POST", f"/v1/sandboxes/{served.id}/ports/{PORT}/url", json_body={}, key=outsider)
    assert minted.status == 404


def test_refused_for_a_deleted_sandbox(router: RouterProcess) -> None:
    with router.client() as client:
        gone = client.create(heartbeat=False)
        gone.close()
    reply = router.http("GET", f"/v1/sandboxes/{gone.id}/ports/{PORT}/hello")
    assert reply.status in (404, 409, 410), reply.body[:300]
    assert gone.id in error_of(reply)["message"]


def test_a_signed_url_works_on_its_own_origin_then_expires(router: RouterProcess, served: Sandbox) -> None:
    minted = router.http("POST", f"/v1/sandboxes/{served.id}/ports/{PORT}/url", json_body={"expires_s": 3})
    assert minted.status == 200, minted.body[:300]
    url = minted.json()["url"]
    assert url.startswith(f"http://{served.id}-{PORT}.localhost:")
    assert f":{router.port}/" not in url  # never the API's (and viewer's) origin
    page = url.replace("/?", "/hello/page?")

    async def visit(target: str) -> tuple[int, Any, list[str]]:
        connector = aiohttp.TCPConnector(resolver=LocalhostNames())
        # A browser: no key, a cookie jar.
        async with aiohttp.ClientSession(connector=connector) as browser, browser.get(target) as resp:
            body = await resp.json() if resp.content_type == "application/json" else await resp.text()
            return resp.status, body, [str(r.url) for r in resp.history]

    status, seen, hops = run(visit(page))
    assert status == 200, seen
    assert len(hops) == 1 and "grove_token" in hops[0]  # the token moved into the host's cookie, out of the URL
    assert seen["path"] == "/hello/page" and seen["host"].startswith(f"{served.id}-{PORT}.localhost")
    assert "grove_port" not in seen["headers"].get("Cookie", "") and "Authorization" not in seen["headers"]
    other_port = url.replace(f"{served.id}-{PORT}.", f"{served.id}-{PORT + 1}.")
    assert run(visit(other_port))[0] == 401  # scoped to its port
    time.sleep(max(0.0, minted.json()["expires_at"] - time.time()) + 0.5)
    status, body, _ = run(visit(page))
    assert status == 401 and "expired" in body["error"]["message"]


def test_a_signed_url_stops_working_when_its_key_is_revoked(router: RouterProcess, served: Sandbox) -> None:
    added = router.cli("key", "add", "short-lived")
    assert added.returncode == 0, added.stderr
    key = added.stdout.decode().strip()
    wait_for(lambda: router.http("GET", "/v1/sandboxes", key=key).status == 200, 5, what="the new key")
    minted = router.http("POST", f"/v1/sandboxes/{served.id}/ports/{PORT}/url", json_body={}, key=key)
    assert minted.status == 200, minted.body[:300]
    page = minted.json()["url"].replace("/?", "/hello/revoked?")

    async def visit() -> tuple[int, Any]:
        connector = aiohttp.TCPConnector(resolver=LocalhostNames())
        async with aiohttp.ClientSession(connector=connector) as browser, \
                browser.get(page, allow_redirects=False) as resp:
            return resp.status, await resp.read()

    assert run(visit())[0] == 303  # accepted: its token moves into a cookie
    revoked = router.cli("key", "revoke", key)
    assert revoked.returncode == 0, revoked.stderr
    _, body = wait_for(lambda: (answer := run(visit()))[0] == 401 and answer, 10, what="the refusal")
    assert b"revoked" in body


def test_an_open_websocket_keeps_the_sandbox_up_and_a_request_wakes_it(router: RouterProcess) -> None:
    with router.client() as client:
        sleepy = client.create(heartbeat=False, idle_timeout_s=2)
        try:
            start_server(sleepy, AIOHTTP_SERVER, PORT, AIOHTTP)

            async def hold() -> tuple[str, str]:
                async with aiohttp.ClientSession(headers=auth(router)) as http, \
                        http.ws_connect(f"{base(router, sleepy.id)}/ws") as ws:
                    await asyncio.sleep(5)  # past the idle timeout, nothing sent: the open connection is activity
                    status = await asyncio.to_thread(lambda: sleepy.status()["status"])
                    await ws.send_str("still here")
                    return status, await ws.receive_str(timeout=30)

            assert run(hold()) == ("ready", "still here")
            wait_for(lambda: sleepy.status()["status"] == "idle", 20, what="scale to zero once the socket closed")
            woken = router.http("GET", f"/v1/sandboxes/{sleepy.id}/ports/{PORT}/hello", timeout=60)
            # The request woke it; its server's process stopped with the scale to zero, so nothing listens.
            assert woken.status == 502 and f"port {PORT}" in error_of(woken)["message"]
            assert sleepy.status()["status"] == "ready"
        finally:
            sleepy.close()


def test_more_open_websockets_than_executor_threads_starve_no_exec(router: RouterProcess, served: Sandbox) -> None:
    # The executor's gthread pool has 32 threads; the relay thread, not the pool, holds upgraded connections.
    async def go() -> tuple[bytes, list[str]]:
        async with aiohttp.ClientSession(headers=auth(router)) as http:
            sockets = [await http.ws_connect(f"{base(router, served.id)}/ws") for _ in range(40)]
            try:
                ran = await asyncio.wait_for(asyncio.to_thread(lambda: served.exec("echo ok").stdout), 60)
                for i, ws in enumerate(sockets):
                    await ws.send_str(f"n{i}")
                return ran, [await ws.receive_str(timeout=30) for ws in sockets]
            finally:
                for ws in sockets:
                    await ws.close()

    ran, echoed = run(go())
    assert ran == b"ok\n"
    assert echoed == [f"n{i}" for i in range(40)]


def test_a_signed_url_opens_a_websocket_on_the_host_named_listener(router: RouterProcess, served: Sandbox) -> None:
    url = served.port_url(PORT, expires_s=60)
    socket_url = url.replace("http://", "ws://").replace("/?", "/ws?")

    async def go() -> str:
        connector = aiohttp.TCPConnector(resolver=LocalhostNames())
        async with aiohttp.ClientSession(connector=connector) as browser, browser.ws_connect(socket_url) as ws:
            await ws.send_str("over the host-named listener")
            return await ws.receive_str(timeout=30)

    assert run(go()) == "over the host-named listener"
