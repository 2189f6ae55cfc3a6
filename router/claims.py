"""A create claiming a ready pool member: what of the request applies, and the hand-over behind the answer.

:mod:`router.pools` keeps the pools and their members; this module hands one member to one create.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import secrets
import time
from collections.abc import Coroutine
from typing import Any, Protocol

from grove.errors import GroveError, InternalError, Invalid
from router.backends.base import Endpoint
from router.models import CreateRequest
from router.pool_filler import Pool, same_image
from router.registry import SandboxRecord
from router.starting import InFlight, StartHost

HAND_OVER_AFTER: contextvars.ContextVar[asyncio.Event | None] = contextvars.ContextVar("hand_over_after",
                                                                                     default=None)
"""Set by a batch create around its items (each item's task inherits it): their hand-overs wait for this
event, set once the batch is answered, so that a thousand executor round trips and record writes do not
queue the one answer every claim of the batch waits for (router/batch.py)."""


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
        if (digest := await self._digest_for(pool, req)) is None:
            pool.misses += 1
            return None
        if (taken := self._take(pool, req, digest)) is None:
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

    async def claim_group(self, pool: Pool, req: CreateRequest,
                          request_ids: list[str | None]) -> list[SandboxRecord | Exception | None]:
        """:meth:`claim` for many creates that differ only in their ``request_id`` (a batch create's items):
        the checks made once, the members taken in one pass, their records written as one group (one log
        append) and their journals begun in one worker-thread hop. A batch of 1,000 claims made one by one
        spent most of its time in a thousand such round trips. Per create: its sandbox, the error that
        failed it (its journal could not begin: a full disk), or None (no ready member left; not counted as
        a miss here: the caller creates it on its own, which tries the pool once more)."""
        self._claiming += 1
        try:
            if (digest := await self._digest_for(pool, req)) is None:
                return [None] * len(request_ids)
            taken: list[tuple[SandboxRecord, Endpoint]] = []
            try:
                for request_id in request_ids:
                    one = self._take(pool, req.with_request_id(request_id), digest, count_miss=False)
                    if one is None:
                        break
                    taken.append(one)
                records = [record for record, _ in taken]
                await self._service.registry.store_many(records)
            except BaseException:
                for record, _ in taken:
                    self._drop(record)
                raise
            failed = await self._service.recorder.start_many(records)
            out: list[SandboxRecord | Exception | None] = []
            for record, previous in taken:
                if (exc := failed.get(record.id)) is not None:
                    self._drop(record)
                    out.append(exc)
                else:
                    self._claimed(record, previous)
                    out.append(record)
            return out + [None] * (len(request_ids) - len(taken))
        finally:
            self._claiming -= 1

    async def _digest_for(self, pool: Pool, req: CreateRequest) -> str | None:
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

    def _take(self, pool: Pool, req: CreateRequest, digest: str, *,
              count_miss: bool = True) -> tuple[SandboxRecord, Endpoint] | None:
        """A ready member of the pool made the claimant's in memory (no await: two claims never get the same
        one), with the endpoint it answers on until its hand-over (the pool's token), or None; members of
        an image since replaced are deleted on the way."""
        service = self._service
        while (record := service.pools.take(pool, count_miss=count_miss)) is not None:
            if not same_image(record.image_digest, digest):
                service.background(service.delete(record.id, reason="its image was replaced"), f"deleting {record.id}")
                continue
            if (previous := record.endpoint()) is None:
                raise InternalError(f"pool member {record.id} is ready without an endpoint")
            record.request, record.token, record.pool = req, secrets.token_urlsafe(32), None
            record.created_at = record.last_activity = time.time()
            service.registry.claimed_from(pool.definition.name, record)
            return record, previous
        return None

    def _drop(self, record: SandboxRecord) -> None:
        """A claim that failed before its answer: the member is deleted (never handed to anyone)."""
        self._service.background(self._service.delete(record.id, reason="its claim failed"), f"deleting {record.id}")

    def _claimed(self, record: SandboxRecord, previous: Endpoint) -> None:
        """A claim durable on disk: findable by its request id, ready, its hand-over begun (behind the
        batch's answer, if it is part of one)."""
        if record.request.request_id:
            self._service.registry.by_request_id[record.request.request_id] = record.id
        self._tasks[record.id] = asyncio.create_task(self._hand_over(record, previous, HAND_OVER_AFTER.get()))
        record.status, record.ready_at = "ready", time.time()

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
            self._tasks.pop(record.id, None)
