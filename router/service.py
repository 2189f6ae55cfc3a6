"""Sandbox lifecycle: create, wake, delete, and the four timeouts; re-adoption after a restart."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import secrets
import time
from collections.abc import Coroutine, Iterator
from typing import Any

from artifacts.archive import Stored, TrajectoryArchive
from artifacts.artifact_index import ArtifactIndex
from artifacts.store import ObjectStore
from grove.errors import Conflict, GroveError, InternalError, Invalid, Unavailable
from router.backends.base import Backend, Endpoint, Started
from router.models import CreateRequest
from router.outflow import ByteBudget
from router.pool_filler import Pool, same_image
from router.pools import Pools
from router.proxy import Upstreams
from router.recorder import Recorder
from router.registry import Registry, SandboxRecord, new_id
from router.settings import RouterSettings
from router.statedisk import is_no_space, storage_error
from router.storage import Storage

log = logging.getLogger("grove.router")
_FLUSH_EVERY_S = 10.0
_QUIET_S = 0.2  # a sandbox's agent between two quick commands is still working


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
        self.objects: ObjectStore = storage.objects
        self.trajectories: TrajectoryArchive = storage.trajectories
        self.artifacts: ArtifactIndex = storage.artifacts
        """The artifact index in the same bucket."""
        # A backend that keeps state in object storage (Knative's snapshots) presigns with it.
        backend.attach_storage(storage.objects)
        self._last_flush = 0.0
        self._locks: dict[str, asyncio.Lock] = {}
        self._creating: dict[str, asyncio.Task[None]] = {}
        self._requests: dict[str, asyncio.Future[None]] = {}
        """Creates writing their records, by request_id (a retry meanwhile waits, then finds the sandbox)."""
        self._writing = 0
        """Fresh creates writing their records (not yet counted in the registry)."""
        self._handing: dict[str, asyncio.Task[None]] = {}
        """Claims answered whose executor has not taken the claim's token yet (the first call waits)."""
        self._reaper: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self.warming: set[str] = set()
        """Sandboxes with a keep-warm request in flight (:mod:`router.keepwarm`)."""
        self.calls_in_flight = 0
        """Data-path calls (exec, files, ...) being answered, across sandboxes (pool filling waits for none)."""
        self.last_call_ended = 0.0
        """``time.monotonic()`` when the last one ended."""
        self.pools = Pools(self, settings.state_dir)
        """The warm pools: members started ahead of time, handed out by creates (router/pools.py)."""
        self.full_outputs = ByteBudget(settings.full_output_bytes_per_s, settings.full_output_burst_bytes)
        """Paces the background stores of truncated commands' full outputs (host CPU a sandbox cannot pay)."""

    # -- start and stop ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the backend, re-adopt what still runs, collect what has no owner, start the reaper."""
        await self.backend.open()
        self.pools.load()
        for record in self.registry.load():
            await self._adopt(record)
        removed = await self.backend.collect_orphans(self.registry.known_ids())
        if removed:
            log.warning("removed %d orphaned sandbox(es): %s", len(removed), ", ".join(removed))
        # A journal without a record: the router died between forgetting a sandbox and storing it.
        for sandbox_id in self.journal.ids() - self.registry.known_ids():
            await self._store_trajectory(sandbox_id)
        self._reaper = asyncio.create_task(self._reap_forever())
        self.pools.start()

    async def _adopt(self, record: SandboxRecord) -> None:
        if record.pool is not None:
            # A member kept only while it still runs as made: a half-made or stopped one is cheaper to
            # replace than to vouch for (the filler starts another), and a pool deleted meanwhile wants none.
            running = record.status == "ready" and await self.backend.is_running(record.id, record.handle)
            if not running or record.pool not in self.pools.names():
                await self.delete(record.id, reason="pool member not running after a router restart")
            return
        if record.status == "pending":
            # The router died while creating it: what the backend made may be half done (no overlay
            # dir yet, or a tree it never heard back from). Start over; the client never saw it ready.
            await self.backend.delete(record.id, {})
            self._creating[record.id] = asyncio.create_task(self._bring_up(record))
            return
        if record.status == "ready":
            if record.handle and await self.backend.is_running(record.id, record.handle):
                record.status = "ready"
            else:
                # It stopped while no router watched: its files are there, the next call starts it.
                record.status = "idle"
                record.endpoint_url = None
            try:
                self.registry.save(record)
            except OSError as exc:
                # Only derived state changed, and the next start derives it again: a full disk must not
                # keep the router from serving what it has.
                if (full := storage_error(exc, self.settings.state_dir)) is None:
                    raise
                log.warning("re-adopting %s without rewriting its record: %s", record.id, full.message)
        if record.status == "deleting":
            await self.delete(record.id, reason=record.end_reason or "delete interrupted by a router restart")

    async def close(self) -> None:
        """Stop the reaper and wait for creations in flight; sandboxes keep running."""
        await self.pools.close()
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        self.full_outputs.close()  # stores still waiting their turn are not worth a slow shutdown
        for task in [*self._creating.values(), *self._handing.values(), *self._background]:
            with contextlib.suppress(BaseException):
                await task
        await self.registry.close()
        self.journal.flush_held(last=True)
        await self.upstreams.close()
        await self.backend.close()

    def _lock(self, sandbox_id: str) -> asyncio.Lock:
        return self._locks.setdefault(sandbox_id, asyncio.Lock())

    # -- lifecycle calls -----------------------------------------------------------------------------

    async def create(self, req: CreateRequest, given: frozenset[str] = frozenset()) -> SandboxRecord:
        """Create a sandbox (idempotent by ``request_id``); wait for it unless ``wait`` is false. A create
        naming a pool (``given``: the fields its body set) or matching one's spec claims a ready member."""
        # A create with this request_id still writing its record: this one is its retry, or a duplicate.
        while req.request_id and (first := self._requests.get(req.request_id)) is not None:
            with contextlib.suppress(BaseException):
                await asyncio.shield(first)
        if req.request_id and (existing := self.registry.by_request_id.get(req.request_id)):
            record = self.registry.get(existing)
            if self.pools.as_made(req) != dataclasses.replace(record.request, wait=req.wait):
                raise Conflict(f"request_id {req.request_id!r} was already used to create {record.id} with another "
                               "body; a retry must send the same body, a new sandbox needs a new request_id")
        else:
            written: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            if req.request_id:
                self._requests[req.request_id] = written
            try:
                record = await self._create_new(req, given)
            finally:
                if req.request_id:
                    del self._requests[req.request_id]
                written.set_result(None)
        task = self._creating.get(record.id)
        if req.wait and task is not None:
            await asyncio.shield(task)
        if req.wait and record.status == "failed":
            raise Unavailable(f"sandbox {record.id} failed to start: {record.error}", retry_after=1)
        return record

    async def _create_new(self, req: CreateRequest, given: frozenset[str]) -> SandboxRecord:
        """A claimed pool member, or a new sandbox starting."""
        if (pool := self.pools.pool_for(req, given)) is not None:
            if (claimed := await self._claim(pool, self.pools.as_create(pool, req))) is not None:
                return claimed
            req = self.pools.as_create(pool, req)
        # Creates still writing their records count too: the limit holds however many arrive at once.
        if self.registry.count() + self._writing >= self.settings.max_sandboxes:
            raise Unavailable(f"this router already runs {self.settings.max_sandboxes} sandboxes", retry_after=5)
        if not req.workdir.startswith("/"):
            raise Invalid("'workdir' must be an absolute path")
        record = SandboxRecord(id=new_id(), request=req, token=secrets.token_urlsafe(32), created_at=time.time())
        self.backend.check(record.spec())
        self._writing += 1
        try:
            record.image_digest = await self.backend.image_digest(req.image)
            # Written before anything tracks it: a full state disk fails the call here and leaves nothing.
            await self.registry.store(record)
        finally:
            self._writing -= 1
        try:
            self.recorder.start(record)
        except BaseException:
            self.registry.unlink(record.id)
            self.journal.remove(record.id)
            raise
        self.registry.add(record)
        self._creating[record.id] = asyncio.create_task(self._bring_up(record))
        return record

    async def _claim(self, pool: Pool, req: CreateRequest) -> SandboxRecord | None:
        """Hand a ready member of the pool to this create, or None if the pool has none (or only members
        of an image since replaced). Everything of the request the member was not made with is applied
        here; see :meth:`_hand_over`."""
        if not req.workdir.startswith("/"):
            raise Invalid("'workdir' must be an absolute path")
        digest = await self.backend.image_digest(req.image)  # a removed image: NotFound, nothing taken
        made = self.pools.made_with(pool)
        if any(getattr(req, name) != getattr(made, name) for name in self.backend.claim_fixed):
            pool.misses += 1
            return None
        while (record := self.pools.take(pool)) is not None:
            if not same_image(record.image_digest, digest):
                self.background(self.delete(record.id, reason="its image was replaced"), f"deleting {record.id}")
                continue
            previous = record.endpoint()
            if previous is None:
                raise InternalError(f"pool member {record.id} is ready without an endpoint")
            record.request, record.token, record.pool = req, secrets.token_urlsafe(32), None
            record.created_at = record.last_activity = time.time()
            self.registry.claimed_from(pool.definition.name, record)
            try:
                # On disk as the claimant's (still pending: a router restarted before the hand-over ends
                # starts it afresh) before the answer, so a restarted router never puts it back in the pool.
                await self.registry.store(record)
                self.recorder.start(record)
            except BaseException:
                self.background(self.delete(record.id, reason="its claim failed"), f"deleting {record.id}")
                raise
            if req.request_id:
                self.registry.by_request_id[req.request_id] = record.id
            self._handing[record.id] = asyncio.create_task(self._hand_over(record, previous))
            record.status, record.ready_at = "ready", time.time()
            return record
        return None

    async def _hand_over(self, record: SandboxRecord, previous: Endpoint) -> None:
        """Make a claimed member its claimant's: the backend relabels it and keeps the claim's secrets for
        a restart; the executor swaps in a fresh app with the claim's token, env and workdir (the pool
        token stops working). Nothing ran in the member before: no files or processes of anyone's.

        The create is answered before this ends (in a burst of claims, the executors' round trips would
        queue the answers behind each other); every call that reaches the executor (:meth:`endpoint`)
        and a delete wait for it first, so no call meets the pool's app, and a failed hand-over fails
        the sandbox with its reason, which the first call answers (409) and the trajectory records."""
        try:
            env = await self.backend.claim(record.spec(), record.handle)
            await self.upstreams.post_json(previous, "/v1/claim",
                                           {"token": record.token, "env": env, "workdir": record.request.workdir})
        except Exception as exc:
            message = exc.message if isinstance(exc, GroveError) else f"{type(exc).__name__}: {exc}"
            if record.status == "ready":
                record.status, record.error = "failed", f"claiming pool member: {message}"
            self.recorder.infra_error(record, f"the sandbox failed to start: claiming pool member: {message}")
        try:
            with contextlib.suppress(OSError):  # a full disk: the record on disk says pending; a restart retries
                await self.registry.store(record)
        finally:
            self._handing.pop(record.id, None)

    async def start_member(self, record: SandboxRecord) -> Started | None:
        """Start a pool member (tracked like a create, so a delete meanwhile waits for it); None if it was
        deleted while it started."""
        task = asyncio.create_task(self.backend.create(record.spec()))
        waiter: asyncio.Task[None] = asyncio.create_task(_settle(task))
        self._creating[record.id] = waiter
        try:
            started = await asyncio.shield(task)
        finally:
            self._creating.pop(record.id, None)
        if record.status == "deleting":
            await self.backend.delete(record.id, started.handle)
            return None
        return started

    def busy(self) -> bool:
        """Whether users' sandboxes are working: a create starting, a call in flight or just answered (pool
        filling defers to them)."""
        if self.calls_in_flight or self._handing or time.monotonic() - self.last_call_ended < _QUIET_S:
            return True
        return any(self.registry.lookup(i) is not None for i in self._creating)

    async def _bring_up(self, record: SandboxRecord) -> None:
        # Tracked until its record is written: every call waits for that (see endpoint), and it shows
        # "ready" only once that is on disk, so no caller sees ready a sandbox a full disk then fails.
        try:
            if await self._start(record):
                try:
                    await self.registry.store(dataclasses.replace(record, status="ready")
                                              if record.status == "pending" else record)
                except OSError as exc:
                    if (full := storage_error(exc, self.settings.state_dir)) is None:
                        raise
                    await self._unrecorded_start(record, full.message)
                else:
                    if record.status == "pending":  # not deleted meanwhile
                        record.status = "ready"
        finally:
            self._creating.pop(record.id, None)

    async def _start(self, record: SandboxRecord) -> bool:
        """Start the sandbox (it stays ``pending`` until its record says ready, or becomes ``failed``);
        whether its record is to be written (not when it was deleted meanwhile)."""
        try:
            started = await self.backend.create(record.spec())
        except GroveError as exc:
            record.status, record.error = "failed", exc.message
            self.recorder.infra_error(record, f"the sandbox failed to start: {exc.message}")
        except Exception as exc:  # a full disk, or a backend bug: keep the router up, say what happened
            full = storage_error(exc, self.settings.state_dir)
            if full is None:
                log.exception("creating %s failed", record.id)
            record.status, record.error = "failed", full.message if full else f"{type(exc).__name__}: {exc}"
            self.recorder.infra_error(record, f"the sandbox failed to start: {record.error}")
        else:
            if record.status == "deleting":  # deleted while it was starting
                await self.backend.delete(record.id, started.handle)
                return False
            record.handle, record.endpoint_url = started.handle, started.endpoint.url
            if started.image_digest != record.image_digest:
                self.recorder.note(record, {"sandbox_update": {"image_digest": started.image_digest}})
            record.image_digest = started.image_digest
            record.ready_at = time.time()
            record.last_activity = time.time()
        return True

    async def _unrecorded_start(self, record: SandboxRecord, error: str) -> None:
        """The state disk filled while the sandbox started: its record still says ``pending``, which a
        restarted router would start again. Take it down and drop the file; it stays listed as failed
        (and a restart collects whatever is left of it as an orphan)."""
        started, endpoint_url, handle = record.endpoint_url is not None, record.endpoint_url, record.handle
        # Failed before the first await: no caller may see it ready, not even while it is taken down.
        record.status, record.error, record.handle, record.endpoint_url = "failed", error, {}, None
        self.registry.unlink(record.id)
        self.recorder.infra_error(record, f"the sandbox failed to start: {error}")
        if started:
            await self.upstreams.drop(endpoint_url)
            await self.backend.delete(record.id, handle)

    async def delete(self, sandbox_id: str, *, reason: str = "deleted by request") -> SandboxRecord:
        """Kill everything of the sandbox and forget it (its id then answers ``deleted``)."""
        record = self.registry.get(sandbox_id, pooled=True)
        async with self._lock(sandbox_id):
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
            for task in (self._creating.get(sandbox_id), self._handing.get(sandbox_id)):
                if task is not None:
                    with contextlib.suppress(BaseException):
                        await task
            await self.upstreams.drop(record.endpoint_url)
            await self.backend.delete(sandbox_id, record.handle)
            record.status, record.ended_at, record.endpoint_url = "deleted", time.time(), None
            if record.pool is None:  # an unclaimed member has no trajectory
                self.recorder.ended(sandbox_id, record.ended_at, reason)
            await self._store_trajectory(sandbox_id)
            self.registry.forget(record)
        self._locks.pop(sandbox_id, None)
        return record

    async def _store_trajectory(self, sandbox_id: str) -> None:
        """Hand the finished journal to the trajectory store (S3 or its spool), then drop it."""
        if self.trajectories is None:
            return  # no storage configured: the journal stays in the state dir, nothing is lost
        try:
            where = await asyncio.to_thread(self._store_journal, self.trajectories, sandbox_id)
        except Exception as exc:
            # Keep the journal: the next router start stores it again. Deleting must not fail on this.
            if full := storage_error(exc, self.settings.state_dir):  # S3 down and no room to spool
                log.warning("storing the trajectory of %s failed; its journal is kept: %s", sandbox_id, full.message)
            else:
                log.exception("storing the trajectory of %s failed; its journal is kept", sandbox_id)
            return
        if where is not None:
            log.info("trajectory of %s stored (%s)", sandbox_id, where)

    def _store_journal(self, trajectories: TrajectoryArchive, sandbox_id: str) -> Stored | None:
        """Read, store and drop a journal, in one worker thread (each step may wait for a disk or S3, none
        of them on the event loop); None if there is no journal."""
        if not self.journal.exists(sandbox_id):
            return None
        record = self.journal.record(sandbox_id)
        record["sandbox"].setdefault("id", sandbox_id)  # a journal torn before its header still names it
        where = trajectories.store(record)
        self.journal.remove(sandbox_id)
        return where

    async def note_own_fault(self, record: SandboxRecord, *, rebase: bool = False) -> str | None:
        """Ask the backend whether the sandbox caused its executor's loss; remember it for the call."""
        try:
            record.own_fault = await self.backend.own_fault(record.id, record.handle, rebase=rebase)
        except Exception:
            log.exception("could not tell whether %s caused its own fault", record.id)
            record.own_fault = None
        return record.own_fault

    def background(self, work: Coroutine[Any, Any, Any], what: str) -> None:
        """Run work after the answer was sent; failures are logged, never lost silently."""

        async def run() -> None:
            try:
                await work
            except Exception:
                log.exception("background work failed: %s", what)

        task = asyncio.create_task(run())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    @contextlib.contextmanager
    def calling(self, record: SandboxRecord) -> Iterator[None]:
        """A data-path call in flight: the sandbox is busy (never idle, never reaped) until it ends."""
        self.touch(record)
        record.inflight += 1
        self.calls_in_flight += 1
        try:
            yield
        finally:
            record.inflight -= 1
            self.calls_in_flight -= 1
            self.last_call_ended = time.monotonic()
            self.touch(record)

    def touch(self, record: SandboxRecord) -> None:
        """Any API call or heartbeat: not idle, client alive."""
        record.last_activity = time.time()

    async def endpoint(self, record: SandboxRecord) -> Endpoint:
        """The executor to call, starting the sandbox first if it was scaled to zero (like an activator)."""
        # A start or a claim's hand-over in flight: its end (record written included) comes first.
        if task := self._creating.get(record.id) or self._handing.get(record.id):
            await asyncio.shield(task)
        if record.status == "ready" and (endpoint := record.endpoint()):
            return endpoint
        async with self._lock(record.id):
            if record.status == "idle":
                started = await self.backend.resume(record.spec(), record.handle)
                record.handle, record.endpoint_url, record.status = started.handle, started.endpoint.url, "ready"
                record.error = None
                try:
                    await self.registry.store(record)
                except OSError as exc:
                    if not is_no_space(exc):
                        raise
                    # Unrecorded, a restarted router would start a second tree over the same layer.
                    await self.upstreams.drop(record.endpoint_url)
                    record.handle = await self.backend.stop(record.id, started.handle)
                    record.status, record.endpoint_url = "idle", None
                    raise
                self.recorder.note(record, {"type": "lifecycle", "t": time.time(), "event": "resumed"})
        if record.status == "failed":
            raise Conflict(f"sandbox {record.id} failed: {record.error}; delete it and create another")
        if record.status in ("deleting", "deleted"):
            raise Conflict(f"sandbox {record.id} was deleted ({record.end_reason})")
        endpoint = record.endpoint()
        if endpoint is None:
            raise InternalError(f"sandbox {record.id} is {record.status} without an endpoint")
        return endpoint

    async def lost(self, record: SandboxRecord) -> None:
        """A call found the executor gone: if its process is dead, the next call restarts it.

        A killed executor can take a moment to be gone (``Backend.exit_grace_s``): look again for that
        long, or the next call would find the same dead socket instead of a restarted sandbox."""
        # First, while the evidence is there: an OOM kill in the sandbox since the last look is its doing,
        # whichever of its processes the kernel chose (PID 1 with everything, or the executor alone).
        own = await self.note_own_fault(record)
        deadline = time.monotonic() + self.backend.exit_grace_s
        while record.status == "ready" and await self.backend.is_running(record.id, record.handle):
            if time.monotonic() >= deadline:
                return  # still running: the connection broke, not the executor
            await asyncio.sleep(0.02)
        if record.status == "ready":
            await self._to_idle(record, error=_lost_error(own))

    async def _to_idle(self, record: SandboxRecord, *, error: str | None = None) -> None:
        async with self._lock(record.id):
            if record.status != "ready":
                return
            await self.upstreams.drop(record.endpoint_url)
            record.handle = await self.backend.stop(record.id, record.handle)
            record.status, record.endpoint_url, record.error = "idle", None, error
            await self.registry.store(record)
            event = {"type": "lifecycle", "t": time.time(), "event": "scaled_to_zero", "error": error}
            self.recorder.note(record, event)

    # -- the reaper ----------------------------------------------------------------------------------

    async def _reap_forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.reap_interval_s)
            try:
                await self.reap_once()
            except Exception:
                log.exception("reaper pass failed")

    async def reap_once(self) -> None:
        """Apply TTL, heartbeat expiry and idle scale-to-zero; notice executors that died; flush the spool."""
        now = time.time()
        self.journal.flush_held()  # steps of ended sandboxes held while the disk was full
        if self.trajectories is not None and now - self._last_flush > _FLUSH_EVERY_S:
            self._last_flush = now
            await asyncio.to_thread(self.trajectories.flush_spool)
        for record in self.registry.live():
            # One sandbox failing (its delete hit EMFILE under an attack, say) must not skip the others.
            try:
                await self._reap(record, now)
            except Exception:
                log.exception("reaping %s failed; the next pass tries again", record.id)

    async def _reap(self, record: SandboxRecord, now: float) -> None:
        req = record.request
        if record.status == "pending":
            return
        if record.status == "deleting":
            # A delete that failed part-way (or was cut off) is finished by a later pass, not left stuck.
            if not self._lock(record.id).locked():
                await self.delete(record.id, reason=record.end_reason or "delete retried")
            return
        if record.pool is not None:  # no client, no timeouts; a member that died is replaced
            if record.status == "ready" and not await self.backend.is_running(record.id, record.handle):
                await self.delete(record.id, reason="pool member exited")
            return
        if now - record.created_at > req.ttl_s:
            await self.delete(record.id, reason=f"ttl of {req.ttl_s:g}s expired")
        elif record.inflight == 0 and now - record.last_activity > req.heartbeat_timeout_s:
            # A client waiting on a call in flight is alive, however long the command runs.
            await self.delete(record.id, reason=f"no heartbeat for {req.heartbeat_timeout_s:g}s")
        elif record.status == "ready" and record.inflight == 0 and now - record.last_activity > req.idle_timeout_s:
            await self._to_idle(record)
        elif record.status == "ready" and not await self.backend.is_running(record.id, record.handle):
            own = await self.note_own_fault(record)
            await self._to_idle(record, error=_lost_error(own))
            self.recorder.fault(record, "the executor exited between calls")



def _lost_error(own: str | None) -> str:
    why = f"exited ({own})" if own else "exited unexpectedly"
    return f"the executor {why}; restarted on the next call"


async def _settle(task: asyncio.Task[Any]) -> None:
    """Wait for a task, whatever it ends with (its owner reads the outcome)."""
    with contextlib.suppress(BaseException):
        await task
