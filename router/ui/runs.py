"""Rollout runs for the viewer: the runs in S3 (``runs/<run_id>/``), one run's summary and groups, its plots.

A runner (``grove rollouts``) uploads ``summary.json``, ``groups.jsonl`` and its plots (``*.png``) there
through the router; the page reads them as data (the plots as images of the viewer's own origin).
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from aiohttp import web

from artifacts.store import ObjectStore
from grove.core.errors import BadRequest, NotFound
from router.api.appkeys import service_of
from router.api.runs import RUNS_PREFIX

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
MAX_GROUPS = 5000
"""Groups shown at most (a run of more lists the first ones and says so)."""


def _objects(request: web.Request) -> ObjectStore:
    return service_of(request).objects


def _name(value: str, what: str) -> str:
    if not _NAME.match(value):
        raise BadRequest(f"{what} {value!r} must be 1-128 of [A-Za-z0-9._-], starting with a letter or digit")
    return value


async def runs(request: web.Request) -> web.StreamResponse:
    """GET /ui/api/runs — the runs that have files in S3, by id."""
    prefixes = await asyncio.to_thread(_objects(request).prefixes, RUNS_PREFIX)
    return web.json_response({"runs": sorted(p[len(RUNS_PREFIX):].rstrip("/") for p in prefixes)})


async def run(request: web.Request) -> web.StreamResponse:
    """GET /ui/api/runs/{run_id} — the run's summary, its groups and the names of its plots."""
    run_id = _name(request.match_info["run_id"], "run id")
    objects = _objects(request)
    prefix = f"{RUNS_PREFIX}{run_id}/"
    files = [o.key[len(prefix):] for o in await asyncio.to_thread(objects.list, prefix)]
    if not files:
        raise NotFound(f"no files of run {run_id} in S3 (a runner uploads them when the run ends)")
    summary = await _json(objects, prefix + "summary.json") if "summary.json" in files else None
    groups: list[Any] = []
    if "groups.jsonl" in files:
        text = (await asyncio.to_thread(objects.get_bytes, prefix + "groups.jsonl")).decode("utf-8", "replace")
        groups = [json.loads(line) for line in text.splitlines()[:MAX_GROUPS] if line.strip()]
    plots = sorted(f for f in files if f.endswith(".png") and _NAME.match(f))
    return web.json_response({"run_id": run_id, "files": sorted(files), "summary": summary, "groups": groups,
                              "groups_cut": len(groups) >= MAX_GROUPS, "plots": plots})


async def plot(request: web.Request) -> web.StreamResponse:
    """GET /ui/api/runs/{run_id}/plots/{name} — one of the run's PNG plots."""
    run_id = _name(request.match_info["run_id"], "run id")
    name = _name(request.match_info["name"], "file name")
    if not name.endswith(".png"):
        raise BadRequest(f"{name!r} is not a plot (.png)")
    data = await asyncio.to_thread(_objects(request).get_bytes, f"{RUNS_PREFIX}{run_id}/{name}")
    if not data.startswith(b"\x89PNG\r\n\x1a\n"):  # served as an image only if it is one
        raise BadRequest(f"{name!r} is not a PNG image")
    return web.Response(body=data, content_type="image/png")


async def _json(objects: Any, key: str) -> Any:
    try:
        return json.loads(await asyncio.to_thread(objects.get_bytes, key))
    except ValueError as exc:
        raise BadRequest(f"{key} is not JSON: {exc}") from None
