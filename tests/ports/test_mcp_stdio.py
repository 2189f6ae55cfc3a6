"""stdio MCP servers: the ``mcp`` package's own server runs in the sandbox speaking stdio, grove starts it and
serves it as streamable HTTP, and the ``mcp`` package's own client calls its tools through the router; each
call is a step, a server that exited answers a clear 502, and a removed publication ends its process."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from mcp.shared.exceptions import MCPError

from grove.client import Grove, Sandbox
from tests.support.router_fixtures import RouterProcess, error_of, wait_for
from tests.support.sandbox_servers import STDIO_COMMAND, drop_libs_dirs, install_stdio_server, mcp_session


@pytest.fixture(scope="module")
def with_server(router: RouterProcess, sandbox: Sandbox) -> Iterator[Sandbox]:
    install_stdio_server(sandbox)
    sandbox.exec("mkdir -p /workspace/here")
    yield sandbox
    drop_libs_dirs()


async def _session_calls(config: dict[str, Any], *calls: tuple[str, dict[str, Any]]) -> tuple[list[str], list[Any]]:
    """Initialize a session with the real client, list the tools, and make the calls in order."""
    async with mcp_session(config) as session:
        tools = await session.list_tools()
        results = []
        for tool, arguments in calls:
            try:
                results.append(await session.call_tool(tool, arguments))
            except MCPError as exc:
                results.append(exc)
        return [t.name for t in tools.tools], results


def _mcp_steps(router: RouterProcess, sandbox: Sandbox) -> list[dict[str, Any]]:
    steps = router.http("GET", f"/v1/sandboxes/{sandbox.id}/trajectory").json()["steps"]
    return [s for s in steps if s.get("type") in ("mcp_call", "process")]


def test_a_stdio_tool_round_trip_is_recorded(router: RouterProcess, with_server: Sandbox) -> None:
    config = with_server.mcp_server("files", command=STDIO_COMMAND, cwd="/workspace/here", env={"NOTE": "hi"})
    assert config["url"] == f"{router.url}/v1/sandboxes/{with_server.id}/mcp/files"
    assert config["transport"] == "streamable_http"

    names, [added, where] = asyncio.run(_session_calls(config, ("add", {"a": 40, "b": 2}), ("where", {})))
    assert sorted(names) == ["add", "crash", "where"]
    assert not added.is_error and [c.text for c in added.content if c.type == "text"] == ["42"]
    assert [c.text for c in where.content if c.type == "text"] == ["/workspace/here hi"]

    steps = _mcp_steps(router, with_server)
    calls = [s for s in steps if s["type"] == "mcp_call" and s["server"] == "files"]
    assert [(s["tool"], s["arguments"], s["result"], s["status"], s["is_error"]) for s in calls] == [
        ("add", {"a": 40, "b": 2}, "42", 200, False), ("where", {}, "/workspace/here hi", 200, False)]
    [start] = [s for s in steps if s["type"] == "process" and s["event"] == "start" and
               s["command"] == ["/bin/sh", "-c", STDIO_COMMAND]]
    assert start["cwd"] == "/workspace/here" and start["env_keys"] == ["NOTE"]

    # A second session (a new client) shares the same server process.
    _, [again] = asyncio.run(_session_calls(config, ("add", {"a": 1, "b": 1})))
    assert [c.text for c in again.content if c.type == "text"] == ["2"]


def test_a_stdio_server_that_exited_answers_a_clear_502(router: RouterProcess, with_server: Sandbox) -> None:
    config = with_server.mcp_server("crashy", command=STDIO_COMMAND)
    _, [crashed] = asyncio.run(_session_calls(config, ("crash", {"code": 4})))
    assert isinstance(crashed, MCPError) and "exited before it answered" in str(crashed)

    gone = router.http("POST", f"/v1/sandboxes/{with_server.id}/mcp/crashy",
                       json_body={"jsonrpc": "2.0", "id": 1, "method": "ping"},
                       headers={"Accept": "application/json, text/event-stream"})
    assert gone.status == 502
    message = error_of(gone)["message"]
    assert "'crashy'" in message and "exited" in message and "exit code 4" in message
    assert "boom: asked to crash" in message and "publish it again" in message

    [step] = [s for s in _mcp_steps(router, with_server) if s["type"] == "mcp_call" and s["server"] == "crashy"]
    assert (step["tool"], step["arguments"], step["status"]) == ("crash", {"code": 4}, 502) and "result" not in step
    exits = wait_for(lambda: [s for s in _mcp_steps(router, with_server)
                              if s["type"] == "process" and s["event"] == "exit" and s["exit_code"] == 4], 30,
                     what="the server's exit step")
    assert len(exits) == 1


def test_removing_a_publication_ends_its_process(router: RouterProcess, grove: Grove,
                                                  with_server: Sandbox) -> None:
    before = {p.pid for p in with_server.processes.list()}
    with_server.mcp_server("brief", command=STDIO_COMMAND)
    [proc] = [p for p in with_server.processes.list() if p.pid not in before]
    assert proc.running and proc.command == ["/bin/sh", "-c", STDIO_COMMAND]
    with_server.remove_mcp_server("brief")
    assert not with_server.processes.wait(proc.pid, timeout_s=30).running
    unknown = router.http("POST", f"/v1/sandboxes/{with_server.id}/mcp/brief", json_body={})
    assert unknown.status == 404 and "PUT /v1/sandboxes" in error_of(unknown)["message"]
    again = router.http("DELETE", f"/v1/sandboxes/{with_server.id}/mcp/brief/publication")
    assert again.status == 404


def test_a_publication_names_exactly_one_server(router: RouterProcess, with_server: Sandbox) -> None:
    both = router.http("PUT", f"/v1/sandboxes/{with_server.id}/mcp/x", json_body={"port": 80, "command": "true"})
    neither = router.http("PUT", f"/v1/sandboxes/{with_server.id}/mcp/x", json_body={})
    for answer in (both, neither):
        assert answer.status == 422 and "exactly one of 'port' and 'command'" in error_of(answer)["message"]
    stdio = router.http("POST", f"/v1/sandboxes/{with_server.id}/processes", json_body={"command": "true",
                                                                                         "stdio": True})
    assert stdio.status == 400 and "MCP servers" in error_of(stdio)["message"]



def test_a_stdio_server_ended_by_scale_to_zero_says_so(router: RouterProcess, grove: Grove) -> None:
    sandbox = grove.create(heartbeat=False, idle_timeout_s=2, heartbeat_timeout_s=120)
    try:
        install_stdio_server(sandbox)
        config = sandbox.mcp_server("sleepy", command=STDIO_COMMAND)
        _, [added] = asyncio.run(_session_calls(config, ("add", {"a": 2, "b": 3})))
        assert [c.text for c in added.content if c.type == "text"] == ["5"]
        wait_for(lambda: grove.request("GET", f"/v1/sandboxes/{sandbox.id}")["status"] == "idle", 30,
                 what="the sandbox to go idle")
        [ended] = [s for s in _mcp_steps(router, sandbox) if s["type"] == "process" and s["event"] == "exit"]
        assert ended["signalled"] == "SIGTERM"  # ended by the stop, and recorded before it
        gone = router.http("POST", f"/v1/sandboxes/{sandbox.id}/mcp/sleepy",
                           json_body={"jsonrpc": "2.0", "id": 1, "method": "ping"},
                           headers={"Accept": "application/json, text/event-stream"})
        assert gone.status == 502 and "its sandbox is idle" in error_of(gone)["message"]
        assert grove.request("GET", f"/v1/sandboxes/{sandbox.id}")["status"] == "idle"  # the 502 woke nothing
    finally:
        sandbox.close()
