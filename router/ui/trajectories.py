"""Where the viewer reads a trajectory: the live journal while the sandbox runs, else the archive in S3.

A stored record is immutable once its sandbox has ended, and the per-step calls of one page (each
output the reader expands) would otherwise fetch and decode the whole record again, so the last few
are kept decoded for a short while — by project and sandbox id, and handed only to a caller who may see
the record's project: nothing one project's page read is served to another's.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from typing import Any

import msgpack

from artifacts import trajectory as tj
from grove.core.errors import NotFound
from router.api.appkeys import project_of_record
from router.lifecycle.service import SandboxService
from router.projects.model import Caller
from router.storage import Storage
from router.trajectory.journal import Journal

CACHED = 4
"""Stored records kept decoded (a 50 MB record is a few hundred MB decoded: keep few)."""
CACHE_S = 300.0


class TrajectoryCache:
    """The last few stored records read, by the project whose part of the bucket they came from and sandbox id,
    for :data:`CACHE_S` seconds; and the last few live ones (the router's one journal of each sandbox), for as
    long as their journal has not changed (a page following a sandbox polls every second)."""

    def __init__(self) -> None:
        self._items: OrderedDict[tuple[str, str], tuple[float, dict[str, Any]]] = OrderedDict()
        self._live: OrderedDict[str, tuple[object, dict[str, Any]]] = OrderedDict()
        self._lock = threading.Lock()

    def live(self, journal: Journal, sandbox_id: str) -> dict[str, Any]:
        """The journal's record, decoded again only when the journal changed since the last call."""
        stamp = journal.stamp(sandbox_id)
        with self._lock:
            hit = self._live.get(sandbox_id)
            if hit is not None and stamp is not None and hit[0] == stamp:
                self._live.move_to_end(sandbox_id)
                return hit[1]
        record = journal.record(sandbox_id)
        with self._lock:
            self._live[sandbox_id] = (stamp, record)
            self._live.move_to_end(sandbox_id)
            while len(self._live) > CACHED:
                self._live.popitem(last=False)
        return record

    def get(self, project: str, sandbox_id: str) -> dict[str, Any] | None:
        """A record of ``project``'s part of the bucket, cached and fresh."""
        key = (project, sandbox_id)
        with self._lock:
            hit = self._items.get(key)
            if hit is None or time.monotonic() - hit[0] > CACHE_S:
                self._items.pop(key, None)
                return None
            self._items.move_to_end(key)
            return hit[1]

    def put(self, project: str, sandbox_id: str, record: dict[str, Any]) -> None:
        """Remember a record read from ``project``'s part of the bucket (dropping the least recently used beyond
        :data:`CACHED`)."""
        key = (project, sandbox_id)
        with self._lock:
            self._items[key] = (time.monotonic(), record)
            self._items.move_to_end(key)
            while len(self._items) > CACHED:
                self._items.popitem(last=False)


async def load(service: SandboxService, cache: TrajectoryCache, caller: Caller, project: str,
               sandbox_id: str) -> tuple[dict[str, Any], bool]:
    """The record and whether it is live (still journalled), else stored in ``project``'s part of the bucket;
    NotFound with a reason otherwise, and for a record whose project ``caller`` may not see (the journal is
    the router's, whoever's sandbox it is)."""
    if service.journal.exists(sandbox_id):
        try:
            record = await asyncio.to_thread(cache.live, service.journal, sandbox_id)
        except NotFound:
            pass  # stored between the check and the read: the archive has it now
        else:
            return _seen_by(caller, record, sandbox_id), True
    hit = cache.get(project, sandbox_id)
    if hit is not None:
        return _seen_by(caller, hit, sandbox_id), False
    record = await asyncio.to_thread(service.storage.of(project).trajectories.get, sandbox_id)
    cache.put(project, sandbox_id, record)
    return _seen_by(caller, record, sandbox_id), False


def _seen_by(caller: Caller, record: dict[str, Any], sandbox_id: str) -> dict[str, Any]:
    if not caller.may_see(project_of_record(record)):
        raise NotFound(f"no trajectory for sandbox {sandbox_id}")
    return record


async def raw(service: SandboxService, storage: Storage, sandbox_id: str) -> bytes:
    """The record as stored (msgpack): the object itself, or the journal's record encoded the same way."""
    if service.journal.exists(sandbox_id):
        record = await asyncio.to_thread(service.journal.record, sandbox_id)
        return bytes(msgpack.packb(record, use_bin_type=True, default=str))
    record = await asyncio.to_thread(storage.trajectories.get, sandbox_id)
    data: bytes = await asyncio.to_thread(storage.objects.get_bytes, tj.trajectory_key(record))
    return data
