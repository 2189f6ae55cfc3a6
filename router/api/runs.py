"""Rollout runs' files in S3 (``runs/<run_id>/<name>``, in the project's part of the bucket): results, summaries,
reports and plots that a runner uploads next to the trajectories, through the router so S3 credentials never
leave it."""

from __future__ import annotations

import asyncio
import re
from typing import Any

from aiohttp import web

from artifacts.trajectory import RUNS_PREFIX
from grove.core.errors import BadRequest
from router.api.appkeys import project_of, service_of, storage_of
from router.api.replies import reply

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_TYPES = {".json": "application/json", ".jsonl": "application/x-ndjson", ".md": "text/markdown",
          ".png": "image/png"}


def _names(request: web.Request) -> tuple[str, str | None]:
    run_id, name = request.match_info["run_id"], request.match_info.get("name")
    for what, value in (("run id", run_id), ("file name", name)):
        if value is not None and not _NAME.match(value):
            raise BadRequest(f"{what} {value!r} must be 1-128 of [A-Za-z0-9._-], starting with a letter or digit")
    return run_id, name


def _store(request: web.Request) -> Any:
    """The call's project's part of the bucket: a run's files are its project's (``runs/`` under it)."""
    return storage_of(request).objects


async def put_run_file(request: web.Request) -> web.Response:
    """PUT /v1/runs/{run_id}/files/{name} — store one file of a run (the body, as is)."""
    run_id, name = _names(request)
    assert name is not None
    data = await request.read()
    key = f"{RUNS_PREFIX}{run_id}/{name}"
    suffix = name[name.rfind("."):] if "." in name else ""
    await asyncio.to_thread(_store(request).put_bytes, key, data, _TYPES.get(suffix, "application/octet-stream"))
    service_of(request).housekeeping.usage.add(project_of(request), len(data))  # the stored_bytes quota
    return reply(request, {"key": key, "size": len(data)}, status=201)


async def list_run_files(request: web.Request) -> web.Response:
    """GET /v1/runs/{run_id}/files — the run's stored files."""
    run_id, _ = _names(request)
    items = await asyncio.to_thread(_store(request).list, f"{RUNS_PREFIX}{run_id}/")
    return reply(request, {"files": [{"key": i.key, "size": i.size} for i in items]})


async def get_run_file(request: web.Request) -> web.Response:
    """GET /v1/runs/{run_id}/files/{name} — one stored file's bytes."""
    run_id, name = _names(request)
    data = await asyncio.to_thread(_store(request).get_bytes, f"{RUNS_PREFIX}{run_id}/{name}")
    return web.Response(body=data, content_type="application/octet-stream")
