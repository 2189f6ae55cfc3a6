"""Handlers for warm pools: ``/v1/pools`` (the rules are :mod:`router.pools.warm`'s; this only translates).

A pool is its project's: the names of two projects' pools never meet, and a key sees only its own
project's (an admin's ``X-Grove-Project: *`` lists every project's)."""

from __future__ import annotations

from aiohttp import web

from grove.core import wire
from grove.core.schema import parse
from router.api.appkeys import in_view, project_of, service_of
from router.api.replies import reply
from router.models import PoolRequest, PoolResize


async def create_pool(request: web.Request) -> web.Response:
    """POST /v1/pools — define a pool; its members start in the background."""
    definition = parse(PoolRequest, wire.decode(await request.read(), request.content_type))
    return reply(request, await service_of(request).pools.create(definition, project_of(request)), status=201)


async def list_pools(request: web.Request) -> web.Response:
    """GET /v1/pools — every pool of the project with its counts."""
    pools = service_of(request).pools
    shown = sorted((p for p in pools.all() if in_view(request, p.project)), key=lambda p: (p.project, p.key))
    return reply(request, {"pools": [pools.shown(pool) for pool in shown]})


async def get_pool(request: web.Request) -> web.Response:
    """GET /v1/pools/{name} — one pool: its definition, ``size``, ``ready``, ``starting``, claims, misses."""
    return reply(request, service_of(request).pools.show(request.match_info["name"], project_of(request)))


async def resize_pool(request: web.Request) -> web.Response:
    """PATCH /v1/pools/{name} — a new size (members beyond it are deleted; missing ones start)."""
    resize = parse(PoolResize, wire.decode(await request.read(), request.content_type))
    pools = service_of(request).pools
    return reply(request, await pools.resize(request.match_info["name"], resize.size, project_of(request)))


async def delete_pool(request: web.Request) -> web.Response:
    """DELETE /v1/pools/{name} — forget the pool and delete its unclaimed members."""
    return reply(request, await service_of(request).pools.delete(request.match_info["name"], project_of(request)))
