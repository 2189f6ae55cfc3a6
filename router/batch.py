"""Many creates in one call (``POST /v1/sandboxes/batch``): a burst of rollouts asks for its sandboxes at
once instead of in a thousand requests.

Each item is exactly a ``POST /v1/sandboxes`` body, validated by the same model and created as
:meth:`router.service.SandboxService.create` creates one (idempotency by ``request_id``, pool naming and
matching, a fresh start when the pool is empty, the router's limits). Items alike but for their request
ids (``create_many``'s) are parsed once, and those that claim from a pool are claimed as one group: one
record-log append for all of them, their journals' headers and hand-overs behind the answer, where a
thousand claims made one by one spent most of the batch in a thousand round trips to the disk threads.
Every other item is created on its own, all of them concurrently. The answer lists, in request order,
each item's public record or its own error body: one item failing fails no other. The
claims' hand-overs to their executors wait until the answer is sent (:data:`router.claims.HAND_OVER_AFTER`):
it is the one answer all of them wait for, and each sandbox's first call waits for its hand-over anyway.

Nothing made is lost: every sandbox is registered (listed, deletable, reaped when its client's heartbeats
stop) before its item is answered, and the creates run on even if the client goes away mid-batch. A
client that lost the answer retries the same batch with the same ``request_id`` per item and gets the
same sandboxes back.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from typing import Any

from aiohttp import web

from grove import wire
from grove.errors import BadRequest
from grove.schema import check_field, parse
from router.appkeys import service_of
from router.claims import HAND_OVER_AFTER
from router.datapath import read_capped
from router.models import MAX_BATCH, CreateRequest
from router.registry import SandboxRecord
from router.replies import error_of, reply
from router.service import SandboxService


async def create_sandboxes(request: web.Request) -> web.Response:
    """``POST /v1/sandboxes/batch``: 200 with ``{"sandboxes": [record | {"error": ...}, ...]}`` in order."""
    service = service_of(request)
    body = wire.decode(await read_capped(request, service.settings.max_body_bytes), request.content_type)
    items = items_of(body)
    shared = body.get("shared", False)
    if not isinstance(shared, bool):
        raise BadRequest("'shared' must be true or false")
    what = f"{request.method} {request.path}"
    answered = asyncio.Event()
    held = HAND_OVER_AFTER.set(answered)  # the items' tasks, made below, inherit it
    try:
        # Shielded: a client gone mid-batch does not cut creates off half-way (each one's sandbox is
        # registered as usual, and found again by a retry with the same request_ids).
        answers = await asyncio.shield(_create_all(service, items, what))
        response = reply(request, _shared(answers) if shared else {"sandboxes": answers})
        with contextlib.suppress(ConnectionError):  # gone: aiohttp sees it again as it finishes the response
            await response.prepare(request)
            await response.write_eof()
    finally:
        HAND_OVER_AFTER.reset(held)
        answered.set()  # whatever happened: no hand-over waits past the batch
    return response


def items_of(body: Any) -> list[Any]:
    """The batch's items, not yet validated (each is, on its own, by :func:`_create`); a body of the wrong
    shape, an empty batch or one past :data:`MAX_BATCH` is the whole call's 400."""
    if not isinstance(body, dict):
        raise BadRequest('body must be an object: {"sandboxes": [<create body>, ...]}')
    if unknown := sorted(set(body) - {"sandboxes", "shared"}):
        raise BadRequest(f"body: unknown field(s) {', '.join(map(repr, unknown))}; known: sandboxes, shared")
    items = body.get("sandboxes")
    if not isinstance(items, list):
        raise BadRequest("'sandboxes' must be a list of create bodies (each as POST /v1/sandboxes takes)")
    if not items:
        raise BadRequest("'sandboxes' is empty: a batch asks for at least one sandbox")
    if len(items) > MAX_BATCH:
        raise BadRequest(f"'sandboxes' has {len(items):,} items; a batch takes at most {MAX_BATCH:,}: split it "
                         "into several calls (request_ids keep each call safe to retry)")
    return items


@dataclasses.dataclass
class _Alike:
    """Consecutive items that differ only in their request ids (``create_many``'s), parsed once."""

    rest: dict[str, Any]
    """The first item without its request id."""
    req: CreateRequest
    given: frozenset[str]
    indexes: list[int] = dataclasses.field(default_factory=list)
    request_ids: list[str | None] = dataclasses.field(default_factory=list)


async def _create_all(service: SandboxService, items: list[Any], what: str) -> list[dict[str, Any]]:
    """Every item's answer, in order. Items alike but for their (new) request ids that claim from a pool are
    claimed as one group (:meth:`SandboxService.claim_many`: one record write and one journal hop for all,
    where a thousand claims one by one spent most of the batch's time in a thousand round trips); every
    other item, and any a pool had no member left for, is created on its own, as ``POST /v1/sandboxes``."""
    answers: list[dict[str, Any] | None] = [None] * len(items)
    groups, alone = _alike(service, items, answers, what)
    for group in groups:
        try:
            pool = service.pools.pool_for(group.req, group.given)
            outcomes: list[SandboxRecord | None] = (
                await service.claim_many(pool, group.req, group.request_ids) if pool is not None
                else [None] * len(group.indexes))
        except Exception as exc:
            for i in group.indexes:
                answers[i] = _error(service, exc, i, what)
            continue
        summary: dict[str, Any] | None = None  # the group's requests differ only in their ids: one summary
        for i, request_id, outcome in zip(group.indexes, group.request_ids, outcomes, strict=True):
            if outcome is None:
                alone.append((i, group.req.with_request_id(request_id), group.given))
            else:
                summary = summary or outcome.request.summary()
                answers[i] = outcome.public(summary)
    made = await asyncio.gather(*(_create(service, req, given, i, what) for i, req, given in alone))
    for (i, _, _), answer in zip(alone, made, strict=True):
        answers[i] = answer
    return [answer for answer in answers if answer is not None]


def _shared(answers: list[dict[str, Any]]) -> dict[str, Any]:
    """The answer with ``shared``: the fields every record has alike (its configuration, and for a group
    of claims the image digest and state) given once, and each record with only what differs from them.
    A record is ``{**shared, **item}``; errors stay whole."""
    records = [answer for answer in answers if "id" in answer]
    if not records:
        return {"shared": {}, "sandboxes": answers}
    keys = set(records[0]) - _OWN
    for record in records:
        keys &= record.keys()
    first = records[0]
    common = {key: first[key] for key in keys}
    for record in records:  # a group's claims share one summary object: mostly identity checks
        for key in list(common):
            if record[key] is not common[key] and record[key] != common[key]:
                del common[key]
    out = [{key: value for key, value in answer.items() if key not in common} if "id" in answer else answer
           for answer in answers]
    return {"shared": common, "sandboxes": out}


_OWN = frozenset({"id", "created_at", "ready_at", "last_activity"})
"""Fields no two sandboxes share: never in ``shared``."""


def _alike(service: SandboxService, items: list[Any], answers: list[dict[str, Any] | None],
           what: str) -> tuple[list[_Alike], list[tuple[int, CreateRequest, frozenset[str]]]]:
    """The items parsed: runs of items alike but for new request ids, and the items to create on their own
    (a request id used before or twice in the batch: :meth:`SandboxService.create` finds its first
    sandbox). An item that does not parse gets its error in ``answers``."""
    groups: list[_Alike] = []
    alone: list[tuple[int, CreateRequest, frozenset[str]]] = []
    seen: set[str] = set()
    for i, item in enumerate(items):
        where = f"sandboxes[{i}]"
        try:
            group = groups[-1] if groups else None
            rest = dict(item) if isinstance(item, dict) else None
            if rest is not None:
                rest.pop("request_id", None)
            if group is not None and rest == group.rest:
                request_id = check_field(CreateRequest, "request_id", item.get("request_id"), where)
            else:
                req = parse(CreateRequest, item, where)
                group = _Alike(rest or {}, req, frozenset(item))
                groups.append(group)
                request_id = req.request_id
            if not service.is_new_request(request_id) or request_id in seen:
                alone.append((i, group.req.with_request_id(request_id), group.given))
                continue
            if request_id is not None:
                seen.add(request_id)
            group.indexes.append(i)
            group.request_ids.append(request_id)
        except Exception as exc:
            answers[i] = _error(service, exc, i, what)
    return [group for group in groups if group.indexes], alone


async def _create(service: SandboxService, req: CreateRequest, given: frozenset[str], index: int,
                  what: str) -> dict[str, Any]:
    """One item on its own: its public record, or its error body."""
    try:
        return (await service.create(req, given)).public()
    except Exception as exc:
        return _error(service, exc, index, what)


def _error(service: SandboxService, exc: Exception, index: int, what: str) -> dict[str, Any]:
    """An item's error body (with ``retry_after`` when the error has one)."""
    err = error_of(exc, service.settings.state_dir, f"{what} item {index}")
    answer = err.to_body()
    if err.retry_after is not None:
        answer["error"]["retry_after"] = err.retry_after
    return answer
