"""One aiohttp request answered by an ASGI callable (the ``mcp`` package's streamable HTTP transport).

Libraries that adapt whole ASGI apps to aiohttp mount them at a route of their own; grove calls the transport
from inside its own handler instead, after the API key, the sandbox and the publication are checked, so this
adapter is one call: the request (its body already read) in, the ASGI messages out as a streamed response.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web
from starlette.types import ASGIApp, Message

from grove.core.errors import InternalError


async def serve_asgi(request: web.Request, app: ASGIApp, body: bytes) -> web.StreamResponse:
    """Answer ``request`` with ``app`` (an ASGI HTTP callable); the response it streamed."""
    peer = request.transport.get_extra_info("peername") if request.transport else None
    scope: dict[str, Any] = {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
        "method": request.method, "scheme": request.scheme, "path": request.path,
        "raw_path": request.raw_path.split("?", 1)[0].encode(), "query_string": request.query_string.encode(),
        "root_path": "", "headers": [(k.lower(), v) for k, v in request.raw_headers],
        "client": tuple(peer[:2]) if isinstance(peer, tuple) else None, "server": None,
    }
    body_sent = False
    finished = asyncio.Event()
    response: web.StreamResponse | None = None

    async def receive() -> Message:
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await finished.wait()  # nothing more comes: the next message is the end of the exchange
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        nonlocal response
        if finished.is_set():
            return  # the client left (an MCP client stops reading once it holds its answer): nothing to write to
        try:
            await _send(message)
        except ConnectionResetError:
            finished.set()  # the next receive tells the app the client disconnected

    async def _send(message: Message) -> None:
        nonlocal response
        if message["type"] == "http.response.start":
            response = web.StreamResponse(status=message["status"])
            for key, value in message.get("headers", []):
                response.headers.add(key.decode("latin-1"), value.decode("latin-1"))
            await response.prepare(request)
        elif message["type"] == "http.response.body":
            if response is None:
                raise InternalError("the ASGI app sent a body before its response's start")
            await response.write(message.get("body", b""))
            if not message.get("more_body", False):
                await response.write_eof()

    try:
        await app(scope, receive, send)
    finally:
        finished.set()
    if response is None:
        raise InternalError("the ASGI app ended without a response")
    return response
