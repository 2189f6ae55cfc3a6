"""Upgraded connections (WebSocket, grove's tunnels) through the stand-in's hops, as Knative passes them.

queue-proxy and the activator proxy with Go's ``httputil.ReverseProxy``, whose ``handleUpgradeResponse`` sends
the request on with its ``Connection: Upgrade`` and ``Upgrade`` headers and, on a ``101``, hijacks the client's
connection (``timeoutWriter.Hijack`` in ``pkg/http/handler/timeout.go`` lets it), writes the backend's head on
it and copies bytes both ways. An answer other than ``101`` is an ordinary response.

The timeout handler around the proxy still runs: nothing of an upgraded connection goes through its writer,
so its last write stays unset. Hence ``timeoutSeconds`` from the request's arrival ends the connection (the
handler returns, the request's context is cancelled, and ``handleUpgradeResponse`` closes the backend on that
cancellation, golang/go#35559), and so do ``responseStartTimeoutSeconds`` and ``idleTimeoutSeconds`` when set,
however busy the connection is: an upgraded connection lives at most the least of the three.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from aiohttp import web
from multidict import CIMultiDict

HEAD_LIMIT = 64 * 1024


def is_upgrade(request: web.Request) -> bool:
    """Whether the request asks to switch protocols (Go's ``upgradeType``: ``Connection`` names ``upgrade``)."""
    tokens = {t.strip().lower() for t in request.headers.get("Connection", "").split(",")}
    return "upgrade" in tokens and bool(request.headers.get("Upgrade"))


class _Feed:
    """What aiohttp's protocol hands an upgraded connection's bytes to (its WebSocket reader's interface)."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer

    def feed_data(self, data: bytes) -> tuple[bool, bytes]:
        if not self.writer.is_closing():
            self.writer.write(data)
        return False, b""

    def feed_eof(self) -> None:
        if not self.writer.is_closing() and self.writer.can_write_eof():
            self.writer.write_eof()


async def pass_upgrade(request: web.Request, base: str, headers: dict[str, str], *,
                       lifetime: float | None = None, began: float | None = None,
                       on_cut: Callable[[], None] | None = None) -> web.StreamResponse:
    """Send the upgrade ``request`` (with ``headers``, hop-by-hop ones already gone) to ``base``; relay a ``101``
    as a raw connection for at most ``lifetime`` seconds from ``began`` (``on_cut`` told when that ends it), or
    any other answer as it is. A backend that cannot be reached is a 502."""
    target = urlsplit(base)
    try:
        reader, writer = await asyncio.open_connection(target.hostname, target.port or 80)
    except OSError as exc:
        return web.Response(status=502, text=f"upstream connect error: {exc}")
    try:
        lines = [f"{request.method} {request.path_qs} HTTP/1.1",
                 *(f"{k}: {v}" for k, v in headers.items()),
                 "Connection: Upgrade", f"Upgrade: {request.headers['Upgrade']}"]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError) as exc:
            return web.Response(status=502, text=f"upstream closed before answering the upgrade: {exc}")
        status, answer = _parse(head)
        if status != 101:
            length = int(answer.get("Content-Length", "0") or 0)
            body = await reader.readexactly(min(length, HEAD_LIMIT))
            for name in ("Content-Length", "Connection", "Transfer-Encoding"):
                answer.popall(name, None)
            return web.Response(status=status, body=body, headers=answer)
        response = web.StreamResponse(status=101, headers=answer)
        response.force_close()
        transport = request.transport
        if transport is None:  # the client left while the backend answered
            return response
        await response.prepare(request)
        request.protocol.set_parser(_Feed(writer))  # type: ignore[arg-type]  # duck-typed like its WebSocketReader
        copy = asyncio.ensure_future(_copy(reader, transport))
        left = None if lifetime is None else max(0.0, lifetime - (time.monotonic() - (began or time.monotonic())))
        done, _ = await asyncio.wait([copy], timeout=left)
        if not done and on_cut is not None and not transport.is_closing():
            on_cut()
        copy.cancel()
        transport.close()
        return response
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


def _parse(head: bytes) -> tuple[int, CIMultiDict[str]]:
    first, *rest = head.decode("latin-1").rstrip("\r\n").split("\r\n")
    headers: CIMultiDict[str] = CIMultiDict()
    for line in rest:
        name, _, value = line.partition(":")
        headers.add(name.strip(), value.strip())
    return int(first.split(" ", 2)[1]), headers


async def _copy(reader: asyncio.StreamReader, transport: asyncio.BaseTransport) -> None:
    assert isinstance(transport, asyncio.Transport)
    with contextlib.suppress(OSError):
        while data := await reader.read(1 << 16):
            if transport.is_closing():
                return
            transport.write(data)
        if transport.can_write_eof():
            transport.write_eof()
