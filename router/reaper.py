"""What takes a sandbox down without its client asking: the TTL, heartbeat expiry and idle scale-to-zero,
and executors found dead (between calls by the reaper's pass, or by a call that lost its executor)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Protocol

from router.backends.base import Backend
from router.proxy import Upstreams
from router.recorder import Recorder
from router.registry import Registry, SandboxRecord
from router.settings import RouterSettings
from router.trajectory_store import TrajectoryStore

log = logging.getLogger("grove.router")


class ReaperHost(Protocol):
    """What the reaper needs of the sandbox service (which owns the records and their locks)."""

    settings: RouterSettings
    backend: Backend
    registry: Registry
    upstreams: Upstreams
    recorder: Recorder

    def lock(self, sandbox_id: str) -> asyncio.Lock:
        """The sandbox's lifecycle lock."""

    async def delete(self, sandbox_id: str, *, reason: str = ...) -> SandboxRecord:
        """Delete a sandbox."""


class Reaper:
    """Applies the timeouts every ``reap_interval_s`` and scales to zero sandboxes whose executor died."""

    def __init__(self, service: ReaperHost, stored: TrajectoryStore) -> None:
        self._service = service
        self._stored = stored
        self._task: asyncio.Task[None] | None = None

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
        await self._stored.flush(now)
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
            if record.status == "ready" and not await service.backend.is_running(record.id, record.handle):
                await service.delete(record.id, reason="pool member exited")
            return
        if now - record.created_at > req.ttl_s:
            await service.delete(record.id, reason=f"ttl of {req.ttl_s:g}s expired")
        elif record.inflight == 0 and now - record.last_activity > req.heartbeat_timeout_s:
            # A client waiting on a call in flight is alive, however long the command runs.
            await service.delete(record.id, reason=f"no heartbeat for {req.heartbeat_timeout_s:g}s")
        elif record.status == "ready" and record.inflight == 0 and now - record.last_activity > req.idle_timeout_s:
            await self._to_idle(record)
        elif record.status == "ready" and not await service.backend.is_running(record.id, record.handle):
            own = await self.note_own_fault(record)
            await self._to_idle(record, error=_lost_error(own))
            service.recorder.fault(record, "the executor exited between calls")

    async def note_own_fault(self, record: SandboxRecord, *, rebase: bool = False) -> str | None:
        """Ask the backend whether the sandbox caused its executor's loss; remember it for the call."""
        try:
            record.own_fault = await self._service.backend.own_fault(record.id, record.handle, rebase=rebase)
        except Exception:
            log.exception("could not tell whether %s caused its own fault", record.id)
            record.own_fault = None
        return record.own_fault

    async def lost(self, record: SandboxRecord) -> None:
        """A call found the executor gone: if its process is dead, the next call restarts it.

        A killed executor can take a moment to be gone (``Backend.exit_grace_s``): look again for that
        long, or the next call would find the same dead socket instead of a restarted sandbox."""
        # First, while the evidence is there: an OOM kill in the sandbox since the last look is its doing,
        # whichever of its processes the kernel chose (PID 1 with everything, or the executor alone).
        own = await self.note_own_fault(record)
        backend = self._service.backend
        deadline = time.monotonic() + backend.exit_grace_s
        while record.status == "ready" and await backend.is_running(record.id, record.handle):
            if time.monotonic() >= deadline:
                return  # still running: the connection broke, not the executor
            await asyncio.sleep(0.02)
        if record.status == "ready":
            await self._to_idle(record, error=_lost_error(own))

    async def _to_idle(self, record: SandboxRecord, *, error: str | None = None) -> None:
        service = self._service
        async with service.lock(record.id):
            if record.status != "ready":
                return
            await service.upstreams.drop(record.endpoint_url)
            record.handle = await service.backend.stop(record.id, record.handle)
            record.status, record.endpoint_url, record.error = "idle", None, error
            await service.registry.store(record)
            event = {"type": "lifecycle", "t": time.time(), "event": "scaled_to_zero", "error": error}
            service.recorder.note(record, event)


def _lost_error(own: str | None) -> str:
    why = f"exited ({own})" if own else "exited unexpectedly"
    return f"the executor {why}; restarted on the next call"
