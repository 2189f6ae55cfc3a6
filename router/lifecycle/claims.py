"""A create claiming a ready pool member: what of the request applies, and the hand-over behind the answer.

:mod:`router.pools.warm` keeps the pools and their members; this module hands one member to one create.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import contextvars
import dataclasses
import os
import time
from collections.abc import Coroutine
from concurrent.futures import Future
from typing import Any, Protocol

from grove.core.errors import GroveError, InternalError, Invalid
from router.backends.base import Endpoint
from router.lifecycle.starting import InFlight, StartHost
from router.models import CreateRequest
from router.pools.filler import Pool, same_image
from router.projects.model import request_key
from router.records.registry import SandboxRecord

HAND_OVER_AFTER: contextvars.ContextVar[asyncio.Event | None] = contextvars.ContextVar("hand_over_after",
                                                                                     default=None)
"""Set by a batch create around its items (each item's task inherits it): their hand-overs wait for this
event, set once the batch is answered, so that a thousand executor round trips and record writes do not
queue the one answer every claim of the batch waits for (router/api/batch.py)."""


@dataclasses.dataclass
class GroupClaim:
    """A group of claims begun (members taken, records queued for the log) and not yet finished."""

    taken: list[tuple[SandboxRecord, Endpoint]]
    """Each member taken, with the endpoint it answers on until its hand-over."""
    written: Future[None] | None
    """Settled once their records are durable (None: nothing was taken)."""
    asked: int
    """How many creates asked."""

    def settled(self) -> bool:
        """Whether the records' append has ended (well or not): finishing the claims waits no more."""
        return self.written is None or self.written.done()


class ClaimHost(StartHost, Protocol):
    """What a claim needs of the sandbox service: what starting needs, and work behind the answer."""

    def background(self, work: Coroutine[Any, Any, Any], what: str) -> None:
        """Run work after the answer was sent."""


class Claims(InFlight):
    """Claims of pool members, and the hand-overs in flight: claims answered whose executor has not taken
    the claim's token yet (the first call waits)."""

    def __init__(self, service: ClaimHost) -> None:
        super().__init__()
        self._service = service
        self._claiming = 0
        self._groups: set[asyncio.Task[None]] = set()
        """Hand-overs of whole batches (each settles its members' futures in ``_tasks``)."""

    def handing(self) -> bool:
        """Whether any claim or hand-over is in flight (a burst of claims: pool filling waits for it)."""
        return bool(self._tasks) or self._claiming > 0

    async def claim(self, pool: Pool, req: CreateRequest) -> SandboxRecord | None:
        """Hand a ready member of the pool to this create, or None if the pool has none (or only members
        of an image since replaced). Everything of the request the member was not made with is applied
        here; see :meth:`_hand_over`."""
        self._claiming += 1
        try:
            return await self._claim(pool, req)
        finally:
            self._claiming -= 1

    async def _claim(self, pool: Pool, req: CreateRequest) -> SandboxRecord | None:
        service = self._service
        if (digest := await self.digest_for(pool, req)) is None:
            pool.misses += 1
            return None
        if (taken := self._take(pool, req, digest, tokens(1)[0])) is None:
            return None
        record, previous = taken
        try:
            # On disk as the claimant's (still pending: a router restarted before the hand-over ends starts
            # it afresh) before the answer, so a restarted router never puts it back in the pool.
            await service.registry.store(record)
            service.recorder.start(record)
        except BaseException:
            self._drop(record)
            raise
        self._claimed(record, previous)
        return record

    def begin_group(self, pool: Pool, req: CreateRequest, request_ids: list[str | None], digest: str) -> GroupClaim:
        """:meth:`claim` for many creates that differ only in their ``request_id`` (a batch create's items), as
        one vectorised claim, in two halves. This one, with no await: the members taken in one pass and
        their records queued as one group (one log append, the request they share encoded once); a
        streamed batch takes its next part while this one's append runs. Every group begun must be
        finished (:meth:`finish_group`), whatever happens in between. ``digest``: what :meth:`digest_for`
        gave for ``req`` (the checks made once for the group)."""
        self._claiming += 1
        taken: list[tuple[SandboxRecord, Endpoint]] = []
        try:
            now = time.time()  # one instant for the group (its patch in the log shares it)
            fresh = tokens(len(request_ids))
            while len(taken) < len(request_ids):
                members = self._service.pools.take_many(pool, len(request_ids) - len(taken))
                if not members:
                    break
                for k, record in enumerate(members):
                    n = len(taken)
                    try:
                        one = self._claimant_of(pool, record, req, request_ids[n], digest, fresh[n], now)
                    except BaseException:
                        for left in members[k:]:  # taken from the pool, never anyone's: deleted
                            self._drop(left)
                        raise
                    if one is not None:
                        taken.append(one)
            written = self._service.registry.queue_group([record for record, _ in taken], req) if taken else None
        except BaseException:
            self._claiming -= 1
            for record, _ in taken:
                self._drop(record)
            raise
        return GroupClaim(taken, written, len(request_ids))

    async def finish_group(self, group: GroupClaim) -> list[SandboxRecord | None]:
        """The second half: once the records are durable, the claims hold, their journals' headers and
        hand-overs left to one task that runs once the batch is answered. Per create: its sandbox, or None
        (no ready member left; not counted as a miss here: the caller creates it on its own, which tries
        the pool once more). If their append failed, every member is dropped and the error raised (none
        was answered)."""
        try:
            if group.written is not None:
                if not group.written.done():
                    await asyncio.shield(asyncio.wrap_future(group.written))
                group.written.result()  # raises what the append raised
        except BaseException:
            for record, _ in group.taken:
                self._drop(record)
            raise
        finally:
            self._claiming -= 1
        records = [record for record, _ in group.taken]
        # Durable: the claims hold. The journals' headers follow (a restart writes them from the records).
        self._service.recorder.start_later(records)
        self._claimed_group(group.taken)
        return [*records, *[None] * (group.asked - len(records))]

    def _claimed_group(self, taken: list[tuple[SandboxRecord, Endpoint]]) -> None:
        """:meth:`_claimed` for a group: one future per sandbox for its first call to wait on, settled by one
        task that hands all of them over (a thousand tasks made before the answer cost more than it)."""
        loop = asyncio.get_running_loop()
        now = time.time()
        for record, _ in taken:
            self._ready(record, now)
            self._tasks[record.id] = loop.create_future()
        group = asyncio.create_task(self._hand_over_group(taken, HAND_OVER_AFTER.get()))
        self._groups.add(group)
        group.add_done_callback(self._groups.discard)

    async def _hand_over_group(self, taken: list[tuple[SandboxRecord, Endpoint]], after: asyncio.Event | None) -> None:
        """Once the batch is answered: the journals' headers written (one worker-thread hop) while every
        member is handed over (:meth:`_hand_over`, all at once, as a batch's single claims were)."""
        try:
            if after is not None:
                await after.wait()
            records = [record for record, _ in taken]
            await asyncio.gather(self._service.recorder.write_started(records),
                                 *(self._hand_over(record, previous, None) for record, previous in taken),
                                 return_exceptions=True)
        finally:
            for record, _ in taken:  # whatever happened (the router closing): no first call waits forever
                self._settled(record.id)

    def tasks(self) -> list[asyncio.Future[None]]:
        """Every hand-over in flight, the groups' own tasks included (closing the router waits for them)."""
        return [*self._tasks.values(), *self._groups]

    async def digest_for(self, pool: Pool, req: CreateRequest) -> str | None:
        """The image digest the pool's members must have to serve this create, or None if they cannot (its
        fixed fields differ from what they were made with). A removed image raises ``NotFound`` here,
        before anything is taken."""
        if not req.workdir.startswith("/"):
            raise Invalid("'workdir' must be an absolute path")
        digest = await self._service.backend.image_digest(req.image)
        made = self._service.pools.made_with(pool)
        if any(getattr(req, name) != getattr(made, name) for name in self._service.backend.claim_fixed):
            return None
        return digest

    def _take(self, pool: Pool, req: CreateRequest, digest: str, token: str, *,
              count_miss: bool = True) -> tuple[SandboxRecord, Endpoint] | None:
        """A ready member of the pool made the claimant's in memory (no await: two claims never get the same
        one), with the endpoint it answers on until its hand-over (the pool's token), or None; members of
        an image since replaced are deleted on the way. ``token``: the claimant's executor token."""
        while (record := self._service.pools.take(pool, count_miss=count_miss)) is not None:
            if (one := self._claimant_of(pool, record, req, req.request_id, digest, token, time.time())) is not None:
                return one
        return None

    def _claimant_of(self, pool: Pool, record: SandboxRecord, req: CreateRequest, request_id: str | None,
                     digest: str, token: str, now: float) -> tuple[SandboxRecord, Endpoint] | None:
        """A member just taken made the claimant's in memory, with the endpoint it answers on until its
        hand-over; None (and deleted) if it is of an image since replaced."""
        service = self._service
        if not same_image(record.image_digest, digest):
            service.background(service.delete(record.id, reason="its image was replaced"), f"deleting {record.id}")
            return None
        if (previous := record.endpoint()) is None:
            raise InternalError(f"pool member {record.id} is ready without an endpoint")
        record.request = req if req.request_id == request_id else req.with_request_id(request_id)
        record.token, record.pool = token, None
        record.created_at = record.last_activity = now
        service.registry.claimed_from(pool.key, record)
        return record, previous

    def _drop(self, record: SandboxRecord) -> None:
        """A claim that failed before its answer: the member is deleted (never handed to anyone)."""
        self._service.background(self._service.delete(record.id, reason="its claim failed"), f"deleting {record.id}")

    def _claimed(self, record: SandboxRecord, previous: Endpoint) -> None:
        """A claim durable on disk: findable by its request id, ready, its hand-over begun (behind the
        batch's answer, if it is part of one)."""
        self._ready(record, time.time())
        self._tasks[record.id] = asyncio.create_task(self._hand_over(record, previous, HAND_OVER_AFTER.get()))

    def _ready(self, record: SandboxRecord, now: float) -> None:
        """A claim durable on disk: findable by its request id, and ready."""
        if record.request.request_id:
            self._service.registry.by_request_id[request_key(record.project, record.request.request_id)] = record.id
        record.status, record.ready_at = "ready", now
        record.spent.began(now)  # its time in the pool is nobody's run (its start, already done, is the claimant's)

    async def _hand_over(self, record: SandboxRecord, previous: Endpoint, after: asyncio.Event | None) -> None:
        """Make a claimed member its claimant's: the backend relabels it and keeps the claim's secrets for
        a restart; the executor swaps in a fresh app with the claim's token, env and workdir (the pool
        token stops working). Nothing ran in the member before: no files or processes of anyone's.

        The create is answered before this ends (in a burst of claims, the executors' round trips would
        queue the answers behind each other); every call that reaches the executor
        (``Scaling.endpoint``) and a delete wait for it first, so no call meets the pool's app, and
        a failed hand-over fails the sandbox with its reason, which the first call answers (409) and the
        trajectory records. A batch's claims begin theirs once the batch is answered (``after``)."""
        service = self._service
        if after is not None:
            await after.wait()
        try:
            env = await service.backend.claim(record.spec(), record.handle)
            await service.upstreams.post_json(previous, "/v1/claim",
                                              {"token": record.token, "env": env, "workdir": record.request.workdir})
        except Exception as exc:
            message = exc.message if isinstance(exc, GroveError) else f"{type(exc).__name__}: {exc}"
            if record.status == "ready":
                record.status, record.error = "failed", f"claiming pool member: {message}"
            service.recorder.infra_error(record, f"the sandbox failed to start: claiming pool member: {message}")
        try:
            with contextlib.suppress(OSError):  # a full disk: the record on disk says pending; a restart retries
                await service.registry.store(record)
        finally:
            self._settled(record.id)

    def _settled(self, sandbox_id: str) -> None:
        """The sandbox's hand-over ended: no call waits for it any more (a group's future is settled)."""
        waiter = self._tasks.pop(sandbox_id, None)
        if waiter is not None and not isinstance(waiter, asyncio.Task) and not waiter.done():
            waiter.set_result(None)


def tokens(count: int) -> list[str]:
    """``count`` executor tokens, each as ``secrets.token_urlsafe(32)`` makes one (32 bytes of the kernel's
    random generator, URL-safe base64, unpadded), from one read: ``os.urandom`` lets go of the GIL, and
    on a busy router each read then waited for the disk threads' turn (~17 us a token, a quarter of a
    batch's claiming)."""
    raw = os.urandom(32 * count)
    return [base64.urlsafe_b64encode(raw[i:i + 32]).rstrip(b"=").decode() for i in range(0, 32 * count, 32)]
