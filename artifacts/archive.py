"""Stored trajectories: upload with index entries, a local spool while S3 is down, list and get.

Nothing is lost: when an upload fails, the record goes to ``<spool>/<sandbox_id>.msgpack`` (written
to a temporary file, fsynced, renamed), and :meth:`TrajectoryArchive.flush_spool` uploads it later —
from this process or from a new one on the same spool directory — deleting each file only after its
upload succeeded. A file that can never go up (unreadable, or refused by S3 as invalid) moves to
``<spool>/rejected/`` instead of blocking the others; nothing there is ever deleted.

Thread safety: every operation on one sandbox's record (store, flush of its spool file, get) holds
that sandbox's lock (one of a fixed set of striped locks), so a flush can never delete a spool file
that a concurrent store has just replaced with a newer record.
"""

from __future__ import annotations

import builtins
import json
import logging
import os
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from artifacts import trajectory as tj
from artifacts.spool import Spool
from artifacts.store import ObjectStore
from grove.core.errors import GroveError, Invalid, NotFound, Unavailable

log = logging.getLogger(__name__)
_STRIPES = 64
_READERS = 8  # index bodies fetched in parallel by list()


@dataclass(frozen=True)
class Stored:
    """What :meth:`TrajectoryArchive.store` did with a record."""

    sandbox_id: str
    """The record's sandbox."""
    key: str
    """Its trajectory key in the bucket (where it is, or will be once the spool is flushed)."""
    spooled: bool
    """True when S3 failed and the record waits in the local spool."""
    error: str | None = None
    """Why the upload failed, when spooled."""


class TrajectoryArchive:
    """Trajectory records in an :class:`ObjectStore`, with a local spool for when it is unreachable."""

    def __init__(self, store: ObjectStore, spool_dir: str | os.PathLike[str], *, retry_after_s: float = 2.0) -> None:
        self.objects = store
        """Where records go."""
        self.spool = Spool(Path(spool_dir))
        """Records waiting for S3."""
        self.retry_after_s = retry_after_s
        """After S3 was found unreachable, ``store`` spools at once for this long (no connect timeouts)."""
        self._locks = [threading.Lock() for _ in range(_STRIPES)]
        self._down_until = 0.0

    def store(self, record: dict[str, Any]) -> Stored:
        """Upload the record and its index entries; on any S3 failure spool it instead (never raises for S3)."""
        data = tj.encode(record)  # a record that cannot be encoded is a caller's bug: Invalid
        sid, key = tj.sandbox_id(record), tj.trajectory_key(record)
        entries = tj.index_entries(record)
        with self._lock(sid):
            try:
                if time.monotonic() < self._down_until:
                    raise Unavailable(f"S3 at {self.objects.config.endpoint} was unreachable moments ago")
                self._upload(key, data, entries)
            except GroveError as exc:
                self.spool.write(sid, data)
                log.warning("trajectory of %s spooled: %s", sid, exc.message)
                return Stored(sid, key, spooled=True, error=exc.message)
            # An older copy left in the spool would overwrite this one at the next flush.
            self.spool.remove(sid)
        return Stored(sid, key, spooled=False)

    def flush_spool(self) -> int:
        """Upload spooled records; return how many this call uploaded. Stops at the first S3 failure."""
        uploaded = 0
        for path in self.spool.files():
            record = self._read_spooled(path)
            if record is None:
                continue
            sid = tj.sandbox_id(record)
            with self._lock(sid):
                if not path.exists():  # a concurrent flush or a successful store got it first
                    continue
                # Re-read under the lock: a store may have replaced it with a newer record meanwhile.
                data = path.read_bytes()
                record = tj.decode(data)
                try:
                    self._upload(tj.trajectory_key(record), data, tj.index_entries(record))
                except Invalid as exc:  # this record will never be accepted: it must not block the rest
                    self.spool.quarantine(path)
                    log.error("spooled trajectory of %s rejected by S3 (%s); moved aside", sid, exc.message)
                    continue
                except GroveError as exc:
                    log.warning("spool flush stopped after %d uploads: %s", uploaded, exc.message)
                    return uploaded
                path.unlink()
                uploaded += 1
        return uploaded

    def pending(self) -> int:
        """How many records wait in the spool."""
        return len(self.spool.files())

    def get(self, sandbox_id: str) -> dict[str, Any]:
        """One record, from the spool if it waits there, else from S3 through ``index/by-id``."""
        with self._lock(sandbox_id):
            data = self.spool.read(sandbox_id)
        if data is not None:
            return tj.decode(data)
        try:
            info = json.loads(self.objects.get_bytes(tj.by_id_key(sandbox_id)))
        except NotFound:
            raise NotFound(f"no stored trajectory for sandbox {sandbox_id}") from None
        return tj.decode(self.objects.get_bytes(str(info["key"])))

    def list(
        self, task_id: str | None = None, model: str | None = None, harness: str | None = None
    ) -> builtins.list[dict[str, Any]]:
        """Summaries of stored (and spooled) records matching every given field, oldest first."""
        wanted = {k: v for k, v in (("task_id", task_id), ("model", model), ("harness", harness)) if v is not None}
        prefix = f"{tj.INDEX_PREFIX}by-id/"
        for index, field in tj.INDEXES.items():
            if field in wanted:  # one index narrows the listing; the other fields are checked per entry
                prefix = tj.index_prefix(index, wanted[field])
                break
        keys = [obj.key for obj in self.objects.list(prefix)]
        with ThreadPoolExecutor(max_workers=_READERS) as pool:
            bodies = list(pool.map(self._maybe_get, keys))
        found = {s["sandbox_id"]: s for s in (json.loads(b) for b in bodies if b is not None)}
        for path in self.spool.files():
            record = self._read_spooled(path)
            if record is not None:
                found[tj.sandbox_id(record)] = {**tj.summary(record), "spooled": True}
        matches = [s for s in found.values() if all(s.get(k) == v for k, v in wanted.items())]
        return sorted(matches, key=lambda s: (s.get("created_at") is None, s.get("created_at") or 0, s["sandbox_id"]))

    def _upload(self, key: str, data: bytes, entries: dict[str, bytes]) -> None:
        # The trajectory first and by-id last (index_entries orders it so): an entry never points at
        # an object that is not there yet. Every put overwrites, so a retried upload is harmless.
        try:
            self.objects.put_bytes(key, data, content_type="application/msgpack")
            for entry_key, body in entries.items():
                self.objects.put_bytes(entry_key, body, content_type="application/json")
        except Unavailable:
            self._down_until = time.monotonic() + self.retry_after_s
            raise
        self._down_until = 0.0

    def _maybe_get(self, key: str) -> bytes | None:
        try:
            return self.objects.get_bytes(key)
        except NotFound:  # deleted between the listing and the read
            return None

    def _read_spooled(self, path: Path) -> dict[str, Any] | None:
        try:
            return tj.decode(path.read_bytes())
        except FileNotFoundError:
            return None
        except Invalid as exc:
            self.spool.quarantine(path)
            log.error("spooled trajectory %s is unreadable (%s); moved to rejected/", path, exc.message)
            return None

    def _lock(self, sandbox_id: str) -> threading.Lock:
        return self._locks[zlib.crc32(sandbox_id.encode()) % _STRIPES]
