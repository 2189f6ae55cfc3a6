"""Proxying one request (HTTP or WebSocket) to a port in a sandbox, over a tunnel of :mod:`router.ports.tunnels`.

What the caller authenticated with never travels on: ``Authorization``, the signed URL's token and its cookie
are taken off, and hop-by-hop headers stay on their hop. Everything else goes through as it is, bodies
streamed both ways (a compressed answer stays compressed).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Mapping
from http.cookies import SimpleCookie

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from grove.core.errors import BadGateway, BadRequest
from router.answer import Answer
from router.api.appkeys import service_of
from router.ports.state import ports_of
from router.records.registry import SandboxRecord

_CHUNK = 256 * 1024
HOP_BY_HOP = frozenset(h.lower() for h in (
    "Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "TE", "Trailer", "Transfer-Encoding",
    "Upgrade", "Host", "Authorization"))
_WS_HANDSHAKE = frozenset(h.lower() for h in (
    "Sec-WebSocket-Key", "Sec-WebSocket-Version", "Sec-WebSocket-Extensions", "Sec-WebSocket-Protocol"))
Tap = Callable[[bytes], None]
TOKEN_PARAM = "grove_token"
"""The query parameter a signed URL carries its token in."""
TOKEN_COOKIE = "grove_port"
"""The cookie a signed URL's first visit sets (on that host only), so the page's own requests carry it."""
KEY_HEADERS = ("X-Access-Token", "E2B-Traffic-Access-Token")
"""Headers E2B's SDK carries the key in (envd's access token, the traffic access token): taken as the key when
there is no ``Authorization``, and never sent on to the sandbox."""
_CREDENTIALS = frozenset(h.lower() for h in KEY_HEADERS)


def key_credential(headers: Mapping[str, str]) -> str | None:
    """The ``Authorization`` value a request authenticates with: a bearer token, else an E2B key header (E2B's
    envd calls carry ``Authorization: Basic <user>:`` beside their token), else what ``Authorization`` holds."""
    given = headers.get("Authorization")
    if given is not None and given[:7].lower() == "bearer ":
        return given
    for name in KEY_HEADERS:
        if name in headers:
            return f"Bearer {headers[name]}"
    return given


def parse_port(text: str) -> int:
    """A port number from a route part; ``BadRequest`` for anything else."""
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise BadRequest(f"port {text[:20]!r} must be a number from 1 to 65535")
    return int(text)


def is_websocket(request: web.Request) -> bool:
    """Whether the request asks to become a WebSocket."""
    return request.headers.get("Upgrade", "").lower() == "websocket"


async def proxy(request: web.Request, record: SandboxRecord, port: int, target: str, host: str | None, *,
                body: bytes | None = None, tap: Tap | None = None,
                on_status: Callable[[int], None] | None = None) -> web.StreamResponse:
    """Send ``request`` to ``target`` (path and query) on ``port`` in the sandbox and relay the answer; ``host``
    is the Host header the server sees (None: ``127.0.0.1:PORT``, as a client inside the sandbox would send).
    ``body`` replaces a request body already read; ``tap`` sees the answer's bytes, ``on_status`` its status as it
    arrives (the client may leave before its end). The sandbox is woken if it
    sleeps, and counts as busy while the connection is open."""
    service = service_of(request)
    with service.calling(record, request.transport):
        with service.recorder.faults(record, f"port {port}"):
            endpoint = await service.endpoint(record)
        session = ports_of(request).clients.session(endpoint)
        url = f"http://127.0.0.1:{port}{target}"
        headers = _forwarded(request.headers, host)
        if is_websocket(request):
            return await _websocket(request, record, port, session, url, headers)
        response = web.StreamResponse()
        if host is None:
            # On the API's origin (which the viewer shares) a page is put in a unique origin of its own: it can
            # read nothing of the viewer's, cookies included. Browsers should use the host-named listener.
            response.headers.add("Content-Security-Policy", "sandbox")
        return await _http(request, record, port, session, url, headers, body, tap, response, on_status)


def _forwarded(incoming: Mapping[str, str], host: str | None) -> CIMultiDict[str]:
    headers: CIMultiDict[str] = CIMultiDict()
    for name, value in incoming.items():
        lower = name.lower()
        if lower in HOP_BY_HOP or lower in _CREDENTIALS:
            continue
        if lower == "cookie":
            value = _without_token_cookie(value)
            if not value:
                continue
        headers.add(name, value)
    if host is not None:
        headers["Host"] = host
    return headers


def _without_token_cookie(header: str) -> str:
    cookies: SimpleCookie = SimpleCookie()
    try:
        cookies.load(header)
    except Exception:
        return header
    if TOKEN_COOKIE not in cookies:
        return header
    return "; ".join(f"{k}={m.coded_value}" for k, m in cookies.items() if k != TOKEN_COOKIE)


async def _http(request: web.Request, record: SandboxRecord, port: int, session: aiohttp.ClientSession, url: str,
                headers: CIMultiDict[str], read: bytes | None, tap: Tap | None, response: web.StreamResponse,
                on_status: Callable[[int], None] | None) -> web.StreamResponse:
    traffic = ports_of(request).traffic
    moved = [len(read or b""), 0]

    async def streamed() -> AsyncIterator[bytes]:
        async for chunk in request.content.iter_chunked(_CHUNK):
            moved[0] += len(chunk)
            yield chunk

    data: bytes | AsyncIterator[bytes] | None = read
    if read is None and request.can_read_body:
        data = streamed()

    status = 502
    try:
        async with session.request(request.method, url, headers=headers, allow_redirects=False,
                                   data=data) as upstream:
            status = upstream.status
            if on_status is not None:
                on_status(status)
            response.set_status(upstream.status, upstream.reason)
            for name, value in upstream.headers.items():
                if name.lower() not in HOP_BY_HOP:
                    response.headers.add(name, value)
            if "Content-Length" not in upstream.headers and request.method != "HEAD" and \
                    upstream.status not in (204, 304):
                response.enable_chunked_encoding()
            # The client may leave before the answer's end (an MCP client does, once it holds its result):
            # there is no one to tell anything; the upstream connection is dropped with the block.
            answer = Answer(request, response)
            await answer.start()
            async for chunk in upstream.content.iter_chunked(_CHUNK):
                if answer.gone:
                    break
                moved[1] += len(chunk)
                if tap is not None:
                    tap(chunk)
                await answer.write(chunk)
            await answer.end()
            return response
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise BadGateway(f"the server on port {port} in the sandbox broke off the answer: {exc}") from exc
    finally:
        traffic.request(record, port, status, moved[0], moved[1])


async def _websocket(request: web.Request, record: SandboxRecord, port: int, session: aiohttp.ClientSession,
                     url: str, headers: CIMultiDict[str]) -> web.StreamResponse:
    protocols = [p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",") if p.strip()]
    for name in _WS_HANDSHAKE:
        headers.popall(name, None)
    started = time.time()
    try:
        upstream = await session.ws_connect(url, headers=headers, protocols=protocols, max_msg_size=0,
                                            autoping=True)
    except aiohttp.WSServerHandshakeError as exc:
        raise BadGateway(f"the server on port {port} in the sandbox refused the WebSocket: {exc.status} "
                         f"{exc.message}") from exc
    except aiohttp.ClientError as exc:
        raise BadGateway(f"the server on port {port} in the sandbox could not take the WebSocket: {exc}") from exc
    client = web.WebSocketResponse(protocols=[upstream.protocol] if upstream.protocol else [], max_msg_size=0)
    counts = {"messages_in": 0, "messages_out": 0, "bytes_in": 0, "bytes_out": 0}
    try:
        await client.prepare(request)
        await asyncio.gather(_pump(client, upstream, counts, "in"), _pump(upstream, client, counts, "out"))
    finally:
        await upstream.close()
        await client.close()
        ports_of(request).traffic.counts(record, port).websockets += 1
        ports_of(request).traffic.session(record, "port_websocket", {
            "t": started, "port": port, "path": url.split(str(port), 1)[1], "duration_s": time.time() - started,
            **counts})
    return client


async def _pump(source: web.WebSocketResponse | aiohttp.ClientWebSocketResponse,
                sink: web.WebSocketResponse | aiohttp.ClientWebSocketResponse, counts: dict[str, int],
                way: str) -> None:
    """Relay messages one way until ``source`` closes; then close ``sink`` with the same code."""
    async for message in source:
        if message.type == aiohttp.WSMsgType.TEXT:
            await sink.send_str(message.data)
            size = len(message.data.encode())
        elif message.type == aiohttp.WSMsgType.BINARY:
            await sink.send_bytes(message.data)
            size = len(message.data)
        else:
            break
        counts[f"messages_{way}"] += 1
        counts[f"bytes_{way}"] += size
    await sink.close(code=source.close_code or aiohttp.WSCloseCode.OK)
