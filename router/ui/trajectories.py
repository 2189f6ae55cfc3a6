"""Where the viewer reads a trajectory: the live journal while the sandbox runs, else the archive in S3.

A stored record is immutable once its sandbox has ended, and the per-step calls of one page (each
output the reader expands) would otherwise fetch and decode the whole record again, so the last few
are kept decoded for a short while.
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
from router.lifecycle.service import SandboxService
from router.storage import Storage
from router.trajectory.journal import Journal

CACHED = 4
"""Stored records kept decoded (a 50 MB record is a few hundred MB decoded: keep few)."""
CACHE_S = 300.0


class TrajectoryCache:
    """The last few stored records read, by sandbox id, for :data:`CACHE_S` seconds; and the last few live
    ones, for as long as their journal has not changed (a page following a sandbox polls every second)."""

    def __init__(self) -> None:
        self._items: OrderedDict[str, tuple[float, dict[str, Any]]] = OrderedDict()
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

    def get(self, sandbox_id: str) -> dict[str, Any] | None:
        """A cached record, if fresh."""
        with self._lock:
            hit = self._items.get(sandbox_id)
            if hit is None or time.monotonic() - hit[0] > CACHE_S:
                self._items.pop(sandbox_id, None)
                return None
            self._items.move_to_end(sandbox_id)
            return hit[1]

    def put(self, sandbox_id: str, record: dict[str, Any]) -> None:
        """Remember a record (dropping the least recently used beyond :data:`CACHED`)."""
        with self._lock:
            self._items[sandbox_id] = (time.monotonic(), record)
            self._items.move_to_end(sandbox_id)
            while len(self._items) > CACHED:
                self._items.popitem(last=False)


async def load(service: SandboxService, storage: Storage, cache: TrajectoryCache,
               sandbox_id: str) -> tuple[dict[str, Any], bool]:
    """The record and whether it is live (still journalled), else stored in ``storage`` (the caller's project's);
    NotFound with a reason otherwise. The caller checks the record's project: a live journal is anyone's."""
    if service.journal.exists(sandbox_id):
        try:
            return await asyncio.to_thread(cache.live, service.journal, sandbox_id), True
        except NotFound:
            pass  # stored between the check and the read: the archive has it now
    hit = cache.get(sandbox_id)
    if hit is not None:
        return hit, False
    record: dict[str, Any] = await asyncio.to_thread(storage.trajectories.get, sandbox_id)
    cache.put(sandbox_id, record)
    return record, False


async def raw(service: SandboxService, storage: Storage, sandbox_id: str) -> bytes:
    """The record as stored (msgpack): the object itself, or the journal's record encoded the same way."""
    if service.journal.exists(sandbox_id):
        record = await asyncio.to_thread(service.journal.record, sandbox_id)
        return bytes(msgpack.packb(record, use_bin_type=True, default=str))
    record = await asyncio.to_thread(storage.trajectories.get, sandbox_id)
    data: bytes = await asyncio.to_thread(storage.objects.get_bytes, tj.trajectory_key(record))
    return data
