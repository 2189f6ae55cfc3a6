"""A server in an E2B sandbox reached as E2B's SDK reaches it: by the host ``sandbox.get_host(port)`` names (on
grove's host-named listener), and on ``E2B_SANDBOX_URL`` with ``E2b-Sandbox-Port`` (grove's port proxy); HTTP
and WebSocket, with E2B's tokens, which never reach the sandbox."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import aiohttp
import httpx
import pytest
from e2b import Sandbox

from tests.ports.test_port_proxy import LocalhostNames
from tests.support.router_fixtures import RouterProcess
from tests.support.sandbox_servers import AIOHTTP_SERVER, drop_libs_dirs, start_server

PORT = 8000
CREDENTIALS = ("authorization", "x-access-token", "e2b-traffic-access-token")


@pytest.fixture
def served(router: RouterProcess, e2b_env: None) -> Iterator[Sandbox]:
    """An E2B sandbox with the aiohttp server listening on PORT."""
    sbx = Sandbox.create("base", timeout=300)
    with router.client() as client:
        start_server(client.attach(sbx.sandbox_id), AIOHTTP_SERVER, PORT, ("aiohttp",))
    yield sbx
    drop_libs_dirs()


def sandbox_headers(sbx: Sandbox, port: int = PORT) -> dict[str, str]:
    """The headers E2B's SDK sends to ``E2B_SANDBOX_URL`` for a port (the code interpreter's, for one)."""
    return {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": str(port),
            "X-Access-Token": str(sbx._envd_access_token)}


def no_credentials(seen: dict[str, Any]) -> bool:
    return not {name.lower() for name in seen["headers"]} & set(CREDENTIALS)


def test_get_host_names_the_port_on_the_host_named_listener(router: RouterProcess, served: Sandbox) -> None:
    host = served.get_host(PORT)
    assert host.startswith(f"{PORT}-{served.sandbox_id}.localhost:")
    token = {"E2B-Traffic-Access-Token": str(served.traffic_access_token)}

    async def go() -> tuple[tuple[int, Any], tuple[int, Any], tuple[str, bytes], int]:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(resolver=LocalhostNames())) as http:
            async with http.get(f"http://{host}/hello/page?x=1", headers=token) as resp:
                page = resp.status, await resp.json()
            async with http.post(f"http://{host}/hello/form", headers={"X-Access-Token": router.key},
                                 data=b"body") as resp:
                posted = resp.status, await resp.json()
            async with http.ws_connect(f"http://{host}/ws", headers=token, protocols=("echo",)) as ws:
                await ws.send_str("through get_host")
                text = await ws.receive_str(timeout=30)
                await ws.send_bytes(b"\x01" * 70_000)
                echoed = text, await ws.receive_bytes(timeout=30)
            async with http.get(f"http://{host}/hello/anonymous") as resp:
                anonymous = resp.status
            return page, posted, echoed, anonymous

    page, posted, echoed, anonymous = asyncio.run(go())
    assert page[0] == 200, page
    assert page[1]["path"] == "/hello/page?x=1" and page[1]["host"] == host and no_credentials(page[1])
    assert posted[0] == 200 and posted[1]["method"] == "POST" and no_credentials(posted[1])
    assert echoed == ("through get_host", b"\x01" * 70_000)
    assert anonymous == 401  # a port of grove's is never open to anyone without the key


def test_the_port_header_on_the_sandbox_url_reaches_the_port(router: RouterProcess, served: Sandbox) -> None:
    sandbox_url = f"{router.url}/e2b/sandbox"
    with httpx.Client(timeout=60) as http:
        got = http.get(f"{sandbox_url}/hello/a%20b?y=2", headers=sandbox_headers(served))
        assert got.status_code == 200, got.text
        seen = got.json()
        assert seen["path"] == "/hello/a%20b?y=2" and seen["host"] == f"127.0.0.1:{PORT}" and no_credentials(seen)
        # Paths envd serves itself go to the named port too: /health, /files, /{service}/{method}.
        for method, path in (("GET", "/health"), ("POST", "/files"), ("POST", "/process.Process/List")):
            shadowed = http.request(method, f"{sandbox_url}{path}", headers=sandbox_headers(served), content=b"{}")
            assert shadowed.status_code == 404 and "Not Found" in shadowed.text, shadowed.text  # aiohttp's 404
        traffic = http.post(f"{sandbox_url}/hello/traffic", headers={
            "E2b-Sandbox-Id": served.sandbox_id, "E2b-Sandbox-Port": str(PORT),
            "E2B-Traffic-Access-Token": str(served.traffic_access_token)})
        assert traffic.status_code == 200 and no_credentials(traffic.json())

    async def ws() -> tuple[str | None, str]:
        async with aiohttp.ClientSession() as http, \
                http.ws_connect(f"{sandbox_url}/ws", headers=sandbox_headers(served), protocols=("echo",)) as sock:
            await sock.send_str("through the port header")
            return sock.protocol, await sock.receive_str(timeout=30)

    assert asyncio.run(ws()) == ("echo", "through the port header")
    # envd's own port is still envd (grove's E2B layer).
    assert served.commands.run("echo envd").stdout == "envd\n"


def test_bad_port_requests_answer_e2b_errors(router: RouterProcess, served: Sandbox) -> None:
    headers = sandbox_headers(served)
    wrong_key = router.http("GET", "/e2b/sandbox/hello", auth=False, headers={**headers, "X-Access-Token": "gk-no"})
    assert wrong_key.status == 401 and set(wrong_key.json()) == {"code", "message"}
    no_key = router.http("POST", "/e2b/sandbox/execute", auth=False,
                         headers={k: v for k, v in headers.items() if k != "X-Access-Token"})
    assert no_key.status == 401
    bad_port = router.http("GET", "/e2b/sandbox/hello", auth=False, headers={**headers, "E2b-Sandbox-Port": "http"})
    assert bad_port.status == 400 and "port 'http'" in bad_port.json()["message"]
    no_port = router.http("GET", "/e2b/sandbox/hello", auth=False,
                          headers={k: v for k, v in headers.items() if k != "E2b-Sandbox-Port"})
    assert no_port.status == 404 and "E2b-Sandbox-Port" in no_port.json()["message"]
    unknown = router.http("GET", "/e2b/sandbox/hello", auth=False, headers={**headers, "E2b-Sandbox-Id": "sb-0000"})
    assert unknown.status == 404 and "sb-0000" in unknown.json()["message"]
    closed = router.http("GET", "/e2b/sandbox/hello", auth=False, headers={**headers, "E2b-Sandbox-Port": "8001"})
    assert closed.status == 502 and "8001" in closed.json()["message"]
    assert served.commands.run("echo fine").stdout == "fine\n"  # nothing else disturbed
