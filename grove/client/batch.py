"""Many sandboxes in one call: the bodies and the calls behind both clients' ``create_many``
(``POST /v1/sandboxes/batch``)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import msgpack

from grove import wire
from grove.errors import GroveError, Invalid, Unavailable, error_from_body

if TYPE_CHECKING:
    from grove.client.aio import AsyncGrove

MAX_BATCH = 1000
"""Most creates the router takes in one call (``router.models.MAX_BATCH``); a larger ask is split."""
RETRIES = 4
"""Calls made for one part of an ask before its unanswered items fail (as the client's own retries)."""


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
    base = shared.pop("request_id", None)
    fresh = os.urandom(16 * len(own)).hex()  # a uuid4's worth of randomness per item, in one read
    bodies = []
    for i, item in enumerate(own):
        body = {"image": image, **shared, **item}
        if body.get("pool") is not None and image == "default" and "image" not in item:
            del body["image"]  # a claim's image is its pool's
        if not body.get("request_id"):
            body["request_id"] = f"{base}-{i}" if base else fresh[32 * i:32 * i + 32]
        bodies.append(body)
    return bodies


async def stream_batch(client: AsyncGrove, bodies: list[dict[str, Any]]
                       ) -> AsyncIterator[tuple[int, dict[str, Any] | GroveError]]:
    """Each body's public record or error as the router answers it (``"stream": true``), in calls of at most
    :data:`MAX_BATCH`. A call cut off mid-answer, or answered 503, is made again for the items it did not
    answer (their request ids find the same sandboxes), up to :data:`RETRIES` times; a call that fails
    as a whole gives its unanswered items, and every later one (not sent), its error."""
    for start in range(0, len(bodies), MAX_BATCH):
        left = dict(enumerate(bodies[start:start + MAX_BATCH], start))
        for attempt in range(RETRIES):
            try:
                async for i, outcome in _one_call(client, left):
                    del left[i]
                    yield i, outcome
            except GroveError as exc:
                if not isinstance(exc, Unavailable) or attempt + 1 == RETRIES:
                    for i in [*left, *range(start + MAX_BATCH, len(bodies))]:
                        yield i, exc
                    return
                await asyncio.sleep(exc.retry_after if exc.retry_after is not None else 0.2 * 2**attempt)
            else:
                break


async def _one_call(client: AsyncGrove, left: dict[int, dict[str, Any]]
                    ) -> AsyncIterator[tuple[int, dict[str, Any] | GroveError]]:
    """One streamed batch call of the ``left`` bodies, keyed by their index in the whole ask."""
    indexes = list(left)
    body = {"sandboxes": list(left.values()), "stream": True}
    unpacker = msgpack.Unpacker(raw=False)
    async with client.stream("/v1/sandboxes/batch", method="POST", msgpack_body=body,
                             headers={"Accept": wire.MSGPACK}) as resp:
        async for chunk in resp.content.iter_any():
            unpacker.feed(chunk)
            for part in unpacker:
                if "done" in part:
                    return
                shared = part["shared"]
                for item in part["sandboxes"]:
                    yield indexes[item.pop("index")], _outcome(item, shared)
    raise Unavailable(f"the grove router at {client.url} cut its answer to a batch create short")


def _outcome(item: dict[str, Any], shared: dict[str, Any]) -> dict[str, Any] | GroveError:
    if "id" in item:  # a record (whose own "error" is null, or says why its start failed)
        return {**shared, **item} if shared else item
    err = error_from_body(500, item)  # the code names the class; the status is only a fallback
    if isinstance(wait := item["error"].get("retry_after"), int | float):
        err.retry_after = float(wait)
    return err
