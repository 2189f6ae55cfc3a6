"""Handlers of ``/v1/storage``: what each project stores, and collecting what is past its retention (the rules
are :mod:`router.housekeeping`'s; this only translates).

A member key sees and collects its own project only; an admin key acts in its project (or the one
``X-Grove-Project`` names), and with ``X-Grove-Project: *`` in every project found — then with this host's
image layers too.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from grove.core.schema import parse, spec
from router.api.appkeys import caller_of, service_of, visible_projects
from router.api.replies import reply
from router.api.sandboxes import read_body


@dataclass(frozen=True)
class GcRequest:
    """A collection pass: what is older than its project's ``retention_days`` and owned by nothing live."""

    dry_run: bool = spec("true: only say what would be removed; false: remove it (there is no default: "
                         "say which)")


async def _projects(request: web.Request) -> tuple[list[str], bool]:
    """The projects this call covers, and whether it covers every one (an admin's ``*``)."""
    shown = visible_projects(request)
    if shown is None:
        return await service_of(request).housekeeping.known_projects(), True
    return sorted(shown), False


async def storage_report(request: web.Request) -> web.Response:
    """GET /v1/storage — per project: trajectories, pushed files, full outputs and run files (count, bytes),
    records waiting in the spool; for an admin, this host's image layers and how much of them nothing uses."""
    projects, _ = await _projects(request)
    keeper = service_of(request).housekeeping
    return reply(request, await keeper.report(projects, host=caller_of(request).admin))


async def storage_gc(request: web.Request) -> web.Response:
    """POST /v1/storage/gc {"dry_run"} — what was (or would be) removed per project and kind, and bytes freed."""
    body = parse(GcRequest, await read_body(request))
    projects, everything = await _projects(request)
    keeper = service_of(request).housekeeping
    return reply(request, await keeper.collect(projects, dry_run=body.dry_run, host=everything))
