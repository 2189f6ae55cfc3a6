"""Keeping warm pools filled: one start at a time, deferred while users' sandboxes work (a create starting,
a call in flight; at most a couple of seconds per start), so refilling does not compete with a burst, and a
few at once while the router is idle, so a pool is full again by the next burst; a
pool whose starts fail (its image removed, a full disk) is tried again every few seconds, its error shown
meanwhile."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import functools
import logging
import secrets
import time
from collections.abc import Callable
from typing import Protocol

from grove.core.errors import GroveError, NotFound
from router.backends.base import Backend, Started
from router.models import CreateRequest, PoolRequest
from router.projects.files import ProjectFiles
from router.projects.model import DEFAULT
from router.records.image_config import run_config_of
from router.records.registry import Registry, SandboxRecord
from router.settings import RouterSettings
from router.trajectory.journal import Journal

log = logging.getLogger("grove.router")
_RETRY_AFTER_FAILURE_S = 5.0
_BUSY_POLL_S = 0.05
# While users' sandboxes work (creates starting, calls in flight), a start waits; at most this long, so a
# router that is never idle still refills, at one start per this many seconds (~3 % of one CPU here).
_MOST_DEFERRED_S = 2.0
# Starts at once while no user's sandbox works (a step's refill, not a burst, pays for them). A start waits much
# of its time (its zygote, cgroup locks, its disk's flushes, its executor's first answer): on 2 CPUs, two at once
# kept the host 44 % busy and filled 300 members in 11.3 s, three 10.3 s (perf/README.md). Three, not the
# four start slots a local 2-CPU host has: a user's create arriving meanwhile still finds one free.
IDLE_STARTS = 3


def pool_key(project: str, name: str) -> str:
    """A pool's key in the router (its members' ``record.pool``, its files' names): its name in the default
    project, ``<project>.<name>`` in another (names hold no '.': two projects' pools of one name never meet)."""
    return name if project == DEFAULT else f"{project}.{name}"


@dataclasses.dataclass
class Pool:
    """One pool: its definition, its project, and what the filler last ran into."""

    definition: PoolRequest
    project: str = DEFAULT
    error: str | None = None
    """Why the last start failed (cleared by the next that succeeds)."""
    failed_at: float = 0.0
    claims: int = 0
    """Creates that took a ready member (counted across restarts: :mod:`router.pools.files`)."""
    misses: int = 0
    """Creates that named the pool while it had no ready member (they got a fresh sandbox)."""

    @property
    def key(self) -> str:
        """:func:`pool_key`."""
        return pool_key(self.project, self.definition.name)


class Admits(Protocol):
    """The service's admission (router/lifecycle/admission.py): its project's quotas, the host's room."""

    def why_not(self, project: str, req: CreateRequest) -> str | None:
        """Why a sandbox of ``project`` made as ``req`` may not start now, or None."""


class PoolHost(Protocol):
    """What the pools need of the sandbox service (which owns the records and the backend)."""

    projects: ProjectFiles
    settings: RouterSettings
    backend: Backend
    registry: Registry
    journal: Journal

    async def delete(self, sandbox_id: str, *, reason: str = ...) -> SandboxRecord:
        """Delete a sandbox (a pool member too)."""

    def lock(self, sandbox_id: str) -> asyncio.Lock:
        """The sandbox's lifecycle lock (a delete waits for it)."""

    async def start_member(self, record: SandboxRecord) -> Started | None:
        """Start a pool member; None if it was deleted while it started."""

    def busy(self) -> bool:
        """Whether users' sandboxes are working."""

    @property
    def admission(self) -> Admits:
        """Whether a sandbox may start now."""


class Filler:
    """The background task that starts pool members."""

    def __init__(self, pools: Callable[[], list[Pool]], service: PoolHost) -> None:
        self._all = pools
        self._service = service
        self._wake_event = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._in_flight: collections.Counter[str] = collections.Counter()
        """Starts under way per pool (counted from before their image look-up): two starts at once never go to
        a pool one member short."""

    def start(self) -> None:
        """Start keeping the pools filled."""
        self._task = asyncio.create_task(self._fill_forever())

    async def close(self) -> None:
        """Stop filling (a start in flight finishes; its member is kept for the next router)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def wake(self) -> None:
        """Look at the pools now (one was defined, resized or claimed from)."""
        self._wake_event.set()

    def _member(self, pool: Pool) -> SandboxRecord:
        return SandboxRecord(id=self._service.registry.new_id(), request=made_with(pool.definition),
                             token=secrets.token_urlsafe(32), created_at=time.time(), pool=pool.key,
                             project=pool.project)

    def _wanting(self) -> Pool | None:
        """A pool short of members, if the router has room for another sandbox."""
        service = self._service
        if service.registry.count() >= service.settings.max_sandboxes:
            return None
        now = time.monotonic()
        for pool in self._all():
            if pool.error is not None and now - pool.failed_at < _RETRY_AFTER_FAILURE_S:
                continue  # tried again later: the image may be back, the disk freed
            if service.registry.pool_count(pool.key) + self._in_flight[pool.key] < pool.definition.size:
                # Members count toward their project's quotas and take the host's room like any sandbox.
                if (why := service.admission.why_not(pool.project, made_with(pool.definition))) is not None:
                    self._failed(pool, f"not filling: {why}")
                    continue
                return pool
        return None

    async def _fill_forever(self) -> None:
        deferred_since = time.monotonic()
        running: set[asyncio.Task[None]] = set()
        try:
            while True:
                pool = self._wanting()
                if pool is None:
                    self._wake_event.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake_event.wait(), _RETRY_AFTER_FAILURE_S)
                    await self._check_images()
                    continue
                busy = self._service.busy()
                if busy and time.monotonic() - deferred_since < _MOST_DEFERRED_S:
                    await asyncio.sleep(_BUSY_POLL_S)  # working sandboxes go first
                    continue
                deferred_since = time.monotonic()
                running.add(asyncio.create_task(self._fill_guarded(pool)))
                # One start at a time while users' sandboxes work; with the router idle (a training step
                # between bursts) a few at once, so the pool is full again before the next burst.
                while len(running) >= (1 if busy else IDLE_STARTS):
                    _, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in running:  # a start itself goes on (shielded); its member is kept for the next router
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)

    async def _fill_guarded(self, pool: Pool) -> None:
        self._in_flight[pool.key] += 1
        try:
            await self._fill_one(pool)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._failed(pool, exc.message if isinstance(exc, GroveError) else f"{type(exc).__name__}: {exc}")
        else:
            pool.error = None
        finally:
            self._in_flight[pool.key] -= 1
            if self._in_flight[pool.key] <= 0:
                del self._in_flight[pool.key]

    def _failed(self, pool: Pool, error: str) -> None:
        if error != pool.error:
            log.warning("filling pool %s failed: %s", pool.key, error)
        pool.error, pool.failed_at = error, time.monotonic()

    async def _check_images(self) -> None:
        """Delete members whose image was removed or replaced since they started: a claim gets the image
        as it is now (the filler makes new members of a replaced image; a removed one stops the pool)."""
        for pool in list(self._all()):
            try:
                digest: str | None = await self._service.backend.image_digest(pool.definition.image)
            except NotFound as exc:
                self._failed(pool, f"its image is gone: {exc.message}")
                digest = None
            for record in self._service.registry.pooled(pool.key):
                if record.status == "ready" and not same_image(record.image_digest, digest):
                    await self._service.delete(record.id, reason="its pool's image was removed or replaced")

    async def _fill_one(self, pool: Pool) -> None:
        service = self._service
        record = self._member(pool)
        try:
            record.image_digest = await service.backend.image_digest(record.request.image)
            run_config = await run_config_of(service.backend, record.request.image)
        except NotFound as exc:
            raise NotFound(f"its image is gone: {exc.message}") from exc
        if not self._still_wanted(pool):
            return  # deleted, replaced or shrunk while its image was looked up
        # Recorded for its claimant, whose create applies the config (a member runs nothing before its claim).
        record.image_config = run_config.record() if run_config is not None else None
        # Listed and locked with no await in between: a delete or resize from here on sees this member and
        # waits (service.delete takes the lock) until it is started and recorded, then deletes it whole. No
        # member outlives its pool, none starts after its deletion.
        async with service.lock(record.id):
            service.registry.add(record)
            try:
                await service.registry.store(record)
                # Its journal made now, off the event loop, so that its claim only writes into it
                # (Journal.prepare).
                await asyncio.to_thread(service.journal.prepare, record.id)
                started = await service.start_member(record)
            except BaseException:
                service.registry.unlink(record.id)
                service.registry.drop(record)
                service.journal.remove(record.id)
                raise
            if started is None:  # start_member's contract; no delete gets in while this lock is held
                return
            record.status, record.handle, record.endpoint_url = "ready", started.handle, started.endpoint.url
            record.image_digest, record.ready_at = started.image_digest, time.time()
            await service.registry.store(record)

    def _still_wanted(self, pool: Pool) -> bool:
        """Whether the pool is still defined as it was (not deleted, nor deleted and made anew) and short, and
        the router and the pool's project still have room (another start, begun meanwhile, may have taken it)."""
        service = self._service
        return (any(p is pool for p in self._all())
                and service.registry.pool_count(pool.key) < pool.definition.size
                and service.registry.count() < service.settings.max_sandboxes
                and service.admission.why_not(pool.project, made_with(pool.definition)) is None)


@functools.lru_cache(maxsize=256)
def made_with(definition: PoolRequest) -> CreateRequest:
    """The create a pool's members are made with (every create compares itself with it: built once)."""
    res = definition.resources
    return CreateRequest(image=definition.image, cpu=res.cpu, memory_mb=res.memory_mb, pids_max=res.pids_max,
                         disk_mb=res.disk_mb, network=definition.network, workdir=definition.workdir,
                         desktop=definition.desktop)


def same_image(made_from: str | None, current: str | None) -> bool:
    """Whether a member made from digest ``made_from`` is of the image as it is now (``current``: None if
    removed; "" where the backend does not know a digest yet, which vouches for nothing either way)."""
    if current is None:
        return False
    return not (made_from and current) or made_from == current
