"""Many sandboxes in one call: the bodies and the calls behind both clients' ``create_many``
(``POST /v1/sandboxes/batch``)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import msgpack

from grove.core import wire
from grove.core.errors import GroveError, Invalid, Unavailable, error_from_body

if TYPE_CHECKING:
    from grove.client.aio import AsyncGrove

MAX_BATCH = 1000
"""Most creates the router takes in one call (``router.models.MAX_BATCH``); a larger ask is split."""
RETRIES = 4
"""Calls made for one part of an ask before its unanswered items fail (as the client's own retries)."""


@dataclasses.dataclass
class Ask:
    """What one ``create_many`` asks for: a body per sandbox, or (a count of alike sandboxes) one template
    body and a request id each, which the router parses once (``{"template", "request_ids"}``)."""

    request_ids: list[str]
    bodies: list[dict[str, Any]] | None = None
    template: dict[str, Any] | None = None

    def call(self, indexes: list[int]) -> dict[str, Any]:
        """The batch call's body for these items."""
        if self.bodies is not None:
            return {"sandboxes": [self.bodies[i] for i in indexes]}
        return {"template": self.template, "request_ids": [self.request_ids[i] for i in indexes]}


def batch_ask(count_or_bodies: int | Sequence[Mapping[str, Any]], image: str, options: Mapping[str, Any]) -> Ask:
    """:func:`batch_bodies`, as a template and request ids when every sandbox is alike (a count)."""
    if isinstance(count_or_bodies, int) and not isinstance(count_or_bodies, bool) and count_or_bodies > 0:
        template = dict(options)
        base = template.pop("request_id", None)
        if template.get("pool") is None or image != "default":
            template = {"image": image, **template}  # a claim's image is its pool's
        return Ask(_request_ids(count_or_bodies, base), template=template)
    bodies = batch_bodies(count_or_bodies, image, options)
    return Ask([body["request_id"] for body in bodies], bodies=bodies)


def _request_ids(count: int, base: str | None) -> list[str]:
    """Item ``i``'s request id: ``f"{base}-{i}"`` from a given ``request_id``, else a fresh one (a uuid4's
    worth of randomness each, from one read)."""
    if base:
        return [f"{base}-{i}" for i in range(count)]
    fresh = os.urandom(16 * count).hex()
    return [fresh[32 * i:32 * i + 32] for i in range(count)]


def batch_bodies(count_or_bodies: int | Sequence[Mapping[str, Any]], image: str,
                 options: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One create body per sandbox: ``image`` and ``options`` shared, each given body's own fields over
    them. Every item carries a request id, so resending the batch never makes a sandbox twice: item ``i``
    gets ``f"{request_id}-{i}"`` from a given ``request_id`` (a retry of the whole ``create_many`` finds
    the same sandboxes), else a fresh one (the SDK's own resend after a dropped connection does)."""
    if isinstance(count_or_bodies, bool | str | bytes) or not isinstance(count_or_bodies, int | Sequence):
        raise Invalid("create_many takes a count or a list of create bodies")
    own: list[Mapping[str, Any]] = ([{}] * count_or_bodies if isinstance(count_or_bodies, int)
                                    else list(count_or_bodies))
    if not own:
        raise Invalid("create_many needs at least one sandbox")
    shared = dict(options)
    request_ids = _request_ids(len(own), shared.pop("request_id", None))
    bodies = []
    for i, item in enumerate(own):
        body = {"image": image, **shared, **item}
        if body.get("pool") is not None and image == "default" and "image" not in item:
            del body["image"]  # a claim's image is its pool's
        if not body.get("request_id"):
            body["request_id"] = request_ids[i]
        bodies.append(body)
    return bodies


Answered = list[tuple[int, "dict[str, Any] | GroveError"]]
"""Items of a batch answered together: (index in the ask, public record or error)."""


async def stream_batch(client: AsyncGrove, ask: Ask) -> AsyncIterator[Answered]:
    """Each body's public record or error as the router answers it (``"stream": true``), a part of the answer
    at a time (one generator step a part between the SDK's layers, not one an item), in calls of at most
    :data:`MAX_BATCH`. A call cut off mid-answer, or answered 503, is made again for the items it did not
    answer (their request ids find the same sandboxes), up to :data:`RETRIES` times; a call that fails
    as a whole gives its unanswered items, and every later one (not sent), its error."""
    total = len(ask.request_ids)
    for start in range(0, total, MAX_BATCH):
        left = dict.fromkeys(range(start, min(start + MAX_BATCH, total)))
        for attempt in range(RETRIES):
            try:
                async for answered in _one_call(client, ask, list(left)):
                    for i, _ in answered:
                        del left[i]
                    yield answered
            except GroveError as exc:
                if not isinstance(exc, Unavailable) or attempt + 1 == RETRIES:
                    yield [(i, exc) for i in [*left, *range(start + MAX_BATCH, total)]]
                    return
                await asyncio.sleep(exc.retry_after if exc.retry_after is not None else 0.2 * 2**attempt)
            else:
                break


async def _one_call(client: AsyncGrove, ask: Ask, indexes: list[int]) -> AsyncIterator[Answered]:
    """One streamed batch call of the ask's items at ``indexes`` (their index in the whole ask), a part of
    the answer at a time."""
    body = {**ask.call(indexes), "stream": True}
    unpacker = msgpack.Unpacker(raw=False)
    async with client.stream("/v1/sandboxes/batch", method="POST", msgpack_body=body,
                             headers={"Accept": wire.MSGPACK}) as resp:
        async for chunk in resp.content.iter_any():
            unpacker.feed(chunk)
            for part in unpacker:
                if "done" in part:
                    return
                shared = part["shared"]
                yield [(indexes[item.pop("index")], _outcome(item, shared)) for item in part["sandboxes"]]
    raise Unavailable(f"the grove router at {client.url} cut its answer to a batch create short")


def _outcome(item: dict[str, Any], shared: dict[str, Any]) -> dict[str, Any] | GroveError:
    if "id" in item:  # a record (whose own "error" is null, or says why its start failed)
        return {**shared, **item} if shared else item
    err = error_from_body(500, item)  # the code names the class; the status is only a fallback
    if isinstance(wait := item["error"].get("retry_after"), int | float):
        err.retry_after = float(wait)
    return err
