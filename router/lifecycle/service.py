"""Sandbox lifecycle: create, wake and delete, driving the collaborators that own the rest.

Starting a sandbox (and re-adoption after a restart) is :mod:`router.lifecycle.starting`'s, a claim of a pool
member :mod:`router.lifecycle.claims`', scaling to zero and back (and lost executors) :mod:`router.lifecycle.scaling`'s,
the timeouts' pass :mod:`router.lifecycle.reaper`'s, storing a finished trajectory :mod:`router.trajectory.store`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import weakref
from collections.abc import Awaitable, Coroutine, Iterator
from typing import Any

from grove.core.errors import Conflict, Invalid, Unavailable
from router.backends.base import Backend, Endpoint, Started
from router.checkpoints.index import CheckpointIndex
from router.checkpoints.service import Checkpoints
from router.housekeeping.keeper import Housekeeping
from router.lifecycle.admission import Admission
from router.lifecycle.claims import Claims, GroupClaim
from router.lifecycle.fairness import FairStarts
from router.lifecycle.metering import run_ended
from router.lifecycle.process_exits import ProcessExits
from router.lifecycle.reaper import Reaper
from router.lifecycle.scaling import Scaling
from router.lifecycle.starting import Starts
from router.models import CreateRequest
from router.pools.filler import Pool
from router.pools.warm import Pools
from router.projects.files import ProjectFiles
from router.projects.model import DEFAULT, request_key
from router.records.activity import ActivityClocks, restored
from router.records.image_config import ImageRunConfig, run_config_of
from router.records.registry import Registry, SandboxRecord
from router.records.statedisk import is_no_space
from router.settings import RouterSettings
from router.storage import Storage
from router.trajectory.fulloutputs import FullOutputs
from router.trajectory.outflow import ByteBudget
from router.trajectory.pushing import ArtifactPushes
from router.trajectory.recorder import Recorder
from router.trajectory.screens import Screens
from router.trajectory.store import TrajectoryStore
from router.upstream.proxy import Upstreams

log = logging.getLogger("grove.router")
_QUIET_S = 0.2  # a sandbox's agent between two quick commands is still working
_SLOW_STOP_STEP_S = 5.0


@dataclasses.dataclass
class Claiming:
    """Claims for many creates begun (:meth:`SandboxService.begin_claims`), not yet ended."""

    group: GroupClaim
    fresh: list[bool]
    """Per create: whether its request id was new (the others are the caller's to create)."""
    ids: list[str]
    """The new request ids, held until the claims end (a create with one of them waits for it)."""
    written: asyncio.Future[None]


class SandboxService:
    """Owns the records and drives the backend; the HTTP layer only translates."""

    def __init__(
        self,
        settings: RouterSettings,
        backend: Backend,
        registry: Registry,
        upstreams: Upstreams,
        recorder: Recorder,
        storage: Storage,
    ) -> None:
        self.settings = settings
        self.backend = backend
        self.registry = registry
        self.upstreams = upstreams
        self.recorder = recorder
        self.journal = recorder.journal
        self.storage = storage
        """Object storage: ``storage.of(project)`` is what one project keeps (trajectories, artifacts, runs)."""
        # A backend that keeps state in object storage (Knative's snapshots) presigns with it.
        backend.attach_storage(storage.objects)
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        """Lifecycle locks, each kept while someone holds or waits for it (an unheld lock is a new one)."""
        self._requests: dict[str, asyncio.Future[None]] = {}
        """Creates writing their records, by request_id (a retry meanwhile waits, then finds the sandbox)."""
        self._background: dict[asyncio.Task[Any], str] = {}  # work after an answer, and what it is
        self.warming: set[str] = set()
        """Sandboxes with a keep-warm request in flight (:mod:`router.lifecycle.keepwarm`)."""
        self.calls_in_flight = 0
        """Data-path calls (exec, files, ...) being answered, across sandboxes (pool filling waits for none)."""
        self.last_call_ended = 0.0
        """``time.monotonic()`` when the last one ended."""
        self.projects = ProjectFiles(settings.state_dir)
        """Project definitions: quotas and retention (``<state>/projects``, re-read as the CLI changes them)."""
        self.housekeeping = Housekeeping(settings, storage, registry, self.journal, self.projects, backend)
        """What each project stores, and collecting it past retention now and then (router/housekeeping)."""
        self.checkpoints = Checkpoints(self, CheckpointIndex(settings.state_dir))
        """Checkpoints, and sandboxes made from them (router/checkpoints)."""
        self.admission = Admission(registry, self.projects, settings.state_dir, host=backend.host_admission,
                                   memory_reserve_mb=settings.memory_reserve_mb,
                                   disk_reserve_mb=settings.disk_reserve_mb,
                                   stored_bytes=self.housekeeping.usage.bytes,
                                   checkpoint_mb=self.checkpoints.index.held_mb)
        """Whether a create may start now: its project's quotas, the host's room (router/lifecycle/admission.py)."""
        self.start_gate = FairStarts(backend.start_slots)
        """The backend's starts, shared fairly between projects (router/lifecycle/fairness.py)."""
        self.pools = Pools(self, settings.state_dir)
        """The warm pools: members started ahead of time, handed out by creates (router/pools/warm.py)."""
        budget = ByteBudget(settings.full_output_bytes_per_s, settings.full_output_burst_bytes)
        self.full_outputs = FullOutputs(budget, storage, upstreams, self.endpoint, recorder)
        """Stores truncated commands' full outputs, paced: host CPU a sandbox cannot pay (router/trajectory)."""
        self.pushes = ArtifactPushes(storage, upstreams, self.endpoint,
                                     executor_reaches_storage=backend.executor_reaches_storage,
                                     url_expires_s=settings.artifact_url_expires_s)
        """Pushes of sandbox files into object storage and the artifact index (router/trajectory/pushing.py)."""
        self.starts = Starts(self)
        """Sandboxes starting, and re-adoption after a restart (router/lifecycle/starting.py)."""
        self.claims = Claims(self)
        """Claims of pool members and their hand-overs (router/lifecycle/claims.py)."""
        self.screens = Screens(storage, settings.state_dir / "screenshots", int(settings.screenshot_mb * (1 << 20)))
        """The images of computer steps, stored content-addressed (router/trajectory/screens.py)."""
        self.stored = TrajectoryStore(self.journal, storage, settings.state_dir)
        """Where finished journals go (router/trajectory/store.py)."""
        self.process_exits = ProcessExits(upstreams, recorder, watch=not backend.warm_by_traffic)
        """Background processes' exits recorded as they happen and before a stop (router/lifecycle)."""
        self.scaling = Scaling(self)
        """Scaling to zero and back, and executors lost (router/lifecycle/scaling.py)."""
        self.activity = ActivityClocks(settings.state_dir)
        """Each sandbox's last activity, kept across restarts (router/records/activity.py)."""
        self.reaper = Reaper(self, self.stored, self.scaling, self.activity)
        """The timeouts, applied now and then (router/lifecycle/reaper.py)."""

    # -- start and stop ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the backend, re-adopt what still runs, collect what has no owner, start the reaper."""
        await self.backend.open()
        self.pools.load()
        clocks, now = self.activity.load(), time.time()
        for record in self.registry.load():
            record.last_activity = restored(clocks.get(record.id), now, record.request.heartbeat_timeout_s)
            await self.starts.adopt(record)
        removed = await self.backend.collect_orphans(self.registry.known_ids())
        if removed:
            log.warning("removed %d orphaned sandbox(es): %s", len(removed), ", ".join(removed))
        await self.stored.store_orphans(self.registry.known_ids())
        self.reaper.start()
        self.housekeeping.start()
        self.pools.start()

    async def close(self) -> None:
        """Stop the reaper and wait for creations in flight; sandboxes keep running. A step still unfinished
        after a few seconds is named in the log: a stop that hangs says where."""
        await _named("the pools' filling", self.pools.close())
        await _named("the reaper", self.reaper.close())
        await _named("housekeeping", self.housekeeping.close())
        await _named("the process-exit watch", self.process_exits.close())
        self.full_outputs.budget.close()  # stores still waiting their turn are not worth a slow shutdown
        for task, what in [*((t, "a create or a pool member starting") for t in self.starts.tasks()),
                           *((t, "a claim") for t in self.claims.tasks()), *self._background.items()]:
            with contextlib.suppress(BaseException):
                await _named(what, task)
        await _named("screenshot uploads in flight", self.screens.drain())  # they end stored or spooled
        await _named("the record log", self.registry.close())
        self.journal.flush_held(last=True)
        await _named("the connections to executors", self.upstreams.close())
        await _named("the backend", self.backend.close())

    def lock(self, sandbox_id: str) -> asyncio.Lock:
        """The sandbox's lifecycle lock (held by a delete, a wake and a scale to zero)."""
        return self._locks.setdefault(sandbox_id, asyncio.Lock())

    # -- lifecycle calls -----------------------------------------------------------------------------

    async def create(self, req: CreateRequest, given: frozenset[str] = frozenset(),
                     project: str = DEFAULT, kind: str = "restore") -> SandboxRecord:
        """Create a sandbox of ``project`` (idempotent by ``request_id`` within the project); wait for it unless
        ``wait`` is false. A create naming one of the project's pools (``given``: the fields its body set) or
        matching one's spec claims a ready member. The image's recorded ENV goes under the create's ``env``,
        its WORKDIR is the ``workdir`` unless ``given`` holds it (router/lifecycle/image_config.py). ``kind``:
        the lineage of a create from a checkpoint."""
        key = request_key(project, req.request_id) if req.request_id else None
        # A create with this request_id still writing its record: this one is its retry, or a duplicate.
        while key and (first := self._requests.get(key)) is not None:
            with contextlib.suppress(BaseException):
                await asyncio.shield(first)
        if key and (existing := self.registry.by_request_id.get(key)):
            record = self.registry.get(existing)
            made = self.pools.as_made(req, project)
            if record.image_config is not None and req.checkpoint is None:  # as the first call's was applied
                made = ImageRunConfig.from_record(record.image_config).apply(made, given)
            if made != dataclasses.replace(record.request, wait=req.wait):
                raise Conflict(f"request_id {req.request_id!r} was already used to create {record.id} with another "
                               "body; a retry must send the same body, a new sandbox needs a new request_id")
        else:
            written: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            if key:
                self._requests[key] = written
            try:
                record = await self._create_new(req, given, project, kind)
            finally:
                if key:
                    del self._requests[key]
                written.set_result(None)
        task = self.starts.pending(record.id)
        if req.wait and task is not None:
            await asyncio.shield(task)
        if req.wait and record.status == "failed":
            if isinstance(record.start_error, Invalid):  # the request's own fault: trying again cannot help
                raise Invalid(f"sandbox {record.id} failed to start: {record.error}")
            raise Unavailable(f"sandbox {record.id} failed to start: {record.error}", retry_after=1)
        return record

    async def _create_new(self, req: CreateRequest, given: frozenset[str], project: str,
                          kind: str = "restore") -> SandboxRecord:
        """A claimed pool member, or a new sandbox starting (always, from a checkpoint)."""
        if req.checkpoint is not None:
            return await self.starts.create(req, project, kind)
        pool = self.pools.pool_for(req, given, project)
        if pool is not None:
            req = self.pools.as_create(pool, req)
        run_config = await run_config_of(self.backend, req.image)
        if run_config is not None:
            req = run_config.apply(req, given)
        if pool is not None and (claimed := await self.claims.claim(pool, req)) is not None:
            return claimed
        return await self.starts.create(req, project, run_config=run_config)

    def is_new_request(self, request_id: str | None, project: str = DEFAULT) -> bool:
        """Whether no create of ``project`` with this ``request_id`` made a sandbox or is making one (None: not
        idempotent)."""
        if request_id is None:
            return True
        key = request_key(project, request_id)
        return key not in self._requests and key not in self.registry.by_request_id

    def all_new_requests(self, request_ids: set[str], project: str = DEFAULT) -> bool:
        """:meth:`is_new_request` of every one of these ids, as set operations (a batch's thousand)."""
        keys = request_ids if project == DEFAULT and not any("\x00" in r for r in request_ids) else \
            {request_key(project, r) for r in request_ids}
        return keys.isdisjoint(self._requests) and keys.isdisjoint(self.registry.by_request_id)

    def begin_claims(self, pool: Pool, req: CreateRequest, request_ids: list[str | None], digest: str) -> Claiming:
        """Claims from ``pool`` for many creates that differ only in their ``request_id``, each new
        (:meth:`is_new_request`; the caller sends the others through :meth:`create`, which finds their
        sandbox), as :meth:`create` would make each (:meth:`router.lifecycle.claims.Claims.begin_group`); a create
        with one of these ids arriving meanwhile waits for them. This first half has no await (``req``
        already :meth:`Pools.as_create`'s, ``digest``
        what :meth:`Claims.digest_for` gave): the members taken, their records queued for the log. Every
        one begun must be ended (:meth:`end_claims`)."""
        # Checked again here, not only by the caller: a create with one of the ids may have come in since.
        project = pool.project
        named = {request_id for request_id in request_ids if request_id is not None}
        if self.all_new_requests(named, project):  # the usual case, checked as a whole
            fresh = [True] * len(request_ids)
        else:
            fresh = [self.is_new_request(request_id, project) for request_id in request_ids]
        new = [request_id for request_id, ok in zip(request_ids, fresh, strict=True) if ok]
        written: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        ids = [request_key(project, request_id) for request_id in new if request_id]
        group = self.claims.begin_group(pool, req, new, digest)
        for request_id in ids:
            self._requests[request_id] = written
        return Claiming(group, fresh, ids, written)

    async def end_claims(self, claiming: Claiming) -> list[SandboxRecord | None]:
        """:meth:`begin_claims`'s second half: each create's sandbox once durable, or None (see there)."""
        try:
            claimed = iter(await self.claims.finish_group(claiming.group))
        finally:
            for request_id in claiming.ids:
                del self._requests[request_id]
            claiming.written.set_result(None)
        # An id no longer new gets None: the caller creates it on its own, which finds its first sandbox.
        return [next(claimed) if ok else None for ok in claiming.fresh]

    async def delete(self, sandbox_id: str, *, reason: str = "deleted by request") -> SandboxRecord:
        """Kill everything of the sandbox and forget it (its id then answers ``deleted``)."""
        record = self.registry.get(sandbox_id, pooled=True)
        async with self.lock(sandbox_id):
            if self.registry.lookup(sandbox_id, pooled=True) is not record or record.status == "deleted":
                return record
            record.status, record.end_reason = "deleting", reason
            try:
                await self.registry.store(record)
            except OSError as exc:
                if not is_no_space(exc):
                    raise
                # Deleting is what frees a full disk, so it must not need space: drop the record instead.
                # A crash from here on leaves an orphan (and a journal) that the next start collects.
                log.warning("deleting %s on a full state disk: its record is dropped first", sandbox_id)
                self.registry.unlink(sandbox_id)
            self.starts.cancel_queued(sandbox_id)  # a start still waiting for its turn is not waited for
            for task in (self.starts.pending(sandbox_id), self.claims.pending(sandbox_id)):
                if task is not None:
                    with contextlib.suppress(BaseException):
                        await task
            await self.process_exits.drain(record)  # their exits recorded before the trajectory closes
            await self.upstreams.drop(record.endpoint_url)
            await run_ended(self.backend, record)  # read while its counters and its layer are still there
            await self.backend.delete(sandbox_id, record.handle)
            self.checkpoints.forget_sandbox(sandbox_id)  # their files went with the sandbox's
            record.status, record.ended_at, record.endpoint_url = "deleted", time.time(), None
            if record.pool is None:  # an unclaimed member has no trajectory
                self.recorder.ended(sandbox_id, record.ended_at, reason, cost=record.cost())
            record.spent.s3_bytes = await self.stored.store(sandbox_id)
            self.housekeeping.usage.add(record.project, record.spent.s3_bytes or 0)  # the stored_bytes quota
            self.registry.forget(record)
            self.screens.forget(sandbox_id)
        self._locks.pop(sandbox_id, None)
        return record

    def background(self, work: Coroutine[Any, Any, Any], what: str) -> None:
        """Run work after the answer was sent; failures are logged, never lost silently."""

        async def run() -> None:
            try:
                await work
            except Exception:
                log.exception("background work failed: %s", what)

        task = asyncio.create_task(run())
        self._background[task] = what
        task.add_done_callback(self._background.pop)

    @contextlib.contextmanager
    def calling(self, record: SandboxRecord, caller: asyncio.BaseTransport | None = None) -> Iterator[None]:
        """A data-path call in flight: the sandbox is busy (never idle, never reaped) until it ends, or, given
        the ``caller``'s connection, until that closes (its client died waiting: nobody heartbeats any more)."""
        self.touch(record)
        record.inflight += 1
        self.calls_in_flight += 1
        if caller is not None:
            record.callers.append(caller)
        try:
            yield
        finally:
            if caller is not None:
                record.callers.remove(caller)
            record.inflight -= 1
            self.calls_in_flight -= 1
            self.last_call_ended = time.monotonic()
            self.touch(record)

    def touch(self, record: SandboxRecord) -> None:
        """Any API call or heartbeat: not idle, client alive."""
        record.last_activity = time.time()

    async def endpoint(self, record: SandboxRecord) -> Endpoint:
        """The executor to call, starting the sandbox first if it was scaled to zero
        (:mod:`router.lifecycle.scaling`)."""
        return await self.scaling.endpoint(record)

    def in_flight(self, sandbox_id: str) -> asyncio.Future[None] | None:
        """The sandbox's start or claim hand-over in flight, if any."""
        return self.starts.pending(sandbox_id) or self.claims.pending(sandbox_id)

    async def lost(self, record: SandboxRecord) -> None:
        """A call found the executor gone: if its process is dead, the next call restarts it."""
        await self.scaling.lost(record)

    async def note_own_fault(self, record: SandboxRecord, *, rebase: bool = False) -> str | None:
        """Ask the backend whether the sandbox caused its executor's loss; remember it for the call."""
        return await self.scaling.note_own_fault(record, rebase=rebase)

    async def reap_once(self) -> None:
        """One pass of the reaper (:meth:`router.lifecycle.reaper.Reaper.reap_once`)."""
        await self.reaper.reap_once()

    async def start_member(self, record: SandboxRecord) -> Started | None:
        """Start a pool member; None if it was deleted while it started (:mod:`router.lifecycle.starting`)."""
        return await self.starts.start_member(record)

    def busy(self) -> bool:
        """Whether users' sandboxes are working: a create starting, a call in flight or just answered (pool
        filling defers to them)."""
        if self.calls_in_flight or self.claims.handing() or time.monotonic() - self.last_call_ended < _QUIET_S:
            return True
        return self.starts.users_starting()


async def _named(what: str, step: Awaitable[Any]) -> None:
    """Await a step of the router's stop, naming it in the log if it is still unfinished after a few seconds."""
    slow = asyncio.get_running_loop().call_later(
        _SLOW_STOP_STEP_S, log.warning, "the router's stop still waits on %s after %g s", what, _SLOW_STOP_STEP_S)
    try:
        await step
    finally:
        slow.cancel()
