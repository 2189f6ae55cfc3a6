"""MCP: the ``mcp`` package's own server runs in the sandbox (streamable HTTP on a port), the ``mcp`` package's
own client calls its tool through the router, and the call is a step of the trajectory."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from grove.client import Sandbox
from tests.support.router_fixtures import RouterProcess, error_of, wait_for
from tests.support.sandbox_servers import MCP_SERVER, drop_libs_dirs, mcp_session, start_server

PORT = 8765


@pytest.fixture(scope="module")
def mcp_sandbox(router: RouterProcess, sandbox: Sandbox) -> Iterator[Sandbox]:
    start_server(sandbox, MCP_SERVER, PORT, ("mcp",))
    yield sandbox
    drop_libs_dirs()


def test_an_mcp_tool_round_trip_is_recorded(router: RouterProcess, mcp_sandbox: Sandbox) -> None:
    config = mcp_sandbox.mcp_server("notes", PORT)
    assert config["url"] == f"{router.url}/v1/sandboxes/{mcp_sandbox.id}/mcp/notes"
    assert config["transport"] == "streamable_http"

    async def go() -> tuple[list[str], Any]:
        async with mcp_session(config) as session:
            tools = await session.list_tools()
            result = await session.call_tool("add", {"a": 40, "b": 2})
            return [t.name for t in tools.tools], result

    names, result = asyncio.run(go())
    assert names == ["add"]
    assert not result.is_error and [c.text for c in result.content if c.type == "text"] == ["42"]

    def calls() -> list[dict[str, Any]]:
        steps = router.http("GET", f"/v1/sandboxes/{mcp_sandbox.id}/trajectory").json()["steps"]
        return [s for s in steps if s.get("type") == "mcp_call"]

    step = wait_for(calls, 30, what="the tool call's step")[-1]
    assert (step["server"], step["tool"], step["arguments"]) == ("notes", "add", {"a": 40, "b": 2})
    assert step["result"] == "42" and step["is_error"] is False and step["status"] == 200


def test_an_unpublished_name_and_a_bad_port_are_refused(router: RouterProcess, mcp_sandbox: Sandbox) -> None:
    unknown = router.http("POST", f"/v1/sandboxes/{mcp_sandbox.id}/mcp/nobody", json_body={})
    assert unknown.status == 404 and "PUT /v1/sandboxes" in error_of(unknown)["message"]
    bad = router.http("PUT", f"/v1/sandboxes/{mcp_sandbox.id}/mcp/x", json_body={"port": 0})
    assert bad.status in (400, 422), bad.body[:300]
