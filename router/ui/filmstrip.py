"""What the viewer shows of a sandbox's screen: a trajectory's filmstrip, the screenshots its steps stored, the
live screen.

The filmstrip is the record's computer steps (their outlines, as :mod:`router.ui.steps` makes them), each with
its screenshot named by hash; the page draws the click point, the drag path and the typed text over and under
it. A screenshot is served only as one of the record's own steps showed it, from the record's project's part
of the bucket, so a page can reach no image of another project's (nor one its record does not name).

The live screen is a *look*: the screen of a running sandbox now, for a page that polls it. It records no step,
starts no display, wakes no sleeping sandbox and keeps none awake (:func:`router.api.computer.call`'s
``look``): a sandbox without a screen running, or not running itself, answers 409 saying which.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

from aiohttp import web

from grove.core.errors import BadGateway, NotFound
from router.api.appkeys import project_of_record, service_of
from router.api.computer import call
from router.ui.api import record_of, sandbox_record, whole_number
from router.ui.steps import outline

FRAME_PAGE = 500
"""Computer steps per filmstrip request by default (the page asks for the rest a page at a time)."""
SHA_HEADER = "X-Grove-Screen-Sha256"
"""The live screen's hash, so a page polling it redraws only when the screen changed."""


def frames(record: dict[str, Any], offset: int, limit: int) -> dict[str, Any]:
    """The record's computer steps from the ``offset``-th on (at most ``limit``), as outlines."""
    steps = record.get("steps")
    steps = steps if isinstance(steps, list) else []
    found = [i for i, s in enumerate(steps) if isinstance(s, dict) and s.get("type") == "computer"]
    shown = found[offset : offset + limit]
    return {"total": len(found), "offset": offset, "frames": [outline(steps[i], i) for i in shown]}


def shows(record: dict[str, Any], sha: str) -> bool:
    """Whether one of the record's computer steps stored the screenshot ``sha``."""
    for step in record.get("steps") or []:
        if isinstance(step, dict) and step.get("type") == "computer":
            shot = step.get("screenshot")
            if isinstance(shot, dict) and shot.get("sha256") == sha and shot.get("stored") is not False:
                return True
    return False


async def filmstrip(request: web.Request) -> web.StreamResponse:
    """GET /ui/api/trajectories/{sandbox_id}/filmstrip?offset=&limit= — the record's computer steps, a page."""
    record, live = await record_of(request, request.match_info["sandbox_id"])
    offset = whole_number(request, "offset", 0, 0, 10**9)
    limit = whole_number(request, "limit", FRAME_PAGE, 0, 2000)
    body = await asyncio.to_thread(frames, record, offset, limit)
    body["live"] = live
    return web.json_response(body)


async def screenshot(request: web.Request) -> web.StreamResponse:
    """GET /ui/api/trajectories/{sandbox_id}/screenshots/{sha}?thumb=1 — a screenshot one of the record's steps
    stored (``thumb=1``: its thumbnail), as PNG."""
    record, _ = await record_of(request, request.match_info["sandbox_id"])
    sha = request.match_info["sha"]
    if not await asyncio.to_thread(shows, record, sha):
        raise NotFound(f"no screenshot {sha[:80]!r} in this trajectory: its steps name none by that hash")
    thumb = request.query.get("thumb") in ("1", "true")
    data = await service_of(request).screens.get(project_of_record(record), sha, thumb=thumb)
    return web.Response(body=data, content_type="image/png")


async def live_screen(request: web.Request) -> web.StreamResponse:
    """GET /ui/api/sandboxes/{id}/screen — the live sandbox's screen now, as PNG (a look: see the module)."""
    service = service_of(request)
    record = sandbox_record(request, request.match_info["id"])
    # One call that never starts a screen: a display that is not running (or died since) is the executor's 409.
    answer = await call(service, record, "GET", "/v1/display/screen", None, look=True)
    png = answer.get("png")
    if not isinstance(png, bytes):
        raise BadGateway("the executor's screenshot held no PNG")
    return web.Response(body=png, content_type="image/png", headers={SHA_HEADER: hashlib.sha256(png).hexdigest()})
