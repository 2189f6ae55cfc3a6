"""Publishing a stdio MCP server: its command started in the sandbox, its stdio bridged to streamable HTTP.

``PUT /v1/sandboxes/{id}/mcp/{name}`` with ``{"command", "cwd"?, "env"?}`` starts the command as a background
process whose stdin and stdout are pipes (a ``process`` step, its exit recorded like any other's), attaches the
router to them and serves them at ``/v1/sandboxes/{id}/mcp/{name}`` (:mod:`router.ports.stdio_mcp`). The process
ends when the publication does: removed (``DELETE …/mcp/{name}/publication``), published again under the same
name, or its sandbox deleted or scaled to zero (then the next request is a 502 saying so: publish it again).
"""

from __future__ import annotations

import contextlib

from aiohttp import web

from grove.core.errors import GroveError, NotFound
from router.api.appkeys import service_of
from router.api.computer import call
from router.api.processes import log_tail, start_recorded, without_exits
from router.lifecycle.service import SandboxService
from router.ports.mcp_steps import call_step
from router.ports.models import McpServerRequest
from router.ports.state import McpServer
from router.ports.stdio_mcp import StdioMcp, ToolCall
from router.ports.tunnels import open_upgraded
from router.records.registry import SandboxRecord


async def publish_stdio(request: web.Request, record: SandboxRecord, name: str,
                        body: McpServerRequest) -> McpServer:
    """Start the server's command in the sandbox and bridge its stdio; the publication."""
    service = service_of(request)
    fields = {"command": body.command, "env": body.env, "stdio": True, **({"cwd": body.cwd} if body.cwd else {})}
    answer = without_exits(service, record, await start_recorded(service, record, fields))
    pid = int(answer["pid"])
    try:
        sock = await open_upgraded(await service.endpoint(record), f"/v1/processes/{pid}/stdio", "grove-stdio")
    except BaseException:
        await _end(service, record, pid)
        raise

    def on_call(done: ToolCall) -> None:
        status = 200 if done.answer is not None else 502
        service.recorder.step(record, call_step(name, done.tool, done.arguments, status, done.started, done.answer))

    async def why_exited() -> str:
        return await _why_exited(service, record, pid)

    bridge = StdioMcp(name, pid, sock, on_call, why_exited)
    try:
        await bridge.start()
    except BaseException:
        sock.close()
        await _end(service, record, pid)
        raise
    return McpServer(None, "", bridge)


async def unpublish(request: web.Request, record: SandboxRecord, server: McpServer) -> None:
    """A publication removed or replaced: a stdio server's bridge closed and its process ended."""
    if server.stdio is None:
        return
    await server.stdio.close()
    await _end(service_of(request), record, server.stdio.pid)


async def _end(service: SandboxService, record: SandboxRecord, pid: int) -> None:
    """SIGTERM to a stdio server (one that closed its stdin may be gone already; a sleeping sandbox has none)."""
    if record.status != "ready":
        return
    with contextlib.suppress(GroveError):
        without_exits(service, record, await call(service, record, "POST", f"/v1/processes/{pid}/signal",
                                                  {"signal": "SIGTERM"}))


async def _why_exited(service: SandboxService, record: SandboxRecord, pid: int) -> str:
    """How a stdio server ended, for its 502: its exit code or signal, and the tail of its stderr."""
    endpoint = record.endpoint()
    if record.status != "ready" or endpoint is None:
        return f"its sandbox is {record.status}, and stopping it ended the server"
    try:
        view = await call(service, record, "GET", f"/v1/processes/{pid}", None)
    except NotFound:
        return "its sandbox was restarted, which ended the server"
    except GroveError as exc:
        return f"its state could not be read ({exc.message})"
    without_exits(service, record, view)
    if view.get("status") == "running":
        how = "it closed its stdout (it still runs)"
    else:
        how = f"exit code {view.get('exit_code')}"
    tail = await log_tail(service, record, pid) or b""
    text = tail.decode("utf-8", "replace").strip()
    return f"{how}; its stderr ends: {text}" if text else f"{how}; it wrote nothing to stderr"
