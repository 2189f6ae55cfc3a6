"""Trajectory search for the viewer: one page at a time from the bucket's keys and index, never every record.

The trajectory keys (``trajectories/<day>/<task>/<sandbox>.msgpack``) are the spine: listing them is a
few list calls even for 10,000 records, and each key already says the day, the task and the sandbox,
so those filters cost nothing. Model and harness narrow the spine through their index prefix (keys
only). Outcome and run need the record's summary (``index/by-id/<sandbox>``): only as many are read as
a page needs, in parallel, up to :data:`MAX_SCAN` per request (the reply's cursor resumes after the last
one read). Newest day first; within a day, by task then sandbox id.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from artifacts import trajectory as tj
from artifacts.store import ObjectStore
from grove.errors import BadRequest, NotFound

MAX_SCAN = 2000
"""Summaries read at most per request when outcome or run filter them (the cursor continues)."""
_READERS = 8
OUTCOMES = ("pass", "fail", "infra_error", "none", "faults")
"""``none``: no outcome recorded; ``faults``: any infra fault noted, whatever the result."""
_UNDATED = "_undated"


@dataclass(frozen=True)
class Query:
    """What the trajectories page asks for."""

    task_id: str | None = None
    model: str | None = None
    harness: str | None = None
    outcome: str | None = None
    run_id: str | None = None
    date_from: str | None = None
    date_to: str | None = None
    after: str | None = None
    limit: int = 50

    def check(self) -> Query:
        """Refuse what cannot be a filter, with the reason."""
        if self.outcome is not None and self.outcome not in OUTCOMES:
            raise BadRequest(f"outcome must be one of {', '.join(OUTCOMES)}, got {self.outcome!r}")
        for name in ("date_from", "date_to"):
            day = getattr(self, name)
            if day is not None and not _is_day(day):
                raise BadRequest(f"{name} must be a day like 2026-11-30, got {day!r}")
        if not 1 <= self.limit <= 500:
            raise BadRequest(f"limit must be between 1 and 500, got {self.limit}")
        if self.after is not None and not self.after.startswith(tj.TRAJECTORY_PREFIX):
            raise BadRequest("after must be a cursor this page returned")
        return self


def search(store: ObjectStore, query: Query) -> dict[str, Any]:
    """``{"items": [summary...], "next": cursor or None, "scanned": n}`` for one page."""
    query.check()
    keys = _spine(store, query)
    if query.model or query.harness:
        for index, value in (("by-model", query.model), ("by-harness", query.harness)):
            if value:
                wanted = {o.key.rsplit("/", 1)[1] for o in store.list(tj.index_prefix(index, value))}
                keys = [k for k in keys if _sid_segment(k) in wanted]
    keys.sort(key=_order, reverse=True)
    if query.after is not None:
        cursor = _order(query.after)
        keys = [k for k in keys if _order(k) < cursor]
    items: list[dict[str, Any]] = []
    scanned = 0
    last: str | None = None
    with ThreadPoolExecutor(max_workers=_READERS) as pool:
        for batch in _batches(keys, query.limit):
            if scanned >= MAX_SCAN:
                break
            for key, summary in zip(batch, pool.map(_summary, [store] * len(batch), batch), strict=True):
                scanned += 1
                last = key
                if summary is not None and _matches(summary, query):
                    items.append(summary)
                    if len(items) == query.limit:
                        break
            if len(items) == query.limit:
                break
    more = last is not None and bool(keys) and _order(last) > _order(keys[-1])
    return {"items": items, "next": last if more else None, "scanned": scanned}


def _spine(store: ObjectStore, query: Query) -> list[str]:
    prefix = tj.TRAJECTORY_PREFIX
    if query.date_from and query.date_from == query.date_to:
        prefix += f"{query.date_from}/"
        if query.task_id:
            prefix += f"{tj.segment(query.task_id)}/"
    task = tj.segment(query.task_id) if query.task_id else None
    keys = []
    for obj in store.list(prefix):
        parts = obj.key[len(tj.TRAJECTORY_PREFIX):].split("/")
        if len(parts) != 3 or not parts[2].endswith(".msgpack"):
            continue
        day = parts[0]
        if task is not None and parts[1] != task:
            continue
        if (query.date_from or query.date_to) and day == _UNDATED:
            continue
        if (query.date_from and day < query.date_from) or (query.date_to and day > query.date_to):
            continue
        keys.append(obj.key)
    return keys


def _matches(summary: dict[str, Any], query: Query) -> bool:
    if query.run_id and summary.get("run_id") != query.run_id:
        return False
    # The index narrowed these already; checked again because a shortened segment could be shared.
    for name in ("task_id", "model", "harness"):
        wanted = getattr(query, name)
        if wanted and summary.get(name) != wanted:
            return False
    outcome = query.outcome
    if outcome == "none":
        return summary.get("result") is None
    if outcome == "faults":
        return bool(summary.get("infra_errors"))
    return outcome is None or summary.get("result") == outcome


def _summary(store: ObjectStore, key: str) -> dict[str, Any] | None:
    try:
        body = store.get_bytes(f"{tj.INDEX_PREFIX}by-id/{_sid_segment(key)}")
    except NotFound:  # the record is going up right now (by-id is written last) or was deleted
        return None
    found = json.loads(body)
    return found if isinstance(found, dict) and found.get("key") == key else None


def _sid_segment(key: str) -> str:
    return key.rsplit("/", 1)[1].removesuffix(".msgpack")


def _order(key: str) -> tuple[bool, str]:
    # Undated records sort below every dated one ('_' would otherwise sort above the digits).
    return (not key.startswith(f"{tj.TRAJECTORY_PREFIX}{_UNDATED}/"), key)


def _batches(keys: list[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(keys), size):
        yield keys[start : start + size]


def _is_day(text: str) -> bool:
    parts = text.split("-")
    return len(parts) == 3 and [len(p) for p in parts] == [4, 2, 2] and all(p.isdigit() for p in parts)
