"""What an unauthenticated caller can hold of the router: few connections, each briefly, before its headers.

aiohttp kept a connection that never finished its request line open for an hour, and accepted until the
process ran out of descriptors, when /healthz and every authenticated call failed too (issue 18, finding
5). Each connection now goes through :class:`Guarded`, which

- closes it if its first request's headers are not complete within ``header_timeout_s`` (slowloris);
  later requests on a kept-alive connection are bounded by aiohttp's keep-alive timeout, which closes a
  connection that has not completed a request by then (``idle_timeout_s``);
- holds at most ``max_connections`` at once: past the cap the oldest connection still waiting for its
  headers makes room (an attacker's half-open ones go first, a caller who sends its request at once
  gets in); if every one is past its headers, the newcomer gets ``503`` with ``Retry-After`` and is closed.

What it sheds or times out is counted and logged once per interval (``router/logs.py``), never per event.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from grove.core.errors import error_body

log = logging.getLogger("grove.router.connections")

_BODY = json.dumps(error_body("unavailable", "the router is at its connection limit; retry in a second")).encode()
BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
        b"Connection: close\r\nContent-Length: " + str(len(_BODY)).encode() + b"\r\n\r\n" + _BODY)


class ConnectionGuard:
    """The router's connections: how many, and which still wait for their first request's headers."""

    def __init__(self, handler_factory: Callable[[], asyncio.Protocol], *, max_connections: int,
                 header_timeout_s: float) -> None:
        self.handler_factory = handler_factory
        self.max_connections = max_connections
        self.header_timeout_s = header_timeout_s
        self.open = 0
        self._waiting: OrderedDict[Guarded, None] = OrderedDict()

    def protocol(self) -> Guarded:
        """A protocol for one new connection (the ``loop.create_server`` factory)."""
        return Guarded(self)

    def admit(self, conn: Guarded) -> bool:
        """Take ``conn`` in, making room if the cap is reached; False: it gets 503."""
        if self.open >= self.max_connections:
            if not self._waiting:
                log.warning("connection refused with 503: %d connections open, all busy", self.open)
                return False
            oldest, _ = self._waiting.popitem(last=False)
            log.warning("connection limit (%d) reached: closing the oldest connection still without a request",
                        self.max_connections)
            oldest.close()
        self.open += 1
        self._waiting[conn] = None
        return True

    def started(self, conn: Guarded) -> None:
        """``conn`` completed its first request's headers."""
        self._waiting.pop(conn, None)

    def gone(self, conn: Guarded) -> None:
        """``conn`` closed."""
        self._waiting.pop(conn, None)
        self.open -= 1


class Guarded(asyncio.Protocol):
    """One connection: aiohttp's handler inside, with a header deadline and a place under the cap."""

    def __init__(self, guard: ConnectionGuard) -> None:
        self._guard = guard
        self._inner: Any = None
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._tail = b""
        self._lost = False
        self._closed: asyncio.Future[None] | None = None  # made when first asked for: most calls never ask

    def closed(self) -> asyncio.Future[None]:
        """Done once the connection has closed (the caller hung up, or died: its kernel closes it)."""
        if self._closed is None:
            self._closed = asyncio.get_running_loop().create_future()
            if self._lost:
                self._closed.set_result(None)
        return self._closed

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Admit (or answer 503 and close), start the header deadline, hand over to aiohttp."""
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        if not self._guard.admit(self):
            transport.write(BUSY)
            transport.close()
            return
        self._timer = asyncio.get_running_loop().call_later(self._guard.header_timeout_s, self._too_slow)
        self._inner = self._guard.handler_factory()
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        """Watch for the end of the first request's headers, then pass the bytes on."""
        if self._inner is None:
            return
        if self._timer is not None:
            window = self._tail + data
            if b"\r\n\r\n" in window or b"\n\n" in window:
                self._timer.cancel()
                self._timer = None
                self._guard.started(self)
            self._tail = window[-3:]
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        """As aiohttp's handler says."""
        return self._inner.eof_received() if self._inner is not None else None

    def pause_writing(self) -> None:
        """Flow control, to aiohttp's handler."""
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        """Flow control, to aiohttp's handler."""
        if self._inner is not None:
            self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        """Give the place back; tell aiohttp, and whoever waits on :meth:`closed`."""
        self._lost = True
        if self._closed is not None and not self._closed.done():
            self._closed.set_result(None)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._inner is not None:
            self._guard.gone(self)
            self._inner.connection_lost(exc)
            self._inner = None

    def close(self) -> None:
        """Close the connection (room for another, or its headers took too long)."""
        if self._transport is not None:
            self._transport.abort()

    def _too_slow(self) -> None:
        self._timer = None
        log.warning("closed a connection that sent no complete request headers within %gs",
                    self._guard.header_timeout_s)
        self.close()


def hung_up(transport: asyncio.BaseTransport | None) -> asyncio.Future[None] | None:
    """A future done once the caller on ``transport`` has gone (None: not a connection the guard holds)."""
    protocol = transport.get_protocol() if transport is not None else None
    return protocol.closed() if isinstance(protocol, Guarded) else None
