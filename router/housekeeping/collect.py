"""Which items a collection pass removes, and removing them.

An item goes when its time (:mod:`router.housekeeping.kinds`) is older than its project's ``retention_days`` and
nothing live owns it. Live owners are, taken before the bucket is listed: every sandbox the router has (a warm
pool's unclaimed members included, however old); every sandbox that ended and whose record is still on its way
to the bucket (its journal not yet stored, or its record waiting in the spool: what it pushed must not go
before the record that names it lands); and, for a run's files, every run a live sandbox is labelled with
(``labels.run_id``). A project with no ``retention_days`` keeps everything.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from artifacts.store import ObjectStore
from grove.core.errors import GroveError
from router.housekeeping.kinds import KINDS, RUN, SANDBOX, Item, Kind, Owner
from router.housekeeping.scan import Holdings

log = logging.getLogger("grove.router")
DAY_S = 86400.0
_REMOVERS = 8
MAX_IDS = 1000
"""Most owner ids a result lists per kind (the counts and bytes cover them all)."""


@dataclass(frozen=True)
class Live:
    """What live things own now."""

    sandboxes: frozenset[str] = frozenset()
    """Sandboxes whose things stay: live, or ended with their record not yet in the bucket."""
    runs: frozenset[str] = frozenset()
    """Runs a live sandbox is labelled with."""

    def owns(self, owner: Owner) -> bool:
        """Whether something live owns what ``owner`` has."""
        if owner.kind == SANDBOX:
            return owner.id in self.sandboxes
        return owner.kind == RUN and owner.id in self.runs


def cutoff(now: float, retention_days: float) -> float:
    """The time before which an item is past a retention of ``retention_days``."""
    return now - retention_days * DAY_S


@dataclass
class Plan:
    """What one pass does with one project."""

    doomed: list[Item] = field(default_factory=list)
    """Past retention, owned by nothing live: removed."""
    kept_live: list[Item] = field(default_factory=list)
    """Past retention, but something live owns it: kept."""


def plan(holdings: Holdings, retention_days: float | None, now: float, live: Live) -> Plan:
    """Which of ``holdings``' items a pass at ``now`` removes, and which it keeps only because they are live."""
    out = Plan()
    if retention_days is None:
        return out
    before = cutoff(now, retention_days)
    for item in holdings.items:
        if item.time is None or item.time >= before:
            continue
        (out.kept_live if live.owns(item.owner) else out.doomed).append(item)
    return out


def remove(store: ObjectStore, items: list[Item], stop: threading.Event | None = None) -> tuple[list[Item], str | None]:
    """Delete each item's objects in its order (a few items at once); the items removed whole, and the first
    failure's message (S3 unreachable: what is left stays for the next pass). Once ``stop`` is set (the router
    stops) no further item is begun."""
    def one(item: Item) -> str | None:
        if stop is not None and stop.is_set():
            return "the router stopped"
        try:
            for info in item.objects:
                store.delete(info.key)
        except GroveError as exc:
            return exc.message
        return None

    removed: list[Item] = []
    error: str | None = None
    with ThreadPoolExecutor(max_workers=_REMOVERS) as pool:
        for item, failure in zip(items, pool.map(one, items), strict=True):
            if failure is None:
                removed.append(item)
            elif error is None:
                error = failure
    return removed, error


def by_kind(items: Iterable[Item], kinds: Iterable[Kind] = KINDS) -> dict[str, dict[str, Any]]:
    """Per kind: ``items`` (sandboxes, runs), ``count`` (records, files), ``bytes``, and the owners' ``ids``
    (the first :data:`MAX_IDS`, sorted)."""
    out: dict[str, dict[str, Any]] = {kind.name: {"items": 0, "count": 0, "bytes": 0, "ids": []} for kind in kinds}
    for item in items:
        total = out.setdefault(item.kind, {"items": 0, "count": 0, "bytes": 0, "ids": []})
        total["items"] += 1
        total["count"] += item.count
        total["bytes"] += item.bytes
        total["ids"].append(item.owner.id)
    for total in out.values():
        total["ids"] = sorted(total["ids"])[:MAX_IDS]
    return out
