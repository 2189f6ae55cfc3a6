"""Workspace snapshots from the router's side: presigned URLs for a sandbox, and removing them.

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

from grove.errors import GroveError
from router.knative.manifest import snapshot_key

log = logging.getLogger("grove.knative")
MAX_PRESIGN_S = 7 * 86400.0  # S3's limit for a presigned URL; a sandbox's ttl is capped the same
PREFIX = "snapshots/"


class Presigner(Protocol):
    """What snapshots need of object storage (``artifacts.store.ObjectStore`` has it)."""

    def presign_put(self, key: str, expires: float) -> str:
        """A URL that PUTs ``key`` without credentials."""

    def presign_get(self, key: str, expires: float) -> str:
        """A URL that GETs ``key`` without credentials."""

    def delete(self, key: str) -> None:
        """Remove ``key`` (no error if it is gone)."""

    def list(self, prefix: str = "", *, recursive: bool = True) -> list[Any]:
        """Objects (with a ``key``) under ``prefix``."""


class Snapshots:
    """Snapshot URLs and removal for the sandboxes of one backend."""

    def __init__(self, storage: Presigner) -> None:
        self.storage = storage
        self._pending: set[asyncio.Task[None]] = set()

    async def urls(self, sandbox_id: str, ttl_s: float) -> tuple[str, str]:
        """(PUT, GET) URLs of the sandbox's snapshot, valid for its lifetime and an hour (at most 7 days)."""
        key, expires = snapshot_key(sandbox_id), min(MAX_PRESIGN_S, ttl_s + 3600.0)
        put = await asyncio.to_thread(self.storage.presign_put, key, expires)
        return put, await asyncio.to_thread(self.storage.presign_get, key, expires)

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
        """Remove the snapshot now; a failure is logged (a leftover is swept after the next restart)."""
        try:
            await asyncio.to_thread(self.storage.delete, snapshot_key(sandbox_id))
        except GroveError as exc:
            log.warning("removing the snapshot of %s failed: %s", sandbox_id, exc.message)

    async def sweep(self, keep: set[str]) -> list[str]:
        """Remove snapshots of sandboxes not in ``keep``; return their ids."""
        found = await asyncio.to_thread(self.storage.list, PREFIX)
        ids = {str(item.key)[len(PREFIX):].split("/", 1)[0] for item in found}
        stale = sorted(ids - keep)
        for sandbox_id in stale:
            await self.remove(sandbox_id)
        return stale

    async def close(self) -> None:
        """Wait briefly for removals in flight; the rest are swept after the next start."""
        if self._pending:
            await asyncio.wait(list(self._pending), timeout=5)
        for task in self._pending:
            task.cancel()
