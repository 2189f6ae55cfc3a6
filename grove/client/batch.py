"""Many sandboxes in one call: the bodies and the calls behind both clients' ``create_many``
(``POST /v1/sandboxes/batch``)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from grove.errors import GroveError, Invalid, error_from_body

if TYPE_CHECKING:
    from grove.client.aio import AsyncGrove

MAX_BATCH = 1000
"""Most creates the router takes in one call (``router.models.MAX_BATCH``); a larger ask is split."""


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


async def send(client: AsyncGrove, bodies: list[dict[str, Any]]) -> list[dict[str, Any] | GroveError]:
    """Each body's public record or error, in order, in calls of at most :data:`MAX_BATCH`. A call that
    fails as a whole (after the client's retries) fails its items and every later one, which are not sent;
    what earlier calls made is still answered, so it is never lost with the error."""
    out: list[dict[str, Any] | GroveError] = []
    for start in range(0, len(bodies), MAX_BATCH):
        try:
            answer = await client.request("POST", "/v1/sandboxes/batch", retry=True,
                                          msgpack_body={"sandboxes": bodies[start:start + MAX_BATCH], "shared": True})
        except GroveError as exc:
            out.extend(exc for _ in bodies[start:])
            break
        shared = answer.get("shared", {})
        out.extend(_outcome(item, shared) for item in answer["sandboxes"])
    return out


def _outcome(item: dict[str, Any], shared: dict[str, Any]) -> dict[str, Any] | GroveError:
    if "id" in item:  # a record (whose own "error" is null, or says why its start failed)
        return {**shared, **item} if shared else item
    err = error_from_body(500, item)  # the code names the class; the status is only a fallback
    if isinstance(wait := item["error"].get("retry_after"), int | float):
        err.retry_after = float(wait)
    return err
