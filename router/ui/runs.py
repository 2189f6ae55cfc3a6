"""Rollout runs for the viewer: the runs in S3 (``runs/<run_id>/``) with their figures, one run's summary and
groups, its plots.

A runner (``grove rollouts``) uploads ``summary.json``, ``groups.jsonl`` and its plots (``*.png``) there
through the router; the page reads them as data (the plots as images of the viewer's own origin).
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections import OrderedDict, defaultdict
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiohttp import web

from artifacts.store import ObjectInfo, ObjectStore
from artifacts.trajectory import RUNS_PREFIX
from grove.core.errors import BadRequest, NotFound
from router.api.appkeys import project_of, storage_of
from router.projects.model import DEFAULT

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
MAX_GROUPS = 5000
"""Groups shown at most (a run of more lists the first ones and says so)."""
MAX_RUNS = 500
"""Runs listed at most, the most recently uploaded first (their files are read for the list)."""
_READERS = 8
_LISTED_FILES = ("run.json", "summary.json")


class RunFiles:
    """The run files the list has read, parsed, by project, key and etag: a run's files change only when a
    runner uploads them again (a new etag), and the list reads the same ones each time it is opened. Bounded.
    Two projects' runs of one id have the same keys: the project keeps one's file from being another's."""

    def __init__(self, size: int = 4 * MAX_RUNS) -> None:
        self._size = size
        self._items: OrderedDict[tuple[str, str, str | None], Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, project: str, objects: ObjectStore, info: ObjectInfo) -> Any:
        """The file's JSON, or None if it is not JSON (a run's files are a runner's upload: data, not trusted);
        ``objects`` is ``project``'s part of the bucket."""
        ident = (project, info.key, info.etag)
        with self._lock:
            if ident in self._items:
                self._items.move_to_end(ident)
                return self._items[ident]
        try:
            value = json.loads(objects.get_bytes(info.key))
        except (ValueError, NotFound):
            value = None
        with self._lock:
            self._items[ident] = value
            while len(self._items) > self._size:
                self._items.popitem(last=False)
        return value


RUN_FILES = web.AppKey("ui_run_files", RunFiles)


def run_rows(objects: ObjectStore, cache: RunFiles, project: str = DEFAULT) -> list[dict[str, Any]]:
    """One row per run under ``runs/`` of ``objects``, ``project``'s part of the bucket: newest upload first, the
    first :data:`MAX_RUNS` (+1) read."""
    by_run: dict[str, dict[str, ObjectInfo]] = defaultdict(dict)
    for info in objects.list(RUNS_PREFIX):
        run_id, _, name = info.key[len(RUNS_PREFIX):].partition("/")
        if _NAME.match(run_id) and name:
            by_run[run_id][name] = info
    recent = sorted(by_run, key=lambda r: (max(i.last_modified or 0 for i in by_run[r].values()), r), reverse=True)
    recent = recent[: MAX_RUNS + 1]
    wanted = [by_run[r][name] for r in recent for name in _LISTED_FILES if name in by_run[r]]
    with ThreadPoolExecutor(_READERS) as pool:
        parsed = pool.map(lambda i: cache.get(project, objects, i), wanted)
        read = dict(zip((i.key for i in wanted), parsed, strict=True))
    rows = [_row(r, by_run[r], read.get(f"{RUNS_PREFIX}{r}/run.json"), read.get(f"{RUNS_PREFIX}{r}/summary.json"))
            for r in recent]
    return sorted(rows, key=lambda row: (row["date"] or 0, row["run_id"]), reverse=True)


def _row(run_id: str, files: dict[str, ObjectInfo], run: Any, summary: Any) -> dict[str, Any]:
    """A run's line in the list; what its files do not say is None."""
    run = run if isinstance(run, dict) else {}
    summary = summary if isinstance(summary, dict) else {}
    created = run.get("created_at")
    uploaded = [i.last_modified for i in files.values() if i.last_modified is not None]
    raw = summary.get("variants")
    variants = [v for v in raw if isinstance(v, dict)] if isinstance(raw, list) else []
    harnesses = [" ".join(x for x in (_text(v.get("harness")), _text(v.get("harness_version"))) if x)
                 for v in variants]
    models = [_text(v.get("model")) or "" for v in variants]
    scored_each = [_count(v.get("scored")) or 0 for v in variants]
    passed_each = [_count(v.get("passed")) or 0 for v in variants]
    scored, passed = sum(scored_each), sum(passed_each)
    listed = [{"harness": h, "model": m, "scored": n, "passed": p}
              for h, m, n, p in zip(harnesses, models, scored_each, passed_each, strict=True)]
    tasks = summary.get("tasks")
    return {
        "run_id": run_id,
        # When the run started (run.json); a run without one, when its first file was uploaded.
        "date": created if _is_number(created) else (min(uploaded) if uploaded else None),
        "summary": bool(summary),
        "variants": listed,
        "harnesses": _unique(harnesses),
        "models": _unique(models),
        "tasks": len(tasks) if isinstance(tasks, dict) else None,
        "attempts": _count(summary.get("attempts")),
        "scored": scored if variants else None,
        "passed": passed if variants else None,
        "pass_rate": round(passed / scored, 4) if scored else None,
    }


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _text(value: Any) -> str | None:
    return value[:200] if isinstance(value, str) and value else None


def _unique(values: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(v for v in values if v))


def _objects(request: web.Request) -> ObjectStore:
    return storage_of(request).objects


def _name(value: str, what: str) -> str:
    if not _NAME.match(value):
        raise BadRequest(f"{what} {value!r} must be 1-128 of [A-Za-z0-9._-], starting with a letter or digit")
    return value


async def runs(request: web.Request) -> web.StreamResponse:
    """GET /ui/api/runs — the runs that have files in S3, newest first: when each started, its harnesses and
    models, how many tasks and attempts, and its pass rate (from the run's ``run.json`` and ``summary.json``)."""
    rows = await asyncio.to_thread(run_rows, _objects(request), request.app[RUN_FILES], project_of(request))
    return web.json_response({"runs": rows[:MAX_RUNS], "cut": len(rows) > MAX_RUNS})


async def page_status(request: web.Request) -> int:
    """The status of a run's page: 200 if the run has files in the session's project, 404 as for a run that
    never was otherwise (another project's runs are not there), 400 for what cannot be a run id."""
    try:
        prefix = f"{RUNS_PREFIX}{_name(request.match_info['run_id'], 'run id')}/"
    except BadRequest as exc:
        return exc.status
    files = await asyncio.to_thread(_objects(request).list, prefix)
    return 200 if files else 404


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
