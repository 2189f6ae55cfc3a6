"""The executor's client: every call the router makes to a sandbox's executor, over pooled keep-alive connections.

:class:`Upstreams` is the one place an executor call is built — the session for its endpoint (a Unix socket, or
TCP), its bearer token, its timeout, a lost connection turned into ``BadGateway``. :func:`forward` streams an API
call through unchanged (the data path; a caller who hangs up mid-answer is no executor lost,
:mod:`router.answer`); :meth:`Upstreams.call` and :meth:`Upstreams.post_json` are the router's
own calls (a pool claim, full outputs, artifact pushes, keep-warm pings).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import aiohttp
from aiohttp import web

from grove.core import wire
from grove.core.errors import BadGateway, UpstreamTimeout
from router.answer import Answer
from router.backends.base import Endpoint

# Headers that describe the body and must travel with it; everything else (auth above all) stays here.
_FORWARD_REQUEST = ("Content-Type", "Content-Length", "Accept", "Content-Encoding")
_FORWARD_RESPONSE = ("Content-Type", "Content-Length", "Retry-After")
_CHUNK = 256 * 1024
Tap = Callable[[bytes], None]


class StreamAborted(Exception):
    """The executor failed after the response had started: the only honest signal left is to cut it."""


class Unreached(Exception):
    """The endpoint refused the connection: nothing of the call was sent, so it can be sent again."""


class Upstreams:
    """One pooled client session per executor endpoint (Unix sockets cannot share a connector)."""

    def __init__(self) -> None:
        self._sessions: dict[str, aiohttp.ClientSession] = {}
        self._tcp: aiohttp.ClientSession | None = None

    def session(self, endpoint: Endpoint) -> tuple[aiohttp.ClientSession, str]:
        """The session for an endpoint and the base URL to use with it."""
        if endpoint.url.startswith("unix:"):
            session = self._sessions.get(endpoint.url)
            if session is None or session.closed:
                connector = aiohttp.UnixConnector(path=endpoint.url[5:], limit=0, keepalive_timeout=30)
                session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None))
                self._sessions[endpoint.url] = session
            return session, "http://executor"
        if self._tcp is None or self._tcp.closed:
            tcp = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=30)
            self._tcp = aiohttp.ClientSession(connector=tcp, timeout=aiohttp.ClientTimeout(total=None))
        return self._tcp, endpoint.url.rstrip("/")

    @staticmethod
    def headers(endpoint: Endpoint, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The headers of a call to ``endpoint``: its bearer token (the one place it is written), and ``extra``."""
        return {**(extra or {}), "Authorization": f"Bearer {endpoint.token}"}

    @contextlib.asynccontextmanager
    async def call(
        self, endpoint: Endpoint, method: str, path: str, *, params: Mapping[str, str] | None = None,
        json_body: Any = None, timeout_s: float | None = None,
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """One call of the router's own to an executor (answers asked for as JSON), its response open for the
        block; ``timeout_s`` bounds the whole call. An executor that cannot be reached, or that goes away before
        it answers, is a ``BadGateway`` naming the call; what happens while the block reads is the block's."""
        session, base = self.session(endpoint)
        try:
            resp = await session.request(method, base + path, params=params, json=json_body,
                                         timeout=aiohttp.ClientTimeout(total=timeout_s),
                                         headers=self.headers(endpoint, {"Accept": wire.JSON}))
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise BadGateway(f"the sandbox's executor did not answer {method} {path}: {exc}") from exc
        try:
            yield resp
        finally:
            resp.release()

    async def post_json(self, endpoint: Endpoint, path: str, body: dict[str, Any], timeout_s: float = 30.0) -> None:
        """POST a JSON body to an executor; ``BadGateway`` unless it answers 200."""
        async with self.call(endpoint, "POST", path, json_body=body, timeout_s=timeout_s) as resp:
            try:
                text = await resp.text()
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise BadGateway(f"the sandbox's executor went away answering {path}: {exc}") from exc
            if resp.status != 200:
                raise BadGateway(f"executor answered {path} with {resp.status}: {text[:500]}")

    async def drop(self, endpoint_url: str | None) -> None:
        """Close the pool of an endpoint that went away."""
        if endpoint_url and (session := self._sessions.pop(endpoint_url, None)):
            await session.close()

    async def close(self) -> None:
        """Close every pool."""
        for session in list(self._sessions.values()):
            await session.close()
        self._sessions.clear()
        if self._tcp is not None:
            await self._tcp.close()


async def _tapped(request: web.Request, tap: Tap) -> AsyncIterator[bytes]:
    async for chunk in request.content.iter_chunked(_CHUNK):
        tap(chunk)
        yield chunk


async def forward(
    request: web.Request,
    upstreams: Upstreams,
    endpoint: Endpoint,
    path: str,
    on_lost: Callable[[], Awaitable[None]],
    *,
    body: bytes | None = None,
    request_tap: Tap | None = None,
    response_tap: Tap | None = None,
) -> web.StreamResponse:
    """Send ``request`` to ``path`` on the executor and stream its answer back unchanged.

    ``body`` replaces the request's own (already read) body; the taps see every chunk going each way,
    which is how the trajectory recorder hashes file transfers without holding them.
    """
    session, base = upstreams.session(endpoint)
    headers = upstreams.headers(endpoint, {h: request.headers[h] for h in _FORWARD_REQUEST if h in request.headers})
    data: bytes | AsyncIterator[bytes] | None
    if body is not None:
        data = body
        headers["Content-Length"] = str(len(body))
    elif request.can_read_body:
        data = _tapped(request, request_tap) if request_tap else request.content  # type: ignore[assignment]
        # An upload gets a connection of its own. The executor may answer before reading all of the body
        # (a full disk mid-upload); gunicorn then closes the connection, not knowing where the next
        # request would start, while the client, having sent every byte, would pool it: the next call
        # on it would meet a reset.
        headers["Connection"] = "close"
    else:
        data = None
    response: web.StreamResponse | None = None
    try:
        async with session.request(
            request.method, base + path, params=request.query, data=data, headers=headers, allow_redirects=False
        ) as upstream:
            if upstream.status == 504 and not _from_executor(upstream):
                text = (await upstream.content.read(300)).decode("utf-8", "replace").strip()
                raise UpstreamTimeout(
                    f"the platform in front of the sandbox cut the call with a 504 ({text!r}): it ran past the "
                    "longest call a sandbox allows (on Knative, the revision's timeoutSeconds, the router's "
                    "--request-timeout; a call that woke the sandbox through the activator counts its cold start "
                    "too); nothing is retried, and the command may still have run to its end"
                )
            response = web.StreamResponse(
                status=upstream.status,
                headers={h: upstream.headers[h] for h in _FORWARD_RESPONSE if h in upstream.headers},
            )
            if "Content-Length" not in upstream.headers:
                response.enable_chunked_encoding()
            answer = Answer(request, response)
            await answer.start()
            async for chunk in upstream.content.iter_chunked(_CHUNK):
                if response_tap:
                    response_tap(chunk)  # read to the end though the caller left: the trajectory records it
                elif answer.gone:
                    break  # the connection to the executor closes with the block; the executor is not lost
                await answer.write(chunk)
            await answer.end()
            return response
    except aiohttp.ClientConnectorError as exc:
        raise Unreached(f"{type(exc).__name__}: {exc}") from exc  # before any byte was sent: the caller decides
    except (TimeoutError, aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
        await on_lost()
        if response is not None and response.prepared:
            raise StreamAborted(f"executor lost mid-response: {exc}") from exc
        raise BadGateway(
            f"the sandbox's executor went away during the call ({type(exc).__name__}: {exc}); "
            "the sandbox is restarted on the next call, its files kept"
        ) from exc


def _from_executor(upstream: aiohttp.ClientResponse) -> bool:
    """Whether an answer is the executor's own (its errors are JSON or msgpack), not a proxy's on the way
    (queue-proxy and the activator answer a plain-text 504 when a call outlives the revision's timeout)."""
    return upstream.content_type in (wire.JSON, wire.MSGPACK, "application/x-ndjson")
