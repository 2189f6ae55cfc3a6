"""Computer use: ``POST /v1/sandboxes/{id}/computer``, the display, and the stored screenshots.

The action goes to the sandbox's executor (:mod:`executor.computer`), which answers with the screen after it
as PNG bytes and a thumbnail. The router stores both content-addressed (:mod:`router.trajectory.screens`),
records the step — the action, its arguments, the image's hash and keys, the cursor, how the screen settled —
and answers the client in JSON with the image in base64, the shape both vendors' tools return.
"""

from __future__ import annotations

import base64
import contextlib
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
from aiohttp import web

from artifacts.trajectory import MAX_EVENT_DEPTH, nests_deeper
from grove.core import wire
from grove.core.errors import BadGateway, BadRequest, Conflict, GroveError, UpstreamTimeout, error_from_body
from router.api.appkeys import project_of, sandbox_of, service_of
from router.api.datapath import read_capped
from router.backends.base import Endpoint
from router.lifecycle.service import SandboxService
from router.records.registry import SandboxRecord

MAX_ACTION_BODY = 1024 * 1024
CALL_TIMEOUT_S = 300.0
"""The longest action: a 60 s wait, 20,000 characters typed, and a minute's settle cap, with room to spare."""


async def computer_handler(request: web.Request) -> web.Response:
    """POST /v1/sandboxes/{id}/computer — one computer-use action, recorded with the screen after it."""
    raw = await read_capped(request, MAX_ACTION_BODY, "computer action")
    try:
        body = wire.decode(raw, request.content_type)
    except GroveError:
        raise
    except Exception as exc:
        raise BadRequest(f"the computer action is not valid JSON or msgpack: {exc}") from exc
    service = service_of(request)
    record = sandbox_of(request, request.match_info["id"])
    started = time.time()
    try:
        answer = await call(service, record, "POST", "/v1/computer", body)
    except GroveError as exc:
        service.recorder.step(record, _failed_step(body, exc, started))
        raise
    shot = answer.pop("screenshot")
    meta = service.screens.keep(record.id, record.project, shot["png"], shot["thumb"])
    meta.update(width=shot["width"], height=shot["height"])
    step: dict[str, Any] = {
        "type": "computer", "t": started, "duration_ms": round((time.time() - started) * 1000),
        "protocol": answer.get("protocol"), "schema": answer.get("schema"), "action": answer.get("action"),
        "args": answer.get("args"), "screenshot": meta, "cursor": answer.get("cursor"), "settle": answer.get("settle"),
    }
    if "region" in answer:
        step["region"] = answer["region"]
    service.recorder.step(record, step)
    reply = {
        "screenshot": {"media_type": "image/png", "data": base64.b64encode(shot["png"]).decode(),
                       "width": shot["width"], "height": shot["height"], "sha256": meta["sha256"]},
        "cursor": answer.get("cursor"), "settle": answer.get("settle"),
    }
    return web.json_response(reply)


async def display_handler(request: web.Request) -> web.Response:
    """GET or POST /v1/sandboxes/{id}/display — the screen's state; POST starts it (and a browser at a URL)."""
    service = service_of(request)
    record = sandbox_of(request, request.match_info["id"])
    body: Any = None
    if request.method == "POST":
        raw = await read_capped(request, MAX_ACTION_BODY, "display request")
        body = wire.decode(raw, request.content_type) if raw else {}
        if not isinstance(body, dict) or set(body) - {"browser"}:
            raise BadRequest("a display request is {} or {\"browser\": URL}")
        browser = body.get("browser")
        if browser is not None and not isinstance(browser, str):
            raise BadRequest("'browser' must be a URL")
    answer = await call(service, record, request.method, "/v1/display", body)
    if request.method == "POST":
        service.recorder.step(record, {"type": "display", "t": time.time(), "browser": (body or {}).get("browser"),
                                       "display": answer})
    return web.json_response(answer)


async def screenshot_handler(request: web.Request) -> web.Response:
    """GET /v1/screenshots/{sha} — a stored screenshot of the call's project (``?thumb=1``: its thumbnail)."""
    thumb = request.query.get("thumb") in ("1", "true")
    data = await service_of(request).screens.get(project_of(request), request.match_info["sha"], thumb=thumb)
    return web.Response(body=data, content_type="image/png",
                        headers={"Cache-Control": "private, max-age=31536000, immutable"})


async def call(service: SandboxService, record: SandboxRecord, method: str, path: str, body: Any, *,
               look: bool = False) -> dict[str, Any]:
    """One call to the sandbox's executor in msgpack (waking it if it sleeps); its answer, or its error raised.

    ``look``: the viewer looking at the screen, not a client using the sandbox. It wakes nothing (a sandbox
    that is not ready is a 409), moves neither the idle nor the heartbeat clock (a page left open must not
    keep an abandoned sandbox alive), and its failure is not recorded as one of the trajectory's faults."""
    busy = _looking(record) if look else service.calling(record)
    faults = contextlib.nullcontext() if look else service.recorder.faults(record, f"{method} {path}")
    with busy, faults:
        endpoint = _awake(record) if look else await service.endpoint(record)
        session, base = service.upstreams.session(endpoint)
        headers = service.upstreams.headers(endpoint, {"Accept": wire.MSGPACK, "Content-Type": wire.MSGPACK})
        data = wire.encode(body, True) if body is not None else None
        try:
            async with session.request(method, base + path, data=data, headers=headers,
                                       timeout=aiohttp.ClientTimeout(total=CALL_TIMEOUT_S)) as resp:
                raw = await resp.read()
                status, content_type = resp.status, resp.content_type
        except TimeoutError as exc:
            raise UpstreamTimeout(f"the sandbox did not answer {path} in {CALL_TIMEOUT_S:g}s") from exc
        except aiohttp.ClientError as exc:
            await service.lost(record)
            raise BadGateway(f"the sandbox's executor went away during {method} {path}: {exc}; it restarts on "
                             "the next call, its files kept") from exc
    decoded = wire.decode(raw, content_type) if raw else {}
    if status != 200:
        raise error_from_body(status, decoded)
    if not isinstance(decoded, dict):
        raise BadGateway(f"the executor answered {path} with a {type(decoded).__name__}, not an object")
    return decoded


@contextlib.contextmanager
def _looking(record: SandboxRecord) -> Iterator[None]:
    """A look in flight: the reaper leaves the sandbox running until it ends, and its clocks are not touched."""
    record.inflight += 1
    try:
        yield
    finally:
        record.inflight -= 1


def _awake(record: SandboxRecord) -> Endpoint:
    """The executor of a sandbox that runs now; Conflict, never a wake-up, otherwise."""
    endpoint = record.endpoint() if record.status == "ready" else None
    if endpoint is not None:
        return endpoint
    if record.status == "idle":
        raise Conflict(f"sandbox {record.id} is asleep (scaled to zero after its idle timeout); looking does not "
                       "wake it: its screen shows again after its next API call")
    raise Conflict(f"sandbox {record.id} is {record.status}: it has no screen to look at")


def _failed_step(body: Any, exc: GroveError, started: float) -> dict[str, Any]:
    """A refused or failed action is a step too: what was asked, and what was wrong."""
    asked = body if isinstance(body, dict) and not nests_deeper(body, MAX_EVENT_DEPTH) else {"body": repr(body)[:200]}
    name = asked.get("action", asked.get("type"))
    return {"type": "computer", "t": started, "action": name if isinstance(name, str) else None,
            "protocol": "anthropic" if "action" in asked else "openai" if "type" in asked else None,
            "args": {k: v for k, v in asked.items() if k not in ("action", "type")},
            "error": {"code": exc.code, "message": exc.message}, "status": exc.status}
