"""Answers in the client's encoding: JSON, or msgpack when it accepts it (one function, every handler)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from grove import wire


def reply(request: web.Request, value: Any, status: int = 200) -> web.Response:
    """JSON, or msgpack when the client accepts it."""
    as_msgpack = wire.is_msgpack(request.headers.get("Accept"))
    return web.Response(
        body=wire.encode(value, as_msgpack), status=status, content_type=wire.MSGPACK if as_msgpack else wire.JSON
    )
