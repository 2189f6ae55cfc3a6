"""MCP servers in a sandbox, published to harnesses outside it as streamable HTTP.

``PUT /v1/sandboxes/{id}/mcp/{name}`` with ``{"port", "path"}`` names an MCP server that serves streamable HTTP
inside the sandbox; ``/v1/sandboxes/{id}/mcp/{name}`` then is that server, through the port proxy, for any MCP
client holding the API key. With ``{"command", "cwd"?, "env"?}`` instead it starts a stdio MCP server in the
sandbox and serves that at the same path (:mod:`router.api.mcp_stdio`). Each ``tools/call`` going through is a
step of the trajectory (:mod:`router.ports.mcp_steps`). The names live in the router's memory for the sandbox's
life (a router restart forgets them, and a stdio server's stdin closes with it: publish again).
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

from aiohttp import web

from grove.core.errors import Invalid, NotFound
from router.api.appkeys import sandbox_of, service_of
from router.api.asgi import serve_asgi
from router.api.datapath import read_capped
from router.api.mcp_stdio import publish_stdio, unpublish
from router.api.port_proxy import proxy
from router.api.replies import reply
from router.api.sandboxes import read_model
from router.ports.mcp_steps import call_step
from router.ports.models import McpServerRequest
from router.ports.state import McpServer, ports_of
from router.records.registry import SandboxRecord

NAME_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
MAX_MESSAGE = 16 * 1024 * 1024
"""Largest JSON-RPC request body the router reads (it must read one whole to see which tool it calls)."""
KEPT_ANSWER = 1024 * 1024
"""Most of an answer kept to find the tool's result in; a larger one is relayed whole but not recorded."""


def _servers(request: web.Request) -> dict[str, McpServer]:
    return ports_of(request).mcp.setdefault(request.match_info["id"], {})


async def publish_mcp(request: web.Request) -> web.Response:
    """PUT /v1/sandboxes/{id}/mcp/{name} {"port", "path"?} or {"command", "cwd"?, "env"?} — publish an MCP server
    of the sandbox (one serving HTTP on a port, or a stdio command the router starts)."""
    body = await read_model(request, McpServerRequest)
    record = sandbox_of(request, request.match_info["id"])
    name = request.match_info["name"]
    if not NAME_RE.fullmatch(name):
        raise Invalid(f"an MCP server's name is 1-63 lowercase letters, digits, '-' or '_', starting with a letter "
                      f"or digit; {name[:80]!r} is not")
    published = ports_of(request).mcp
    for gone in set(published) - {r.id for r in service_of(request).registry.live()}:
        del published[gone]  # the names of deleted sandboxes go when the next one is published
    if (old := _servers(request).pop(name, None)) is not None:
        await unpublish(request, record, old)
    url = f"{request.scheme}://{request.host}/v1/sandboxes/{record.id}/mcp/{name}"
    if body.command is not None:
        server = await publish_stdio(request, record, name, body)
        _servers(request)[name] = server
        assert server.stdio is not None
        return reply(request, {"name": name, "url": url, "transport": "streamable_http", "stdio": True,
                               "pid": server.stdio.pid})
    path = body.path if body.path.startswith("/") else "/" + body.path
    _servers(request)[name] = McpServer(body.port, path)
    return reply(request, {"name": name, "url": url, "transport": "streamable_http", "port": body.port,
                           "path": path})


async def unpublish_mcp(request: web.Request) -> web.Response:
    """DELETE /v1/sandboxes/{id}/mcp/{name}/publication — remove a publication (a stdio server's process ends)."""
    record = sandbox_of(request, request.match_info["id"])
    name = request.match_info["name"]
    server = _servers(request).pop(name, None)
    if server is None:
        raise NotFound(f"no MCP server {name!r} is published in {record.id}")
    await unpublish(request, record, server)
    return reply(request, {"name": name, "removed": True})


async def mcp_handler(request: web.Request) -> web.StreamResponse:
    """GET|POST|DELETE /v1/sandboxes/{id}/mcp/{name} — the published server; tool calls recorded."""
    record = sandbox_of(request, request.match_info["id"])
    name = request.match_info["name"]
    server = _servers(request).get(name)
    if server is None:
        raise NotFound(f"no MCP server {name!r} is published in {record.id}: PUT /v1/sandboxes/{record.id}/mcp/"
                       f"{name} with its port or command first")
    if server.stdio is not None:
        body = await read_capped(request, MAX_MESSAGE, "MCP message")
        # A call of the sandbox's like any other (tool calls recorded by the bridge as it sees them).
        with service_of(request).calling(record, request.transport):
            return await serve_asgi(request, server.stdio.handle, body)
    assert server.port is not None
    target = server.path + (f"?{request.query_string}" if request.query_string else "")
    if request.method != "POST":
        return await proxy(request, record, server.port, target, None)
    body = await read_capped(request, MAX_MESSAGE, "MCP message")
    calls = _tool_calls(body)
    answer = bytearray()

    def keep(chunk: bytes) -> None:
        if calls and len(answer) <= KEPT_ANSWER:
            answer.extend(chunk)

    started = time.time()
    status = [502]
    try:
        return await proxy(request, record, server.port, target, None, body=body, tap=keep, on_status=status.append)
    finally:
        # Recorded also when the client left before the answer's end (an MCP client stops reading its POST's
        # event stream once it holds the result): the call ran in the sandbox either way.
        _record_calls(request, record, name, calls, bytes(answer), status[-1], started)


def _record_calls(request: web.Request, record: SandboxRecord, name: str, calls: dict[Any, tuple[str, Any]],
                  answer: bytes, status: int, started: float) -> None:
    results = _results(answer) if len(answer) <= KEPT_ANSWER else {}
    for call_id, (tool, arguments) in calls.items():
        step = call_step(name, tool, arguments, status, started, results.get(call_id))
        service_of(request).recorder.step(record, step)


def _tool_calls(body: bytes) -> dict[Any, tuple[str, Any]]:
    """``{json-rpc id: (tool, arguments)}`` of the ``tools/call`` requests in a message (or a batch)."""
    try:
        message = json.loads(body)
    except ValueError:
        return {}
    calls = {}
    for item in message if isinstance(message, list) else [message]:
        if isinstance(item, dict) and item.get("method") == "tools/call" and isinstance(item.get("params"), dict):
            calls[json.dumps(item.get("id"))] = (str(item["params"].get("name")), item["params"].get("arguments"))
    return calls


def _results(answer: bytes) -> dict[Any, dict[str, Any]]:
    """The response to each answered id, from a JSON answer or a server-sent event stream."""
    text = answer.decode("utf-8", "replace")
    found: dict[Any, dict[str, Any]] = {}
    candidates = [text] + [line[5:].strip() for line in text.splitlines() if line.startswith("data:")]
    for candidate in candidates:
        try:
            message = json.loads(candidate)
        except ValueError:
            continue
        for item in message if isinstance(message, list) else [message]:
            if isinstance(item, dict) and "id" in item:
                found[json.dumps(item["id"])] = item
    return found
