"""The HTTP hops of the stand-in's data path: Knative's timeout handler around a reverse proxy, and a plain relay.

queue-proxy and the activator both wrap their reverse proxy in ``pkg/http/handler/timeout.go``'s handler, with
the revision's ``timeoutSeconds``, ``responseStartTimeoutSeconds`` and ``idleTimeoutSeconds`` (the activator's
in ``cmd/activator/main.go``, queue-proxy's in ``pkg/queue/sharedmain/handlers.go``): the clock starts when the
request arrives at that hop, so at the activator a cold start counts against the response-start timeout.
Upgraded connections (WebSocket, grove's tunnels) are passed through as the real hops pass them
(:mod:`tests.support.knative_upgrades`), with the timeouts that apply to them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import aiohttp
from aiohttp import web

from tests.support.k8s_standin import Obj
from tests.support.knative_upgrades import is_upgrade, pass_upgrade

HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "content-length"}
"""Hop-by-hop headers no proxy passes on (Host is kept, as Go's ReverseProxy keeps the inbound Host)."""


def revision_timeouts(spec: Obj) -> tuple[float, float, float]:
    """(total, response start, idle) of a revision's (defaulted) spec; 0 for the last two: none."""
    return (float(spec.get("timeoutSeconds") or 300), float(spec.get("responseStartTimeoutSeconds") or 0),
            float(spec.get("idleTimeoutSeconds") or 0))


def _headers(request: web.Request, drop: frozenset[str] = frozenset()) -> dict[str, str]:
    return {k: v for k, v in request.headers.items() if k.lower() not in HOP and k.lower() not in drop}


async def timed_proxy(session: aiohttp.ClientSession, request: web.Request, target: Callable[[], str],
                      spec: Obj, message: str, on_cut: Callable[[], None], *,
                      before: Awaitable[None] | None = None, drop: frozenset[str] = frozenset(),
                      on_upgrade: Callable[[], None] | None = None) -> web.StreamResponse:
    """Proxy ``request`` to ``target()`` (a base URL, asked once ``before`` is done) under Knative's timeout
    handler: a 504 with ``message`` when no byte came within the response-start (or idle) timeout of the
    request's arrival, ``before`` included; at ``timeoutSeconds`` a started response gets ``message`` appended
    and ends. ``on_cut`` is told of each call this hop cut while its caller still listened, ``on_upgrade`` of
    each upgrade request it took on its upgrade path (whatever the backend answers it)."""
    began = time.monotonic()
    total, start, idle = revision_timeouts(spec)
    first = min(total, start or total, idle or total)

    def cut() -> None:
        if request.transport is not None and not request.transport.is_closing():
            on_cut()  # a caller that already left was cut by a hop in front of this one

    if is_upgrade(request):
        if on_upgrade is not None:
            on_upgrade()
        try:
            if before is not None:
                await asyncio.wait_for(before, first)
            base = target()
        except TimeoutError:
            cut()
            return web.Response(status=504, text=message)
        except RuntimeError as exc:
            return web.Response(status=503, text=str(exc))
        # Nothing of an upgraded connection is written through the timeout handler's writer, so each of the
        # three timeouts that is set ends it, counted from the request's arrival.
        return await pass_upgrade(request, base, _headers(request, drop), lifetime=first, began=began, on_cut=cut)

    async def begin() -> tuple[aiohttp.ClientResponse, object]:
        if before is not None:
            await before
        manager = session.request(request.method, target() + request.path_qs, headers=_headers(request, drop),
                                  data=request.content if request.can_read_body else None, auto_decompress=False,
                                  allow_redirects=False)
        return await manager.__aenter__(), manager

    try:
        upstream, manager = await asyncio.wait_for(begin(), first)
    except TimeoutError:
        cut()
        return web.Response(status=504, text=message)
    except RuntimeError as exc:  # the revision could not get a pod: the activator's throttler gives up
        return web.Response(status=503, text=str(exc))
    try:
        out = web.StreamResponse(status=upstream.status, headers={
            k: v for k, v in upstream.headers.items() if k.lower() not in HOP})
        await out.prepare(request)
        while True:
            left = total - (time.monotonic() - began)
            try:
                chunk = await asyncio.wait_for(upstream.content.readany(), max(0.0, min(left, idle or left)))
            except TimeoutError:
                cut()
                await out.write(message.encode())
                break
            if not chunk:
                break
            await out.write(chunk)
        await out.write_eof()
        return out
    finally:
        await manager.__aexit__(None, None, None)  # type: ignore[attr-defined]


async def relay(session: aiohttp.ClientSession, request: web.Request, base: str,
                extra: dict[str, str] | None = None) -> web.StreamResponse:
    """Pass ``request`` on to ``base`` and stream the answer back, adding ``extra`` headers (an ingress's)."""
    headers = {**_headers(request), **(extra or {})}
    if is_upgrade(request):
        return await pass_upgrade(request, base, headers)
    out: web.StreamResponse | None = None
    try:
        async with session.request(request.method, base + request.path_qs, headers=headers, auto_decompress=False,
                                   data=request.content if request.can_read_body else None,
                                   allow_redirects=False) as upstream:
            out = web.StreamResponse(status=upstream.status, headers={
                k: v for k, v in upstream.headers.items() if k.lower() not in HOP})
            await out.prepare(request)
            async for chunk in upstream.content.iter_any():
                await out.write(chunk)
            await out.write_eof()
            return out
    except aiohttp.ClientConnectionError as exc:
        if out is not None:
            raise  # the answer had started: a cut connection is the only signal left
        return web.Response(status=502, text=f"upstream connect error: {exc}")
