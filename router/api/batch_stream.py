"""A batch create answered as it goes (``POST /v1/sandboxes/batch`` with ``"stream": true``): each part of
the answer is sent once its sandboxes are durable, so a burst's first rollouts start while the router is
still claiming the rest, instead of every sandbox waiting for the last.

The answer is a sequence of parts, as JSON lines (``application/x-ndjson``) or, to a client that accepts
msgpack, msgpack objects one after another. A part is ``{"shared": {...}, "sandboxes": [item, ...]}``:
each item carries its ``index`` in the request and is, with ``shared`` under it, exactly what the
plain answer holds at that index (a record, or ``{"error": ...}``). The last part is ``{"done": N}``, N
the items answered: a stream that ends without it was cut, and a client resends the items it did not get
(their request ids find the same sandboxes).

Alike claims are answered first more than half of them at once (:func:`parts`: the batch's median sandbox in
the first answer), then :data:`PART` at a time, each later part's take and encoding overlapping earlier
parts' log appends (one fsync for as many parts as were queued while the previous one ran). Everything else
about the batch is as :mod:`router.api.batch` says: the same parsing, the same claims, the same creates; a
client gone mid-stream cuts none of them off.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import json
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import msgpack
from aiohttp import web

from grove.core import wire
from router.api.batch_items import Alike, Items, alike, create_one, item_error
from router.lifecycle.claims import HAND_OVER_AFTER
from router.lifecycle.service import Claiming, SandboxService
from router.models import CreateRequest
from router.pools.filler import Pool
from router.records.image_config import run_config_of
from router.records.registry import SandboxRecord

PART = 250
"""Alike claims per part of the answer after the first (:func:`parts`): each part's log append (one fsync
and the disk thread's turn for the GIL) is shared by many."""
NDJSON = "application/x-ndjson"
_OWN = ("id", "created_at", "ready_at", "last_activity")
"""What every claimed sandbox has of its own: in its item, never in ``shared``."""
_USUALLY_ALIKE = ("status", "image_digest", "ended_at", "end_reason", "error")
"""Record fields a part's claims almost always share: in ``shared``, and in an item only where it differs."""

Write = Callable[[dict[str, Any]], Awaitable[None]]


async def stream_sandboxes(request: web.Request, service: SandboxService, items: Items,
                           project: str) -> web.StreamResponse:
    """The streamed answer (the body is already checked as a whole: :func:`router.api.batch_items.items_of`)."""
    as_msgpack = wire.is_msgpack(request.headers.get("Accept"))
    encode: Callable[[Any], bytes] = (
        msgpack.Packer(use_bin_type=True).pack if as_msgpack
        else (lambda part: json.dumps(wire.to_text(part), separators=(",", ":")).encode() + b"\n"))
    response = web.StreamResponse(headers={"Content-Type": wire.MSGPACK if as_msgpack else NDJSON})
    gone = False

    async def write(part: dict[str, Any]) -> None:
        nonlocal gone
        if not gone:
            try:
                await response.write(encode(part))
            except ConnectionError:  # the client went: the creates run on (a retry finds them)
                gone = True

    answered = asyncio.Event()
    held = HAND_OVER_AFTER.set(answered)  # the producer (and the claims' tasks it makes) inherit it
    try:
        with contextlib.suppress(ConnectionError):
            await response.prepare(request)
        # Its own task, shielded: a client gone mid-batch cuts no create off half-way.
        producer = asyncio.ensure_future(produce(service, items, f"{request.method} {request.path}", write, project))
        await asyncio.shield(producer)
        if not gone:
            with contextlib.suppress(ConnectionError):
                await response.write_eof()
    finally:
        HAND_OVER_AFTER.reset(held)
        answered.set()  # the answer is out (or never will be): the hand-overs go ahead
    return response


async def produce(service: SandboxService, items: Items, what: str, write: Write, project: str) -> None:
    """Every item answered through ``write``, part by part, then ``{"done": N}`` (the plain answer is these
    parts gathered: :mod:`router.api.batch`)."""
    errors: list[dict[str, Any] | None] = [None] * len(items)
    groups, alone = alike(service, items, errors, what, project)
    if bad := [{"index": i, **answer} for i, answer in enumerate(errors) if answer is not None]:
        await write({"shared": {}, "sandboxes": bad})
    for group in groups:
        digest = None
        try:
            pool = service.pools.pool_for(group.req, group.given, project)
            if pool is not None:
                req = service.pools.as_create(pool, group.req)
                if (run_config := await run_config_of(service.backend, req.image)) is not None:
                    req = run_config.apply(req, group.given)  # as SandboxService.create applies it
                digest = await service.claims.digest_for(pool, req)
        except Exception as exc:
            await write(_errors(service, exc, group.indexes, what))
            continue
        if pool is None or digest is None:
            alone.extend((i, group.req.with_request_id(rid), group.given)
                         for i, rid in zip(group.indexes, group.request_ids, strict=True))
            continue
        await _claim_parts(service, pool, req, digest, group, what, write, alone)

    async def one(i: int, req: CreateRequest, given: frozenset[str]) -> None:
        answer = await create_one(service, req, given, i, what, project)
        await write({"shared": {}, "sandboxes": [{"index": i, **answer}]})

    await asyncio.gather(*(one(i, req, given) for i, req, given in alone))
    await write({"done": len(items)})


async def _claim_parts(service: SandboxService, pool: Pool, req: CreateRequest, digest: str, group: Alike,
                       what: str, write: Write, alone: list[tuple[int, CreateRequest, frozenset[str]]]) -> None:
    """An alike group claimed part by part (:func:`parts`), each part answered as soon as it is durable. The
    first is answered before the next is taken; later ones are taken and queued for the log (no await) one
    after another while earlier ones' appends run, so the log's writer takes several in one fsync when the
    disk is slower than the taking."""
    begun: collections.deque[tuple[list[int], list[str | None], Claiming]] = collections.deque()
    with gc_held():
        try:
            for start, end in parts(len(group.indexes)):
                indexes, request_ids = group.indexes[start:end], group.request_ids[start:end]
                try:
                    begun.append((indexes, request_ids, service.begin_claims(pool, req, request_ids, digest)))
                except Exception as exc:
                    await write(_errors(service, exc, indexes, what))
                # The first part is answered before the next is taken: taking that held the GIL the first
                # part's log append waited for (501 claims durable 12-14 ms after they were taken; alone, ~4).
                while begun and (start == 0 or begun[0][2].group.settled()):
                    await _end_part(service, group, *begun.popleft(), what, write, alone)
                await asyncio.sleep(0)  # what was just answered goes out now, not after the next part's taking
            while begun:
                await _end_part(service, group, *begun.popleft(), what, write, alone)
        finally:
            for _, _, claiming in begun:  # something failed in between: the claims still end (a retry finds them)
                with contextlib.suppress(Exception):
                    await service.end_claims(claiming)


async def _end_part(service: SandboxService, group: Alike, indexes: list[int], request_ids: list[str | None],
                    claiming: Claiming, what: str, write: Write,
                    alone: list[tuple[int, CreateRequest, frozenset[str]]]) -> None:
    """A part's claims ended and answered; what the pool had no member for goes to ``alone``."""
    try:
        outcomes = await service.end_claims(claiming)
    except Exception as exc:
        await write(_errors(service, exc, indexes, what))
        return
    claimed: list[tuple[int, SandboxRecord]] = []
    for i, request_id, outcome in zip(indexes, request_ids, outcomes, strict=True):
        if outcome is None:
            alone.append((i, group.req.with_request_id(request_id), group.given))
        else:
            claimed.append((i, outcome))
    if claimed:
        await write(_claims_part(claimed))


GC_HOLD_S = 1.0
"""Longest the collector stays held off for batches (:func:`gc_held`), whatever they wait for: a client that
does not read its stream holds its batch up (each part's write waits for room), not the collector."""
_gc_holders = 0
"""Batches claiming now with the collector held off; the collector is the process's own."""
_gc_back: asyncio.TimerHandle | None = None


@contextlib.contextmanager
def gc_held(max_s: float = GC_HOLD_S) -> Iterator[None]:
    """The cyclic garbage collector held off while a batch claims (in the event loop): a full collection
    over a router holding a thousand pooled sandboxes' objects took 10-70 ms, in the middle of the answer
    every claim of the batch waits for. What the claims allocate is collected as usual once the last batch
    claiming ends, or ``max_s`` after the first began, whichever comes first."""
    global _gc_holders, _gc_back
    if _gc_holders == 0:
        if not gc.isenabled():  # held off by someone else: theirs to turn back on
            yield
            return
        gc.disable()
        _gc_back = asyncio.get_running_loop().call_later(max_s, gc.enable)
    _gc_holders += 1
    try:
        yield
    finally:
        _gc_holders -= 1
        if _gc_holders == 0:
            gc.enable()
            if _gc_back is not None:
                _gc_back.cancel()
                _gc_back = None


def parts(count: int) -> list[tuple[int, int]]:
    """Where a group of ``count`` alike claims is cut into parts: first more than half of it (the two middle
    sandboxes of an even count included), so that the batch's median sandbox comes in the first answer (a
    client starting rollouts from that part reads the next only once its loop is free again: their first
    calls held a second part 100-140 ms in the burst bench), then the rest :data:`PART` at a time."""
    if count <= 0:
        return []
    first = count // 2 + 1
    return [(0, first), *((start, min(start + PART, count)) for start in range(first, count, PART))]


def _errors(service: SandboxService, exc: Exception, indexes: list[int], what: str) -> dict[str, Any]:
    return {"shared": {}, "sandboxes": [{"index": i, **item_error(service, exc, i, what)} for i in indexes]}


def _claims_part(claimed: list[tuple[int, SandboxRecord]]) -> dict[str, Any]:
    """A part of claims (whose requests differ only in their request ids): their common fields once, each
    item only its own, built directly (not whole records stripped again)."""
    first = claimed[0][1]
    shared = first.public()
    for name in _OWN:
        del shared[name]
    out = []
    for i, record in claimed:
        item = {"index": i, "id": record.id, "created_at": record.created_at, "ready_at": record.ready_at,
                "last_activity": record.last_activity}
        for name in _USUALLY_ALIKE:
            if (value := getattr(record, name)) != shared[name]:
                item[name] = value
        out.append(item)
    return {"shared": shared, "sandboxes": out}
