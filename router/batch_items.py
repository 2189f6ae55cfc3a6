"""The items of a batch create (``POST /v1/sandboxes/batch``), parsed, grouped and answered one by one:
what the plain answer (:mod:`router.batch`) and the streamed one (:mod:`router.batch_stream`) share."""

from __future__ import annotations

import dataclasses
from typing import Any

from grove.errors import BadRequest
from grove.schema import check_field, parse
from router.models import MAX_BATCH, CreateRequest
from router.replies import error_of
from router.service import SandboxService


def items_of(body: Any) -> list[Any]:
    """The batch's items, not yet validated (each is, on its own, by :func:`alike`); a body of the wrong
    shape, an empty batch or one past :data:`MAX_BATCH` is the whole call's 400."""
    if not isinstance(body, dict):
        raise BadRequest('body must be an object: {"sandboxes": [<create body>, ...]}')
    if unknown := sorted(set(body) - {"sandboxes", "shared", "stream"}):
        raise BadRequest(f"body: unknown field(s) {', '.join(map(repr, unknown))}; known: sandboxes, shared, stream")
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
class Alike:
    """Consecutive items that differ only in their request ids (``create_many``'s), parsed once."""

    rest: dict[str, Any]
    """The first item without its request id."""
    req: CreateRequest
    given: frozenset[str]
    indexes: list[int] = dataclasses.field(default_factory=list)
    request_ids: list[str | None] = dataclasses.field(default_factory=list)


def alike(service: SandboxService, items: list[Any], answers: list[dict[str, Any] | None],
           what: str) -> tuple[list[Alike], list[tuple[int, CreateRequest, frozenset[str]]]]:
    """The items parsed: runs of items alike but for new request ids, and the items to create on their own
    (a request id used before or twice in the batch: :meth:`SandboxService.create` finds its first
    sandbox). An item that does not parse gets its error in ``answers``."""
    groups: list[Alike] = []
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
                group = Alike(rest or {}, req, frozenset(item))
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
            answers[i] = item_error(service, exc, i, what)
    return [group for group in groups if group.indexes], alone


async def create_one(service: SandboxService, req: CreateRequest, given: frozenset[str], index: int,
                  what: str) -> dict[str, Any]:
    """One item on its own: its public record, or its error body."""
    try:
        return (await service.create(req, given)).public()
    except Exception as exc:
        return item_error(service, exc, index, what)


def item_error(service: SandboxService, exc: Exception, index: int, what: str) -> dict[str, Any]:
    """An item's error body (with ``retry_after`` when the error has one)."""
    err = error_of(exc, service.settings.state_dir, f"{what} item {index}")
    answer = err.to_body()
    if err.retry_after is not None:
        answer["error"]["retry_after"] = err.retry_after
    return answer
