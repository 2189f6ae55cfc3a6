"""``POST /v1/trajectories/{sandbox_id}/replay``: a stored trajectory re-run in a fresh sandbox, step by step compared
(:mod:`router.lifecycle.replay`, rules in :mod:`artifacts.replay`)."""

from __future__ import annotations

from aiohttp import web

from grove.core import wire
from grove.core.schema import parse
from router.api.appkeys import project_of, service_of
from router.api.datapath import read_capped
from router.api.replies import reply
from router.api.trajectories import read_trajectory
from router.lifecycle.replay import Replayer, ReplayRequest


async def replay_trajectory(request: web.Request) -> web.Response:
    """Replay the trajectory (``{"until"?, "env"?, "volatile"?, "keep"?}``); the report, the kept sandbox's id in it.
    409 if the image it ran on is gone or changed."""
    service = service_of(request)
    raw = await read_capped(request, service.settings.max_body_bytes)
    req = parse(ReplayRequest, wire.decode(raw, request.content_type) if raw else {})
    record = await read_trajectory(request, request.match_info["sandbox_id"])
    report = await Replayer(service).replay(record, req, project_of(request))
    return reply(request, report)
