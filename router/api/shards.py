"""The two steps of the middleware chain that make a router one of several: a peer's signed caller is taken
as checked, and a call for another shard's sandbox goes to its owner."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from grove.core.errors import Misdirected, Unavailable
from router.api.appkeys import CALLER, caller_of
from router.shards import signing
from router.shards.peers import Peers

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
PEERS = web.AppKey("peers", Peers)
"""This router's shard and its peers."""


@web.middleware
async def peer_auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A call signed by a peer acts as the caller the peer checked (``Unauthorized`` if the signature or its
    date is wrong); the key check after this one then has nothing to do."""
    if signing.SIGNATURE in request.headers or signing.PEER in request.headers:
        config = request.app[PEERS].config
        request[CALLER] = signing.verify(config.secret, request.headers, request.method, request.raw_path)
    return await handler(request)


@web.middleware
async def shards_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A call under ``/v1/sandboxes/{id}`` for another shard's sandbox, or a read of its trajectory, is passed on to
    that shard's router, once: a call a peer passed on that is not this router's either is refused (421), never
    sent round. A trajectory read whose owner is down is answered here from storage (a stored one, in a bucket
    the shards share)."""
    peers = request.app[PEERS]
    trajectory = request.method == "GET" and request.match_info.get("sandbox_id") is not None and \
        request.path.startswith("/v1/trajectories/")
    sandbox_id = request.match_info.get("sandbox_id") if trajectory else request.match_info.get("id")
    if sandbox_id is None or not (trajectory or request.path.startswith("/v1/sandboxes/")) or \
            (owner := peers.owner(sandbox_id)) is None:
        return await handler(request)
    if CALLER not in request:  # a route with its own credential (a signed port URL, an upload token)
        raise Misdirected(f"sandbox {sandbox_id} is shard {owner}'s: send this call to its router, "
                          f"{peers.url_of(owner, sandbox_id)} (calls without an API key are not passed on)")
    if signing.PEER in request.headers:
        raise Misdirected(f"sandbox {sandbox_id} is shard {owner}'s, not this router's ({peers.config.name}), and "
                          f"peer {request.headers[signing.PEER]!r} sent it here: the routers' --peers disagree")
    if not trajectory:
        return await peers.forward(request, owner, caller_of(request))
    try:  # the owner reads a live one from its journal; a stored one is in the bucket, which this router may share
        return await peers.forward(request, owner, caller_of(request))
    except Unavailable:
        return await handler(request)


async def across_shards(request: web.Request, own: list[dict[str, Any]]) -> dict[str, Any]:
    """A list call's answer from every shard (``?shards=all``): this router's rows and its peers', merged by
    creation time, with the shards that did not answer named (``unavailable_shards``) rather than failing the
    whole list; ``shard_errors`` says why each did not (a 401 there is a ``GROVE_PEER_SECRET`` mismatch)."""
    rows, errors = await request.app[PEERS].lists(request, caller_of(request))
    merged = sorted([*own, *rows], key=lambda row: float(row.get("created_at") or 0.0))
    return {"sandboxes": merged, "unavailable_shards": sorted(errors), "shard_errors": errors}
