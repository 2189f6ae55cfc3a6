"""Many creates in one call (``POST /v1/sandboxes/batch``): a burst of rollouts asks for its sandboxes at
once instead of in a thousand requests.

Each item is exactly a ``POST /v1/sandboxes`` body, validated by the same model and created as
:meth:`router.lifecycle.service.SandboxService.create` creates one (idempotency by ``request_id``, pool naming and
matching, a fresh start when the pool is empty, the router's limits). Items alike but for their request
ids (``create_many``'s) are parsed once, and those that claim from a pool are claimed as one group: one
record-log append for all of them, their journals' headers and hand-overs behind the answer, where a
thousand claims made one by one spent most of the batch in a thousand round trips to the disk threads.
Every other item is created on its own, all of them concurrently. The answer lists, in request order,
each item's public record or its own error body: one item failing fails no other. The
claims' hand-overs to their executors wait until the answer is sent (:data:`router.lifecycle.claims.HAND_OVER_AFTER`):
it is the one answer all of them wait for, and each sandbox's first call waits for its hand-over anyway.

Nothing made is lost: every sandbox is registered (listed, deletable, reaped when its client's heartbeats
stop) before its item is answered, and the creates run on even if the client goes away mid-batch. A
client that lost the answer retries the same batch with the same ``request_id`` per item and gets the
same sandboxes back.

With ``"stream": true`` the answer comes in parts as the sandboxes are made (:mod:`router.api.batch_stream`);
the plain answer is the same parts gathered, so both take one path through the items.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from aiohttp import web

from grove.core import wire
from grove.core.errors import BadRequest
from router.api.appkeys import project_of, service_of
from router.api.batch_items import items_of
from router.api.batch_stream import produce, stream_sandboxes
from router.api.datapath import read_capped
from router.api.replies import reply
from router.lifecycle.claims import HAND_OVER_AFTER


async def create_sandboxes(request: web.Request) -> web.StreamResponse:
    """``POST /v1/sandboxes/batch``: 200 with ``{"sandboxes": [record | {"error": ...}, ...]}`` in order."""
    service = service_of(request)
    body = wire.decode(await read_capped(request, service.settings.max_body_bytes), request.content_type)
    items = items_of(body)
    shared, stream = body.get("shared", False), body.get("stream", False)
    for name, value in (("shared", shared), ("stream", stream)):
        if not isinstance(value, bool):
            raise BadRequest(f"'{name}' must be true or false")
    if stream:
        return await stream_sandboxes(request, service, items, project_of(request))
    what = f"{request.method} {request.path}"
    answered = asyncio.Event()
    held = HAND_OVER_AFTER.set(answered)  # the items' tasks, made below, inherit it
    try:
        # Shielded: a client gone mid-batch does not cut creates off half-way (each one's sandbox is
        # registered as usual, and found again by a retry with the same request_ids).
        answers: list[dict[str, Any]] = [{}] * len(items)

        async def gather(part: dict[str, Any]) -> None:
            shared = part.get("shared", {})
            for item in part.get("sandboxes", []):
                i = item.pop("index")
                answers[i] = {**shared, **item}

        await asyncio.shield(produce(service, items, what, gather, project_of(request)))
        response = reply(request, _shared(answers) if shared else {"sandboxes": answers})
        with contextlib.suppress(ConnectionError):  # gone: aiohttp sees it again as it finishes the response
            await response.prepare(request)
            await response.write_eof()
    finally:
        HAND_OVER_AFTER.reset(held)
        answered.set()  # whatever happened: no hand-over waits past the batch
    return response


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
