"""The sandbox side at ``/e2b/sandbox``: envd's Connect-RPC services (``/{service}/{method}``) and its plain
``/files`` and ``/health`` routes. The SDK names the sandbox in ``E2b-Sandbox-Id`` and authenticates with the
envd access token create handed it (the caller's grove key) in ``X-Access-Token``; a sandbox of another
project is unknown here, as everywhere.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from grove.core.errors import GroveError, NotFound
from router.api.appkeys import service_of
from router.api.compat.calls import SandboxCalls
from router.api.compat.e2b import filesystem, process
from router.api.compat.e2b.control import live_sandbox
from router.api.compat.e2b.wire import (
    STREAM_TYPE,
    ConnectError,
    connect_error_body,
    connect_status,
    end_stream,
    message,
    unenvelope,
)
from router.api.datapath import read_capped
from router.records.registry import SAFE_ID_RE

Unary = Callable[[SandboxCalls, dict[str, Any]], Awaitable[dict[str, Any]]]
MAX_MESSAGE = 64 * 1024 * 1024

UNARY: dict[str, Unary] = {
    "process.Process/List": process.list_processes,
    "process.Process/SendSignal": process.send_signal,
    "process.Process/SendInput": process.send_input,
    "process.Process/CloseStdin": process.close_stdin,
    "filesystem.Filesystem/Stat": filesystem.stat_entry,
    "filesystem.Filesystem/ListDir": filesystem.list_dir,
    "filesystem.Filesystem/MakeDir": filesystem.make_dir,
    "filesystem.Filesystem/Move": filesystem.move,
    "filesystem.Filesystem/Remove": filesystem.remove,
}
STREAMING = {"process.Process/Start": "Start", "process.Process/Connect": "Connect"}


def sandbox_calls(request: web.Request) -> SandboxCalls:
    """Calls on the sandbox ``E2b-Sandbox-Id`` names (the caller's project's, live)."""
    sandbox_id = request.headers.get("E2b-Sandbox-Id", "")
    if not SAFE_ID_RE.fullmatch(sandbox_id):
        raise NotFound(f"sandbox {sandbox_id[:80]!r} not found (E2b-Sandbox-Id must name a grove sandbox)")
    return SandboxCalls(service_of(request), live_sandbox(request, sandbox_id), "e2b")


async def rpc(request: web.Request) -> web.StreamResponse:
    """``POST /e2b/sandbox/{service}/{method}``: one Connect call, unary or server-streaming."""
    name = f"{request.match_info['service']}/{request.match_info['method']}"
    streaming = request.content_type == STREAM_TYPE
    try:
        raw = await read_capped(request, MAX_MESSAGE, "Connect message")
        body = unenvelope(raw) if streaming else message(raw)
        calls = sandbox_calls(request)
        if name in STREAMING and streaming:
            return await process.stream(request, calls, STREAMING[name], body)
        handler = UNARY.get(name) if not streaming else None
        if handler is None:
            raise ConnectError("unimplemented", f"{name} is not supported by grove's E2B endpoint")
        return web.json_response(await handler(calls, body))
    except GroveError as err:
        if streaming:
            return web.Response(body=end_stream(err), content_type=STREAM_TYPE)
        return web.json_response(connect_error_body(err), status=connect_status(err))


async def health(request: web.Request) -> web.Response:
    """``GET /e2b/sandbox/health``: the sandbox is there (envd answers 204)."""
    sandbox_calls(request)
    return web.Response(status=204)


async def files(request: web.Request) -> web.StreamResponse:
    """``GET``/``POST /e2b/sandbox/files``."""
    calls = sandbox_calls(request)
    if request.method == "GET":
        return await filesystem.read_file(request, calls)
    return await filesystem.write_files(request, calls)
