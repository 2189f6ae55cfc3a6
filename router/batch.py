"""Many creates in one call (``POST /v1/sandboxes/batch``): a burst of rollouts asks for its sandboxes at
once instead of in a thousand requests.

Each item is exactly a ``POST /v1/sandboxes`` body, validated by the same model and created by the same
:meth:`router.service.SandboxService.create` (idempotency by ``request_id``, pool naming and matching, a
fresh start when the pool is empty, the router's limits), all of them concurrently. The answer lists, in
request order, each item's public record or its own error body: one item failing fails no other. The
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
from typing import Any

from aiohttp import web

from grove import wire
from grove.errors import BadRequest
from grove.schema import parse
from router.appkeys import service_of
from router.claims import HAND_OVER_AFTER
from router.datapath import read_capped
from router.models import MAX_BATCH, CreateRequest
from router.replies import error_of, reply
from router.service import SandboxService


async def create_sandboxes(request: web.Request) -> web.Response:
    """``POST /v1/sandboxes/batch``: 200 with ``{"sandboxes": [record | {"error": ...}, ...]}`` in order."""
    service = service_of(request)
    body = wire.decode(await read_capped(request, service.settings.max_body_bytes), request.content_type)
    items = items_of(body)
    what = f"{request.method} {request.path}"
    answered = asyncio.Event()
    held = HAND_OVER_AFTER.set(answered)  # the items' tasks, made below, inherit it
    try:
        # Shielded: a client gone mid-batch does not cut creates off half-way (each one's sandbox is
        # registered as usual, and found again by a retry with the same request_ids).
        answers = await asyncio.shield(
            asyncio.gather(*(_create(service, item, i, what) for i, item in enumerate(items))))
        response = reply(request, {"sandboxes": answers})
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
    if unknown := sorted(set(body) - {"sandboxes"}):
        raise BadRequest(f"body: unknown field(s) {', '.join(map(repr, unknown))}; known: sandboxes")
    items = body.get("sandboxes")
    if not isinstance(items, list):
        raise BadRequest("'sandboxes' must be a list of create bodies (each as POST /v1/sandboxes takes)")
    if not items:
        raise BadRequest("'sandboxes' is empty: a batch asks for at least one sandbox")
    if len(items) > MAX_BATCH:
        raise BadRequest(f"'sandboxes' has {len(items):,} items; a batch takes at most {MAX_BATCH:,}: split it "
                         "into several calls (request_ids keep each call safe to retry)")
    return items


async def _create(service: SandboxService, item: Any, index: int, what: str) -> dict[str, Any]:
    """One item: its public record, or its error body (with ``retry_after`` when the error has one)."""
    try:
        req = parse(CreateRequest, item, f"sandboxes[{index}]")
        # Which fields the item set: one naming a pool may leave out (or repeat) the pool's own.
        record = await service.create(req, frozenset(item))
        return record.public()
    except Exception as exc:
        err = error_of(exc, service.settings.state_dir, f"{what} item {index}")
        answer = err.to_body()
        if err.retry_after is not None:
            answer["error"]["retry_after"] = err.retry_after
        return answer
