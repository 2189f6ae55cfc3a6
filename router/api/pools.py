"""Handlers for warm pools: ``/v1/pools`` (the rules are :mod:`router.pools.warm`'s; this only translates)."""

from __future__ import annotations

from aiohttp import web

from grove.core import wire
from grove.core.schema import parse
from router.api.appkeys import service_of
from router.api.replies import reply
from router.models import PoolRequest, PoolResize


async def create_pool(request: web.Request) -> web.Response:
    """POST /v1/pools — define a pool; its members start in the background."""
    definition = parse(PoolRequest, wire.decode(await request.read(), request.content_type))
    return reply(request, await service_of(request).pools.create(definition), status=201)


async def list_pools(request: web.Request) -> web.Response:
    """GET /v1/pools — every pool with its counts."""
    pools = service_of(request).pools
    return reply(request, {"pools": [pools.show(name) for name in pools.names()]})


async def get_pool(request: web.Request) -> web.Response:
    """GET /v1/pools/{name} — one pool: its definition, ``size``, ``ready``, ``starting``, claims, misses."""
    return reply(request, service_of(request).pools.show(request.match_info["name"]))


async def resize_pool(request: web.Request) -> web.Response:
    """PATCH /v1/pools/{name} — a new size (members beyond it are deleted; missing ones start)."""
    resize = parse(PoolResize, wire.decode(await request.read(), request.content_type))
    return reply(request, await service_of(request).pools.resize(request.match_info["name"], resize.size))


async def delete_pool(request: web.Request) -> web.Response:
    """DELETE /v1/pools/{name} — forget the pool and delete its unclaimed members."""
    return reply(request, await service_of(request).pools.delete(request.match_info["name"]))
