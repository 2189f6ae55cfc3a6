"""Sandboxes starting: a fresh create and its bring-up, a pool member's start, re-adoption after a restart.

Each start is tracked until its record is written: a call (``Scaling.endpoint``) and a delete wait
for it first, and a sandbox shows ``ready`` only once that is on disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import secrets
import time
from typing import Any, Protocol

from grove.core.errors import GroveError, Invalid, Unavailable, error_from_body
from router.backends.base import Backend, Started
from router.checkpoints.service import Checkpoints
from router.lifecycle.admission import Admission
from router.lifecycle.fairness import FairStarts
from router.lifecycle.metering import run_ended
from router.models import CreateRequest
from router.pools.warm import Pools
from router.projects.model import DEFAULT
from router.records.image_config import ImageRunConfig
from router.records.registry import Registry, SandboxRecord
from router.records.statedisk import storage_error
from router.settings import RouterSettings
from router.trajectory.recorder import Recorder
from router.upstream.proxy import Upstreams

log = logging.getLogger("grove.router")


class StartHost(Protocol):
    """What starting needs of the sandbox service (which owns the records and the backend)."""

    admission: Admission
    start_gate: FairStarts
    settings: RouterSettings
    backend: Backend
    registry: Registry
    upstreams: Upstreams
    recorder: Recorder
    pools: Pools
    checkpoints: Checkpoints

    async def delete(self, sandbox_id: str, *, reason: str = ...) -> SandboxRecord:
        """Delete a sandbox."""


class InFlight:
    """Work in flight by sandbox id, each task dropped when it ends: a call and a delete of the sandbox
    wait for it first, and closing the router waits for all."""

    def __init__(self) -> None:
        self._tasks: dict[str, asyncio.Future[None]] = {}
        """A task, or a future its group's task settles (a batch of claims: one task for all, not a thousand)."""

    def pending(self, sandbox_id: str) -> asyncio.Future[None] | None:
        """The sandbox's task in flight, if any."""
        return self._tasks.get(sandbox_id)

    def tasks(self) -> list[asyncio.Future[None]]:
        """Every task in flight."""
        return list(self._tasks.values())


class Starts(InFlight):
    """The starts in flight, by sandbox id."""

    def __init__(self, service: StartHost) -> None:
        super().__init__()
        self._service = service
        self._writing = 0
        """Fresh creates writing their records (not yet counted in the registry)."""
        self._queued: set[str] = set()
        """Starts waiting for their turn (:class:`FairStarts`): a delete meanwhile cancels them outright."""
        self._admitted: dict[str, tuple[str, CreateRequest]] = {}
        """Creates admitted (:class:`Admission`) whose start is not over: by sandbox id, their project and request."""

    async def create(self, req: CreateRequest, project: str = DEFAULT, kind: str = "restore",
                     run_config: ImageRunConfig | None = None) -> SandboxRecord:
        """A new sandbox of ``project``: its record written (the only step the create waits for), its start
        begun. ``kind``: its lineage's, if made from a checkpoint (``restore`` or ``fork``); ``run_config``:
        its image's, already applied to ``req``."""
        service = self._service
        lineage = None
        if req.checkpoint is not None:
            req, lineage = service.checkpoints.restoring(req, project, kind)
        # Creates still writing their records count too: the limit holds however many arrive at once.
        if service.registry.count() + self._writing >= service.settings.max_sandboxes:
            raise Unavailable(f"this router already runs {service.settings.max_sandboxes} sandboxes", retry_after=5)
        if not req.workdir.startswith("/"):
            raise Invalid("'workdir' must be an absolute path")
        record = SandboxRecord(id=service.registry.new_id(), request=req, token=secrets.token_urlsafe(32),
                               created_at=time.time(), project=project, lineage=lineage,
                               image_config=run_config.record() if run_config is not None else None)
        service.backend.check(record.spec())
        # Over its project's quotas, a create gets its 429 now, not after waiting for the host's room (up to
        # HOST_WAIT_S): this only reads, so nothing is counted or left behind should the wait end in a 503 or
        # the request be cancelled.
        service.admission.check_quotas(project, req)
        # A burst larger than the host can start at once waits here for the starts before it (bounded).
        await service.admission.wait_for_room(project, req)
        # The project's quotas again, and the host's room, checked and counted with no await in between: a
        # burst's creates all see each other, and the quota may have been taken while this one waited, by the
        # project's creates admitted meanwhile.
        service.admission.admit(project, req)
        service.admission.started(project, req)
        self._admitted[record.id] = (project, req)
        self._writing += 1
        try:
            record.image_digest = await service.backend.image_digest(req.image)
            # Written before anything tracks it: a full state disk fails the call here and leaves nothing.
            await service.registry.store(record)
            try:
                service.recorder.start(record)
            except BaseException:
                service.registry.unlink(record.id)
                service.recorder.journal.remove(record.id)
                raise
        except BaseException:
            self._end_admission(record.id)
            raise
        finally:
            self._writing -= 1
            service.admission.registered(project, req)
        service.registry.add(record)
        self.bring_up(record)
        return record

    def _end_admission(self, sandbox_id: str) -> None:
        """A create's start is over (started, failed, deleted, or never begun): the admission stops counting it."""
        admitted = self._admitted.pop(sandbox_id, None)
        if admitted is not None:
            self._service.admission.ended(*admitted)

    def cancel_queued(self, sandbox_id: str) -> None:
        """A sandbox deleted while its start waits for its turn: the wait ends now (nothing was started)."""
        task = self._tasks.get(sandbox_id)
        if sandbox_id in self._queued and task is not None:
            task.cancel()

    def users_starting(self) -> bool:
        """Whether a user's sandbox is starting (a pool member's start does not count)."""
        return any(self._service.registry.lookup(i) is not None for i in self._tasks)

    def bring_up(self, record: SandboxRecord) -> None:
        """Start a created sandbox in the background."""
        self._tasks[record.id] = asyncio.create_task(self._bring_up(record))

    async def adopt(self, record: SandboxRecord) -> None:
        """Take on a sandbox an earlier router left: keep what still runs, finish what was cut off."""
        service = self._service
        if record.pool is not None:
            # A member kept only while it still runs as made: a half-made or stopped one is cheaper to
            # replace than to vouch for (the filler starts another), and a pool deleted meanwhile wants none.
            running = record.status == "ready" and await service.backend.is_running(record.id, record.handle)
            if not running or record.pool not in service.pools.pool_keys():
                await service.delete(record.id, reason="pool member not running after a router restart")
            return
        if record.status in ("pending", "ready") and service.recorder.journal.unused(record.id):
            # A batch's claim answered before its journal's header was written (Journal.defer_start): the
            # record on disk holds all of it.
            service.recorder.start(record)
        if record.status == "pending":
            # The router died while creating it: what the backend made may be half done (no overlay
            # dir yet, or a tree it never heard back from). Start over; the client never saw it ready.
            await service.backend.delete(record.id, {})
            self.bring_up(record)
            return
        if record.status == "ready":
            if record.handle and await service.backend.is_running(record.id, record.handle):
                record.status = "ready"
                if record.spent.run_started is None:  # begun under a grove that kept no costs: counted from now
                    record.spent.began(time.time())
            else:
                # It stopped while no router watched: its files are there, the next call starts it. Its run is
                # counted until now (when it ended is not known).
                await run_ended(service.backend, record)
                record.status = "idle"
                record.endpoint_url = None
            try:
                service.registry.save(record)
            except OSError as exc:
                # Only derived state changed, and the next start derives it again: a full disk must not
                # keep the router from serving what it has.
                if (full := storage_error(exc, service.settings.state_dir)) is None:
                    raise
                log.warning("re-adopting %s without rewriting its record: %s", record.id, full.message)
        if record.status == "deleting":
            await service.delete(record.id, reason=record.end_reason or "delete interrupted by a router restart")

    async def start_member(self, record: SandboxRecord) -> Started | None:
        """Start a pool member (tracked like a create, so a delete meanwhile waits for it); None if it was
        deleted while it started."""
        task = asyncio.create_task(self._started_with_desktop(record))
        waiter: asyncio.Task[None] = asyncio.create_task(_settle(task))
        self._tasks[record.id] = waiter
        try:
            started = await asyncio.shield(task)
        finally:
            self._tasks.pop(record.id, None)
        if record.status == "deleting":
            await self._service.backend.delete(record.id, started.handle)
            return None
        return started

    async def _started_with_desktop(self, record: SandboxRecord) -> Started:
        started = await self._service.backend.create(record.spec())
        await self._desktop_up(record, started)
        return started

    async def _desktop_up(self, record: SandboxRecord, started: Started) -> None:
        """A sandbox made with ``desktop.start``: its screen (and browser) up before it counts as ready, so its
        first screenshot waits for nothing. A failure takes the sandbox down and fails the start."""
        desktop = record.request.desktop
        if desktop is None or not desktop.start:
            return
        try:
            body = {"browser": desktop.browser} if desktop.browser else {}
            async with self._service.upstreams.call(started.endpoint, "POST", "/v1/display", json_body=body,
                                                    timeout_s=90.0) as resp:
                answer = await resp.read()
                if resp.status != 200:
                    raise error_from_body(resp.status, json.loads(answer) if answer else None)
        except BaseException:
            await self._service.backend.delete(record.id, started.handle)
            raise
    async def _bring_up(self, record: SandboxRecord) -> None:
        # Tracked until its record is written: every call waits for that (see endpoint), and it shows
        # "ready" only once that is on disk, so no caller sees ready a sandbox a full disk then fails.
        try:
            if await self._start(record):
                try:
                    await self._service.registry.store(dataclasses.replace(record, status="ready")
                                                       if record.status == "pending" else record)
                except OSError as exc:
                    if (full := storage_error(exc, self._service.settings.state_dir)) is None:
                        raise
                    await self._unrecorded_start(record, full.message)
                else:
                    if record.status == "pending":  # not deleted meanwhile
                        record.status = "ready"
        finally:
            self._tasks.pop(record.id, None)
            self._end_admission(record.id)

    async def _start(self, record: SandboxRecord) -> bool:
        """Start the sandbox (it stays ``pending`` until its record says ready, or becomes ``failed``);
        whether its record is to be written (not when it was deleted meanwhile)."""
        service = self._service
        try:
            # A turn among the projects' starts (router/lifecycle/fairness.py): one project's burst waits in
            # its own line, not in front of everyone else's creates.
            self._queued.add(record.id)
            try:
                async with service.start_gate.turn(record.project):
                    self._queued.discard(record.id)
                    if record.status == "deleting":  # deleted while it waited for its turn: nothing to start
                        return False
                    started = await service.backend.create(record.spec())
                    await self._desktop_up(record, started)
            finally:
                self._queued.discard(record.id)
        except GroveError as exc:
            record.status, record.error, record.start_error = "failed", exc.message, exc
            service.recorder.infra_error(record, f"the sandbox failed to start: {exc.message}")
        except Exception as exc:  # a full disk, or a backend bug: keep the router up, say what happened
            full = storage_error(exc, service.settings.state_dir)
            if full is None:
                log.exception("creating %s failed", record.id)
            record.status, record.error = "failed", full.message if full else f"{type(exc).__name__}: {exc}"
            service.recorder.infra_error(record, f"the sandbox failed to start: {record.error}")
        else:
            if record.status == "deleting":  # deleted while it was starting
                await service.backend.delete(record.id, started.handle)
                return False
            record.handle, record.endpoint_url = started.handle, started.endpoint.url
            if started.image_digest != record.image_digest:
                service.recorder.note(record, {"sandbox_update": {"image_digest": started.image_digest}})
            record.image_digest = started.image_digest
            record.ready_at = time.time()
            record.spent.began(record.ready_at)
            record.last_activity = time.time()
        return True

    async def _unrecorded_start(self, record: SandboxRecord, error: str) -> None:
        """The state disk filled while the sandbox started: its record still says ``pending``, which a
        restarted router would start again. Take it down and drop the file; it stays listed as failed
        (and a restart collects whatever is left of it as an orphan)."""
        started, endpoint_url, handle = record.endpoint_url is not None, record.endpoint_url, record.handle
        # Failed before the first await: no caller may see it ready, not even while it is taken down.
        record.spent.ended(None, time.time())  # its run ends here, unread: it served no one
        record.status, record.error, record.handle, record.endpoint_url = "failed", error, {}, None
        self._service.registry.unlink(record.id)
        self._service.recorder.infra_error(record, f"the sandbox failed to start: {error}")
        if started:
            await self._service.upstreams.drop(endpoint_url)
            await self._service.backend.delete(record.id, handle)


async def _settle(task: asyncio.Task[Any]) -> None:
    """Wait for a task, whatever it ends with (its owner reads the outcome)."""
    with contextlib.suppress(BaseException):
        await task
