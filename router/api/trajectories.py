"""Handlers for the record: harness events, trajectories (live and stored) and artifacts in S3."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Protocol

from aiohttp import web

from artifacts.trajectory import MAX_EVENT_DEPTH
from grove.core import wire
from grove.core.errors import BadRequest, Invalid, NotFound
from grove.core.schema import parse
from router.api.appkeys import (
    caller_of,
    knows,
    project_of_record,
    service_of,
    storage_of,
    storage_of_sandbox,
    unknown_sandbox,
)
from router.api.datapath import read_capped
from router.api.events import check_event
from router.api.replies import reply
from router.models import EventsRequest, PushRequest


class TrajectoryReader(Protocol):
    """What the trajectory calls need of the archive."""

    def list(self, task_id: str | None = None, model: str | None = None, harness: str | None = None) -> list[Any]:
        """Summaries of stored trajectories, filtered."""

    def get(self, sandbox_id: str) -> dict[str, Any]:
        """One stored trajectory record."""


async def post_events(request: web.Request) -> web.Response:
    """POST /v1/sandboxes/{id}/events — append harness events; a ``result`` event sets the outcome."""
    service = service_of(request)
    record = service.registry.get(request.match_info["id"])
    try:
        body = wire.decode(await read_capped(request, service.settings.max_body_bytes), request.content_type)
    except RecursionError as exc:
        raise Invalid(f"event data nests deeper than {MAX_EVENT_DEPTH} levels") from exc
    if isinstance(body, dict) and "kind" in body and "events" not in body:
        body = {"events": [body]}  # one event on its own is fine too
    events = parse(EventsRequest, body)
    for index, event in enumerate(events.events):
        check_event(index, event.kind, event.data)
    service.touch(record)
    outcome = service.recorder.events(record, [{"kind": e.kind, "data": e.data} for e in events.events])
    return reply(request, {"id": record.id, "appended": len(events.events), "outcome": outcome})


async def get_live_trajectory(request: web.Request) -> web.Response:
    """GET /v1/sandboxes/{id}/trajectory — the record so far, while the sandbox lives."""
    service = service_of(request)
    record = service.registry.get(request.match_info["id"])
    return reply(request, await asyncio.to_thread(service.journal.record, record.id))


async def list_trajectories(request: web.Request) -> web.Response:
    """GET /v1/trajectories?task_id=&model=&harness= — the project's stored trajectories, from S3."""
    reader: TrajectoryReader = storage_of(request).trajectories
    q = request.query
    items = await asyncio.to_thread(reader.list, q.get("task_id"), q.get("model"), q.get("harness"))
    return reply(request, {"trajectories": items})


async def get_trajectory(request: web.Request) -> web.Response:
    """GET /v1/trajectories/{sandbox_id} — one trajectory, alive (from its journal) or stored."""
    return reply(request, await read_trajectory(request, request.match_info["sandbox_id"]))


async def read_trajectory(request: web.Request, sandbox_id: str) -> dict[str, Any]:
    """A trajectory the caller may see, alive (from its journal) or stored; NotFound as for any unknown id."""
    service = service_of(request)
    if service.journal.exists(sandbox_id):
        record = await asyncio.to_thread(service.journal.record, sandbox_id)
        if caller_of(request).may_see(project_of_record(record)):
            return record
        raise unknown_sandbox(sandbox_id)
    reader: TrajectoryReader = storage_of_sandbox(request, sandbox_id).trajectories
    try:
        return await asyncio.to_thread(reader.get, sandbox_id)
    except NotFound:
        if not knows(request, sandbox_id):  # nothing of it anywhere the caller may look: as any unknown id
            raise unknown_sandbox(sandbox_id) from None
        raise


async def post_artifacts(request: web.Request) -> web.Response:
    """POST /v1/sandboxes/{id}/artifacts {"paths": [...], "url_expires_s"?} — files to S3 via presigned URLs,
    indexed for listing; keys, sizes, sha256 and GET URLs back."""
    service = service_of(request)
    record = service.registry.get(request.match_info["id"])
    raw = await read_capped(request, service.settings.max_body_bytes)
    push = parse(PushRequest, wire.decode(raw, request.content_type))
    if not push.paths or not all(push.paths):
        raise BadRequest("'paths' must be a non-empty list of paths in the sandbox")
    service.touch(record)
    with service.recorder.faults(record, "pushing artifacts"):  # S3 or the executor failing is the environment's
        items = await service.pushes.push(record, push.paths, url_expires_s=push.url_expires_s)
    service.recorder.step(record, {"type": "artifacts", "t": time.time(), "items": items})
    return reply(request, {"artifacts": items})


