"""Finished journals handed to the trajectory archive (S3 or its spool), then dropped from the state dir.

A sandbox's journal is stored when it is deleted; one a crashed router left without a record is stored at
the next start; and the reaper's pass keeps the spool (trajectories written while S3 was down) flowing.
Storing a record completes its cost: the bytes the sandbox left in object storage (:func:`s3_bytes`).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from artifacts import trajectory as tj
from artifacts.archive import Stored, TrajectoryArchive
from artifacts.catalog import ARTIFACT_PREFIX
from artifacts.store import ObjectStore
from grove.core.errors import GroveError
from router.projects.model import DEFAULT
from router.records.statedisk import storage_error
from router.storage import Storage
from router.trajectory.journal import Journal

log = logging.getLogger("grove.router")
_FLUSH_EVERY_S = 10.0


class TrajectoryStore:
    """Stores the journals of ended sandboxes; storing never fails a delete (the journal is kept instead)."""

    def __init__(self, journal: Journal, storage: Storage | None, state_dir: Path) -> None:
        self._journal = journal
        self._storage = storage
        self._trajectories = storage.trajectories if storage is not None else None
        self._state_dir = state_dir
        self._last_flush = 0.0

    async def store(self, sandbox_id: str) -> int | None:
        """Hand the finished journal to the trajectory store (S3 or its spool), then drop it; the bytes the sandbox
        left in object storage (:func:`s3_bytes`), or None when they are not known (nothing stored now)."""
        if self._trajectories is None:
            if self._journal.unused(sandbox_id):  # an unclaimed pool member's, made ahead: nothing to keep
                self._journal.remove(sandbox_id)
            return None  # no storage configured: the journal stays in the state dir, nothing is lost
        try:
            where, stored_bytes = await asyncio.to_thread(self._store_journal, self._trajectories, sandbox_id)
        except Exception as exc:
            # Keep the journal: the next router start stores it again. Deleting must not fail on this.
            if full := storage_error(exc, self._state_dir):  # S3 down and no room to spool
                log.warning("storing the trajectory of %s failed; its journal is kept: %s", sandbox_id, full.message)
            else:
                log.exception("storing the trajectory of %s failed; its journal is kept", sandbox_id)
            return None
        if where is not None:
            log.info("trajectory of %s stored (%s)", sandbox_id, where)
        return stored_bytes

    async def store_orphans(self, known: set[str]) -> None:
        """Store every journal without a record: the router died between forgetting a sandbox and storing it."""
        for sandbox_id in self._journal.ids() - known:
            await self.store(sandbox_id)

    async def flush(self, now: float) -> None:
        """Write the steps of ended sandboxes held while the disk was full; now and then, empty the spool."""
        self._journal.flush_held()
        if self._trajectories is not None and now - self._last_flush > _FLUSH_EVERY_S:
            self._last_flush = now
            await asyncio.to_thread(self._flush_spools)

    def _flush_spools(self) -> None:
        """Upload what waits in the spools: the default project's, then each other project's."""
        assert self._storage is not None
        self._storage.trajectories.flush_spool()
        for project in self._storage.spooled_projects():
            self._storage.of(project).trajectories.flush_spool()

    def _store_journal(self, trajectories: TrajectoryArchive, sandbox_id: str) -> tuple[Stored | None, int | None]:
        """Read, store and drop a journal, in one worker thread (each step may wait for a disk or S3, none
        of them on the event loop); where it went (None if there is no journal) and its cost's S3 bytes."""
        if not self._journal.exists(sandbox_id):
            return None, None
        if self._journal.unused(sandbox_id):  # an unclaimed pool member's, made ahead: no trajectory
            self._journal.remove(sandbox_id)
            return None, None
        record = self._journal.record(sandbox_id)
        record["sandbox"].setdefault("id", sandbox_id)  # a journal torn before its header still names it
        if self._storage is not None:  # into its project's part of the bucket
            trajectories = self._storage.of(str(record["sandbox"].get("project") or DEFAULT)).trajectories
        stored_bytes = s3_bytes(record, trajectories.objects) if isinstance(record.get("cost"), dict) else None
        where = trajectories.store(record)
        self._journal.remove(sandbox_id)
        return where, stored_bytes


def s3_bytes(record: dict[str, Any], objects: ObjectStore) -> int | None:
    """Set (and return) the record's ``cost.s3_bytes``: its artifacts and full outputs as the bucket lists them, plus
    the record itself as it will be stored. None if the bucket cannot be listed (S3 down: the record is spooled).
    The bucket is listed only when the record shows that something may be there (a push, a full output, a push
    that failed part-way): most sandboxes store none, and their deletes make no extra round trip."""
    cost, sandbox_id = record["cost"], tj.sandbox_id(record)
    artifacts = 0
    if _may_have_objects(record):
        try:
            artifacts = sum(o.size for o in objects.list(f"{ARTIFACT_PREFIX}{sandbox_id}/"))
        except GroveError:
            cost["s3_bytes"] = None
            return None
    # The record holds its own size: packed once with a guess, then corrected by the width of the final number in
    # msgpack (the rest of the record does not change), instead of packing it until the figure stops moving.
    cost["s3_bytes"] = artifacts
    rest = artifacts + len(tj.encode(record)) - _uint_width(artifacts)  # all but the figure's own bytes
    total = rest + _uint_width(rest)
    while total != rest + _uint_width(total):  # the figure grew into a wider integer
        total = rest + _uint_width(total)
    cost["s3_bytes"] = total
    return total


def _may_have_objects(record: dict[str, Any]) -> bool:
    """Whether anything of the sandbox may be under its artifact prefix: a push, a stored full output, or a push
    that failed (it may have stored some of its files)."""
    for step in record.get("steps") or []:
        if step.get("type") == "artifacts" or step.get("stdout_artifact") or step.get("stderr_artifact"):
            return True
    outcome = record.get("outcome") or {}
    faults = [*(outcome.get("infra_errors") or []), *(outcome.get("sandbox_errors") or [])]
    return any(str(f.get("reason", "")).startswith("pushing artifacts") for f in faults if isinstance(f, dict))


def _uint_width(value: int) -> int:
    """Bytes msgpack packs a non-negative integer into."""
    return 1 if value < 0x80 else 2 if value <= 0xFF else 3 if value <= 0xFFFF else 5 if value <= 0xFFFFFFFF else 9
