"""Byte streams to a port inside a sandbox, through its executor's one port.

:func:`open_upgraded` asks the executor to upgrade a connection (``Upgrade: grove-tunnel`` to a port, or
``grove-pty`` for a terminal) and returns the raw socket once it answered ``101``. :class:`TunnelConnector` is
an aiohttp connector whose connections are such tunnels, so the router's proxy speaks HTTP and WebSocket to
the sandbox's server with aiohttp's own client — pooled keep-alive tunnels included — and writes no HTTP of
its own. :class:`PortClients` keeps one client session per executor endpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode, urlsplit

import aiohttp
from aiohttp.client_proto import ResponseHandler

from grove.core.errors import BadGateway, GroveError, error_from_body
from router.backends.base import Endpoint

_HEAD_LIMIT = 64 * 1024
KEEPALIVE_S = 15.0
"""How long an idle tunnel stays pooled (each holds a connection to the sandbox's server, as a browser would)."""


class Refused(BadGateway):
    """The executor answered the upgrade with an error (nothing listens on the port, a bad port)."""


async def open_upgraded(endpoint: Endpoint, path: str, protocol: str,
                        query: Mapping[str, str] | None = None) -> socket.socket:
    """A connection to ``endpoint`` upgraded to ``protocol`` at ``path``: the socket, ready for raw bytes.

    ``BadGateway`` if the executor cannot be reached; its own error (with its status) if it refused."""
    loop = asyncio.get_running_loop()
    sock, host = await _connect(endpoint)
    try:
        target = path + (f"?{urlencode(query)}" if query else "")
        head = (f"GET {target} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {endpoint.token}\r\n"
                f"Connection: Upgrade\r\nUpgrade: {protocol}\r\n\r\n")
        await loop.sock_sendall(sock, head.encode())
        head_bytes = await _read_head(sock, protocol)
    except OSError as exc:
        sock.close()
        raise BadGateway(f"the sandbox's executor went away while upgrading to {protocol}: {exc}") from exc
    except BaseException:
        sock.close()
        raise
    if _status(head_bytes) != b"101":
        rest = await _rest_of_body(sock, head_bytes, b"")
        sock.close()
        raise _refusal(head_bytes, rest)
    # What follows the 101 is the other side's first bytes (a terminal's shell prompts at once, a process may
    # write before it is read, a server may greet first): left in the socket for whoever reads it next.
    return sock


async def _read_head(sock: socket.socket, protocol: str) -> bytes:
    """The answer's head (its blank line taken off the socket too, not returned), and not a byte of what follows."""
    loop = asyncio.get_running_loop()
    head = b""
    while True:
        await _readable(loop, sock)
        try:
            seen = sock.recv(_HEAD_LIMIT, socket.MSG_PEEK)
        except BlockingIOError:
            continue
        if not seen:
            raise BadGateway(f"the sandbox's executor closed the connection while upgrading to {protocol}")
        end = (head[-3:] + seen).find(b"\r\n\r\n")
        if end >= 0:  # the blank line ends within what is waiting: take the head up to it, no further
            return (head + sock.recv(end + 4 - len(head[-3:])))[:-4]
        if len(head) + len(seen) > _HEAD_LIMIT:
            raise BadGateway(f"the sandbox's executor answered the upgrade to {protocol} with an over-long head")
        head += sock.recv(len(seen))  # all of it is head: its end has not come yet


async def _readable(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
    """Until ``sock`` has something to read (or its peer closed it)."""
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(sock.fileno(), wake)
    try:
        await ready
    finally:
        loop.remove_reader(sock.fileno())


async def _connect(endpoint: Endpoint) -> tuple[socket.socket, str]:
    loop = asyncio.get_running_loop()
    if endpoint.url.startswith("unix:"):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        address: Any = endpoint.url[5:]
        host = "executor"
    else:
        parts = urlsplit(endpoint.url)
        infos = await loop.getaddrinfo(parts.hostname, parts.port or 80, type=socket.SOCK_STREAM)
        family, kind, proto, _, address = infos[0]
        sock = socket.socket(family, kind, proto)
        host = parts.netloc
    sock.setblocking(False)
    try:
        await loop.sock_connect(sock, address)
    except OSError as exc:
        sock.close()
        raise BadGateway(f"the sandbox's executor could not be reached ({exc}); the sandbox is restarted on "
                         "the next call, its files kept") from exc
    return sock, host


async def _rest_of_body(sock: socket.socket, head: bytes, have: bytes) -> bytes:
    """The rest of a refusal's (small, JSON) body, as its Content-Length says."""
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")[1:]
                   if line.lower().startswith(b"content-length:") and line.split(b":", 1)[1].strip().isdigit()), 0)
    more = b""
    loop = asyncio.get_running_loop()
    with contextlib.suppress(OSError):
        while len(have) + len(more) < min(length, _HEAD_LIMIT):
            chunk = await asyncio.wait_for(loop.sock_recv(sock, 4096), 5.0)
            if not chunk:
                break
            more += chunk
    return more


def _status(head: bytes) -> bytes:
    """The status code of an answer's head (``HTTP/1.1 101 Switching Protocols``: ``101``; the reason is optional)."""
    return b"".join(head.split(b"\r\n", 1)[0].split(b" ", 2)[1:2])


def _refusal(head: bytes, body: bytes) -> GroveError:
    """The executor's own error from a refused upgrade (its JSON body), or a ``BadGateway`` naming the status."""
    with contextlib.suppress(ValueError):
        return error_from_body(int(_status(head)), json.loads(body))
    return Refused(f"the sandbox's executor refused the upgrade: {head.splitlines()[0].decode(errors='replace')}")


class TunnelConnector(aiohttp.BaseConnector):
    """aiohttp connections that are tunnels to ``http://127.0.0.1:PORT`` inside one sandbox (the URL's port
    picks the sandbox's port; pooling is per port)."""

    def __init__(self, endpoint: Endpoint) -> None:
        super().__init__(keepalive_timeout=KEEPALIVE_S, limit=0)
        self.endpoint = endpoint

    async def _create_connection(self, req: Any, traces: Any, timeout: Any) -> ResponseHandler:
        port = req.url.port
        sock = await open_upgraded(self.endpoint, f"/v1/ports/{port}/tunnel", "grove-tunnel")
        try:
            _, proto = await asyncio.get_running_loop().create_connection(self._factory, sock=sock)
        except OSError as exc:
            sock.close()
            raise BadGateway(f"the tunnel to port {port} broke as it opened: {exc}") from exc
        return proto


class PortClients:
    """One aiohttp session (over tunnels) per executor endpoint; an endpoint that moved gets a new one."""

    def __init__(self) -> None:
        self._sessions: dict[tuple[str, str], aiohttp.ClientSession] = {}

    def session(self, endpoint: Endpoint) -> aiohttp.ClientSession:
        """The session whose requests to ``http://127.0.0.1:PORT/...`` reach PORT in the endpoint's sandbox."""
        key = (endpoint.url, endpoint.token)
        session = self._sessions.get(key)
        if session is None or session.closed:
            for old in [k for k in self._sessions if k[0] == endpoint.url]:
                asyncio.get_running_loop().create_task(self._sessions.pop(old).close())
            # No cookie jar and no decompression: cookies and encodings are the client's and server's business.
            session = aiohttp.ClientSession(connector=TunnelConnector(endpoint), auto_decompress=False,
                                            timeout=aiohttp.ClientTimeout(total=None),
                                            cookie_jar=aiohttp.DummyCookieJar())
            self._sessions[key] = session
        return session

    async def close(self) -> None:
        """Close every session (the app's end)."""
        for session in self._sessions.values():
            await session.close()
        self._sessions.clear()
