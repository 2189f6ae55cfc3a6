"""Workspace snapshots from the router's side: a sandbox's GET URL and upload token, and removing them.

The executor uploads its last snapshot while its pod terminates, which is after the router asked for
the Service's deletion. So a snapshot is removed only once the Service is gone from the watch — the
backend deletes with ``propagationPolicy: Foreground``, so the Service outlives its pods — and a router
restart sweeps snapshots of sandboxes it no longer knows.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Protocol

from artifacts.s3config import S3Config
from grove.core.errors import GroveError
from router.backends.knative.manifest import snapshot_key, snapshot_prefix
from router.backends.knative.uploads import DEFAULT_PART, MultipartStorage, SnapshotUploads, signing_key

log = logging.getLogger("grove.knative")
MAX_PRESIGN_S = 7 * 86400.0  # S3's limit for a presigned URL; a sandbox's ttl is capped the same
CHECKPOINTS = "checkpoints/"


def checkpoint_key(instance: str, sandbox_id: str, checkpoint_id: str) -> str:
    """Where a checkpoint of a Knative sandbox is kept (in its router instance's part of ``checkpoints/``): a copy
    of its snapshot (a tar of its workspace)."""
    return f"{CHECKPOINTS}{instance}/{sandbox_id}/{checkpoint_id}"


class Presigner(MultipartStorage, Protocol):
    """What snapshots need of object storage (``artifacts.store.ObjectStore`` has it)."""

    config: S3Config

    def delete(self, key: str) -> None:
        """Remove ``key`` (no error if it is gone)."""

    def copy(self, source: str, target: str) -> None:
        """Copy ``source`` to ``target`` (server-side)."""

    def exists(self, key: str) -> bool:
        """Whether ``key`` exists."""

    def stat(self, key: str) -> Any:
        """Size (``.size``), etag and time of ``key``."""

    def list(self, prefix: str = "", *, recursive: bool = True) -> list[Any]:
        """Objects (with a ``key``) under ``prefix``."""


class Snapshots:
    """Snapshot URLs and removal for the sandboxes of one backend."""

    def __init__(self, storage: Presigner, instance: str, part_size: int = DEFAULT_PART) -> None:
        self.storage = storage
        self.instance = instance
        self.prefix = snapshot_prefix(instance)
        """This router's part of ``snapshots/``: it sweeps nothing outside it."""
        self.uploads = SnapshotUploads(storage, signing_key(storage.config.secret_key), instance, part_size)
        """The broker of the executors' multipart uploads."""
        self._pending: set[asyncio.Task[None]] = set()

    async def access(self, sandbox_id: str, ttl_s: float, disk_mb: int) -> tuple[str, str]:
        """(GET URL, upload token) of the sandbox's snapshot. The GET URL is valid for the sandbox's lifetime
        and an hour (at most 7 days, as long as a sandbox may live); the token does not expire, and the part
        URLs it buys are made when needed."""
        expires = min(MAX_PRESIGN_S, ttl_s + 3600.0)
        get = await asyncio.to_thread(self.storage.presign_get, snapshot_key(self.instance, sandbox_id), expires)
        return get, self.uploads.token(sandbox_id, disk_mb)

    def forget_when(self, sandbox_id: str, gone: Callable[[], Any]) -> None:
        """Remove the snapshot in the background once ``await gone()`` returns (the pods are gone)."""

        async def later() -> None:
            try:
                await gone()
            except GroveError as exc:
                log.warning("not removing the snapshot of %s yet: %s", sandbox_id, exc.message)
                return
            await self.remove(sandbox_id)

        task = asyncio.create_task(later())
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def remove(self, sandbox_id: str) -> None:
        """Remove the snapshot and any upload of one in progress now; a failure is logged (a leftover is
        swept after the next restart)."""
        try:
            await self.uploads.abort_all(sandbox_id)
            await asyncio.to_thread(self.storage.delete, snapshot_key(self.instance, sandbox_id))
        except GroveError as exc:
            log.warning("removing the snapshot of %s failed: %s", sandbox_id, exc.message)

    async def remove_checkpoints(self, sandbox_id: str) -> None:
        """Remove every checkpoint of a sandbox (it was deleted: its checkpoints go with it)."""
        for item in await asyncio.to_thread(self.storage.list, checkpoint_key(self.instance, sandbox_id, "")):
            await asyncio.to_thread(self.storage.delete, str(item.key))

    async def sweep(self, keep: set[str]) -> list[str]:
        """Remove this instance's snapshots and checkpoints of sandboxes not in ``keep``; return their ids."""
        found = [str(item.key) for item in await asyncio.to_thread(self.storage.list, self.prefix)]
        found += [key for key, _ in await asyncio.to_thread(self.storage.incomplete_uploads, self.prefix)]
        ids = {key[len(self.prefix):].split("/", 1)[0] for key in found}
        mine = f"{CHECKPOINTS}{self.instance}/"
        kept = {str(item.key)[len(mine):].split("/", 1)[0]
                for item in await asyncio.to_thread(self.storage.list, mine)}
        stale = sorted((ids | kept) - keep)
        for sandbox_id in stale:
            await self.remove(sandbox_id)
            await self.remove_checkpoints(sandbox_id)
        return stale

    async def close(self) -> None:
        """Wait briefly for removals in flight; the rest are swept after the next start."""
        if self._pending:
            await asyncio.wait(list(self._pending), timeout=5)
        for task in self._pending:
            task.cancel()
