"""The JSON the viewer's pages fetch (session cookie, not bearer key; not part of the /v1 API or its spec).

Trajectories come in pieces so a record of thousands of steps opens at once: the header with the record's
phases (:mod:`router.ui.phases`) and a page of step outlines (:mod:`router.ui.steps`; of one phase, for
comparing), then each output when the reader expands it, a file step's whole text or diff when asked
(:mod:`router.ui.files`), and a truncated output's full text through a short-lived presigned GET of the
object the router stored for it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from aiohttp import web

from artifacts import trajectory as tj
from artifacts.catalog import ARTIFACT_PREFIX
from grove.core.errors import BadRequest, GroveError, NotFound
from router.api.appkeys import (
    caller_of,
    in_view,
    knows,
    project_of,
    project_of_sandbox,
    service_of,
    storage_of,
    storage_of_sandbox,
    unknown_sandbox,
)
from router.records.registry import SAFE_ID_RE, SandboxRecord
from router.ui.files import is_file_step, views
from router.ui.phases import PHASES
from router.ui.search import Query, Summaries, search
from router.ui.steps import STREAMS, page, plain
from router.ui.steps import output as step_output
from router.ui.trajectories import TrajectoryCache, load
from router.ui.trajectories import raw as raw_record

TRAJECTORIES = web.AppKey("ui_trajectories", TrajectoryCache)
SUMMARIES = web.AppKey("ui_summaries", Summaries)
STEP_PAGE = 250
"""Step outlines per request by default (the page asks for more as the reader scrolls on)."""
PRESIGN_S = 300.0
"""How long a full-output link the viewer hands out stays valid."""


def whole_number(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    """A query parameter that is a whole number from ``low`` to ``high`` (``default`` when absent)."""
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(f"{name} must be a whole number, got {raw!r}") from None
    if not low <= value <= high:
        raise BadRequest(f"{name} must be between {low} and {high}, got {value}")
    return value


_LIVE = ("status", "ready_at", "ended_at", "end_reason", "error", "last_activity")


def _as_recorded(request: web.Request, record: SandboxRecord) -> dict[str, Any]:
    """A live sandbox in the shape of a trajectory record's ``sandbox`` (what the recorder writes), with its
    live state: the viewer's pages read one shape, live or stored."""
    public = record.public()
    return {**service_of(request).recorder.metadata(record), **{k: public[k] for k in _LIVE}}


async def sandboxes(request: web.Request) -> web.StreamResponse:
    """GET /ui/api/sandboxes — every live sandbox of the session's project, newest first, with the router's
    clock."""
    live = [r for r in service_of(request).registry.claimed() if in_view(request, r.project)]
    live.sort(key=lambda r: r.created_at, reverse=True)
    return web.json_response({"now": time.time(), "sandboxes": [_as_recorded(request, r) for r in live]})


def sandbox_record(request: web.Request, sandbox_id: str) -> SandboxRecord:
    """A sandbox the router knows (live, or just after its end) that the caller may see; NotFound as for an
    unknown id otherwise."""
    registry = service_of(request).registry
    found = registry.lookup(sandbox_id)
    if found is None:
        registry.get(sandbox_id)  # the right NotFound (unknown, or gone)
        raise unknown_sandbox(sandbox_id)
    if not caller_of(request).may_see(found.project):
        raise unknown_sandbox(sandbox_id)
    return found


async def sandbox(request: web.Request) -> web.StreamResponse:
    """GET /ui/api/sandboxes/{id} — one sandbox (also just after its end, while the router remembers it)."""
    found = sandbox_record(request, request.match_info["id"])
    return web.json_response({"now": time.time(), "sandbox": _as_recorded(request, found)})


async def delete_sandbox(request: web.Request) -> web.StreamResponse:
    """POST /ui/api/sandboxes/{id}/delete — delete it (the guard checked the CSRF token)."""
    record = await service_of(request).delete(request.match_info["id"], reason="deleted from the viewer")
    return web.json_response({"sandbox": _as_recorded(request, record)})


async def trajectories(request: web.Request) -> web.StreamResponse:
    """GET /ui/api/trajectories?task_id=&model=&harness=&outcome=&run_id=&date_from=&date_to=&after=&limit="""
    q = request.query
    objects = storage_of(request).objects

    def text(name: str) -> str | None:
        value = q.get(name, "").strip()
        return value or None

    query = Query(task_id=text("task_id"), model=text("model"), harness=text("harness"), outcome=text("outcome"),
                  run_id=text("run_id"), date_from=text("date_from"), date_to=text("date_to"), after=text("after"),
                  limit=whole_number(request, "limit", 50, 1, 500)).check()
    summaries = request.app[SUMMARIES]
    return web.json_response(await asyncio.to_thread(search, objects, query, summaries, project_of(request)))


async def record_of(request: web.Request, sandbox_id: str) -> tuple[dict[str, Any], bool]:
    """A sandbox's record and whether it is live, if the caller may see it: its project's (the router's
    lookup, else the caller's part of the bucket); another project's answers as one that never was."""
    project = project_of_sandbox(request, sandbox_id)
    try:
        return await load(service_of(request), request.app[TRAJECTORIES], caller_of(request), project, sandbox_id)
    except NotFound:
        if not knows(request, sandbox_id):  # nothing of it anywhere the caller may look: as any unknown id
            raise unknown_sandbox(sandbox_id) from None
        raise


async def _record(request: web.Request) -> tuple[dict[str, Any], bool]:
    return await record_of(request, request.match_info["sandbox_id"])


async def page_status(request: web.Request, sandbox_id: str, *, trajectory: bool) -> int:
    """The status of a page about a sandbox: 200 if its data call would answer (the sandbox, or with
    ``trajectory`` its record), else that call's error status — 404 for another project's sandbox and an
    unknown one alike. The page's script shows the reason."""
    if not SAFE_ID_RE.fullmatch(sandbox_id):
        return 404
    try:
        if trajectory:
            await record_of(request, sandbox_id)
        else:
            sandbox_record(request, sandbox_id)
    except GroveError as exc:
        return exc.status
    return 200


def _step(record: dict[str, Any], request: web.Request) -> Any:
    all_steps = record.get("steps") or []
    index = _index(request.match_info["n"])
    if index >= len(all_steps):
        raise NotFound(f"the trajectory has {len(all_steps)} steps; there is no step {index}")
    return all_steps[index]


def _index(raw: str) -> int:
    if not raw.isdigit():
        raise BadRequest(f"a step number is a whole number, got {raw!r}")
    return int(raw)


def _stream(request: web.Request) -> str:
    stream = request.match_info["stream"]
    if stream not in STREAMS:
        raise BadRequest(f"stream must be stdout or stderr, got {stream!r}")
    return stream


async def trajectory(request: web.Request) -> web.StreamResponse:
    """GET /ui/api/trajectories/{sandbox_id}?offset=&limit=&phase= — the header, the phases, and one page of
    step outlines (of one phase: setup, agent or grading, when asked; ``limit=0``: the header alone)."""
    record, live = await _record(request)
    offset = whole_number(request, "offset", 0, 0, 10**9)
    limit = whole_number(request, "limit", STEP_PAGE, 0, 2000)
    phase = request.query.get("phase") or None
    if phase is not None and phase not in PHASES:
        raise BadRequest(f"phase must be one of {', '.join(PHASES)}, got {phase!r}")
    # Diffs of a page's file writes take a moment on a large record: off the event loop.
    body = await asyncio.to_thread(page, record, offset, limit, phase)
    body["live"] = live
    return web.json_response(body)


async def step(request: web.Request) -> web.StreamResponse:
    """GET /ui/api/trajectories/{sandbox_id}/steps/{n} — one step whole (outputs apart), e.g. a long message."""
    record, _ = await _record(request)
    found = _step(record, request)
    whole = {k: v for k, v in found.items() if k not in STREAMS} if isinstance(found, dict) else found
    return web.json_response(plain(whole))


async def file_view(request: web.Request) -> web.StreamResponse:
    """GET /ui/api/trajectories/{sandbox_id}/steps/{n}/file — a file step's whole text or diff (an outline has
    its first lines)."""
    record, _ = await _record(request)
    found = _step(record, request)
    if not is_file_step(found):
        raise NotFound(f"step {request.match_info['n']} is not a file read or write")
    index = _index(request.match_info["n"])
    shown = await asyncio.to_thread(views, record["steps"], [index], whole=True)
    return web.json_response(shown[index])


async def output(request: web.Request) -> web.StreamResponse:
    """GET /ui/api/trajectories/{sandbox_id}/steps/{n}/{stream} — one output, as text."""
    record, _ = await _record(request)
    return web.json_response(step_output(_step(record, request), _stream(request)))


async def full_output(request: web.Request) -> web.StreamResponse:
    """GET /ui/api/trajectories/{sandbox_id}/steps/{n}/{stream}/full — 303 to a presigned GET of the full text."""
    sandbox_id = request.match_info["sandbox_id"]
    record, _ = await _record(request)
    found = _step(record, request)
    stream = _stream(request)
    key = found.get(f"{stream}_artifact") if isinstance(found, dict) else None
    # The step's fields are partly the executor's answer (hostile): a record links only its own sandbox's
    # outputs, in its own project's part of the bucket.
    if not isinstance(key, str) or not key.startswith(f"{ARTIFACT_PREFIX}{sandbox_id}/"):
        raise NotFound(f"this step's {stream} was not truncated: the page has all of it")
    objects = storage_of_sandbox(request, sandbox_id).objects
    if not await asyncio.to_thread(objects.exists, key):
        raise NotFound(f"the full {stream} is not in S3 (yet): the router stores it in the background, "
                       "or the sandbox was deleted before it could")
    url = await asyncio.to_thread(objects.presign_get, key, PRESIGN_S)
    return web.Response(status=303, headers={"Location": url})


async def raw(request: web.Request) -> web.StreamResponse:
    """GET /ui/api/trajectories/{sandbox_id}/raw — the record as msgpack, as a download."""
    sandbox_id = request.match_info["sandbox_id"]
    await _record(request)  # whose it is, checked
    data = await raw_record(service_of(request), storage_of_sandbox(request, sandbox_id), sandbox_id)
    name = f"{tj.segment(sandbox_id)}.msgpack"
    return web.Response(body=data, content_type="application/msgpack",
                        headers={"Content-Disposition": f'attachment; filename="{name}"'})
