"""Scaling a sandbox to zero and back: a call wakes an idle sandbox (like an activator); an idle timeout or
an executor found dead stops it, its files kept, until the next call."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol

from grove.core.errors import Conflict, InternalError
from router.backends.base import Backend, Endpoint
from router.lifecycle.metering import run_ended
from router.lifecycle.process_exits import ProcessExits
from router.records.registry import Registry, SandboxRecord
from router.records.statedisk import is_no_space
from router.trajectory.recorder import Recorder
from router.upstream.proxy import Upstreams

log = logging.getLogger("grove.router")


class ScalingHost(Protocol):
    """What scaling needs of the sandbox service (which owns the records and their locks)."""

    backend: Backend
    registry: Registry
    upstreams: Upstreams
    recorder: Recorder
    process_exits: ProcessExits

    def lock(self, sandbox_id: str) -> asyncio.Lock:
        """The sandbox's lifecycle lock."""

    def in_flight(self, sandbox_id: str) -> asyncio.Future[None] | None:
        """The sandbox's start or claim hand-over in flight, if any."""


class Scaling:
    """Wakes sandboxes for calls and stops idle or lost ones."""

    def __init__(self, service: ScalingHost) -> None:
        self._service = service

    async def endpoint(self, record: SandboxRecord) -> Endpoint:
        """The executor to call, starting the sandbox first if it was scaled to zero (like an activator)."""
        service = self._service
        # A start or a claim's hand-over in flight: its end (record written included) comes first.
        if task := service.in_flight(record.id):
            await asyncio.shield(task)
        if record.status == "ready" and (endpoint := record.endpoint()):
            return endpoint
        async with service.lock(record.id):
            if record.status == "idle":
                started = await service.backend.resume(record.spec(), record.handle)
                record.handle, record.endpoint_url, record.status = started.handle, started.endpoint.url, "ready"
                record.error = None
                record.spent.began(time.time())
                try:
                    await service.registry.store(record)
                except OSError as exc:
                    if not is_no_space(exc):
                        raise
                    # Unrecorded, a restarted router would start a second tree over the same layer.
                    await service.upstreams.drop(record.endpoint_url)
                    await run_ended(service.backend, record)
                    record.handle = await service.backend.stop(record.id, started.handle)
                    record.status, record.endpoint_url = "idle", None
                    raise
                service.recorder.note(record, {"type": "lifecycle", "t": time.time(), "event": "resumed"})
        if record.status == "failed":
            raise Conflict(f"sandbox {record.id} failed: {record.error}; delete it and create another")
        if record.status in ("deleting", "deleted"):
            raise Conflict(f"sandbox {record.id} was deleted ({record.end_reason})")
        endpoint = record.endpoint()
        if endpoint is None:
            raise InternalError(f"sandbox {record.id} is {record.status} without an endpoint")
        return endpoint

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
            await self.to_idle(record, error=lost_error(own))

    async def to_idle(self, record: SandboxRecord, *, error: str | None = None) -> None:
        """Stop the sandbox's executor, keeping its files: the next call starts it again."""
        service = self._service
        async with service.lock(record.id):
            if record.status != "ready":
                return
            await service.process_exits.drain(record)  # its processes end here: their exits are recorded
            await service.upstreams.drop(record.endpoint_url)
            await run_ended(service.backend, record)  # before its processes (and their view of its layer) are gone
            record.handle = await service.backend.stop(record.id, record.handle)
            record.status, record.endpoint_url, record.error = "idle", None, error
            await service.registry.store(record)
            event = {"type": "lifecycle", "t": time.time(), "event": "scaled_to_zero", "error": error}
            service.recorder.note(record, event)


def lost_error(own: str | None) -> str:
    """What a sandbox whose executor exited says until its next call (``own``: the sandbox's own fault)."""
    why = f"exited ({own})" if own else "exited unexpectedly"
    return f"the executor {why}; restarted on the next call"
