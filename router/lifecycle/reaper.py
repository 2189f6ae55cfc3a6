"""The reaper: a pass every ``reap_interval_s`` applies the timeouts a client may not be around for (TTL,
heartbeat expiry, idle scale-to-zero), notices executors that died between calls and keeps the spool flowing."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Protocol

from router.backends.base import Backend
from router.lifecycle.scaling import Scaling, lost_error
from router.records.activity import ActivityClocks
from router.records.registry import Registry, SandboxRecord
from router.settings import RouterSettings
from router.trajectory.recorder import Recorder
from router.trajectory.screens import Screens
from router.trajectory.store import TrajectoryStore

_CLOCKS_EVERY = 5
"""The activity clocks are written to disk every this many passes (kept across a restart)."""
_MEMBER_EVERY = 5
"""A pool member (no client, nothing running) is checked for a dead executor every this many passes."""

log = logging.getLogger("grove.router")


class ReaperHost(Protocol):
    """What the reaper needs of the sandbox service (which owns the records and their locks)."""

    settings: RouterSettings
    backend: Backend
    registry: Registry
    recorder: Recorder
    screens: Screens

    def lock(self, sandbox_id: str) -> asyncio.Lock:
        """The sandbox's lifecycle lock."""

    async def delete(self, sandbox_id: str, *, reason: str = ...) -> SandboxRecord:
        """Delete a sandbox."""


class Reaper:
    """Applies the timeouts every ``reap_interval_s`` and scales to zero sandboxes whose executor died."""

    def __init__(self, service: ReaperHost, stored: TrajectoryStore, scaling: Scaling, clocks: ActivityClocks) -> None:
        self._service = service
        self._stored = stored
        self._scaling = scaling
        self._clocks = clocks
        self._task: asyncio.Task[None] | None = None
        self._passes = 0

    def start(self) -> None:
        """Start the periodic pass."""
        self._task = asyncio.create_task(self._reap_forever())

    async def close(self) -> None:
        """Stop the periodic pass."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _reap_forever(self) -> None:
        while True:
            await asyncio.sleep(self._service.settings.reap_interval_s)
            try:
                await self.reap_once()
            except Exception:
                log.exception("reaper pass failed")

    async def reap_once(self) -> None:
        """Apply TTL, heartbeat expiry and idle scale-to-zero; notice executors that died; flush the spool."""
        now = time.time()
        self._passes += 1
        await self._stored.flush(now)
        if self._passes % _CLOCKS_EVERY == 0:
            await self._service.screens.flush()
            await asyncio.to_thread(self._clocks.save, self._service.registry.live())
        for record in self._service.registry.live():
            # One sandbox failing (its delete hit EMFILE under an attack, say) must not skip the others.
            try:
                await self._reap(record, now)
            except Exception:
                log.exception("reaping %s failed; the next pass tries again", record.id)

    async def _reap(self, record: SandboxRecord, now: float) -> None:
        service, req = self._service, record.request
        if record.status == "pending":
            return
        if record.status == "deleting":
            # A delete that failed part-way (or was cut off) is finished by a later pass, not left stuck.
            if not service.lock(record.id).locked():
                await service.delete(record.id, reason=record.end_reason or "delete retried")
            return
        if record.pool is not None:  # no client, no timeouts; a member that died is replaced
            # Each member is looked at every _MEMBER_EVERY-th pass: a pool of 1,000 checked every pass cost
            # ~30 ms of the event loop a second, in the middle of the claims it is there for.
            if (self._passes + hash(record.id)) % _MEMBER_EVERY:
                return
            if record.status == "ready" and not await service.backend.is_running(record.id, record.handle):
                await service.delete(record.id, reason="pool member exited")
            return
        if now - record.created_at > req.ttl_s:
            await service.delete(record.id, reason=f"ttl of {req.ttl_s:g}s expired")
        elif now - record.last_activity > req.heartbeat_timeout_s and not record.waited_on():
            # A client waiting on a call in flight is alive, however long the command runs; one whose connection
            # closed mid-call (its process killed) is not.
            await service.delete(record.id, reason=f"no heartbeat for {req.heartbeat_timeout_s:g}s")
        elif record.status == "ready" and record.inflight == 0 and now - record.last_activity > req.idle_timeout_s:
            await self._scaling.to_idle(record)
        elif record.status == "ready" and not await service.backend.is_running(record.id, record.handle):
            own = await self._scaling.note_own_fault(record)
            await self._scaling.to_idle(record, error=lost_error(own))
            service.recorder.fault(record, "the executor exited between calls")
