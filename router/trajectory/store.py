"""Finished journals handed to the trajectory archive (S3 or its spool), then dropped from the state dir.

A sandbox's journal is stored when it is deleted; one a crashed router left without a record is stored at
the next start; and the reaper's pass keeps the spool (trajectories written while S3 was down) flowing.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from artifacts.archive import Stored, TrajectoryArchive
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

    async def store(self, sandbox_id: str) -> None:
        """Hand the finished journal to the trajectory store (S3 or its spool), then drop it."""
        if self._trajectories is None:
            if self._journal.unused(sandbox_id):  # an unclaimed pool member's, made ahead: nothing to keep
                self._journal.remove(sandbox_id)
            return  # no storage configured: the journal stays in the state dir, nothing is lost
        try:
            where = await asyncio.to_thread(self._store_journal, self._trajectories, sandbox_id)
        except Exception as exc:
            # Keep the journal: the next router start stores it again. Deleting must not fail on this.
            if full := storage_error(exc, self._state_dir):  # S3 down and no room to spool
                log.warning("storing the trajectory of %s failed; its journal is kept: %s", sandbox_id, full.message)
            else:
                log.exception("storing the trajectory of %s failed; its journal is kept", sandbox_id)
            return
        if where is not None:
            log.info("trajectory of %s stored (%s)", sandbox_id, where)

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

    def _store_journal(self, trajectories: TrajectoryArchive, sandbox_id: str) -> Stored | None:
        """Read, store and drop a journal, in one worker thread (each step may wait for a disk or S3, none
        of them on the event loop); None if there is no journal."""
        if not self._journal.exists(sandbox_id):
            return None
        if self._journal.unused(sandbox_id):  # an unclaimed pool member's, made ahead: no trajectory
            self._journal.remove(sandbox_id)
            return None
        record = self._journal.record(sandbox_id)
        record["sandbox"].setdefault("id", sandbox_id)  # a journal torn before its header still names it
        if self._storage is not None:  # into its project's part of the bucket
            trajectories = self._storage.of(str(record["sandbox"].get("project") or DEFAULT)).trajectories
        where = trajectories.store(record)
        self._journal.remove(sandbox_id)
        return where
