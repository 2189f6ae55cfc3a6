"""Handlers of the sandboxes themselves: create, list, get, delete, heartbeat, and the router's health."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from grove.core import wire
from grove.core.errors import BadRequest, InternalError
from grove.core.schema import parse
from router.api.appkeys import SERVICE, in_view, project_of, sandbox_of, service_of
from router.api.datapath import read_capped
from router.api.replies import reply
from router.api.shards import across_shards
from router.lifecycle.keepwarm import keep_warm
from router.models import CreateRequest, Empty
from router.records.registry import SandboxRecord


async def read_body(request: web.Request) -> Any:
    """Decode a lifecycle body (not yet validated)."""
    raw = await read_capped(request, request.app[SERVICE].settings.max_body_bytes)
    return wire.decode(raw, request.content_type)


async def read_model(request: web.Request, model: type[Any]) -> Any:
    """Decode and validate a lifecycle body."""
    return parse(model, await read_body(request))


def _record(request: web.Request) -> SandboxRecord:
    return sandbox_of(request, request.match_info["id"])


async def create_sandbox(request: web.Request) -> web.Response:
    body = await read_body(request)
    req = parse(CreateRequest, body)
    # Which fields the body set: a create naming a pool may leave out (or repeat) the pool's own.
    record = await service_of(request).create(req, frozenset(body), project_of(request))
    return reply(request, record.public(), status=201)


async def list_sandboxes(request: web.Request) -> web.Response:
    labels: dict[str, str] = {}
    for raw in request.query.getall("label", []):
        key, sep, value = raw.partition("=")
        if not sep or not key:
            raise BadRequest(f"label filter {raw!r} must look like key=value")
        labels[key] = value
    status = request.query.get("status")
    live = service_of(request).registry.claimed()
    records = [r for r in live if in_view(request, r.project) and r.matches(labels)
               and (not status or r.status == status)]
    rows = [r.public() for r in sorted(records, key=lambda r: r.created_at)]
    if request.query.get("shards") == "all":  # every shard's, merged; the unreachable ones named
        return reply(request, await across_shards(request, rows))
    return reply(request, {"sandboxes": rows})


async def get_sandbox(request: web.Request) -> web.Response:
    sandbox_id = request.match_info["id"]
    registry = service_of(request).registry
    record = registry.lookup(sandbox_id)  # the middleware checked whose it is
    if record is None:
        registry.get(sandbox_id)  # raises the right NotFound
        raise InternalError("unreachable")
    return reply(request, record.public())


async def delete_sandbox(request: web.Request) -> web.Response:
    record = await service_of(request).delete(request.match_info["id"])
    return reply(request, record.public())


async def heartbeat(request: web.Request) -> web.Response:
    await read_model(request, Empty)
    record = _record(request)
    service_of(request).touch(record)
    keep_warm(service_of(request), record)
    return reply(request, {"id": record.id, "status": record.status, "last_activity": record.last_activity})


async def healthz(request: web.Request) -> web.Response:
    """The router answers; its backend, how many sandboxes it runs and the most it will (a client sizes its
    concurrency by it: isolated grading holds two sandboxes per attempt while it grades)."""
    service = service_of(request)
    return reply(request, {"ok": True, "backend": service.backend.name, "sandboxes": len(service.registry.claimed()),
                           "max_sandboxes": service.settings.max_sandboxes, "shard": service.registry.shard})
