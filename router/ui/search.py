"""Trajectory search for the viewer: one page at a time from the bucket's keys and index, never every record.

The trajectory keys (``trajectories/<day>/<task>/<sandbox>.msgpack``) are the spine, walked a day at a
time, newest first: one short listing for the days, then one per day visited (a page usually needs
one), and a key already says the day, the task and the sandbox, so those filters cost nothing (a task
filter lists only ``<day>/<task>/``). Model, harness, outcome and run need the record's summary
(``index/by-id/<sandbox>``): only as many are read as the page needs, in parallel, up to
:data:`MAX_SCAN` per request (the reply's cursor resumes after the last one read), and kept
(:class:`Summaries`) for the next page or search. (Listing a model's whole index prefix instead costs
more than reading a page's summaries: S3 lists about a thousand keys per call, and seaweedfs slowly.)
Within a day, records come by task, then sandbox id.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from artifacts import trajectory as tj
from artifacts.store import ObjectStore
from grove.core.errors import BadRequest, NotFound
from router.projects.model import DEFAULT

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


class Summaries:
    """Summaries already read, by project and trajectory key: a record's summary never changes once stored, and
    paging on or refining a search reads the same ones again. Bounded (least recently used go). The project is
    part of the key: two projects' parts of the bucket hold the same keys, and one's summary is never another's
    answer."""

    def __init__(self, size: int = 100_000) -> None:
        self._size = size
        self._items: OrderedDict[tuple[str, str], dict[str, Any]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, project: str, store: ObjectStore, key: str) -> dict[str, Any] | None:
        """The summary of the record at ``key`` of ``store``, ``project``'s part of the bucket (None if its index
        entry is missing)."""
        ident = (project, key)
        with self._lock:
            found = self._items.get(ident)
            if found is not None:
                self._items.move_to_end(ident)
                return found
        found = _summary(store, key)
        if found is not None:
            with self._lock:
                self._items[ident] = found
                while len(self._items) > self._size:
                    self._items.popitem(last=False)
        return found


def search(store: ObjectStore, query: Query, summaries: Summaries | None = None,
           project: str = DEFAULT) -> dict[str, Any]:
    """``{"items": [summary...], "next": cursor or None, "scanned": n}`` for one page of ``store``, ``project``'s
    part of the bucket."""
    query.check()
    cursor = _order(query.after) if query.after is not None else None
    cache = summaries or Summaries()
    items: list[dict[str, Any]] = []
    scanned = 0
    last: str | None = None
    with ThreadPoolExecutor(max_workers=_READERS) as pool:
        for day in _days(store, query):
            keys = _day_keys(store, day, query)
            if cursor is not None:
                keys = [k for k in keys if _order(k) < cursor]
            for batch in _batches(keys, query.limit):
                found = pool.map(cache.get, [project] * len(batch), [store] * len(batch), batch)
                for key, summary in zip(batch, found, strict=True):
                    scanned += 1
                    last = key
                    if summary is not None and _matches(summary, query):
                        items.append(summary)
                        if len(items) == query.limit:
                            return {"items": items, "next": key, "scanned": scanned}
                if scanned >= MAX_SCAN:
                    return {"items": items, "next": last, "scanned": scanned}
    return {"items": items, "next": None, "scanned": scanned}


def _days(store: ObjectStore, query: Query) -> list[str]:
    """The days that have records, newest first (undated last), within the query's range."""
    days = [p[len(tj.TRAJECTORY_PREFIX):].rstrip("/") for p in store.prefixes(tj.TRAJECTORY_PREFIX)]
    if query.date_from or query.date_to:
        days = [d for d in days if d != _UNDATED and (not query.date_from or d >= query.date_from)
                and (not query.date_to or d <= query.date_to)]
    if query.after is not None:
        cursor_day = query.after[len(tj.TRAJECTORY_PREFIX):].split("/", 1)[0]
        days = [d for d in days if _day_order(d) <= _day_order(cursor_day)]
    return sorted(days, key=_day_order, reverse=True)


def _day_keys(store: ObjectStore, day: str, query: Query) -> list[str]:
    """One day's trajectory keys (of one task, with that filter), newest-first order."""
    prefix = f"{tj.TRAJECTORY_PREFIX}{day}/"
    if query.task_id:
        prefix += f"{tj.segment(query.task_id)}/"
    keys = [o.key for o in store.list(prefix) if o.key.endswith(".msgpack") and o.key.count("/") == 3]
    return sorted(keys, key=_order, reverse=True)


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


def _day_order(day: str) -> tuple[bool, str]:
    return (day != _UNDATED, day)


def _batches(keys: list[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(keys), size):
        yield keys[start : start + size]


def _is_day(text: str) -> bool:
    parts = text.split("-")
    return len(parts) == 3 and [len(p) for p in parts] == [4, 2, 2] and all(p.isdigit() for p in parts)
