"""The router's housekeeper of what it stores: a report of what each project holds, collection passes (on request,
and every ``gc_interval_h`` hours from a task started with the service), and the stored-bytes figure a
``stored_bytes`` quota reads.

A pass removes, per project, what is older than the project's ``retention_days`` (``<state>/projects/<name>.json``)
and owned by nothing live (:mod:`router.housekeeping.collect`); on the local backend it also removes the image
layers and retired images no image and no sandbox uses (:mod:`router.backends.local.image_gc`).

Beside it, the bucket may have S3 lifecycle rules (``grove up --artifact-retention-days`` and
``--trajectory-retention-days``, :mod:`artifacts.retention`): the S3 server expires objects by their age since
written, under the top-level prefixes ``artifacts/``, ``index/artifacts/``, ``trajectories/`` and ``index/by-``
— that is, the default project's keys only (another project's live under ``projects/<name>/``) — knowing nothing
of live sandboxes, of which record names which artifact, or of run files. Both may be on; for the default
project the shorter wins. Project retention is the one that is per project and never takes what a live
sandbox still owns.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from typing import Any
from urllib.parse import unquote

from artifacts import catalog
from artifacts.spool import SUFFIX
from grove.core.errors import GroveError, Invalid
from router.auth import key_projects
from router.backends.base import Backend
from router.backends.local.image_gc import HostImages, Piece, host_images
from router.housekeeping.collect import Live, by_kind, cutoff, plan, remove
from router.housekeeping.kinds import KINDS, Item
from router.housekeeping.scan import EntryCache, Holdings, scan
from router.housekeeping.usage import StorageUsage
from router.projects.files import ProjectFiles
from router.projects.model import DEFAULT, check_name
from router.records.registry import Registry
from router.settings import RouterSettings
from router.storage import Storage
from router.trajectory.journal import Journal

log = logging.getLogger("grove.router")
HOUR_S = 3600.0
FIRST_PASS_S = 600.0
"""The first scheduled pass comes this long after the start at the latest (a router restarted more often than
``gc_interval_h`` still collects)."""
PROJECTS_PREFIX = "projects/"
"""Where the parts of the bucket of projects other than the default are (``router.projects.model.object_prefix``)."""


class Housekeeping:
    """Reports and collects what the router stores; one scan or pass at a time."""

    def __init__(self, settings: RouterSettings, storage: Storage, registry: Registry, journal: Journal,
                 projects: ProjectFiles, backend: Backend) -> None:
        self._settings = settings
        self._storage = storage
        self._registry = registry
        self._journal = journal
        self._projects = projects
        self.images: HostImages | None = host_images(backend, settings.layout)
        """The backend's images on this host (None: it keeps none here)."""
        self.usage = StorageUsage(self._measure_soon)
        """Per project, its stored bytes as last measured (for a ``stored_bytes`` quota)."""
        self._caches: dict[str, EntryCache] = {}
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._measuring: dict[str, asyncio.Task[None]] = {}
        self._stop = threading.Event()
        """Set at close: a pass removing in a worker thread stops after the item it is at."""

    # -- the scheduled pass ----------------------------------------------------------------------------

    def start(self) -> None:
        """Start the scheduled passes (none with ``gc_interval_h`` 0)."""
        if self._settings.gc_interval_h > 0:
            self._task = asyncio.create_task(self._forever())

    async def close(self) -> None:
        """Stop the scheduled passes and any measurement (a pass cut off leaves the rest for the next)."""
        self._stop.set()
        for task in [t for t in (self._task, *self._measuring.values()) if t is not None]:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _forever(self) -> None:
        interval = self._settings.gc_interval_h * HOUR_S
        delay = min(interval, FIRST_PASS_S)
        while True:
            await asyncio.sleep(delay)
            delay = interval
            try:
                await self.collect(await self.known_projects(), dry_run=False, host=True, why="scheduled")
            except GroveError as exc:
                log.warning("storage gc (scheduled) failed, the next pass tries again: %s", exc.message)
            except Exception:
                log.exception("storage gc (scheduled) failed, the next pass tries again")

    # -- what there is -----------------------------------------------------------------------------------

    async def known_projects(self) -> list[str]:
        """Every project found: defined, named by a key, holding a live sandbox, a spool or part of the bucket."""
        names = {DEFAULT, *self._projects.all(), *(record.project for record in self._registry.live())}
        names |= await asyncio.to_thread(self._found_outside)
        return sorted(names)

    def _found_outside(self) -> set[str]:
        names = key_projects(self._settings.state_dir) | set(self._storage.spooled_projects())
        for prefix in self._storage.objects.prefixes(PROJECTS_PREFIX):
            with contextlib.suppress(Invalid):  # not a project's: left to whoever wrote it
                names.add(check_name(prefix[len(PROJECTS_PREFIX):].rstrip("/")))
        return names

    async def report(self, projects: list[str], *, host: bool) -> dict[str, Any]:
        """What each of ``projects`` holds (and, with ``host``, the images on this host)."""
        shown = []
        async with self._lock:
            for project in projects:
                holdings = await asyncio.to_thread(scan, project, self._storage.of(project), self._cache(project))
                self.usage.record(project, holdings.bytes())
                shown.append(self._shown(holdings))
            images = await asyncio.to_thread(self.images.survey) if host and self.images is not None else None
        return {"projects": shown, "kinds": {kind.name: kind.doc for kind in KINDS},
                "host": None if images is None else {"images": _image_totals(images)}}

    def _shown(self, holdings: Holdings) -> dict[str, Any]:
        return {"project": holdings.project, "retention_days": self._projects.get(holdings.project).retention_days,
                "kinds": holdings.totals(), "stored_bytes": holdings.bytes(), "spooled": holdings.spooled,
                "scanned_at": holdings.scanned_at, "scan_s": round(holdings.took_s, 3)}

    # -- collection ----------------------------------------------------------------------------------------

    async def collect(self, projects: list[str], *, dry_run: bool, host: bool, now: float | None = None,
                      why: str = "by request") -> dict[str, Any]:
        """One pass over ``projects`` (and, with ``host``, this host's images): what it removed, or with
        ``dry_run`` what it would remove (nothing is touched then)."""
        started = time.monotonic()
        results = []
        async with self._lock:
            for project in projects:
                results.append(await self._collect_one(project, dry_run, now))
            images = None
            if host and self.images is not None:
                images = await asyncio.to_thread(self._images_pass, self.images, dry_run)
        freed = sum(r["bytes_freed"] for r in results) + sum(p.bytes for p in images or ())
        result = {"dry_run": dry_run, "projects": results, "bytes_freed": freed,
                  "host": None if images is None else {"images": _image_list(images)},
                  "took_s": round(time.monotonic() - started, 3)}
        if not dry_run:
            _log_pass(result, why)
        return result

    async def _collect_one(self, project: str, dry_run: bool, now: float | None) -> dict[str, Any]:
        retention = self._projects.get(project).retention_days
        if retention is None:  # kept for ever: nothing to look at (a large default project is not listed for it)
            return {"project": project, "retention_days": None, "cutoff": None, "removed": by_kind(()),
                    "bytes_freed": 0, "stored_bytes": None, "kept_live": {"items": 0, "bytes": 0}, "error": None}
        records = self._registry.live()  # taken before the listing: whatever is made later is not listed
        sandboxes = frozenset(record.id for record in records)
        runs = frozenset(run for record in records if (run := record.request.metadata.labels.get(catalog.RUN_LABEL)))
        storage, cache = self._storage.of(project), self._cache(project)

        def work() -> tuple[Holdings, list[Item], list[Item], str | None, float]:
            live = Live(sandboxes | self._journal.ids() | _spooled(storage), runs)
            holdings = scan(project, storage, cache)
            at = time.time() if now is None else now
            chosen = plan(holdings, retention, at, live)
            removed, error = (chosen.doomed, None) if dry_run else remove(storage.objects, chosen.doomed, self._stop)
            return holdings, removed, chosen.kept_live, error, at

        holdings, removed, kept, error, at = await asyncio.to_thread(work)
        freed = sum(item.bytes for item in removed)
        stored = holdings.bytes() - (0 if dry_run else freed)
        self.usage.record(project, stored)
        return {"project": project, "retention_days": retention, "cutoff": cutoff(at, retention),
                "removed": by_kind(removed), "bytes_freed": freed, "stored_bytes": stored,
                "kept_live": {"items": len(kept), "bytes": sum(item.bytes for item in kept)}, "error": error}

    @staticmethod
    def _images_pass(images: HostImages, dry_run: bool) -> list[Piece]:
        return [piece for piece in images.survey() if not piece.used] if dry_run else images.collect()

    # -- the stored-bytes figure --------------------------------------------------------------------------

    def _measure_soon(self, project: str) -> None:
        """Measure ``project``'s stored bytes in the background (asked by :class:`StorageUsage`)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # asked from a worker thread: the next ask from the loop measures
            return
        if project not in self._measuring:
            task = loop.create_task(self._measure(project))
            self._measuring[project] = task
            task.add_done_callback(lambda _: self._measuring.pop(project, None))

    async def _measure(self, project: str) -> None:
        try:
            async with self._lock:
                holdings = await asyncio.to_thread(scan, project, self._storage.of(project), self._cache(project))
        except GroveError as exc:
            log.warning("measuring what project %s stores failed: %s", project, exc.message)
            return
        self.usage.record(project, holdings.bytes())

    def _cache(self, project: str) -> EntryCache:
        return self._caches.setdefault(project, EntryCache())


def _spooled(storage: Storage) -> frozenset[str]:
    """The sandboxes whose records wait in a project's spool."""
    return frozenset(unquote(path.name.removesuffix(SUFFIX)) for path in storage.trajectories.spool.files())


def _image_totals(pieces: list[Piece]) -> dict[str, int]:
    unused = [piece for piece in pieces if not piece.used]
    return {"pieces": len(pieces), "bytes": sum(p.bytes for p in pieces),
            "unused": len(unused), "unused_bytes": sum(p.bytes for p in unused)}


def _image_list(pieces: list[Piece]) -> dict[str, Any]:
    return {"count": len(pieces), "bytes": sum(p.bytes for p in pieces),
            "removed": [{"id": p.id, "bytes": p.bytes} for p in pieces]}


def _log_pass(result: dict[str, Any], why: str) -> None:
    """One line for the pass (the router's log keeps one line per kind of message per interval: a line per
    project would lose all but the first): what went from which project, and from the images. A pass that
    removed something says so as a warning, the level the router's log keeps (data went)."""
    parts = []
    for project in result["projects"]:
        kinds = [f"{name} {total['count']} ({owners(total['items'], name)})"
                 for name, total in project["removed"].items() if total["items"]]
        if kinds:
            parts.append(f"project {project['project']}: removed {', '.join(kinds)} past "
                         f"{project['retention_days']:g} day(s), {human_bytes(project['bytes_freed'])}")
        if project["error"]:
            parts.append(f"project {project['project']}: stopped by {project['error']} (the next pass tries again)")
    images = (result["host"] or {}).get("images")
    if images and images["count"]:
        parts.append(f"images: removed {images['count']} layer(s) and retired image(s) nothing uses, "
                     f"{human_bytes(images['bytes'])}")
    summary = f"{human_bytes(result['bytes_freed'])} freed, {len(result['projects'])} project(s), {result['took_s']}s"
    (log.warning if parts else log.info)("storage gc (%s): %s", why, "; ".join([*parts, summary]))


def owners(count: int, kind: str) -> str:
    """``1 sandbox``, ``2 runs``: what ``count`` items of a kind belong to."""
    noun = "run" if kind == "runs" else "sandbox"
    return f"{count} {noun}{'' if count == 1 else 'es' if noun == 'sandbox' else 's'}"


def human_bytes(size: int) -> str:
    """``1.5 MiB`` and the like."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"
