"""The port proxy and the terminal on the Knative backend: router → the revision's Service → queue-proxy (or the
activator for a sandbox at zero) → executor, the stand-in's hops passing upgrades as Knative's do
(:mod:`tests.support.knative_upgrades`), with real aiohttp clients and a real aiohttp server in the pod."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from grove.client import Sandbox
from tests.conftest import free_tcp_port
from tests.ports.test_pty import _read_until
from tests.support.knative_fixtures import Cluster
from tests.support.router_fixtures import RouterProcess
from tests.support.sandbox_servers import AIOHTTP_SERVER, drop_libs_dirs, start_server

HOME = "srv"
"""Where the server's files go: the stand-in's pods run commands on the host's root, so exec and the file API
agree only on paths relative to the workdir."""


@dataclass
class Served:
    """The module's sandbox and its server."""

    sandbox: Sandbox
    port: int
    pid: int = 0

    def start(self) -> None:
        self.pid = start_server(self.sandbox, AIOHTTP_SERVER, self.port, ("aiohttp",), home=HOME)

    def stop(self) -> None:
        """End the server, as a pod's end would end it: the stand-in's pods share the host, where a process in a
        session of its own outlives the executor."""
        if self.pid:
            self.sandbox.exec(f"kill {self.pid}; while kill -0 {self.pid} 2>/dev/null; do sleep 0.05; done")
            self.pid = 0


@pytest.fixture(scope="module")
def served(module_knative_router: RouterProcess) -> Iterator[Served]:
    """A sandbox with the aiohttp server listening (the stand-in's pods share the host's loopback: a free port)."""
    with module_knative_router.client() as grove:
        found = Served(grove.create("python:3.11-slim", heartbeat=False), free_tcp_port())
        try:
            found.start()
            yield found
        finally:
            found.stop()
            found.sandbox.close()
            drop_libs_dirs()


def _base(router: RouterProcess, sandbox_id: str, port: int) -> str:
    return f"{router.url}/v1/sandboxes/{sandbox_id}/ports/{port}"


async def _hello_and_echo(router: RouterProcess, sandbox_id: str, port: int) -> tuple[int, dict[str, Any], str]:
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {router.key}"}) as http:
        async with http.get(f"{_base(router, sandbox_id, port)}/hello/there?x=1") as resp:
            status, body = resp.status, await resp.json()
        async with http.ws_connect(f"{_base(router, sandbox_id, port)}/ws", protocols=("echo",)) as ws:
            await ws.send_str("through knative")
            echoed = await ws.receive_str(timeout=30)
    return status, body, echoed


def test_http_and_a_websocket_reach_the_pods_server_through_queue_proxy(
        module_knative_router: RouterProcess, module_cluster: Cluster, served: Served) -> None:
    sandbox, port = served.sandbox, served.port
    before = module_cluster.knative.hops["queue-proxy-upgrade"]
    status, body, echoed = asyncio.run(_hello_and_echo(module_knative_router, sandbox.id, port))
    assert status == 200 and body["path"] == "/hello/there?x=1" and body["method"] == "GET"
    assert "Authorization" not in body["headers"]
    assert echoed == "through knative"
    # The tunnels went through queue-proxy's upgrade path (not a plain-HTTP request of its).
    assert module_cluster.knative.hops["queue-proxy-upgrade"] > before


def test_proxy_traffic_wakes_a_sandbox_at_zero_through_the_activator(
        module_knative_router: RouterProcess, module_cluster: Cluster, served: Served) -> None:
    """At zero the pod and its server are gone; the proxied request wakes the sandbox (through the activator,
    which passes the tunnel's upgrade on once the pod is up); the server the test starts again answers."""
    sandbox, port = served.sandbox, served.port
    ks = module_cluster.knative.services[sandbox.id]
    served.stop()
    module_cluster.knative.scale_to_zero(sandbox.id)
    assert ks.pod is None
    activations = module_cluster.knative.hops["activator-upgrade"]
    reply = module_knative_router.http("GET", f"/v1/sandboxes/{sandbox.id}/ports/{port}/hello")
    # The request that woke the pod finds nothing listening yet (servers are the user's to start): a clear 502.
    assert reply.status == 502 and f"nothing listens on port {port}" in reply.json()["error"]["message"]
    assert ks.pod is not None and ks.starts == 2
    assert module_cluster.knative.hops["activator-upgrade"] > activations
    served.start()
    status, body, echoed = asyncio.run(_hello_and_echo(module_knative_router, sandbox.id, port))
    assert status == 200 and body["path"] == "/hello/there?x=1" and echoed == "through knative"


def test_a_terminal_through_queue_proxy(module_knative_router: RouterProcess, served: Served) -> None:
    sandbox = served.sandbox

    async def go() -> tuple[bytes, dict[str, Any]]:
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {module_knative_router.key}"}) as http, \
                http.ws_connect(f"{module_knative_router.url}/v1/sandboxes/{sandbox.id}/pty") as ws:
            await ws.send_bytes(b"echo sum=$((40+2)); exit 4\n")
            seen = await _read_until(ws, b"sum=42")
            while True:
                message = await ws.receive(timeout=30)
                if message.type == aiohttp.WSMsgType.TEXT:
                    return seen, message.json()

    seen, end = asyncio.run(go())
    assert b"sum=42" in seen and end == {"type": "exit", "exit_code": 4}


def test_a_terminal_outlives_the_revision_timeout(module_knative_router: RouterProcess,
                                                  module_cluster: Cluster) -> None:
    """Every hop ends an upgraded connection at the revision's timeout (2 s here): the router resumes the
    executor's session, the output the shell wrote meanwhile is replayed, and the client's WebSocket never
    notices; the shell is the same one throughout."""
    with module_knative_router.client() as grove:
        sandbox = grove.create("python:3.11-slim", heartbeat=False)
        try:
            spec = module_cluster.knative.services[sandbox.id].obj["spec"]["template"]["spec"]
            spec.update(timeoutSeconds=2, responseStartTimeoutSeconds=2, idleTimeoutSeconds=2)
            cuts = module_cluster.knative.timeouts

            async def go() -> tuple[bytes, dict[str, Any]]:
                key = {"Authorization": f"Bearer {module_knative_router.key}"}
                async with aiohttp.ClientSession(headers=key) as http, \
                        http.ws_connect(f"{module_knative_router.url}/v1/sandboxes/{sandbox.id}/pty") as ws:
                    await ws.send_bytes(b"echo first=$$; sleep 3; echo during=$((20+1)); sleep 2\n")
                    seen = await _read_until(ws, b"during=21")  # written while the first connection was gone
                    await ws.send_bytes(b"echo last=$$; exit 6\n")
                    while True:
                        message = await ws.receive(timeout=30)
                        if message.type == aiohttp.WSMsgType.TEXT:
                            return seen, message.json()
                        seen += message.data

            seen, end = asyncio.run(go())
            assert end == {"type": "exit", "exit_code": 6}
            text = seen.decode(errors="replace")
            pids = [line.split("=", 1)[1].strip() for line in text.splitlines()
                    if line.startswith(("first=", "last="))]
            assert len(pids) == 2 and pids[0] == pids[1], text  # one shell, across connections
            assert module_cluster.knative.timeouts >= cuts + 2  # cut twice at least: 5 s of session, 2 s a connection
            steps = module_knative_router.http("GET", f"/v1/sandboxes/{sandbox.id}/trajectory").json()["steps"]
            resumes = [s for s in steps if s.get("type") == "pty_resume"]
            assert len(resumes) >= 2 and resumes[0]["offset"] > 0
            assert [s for s in steps if s.get("type") == "pty_close"][-1]["exit_code"] == 6
        finally:
            sandbox.close()


def test_a_ports_websocket_ends_at_the_revision_timeout_and_requests_go_on(
        module_knative_router: RouterProcess, module_cluster: Cluster, served: Served) -> None:
    """A WebSocket to the sandbox's own server is that server's protocol, which grove cannot resume: the hops
    end it at the revision's timeout (2 s here) and its client sees it close; HTTP requests after the cut get
    tunnels of their own."""
    sandbox, port = served.sandbox, served.port
    spec = module_cluster.knative.services[sandbox.id].obj["spec"]["template"]["spec"]
    saved = {k: spec[k] for k in ("timeoutSeconds", "responseStartTimeoutSeconds", "idleTimeoutSeconds")}
    spec.update(timeoutSeconds=2, responseStartTimeoutSeconds=2, idleTimeoutSeconds=2)
    cuts = module_cluster.knative.timeouts

    async def go() -> tuple[str, aiohttp.WSMsgType, list[int]]:
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {module_knative_router.key}"}) as http:
            async with http.ws_connect(f"{_base(module_knative_router, sandbox.id, port)}/ws") as ws:
                await ws.send_str("before the cut")
                echoed = await ws.receive_str(timeout=30)
                end = await ws.receive(timeout=30)  # nothing sent: what comes is the close at the cut
            statuses = []
            for _ in range(3):
                async with http.get(f"{_base(module_knative_router, sandbox.id, port)}/hello") as resp:
                    statuses.append(resp.status)
                await asyncio.sleep(1)
        return echoed, end.type, statuses

    try:
        echoed, end, statuses = asyncio.run(go())
    finally:
        spec.update(saved)
    assert echoed == "before the cut"
    assert end in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSING)
    assert module_cluster.knative.timeouts > cuts
    assert statuses == [200, 200, 200]
