"""One project's part of the bucket, listed and grouped into items (:mod:`router.housekeeping.kinds`).

Each prefix a kind names is listed once per scan. The index entries kinds read are fetched in parallel and
kept from one scan to the next by key and etag (a record's entry is written once; an artifact pushed again
gets a new etag), so a later scan of a large project reads only what is new since the last.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from artifacts.store import ObjectInfo, ObjectStore
from grove.core.errors import NotFound
from router.housekeeping.kinds import KINDS, Item, Kind, Owner
from router.storage import Storage

log = logging.getLogger("grove.router")
_READERS = 8
_KEPT = ("ended_at", "kind")
"""The fields of an index entry the kinds read (the rest of a body is not kept)."""


class EntryCache:
    """Index entries' fields by key, each with the etag it was read at (one per project, across scans)."""

    def __init__(self) -> None:
        self._fields: dict[str, tuple[str | None, dict[str, Any]]] = {}

    def get(self, info: ObjectInfo) -> dict[str, Any] | None:
        """The fields read of this version of the entry, if it was read."""
        found = self._fields.get(info.key)
        return found[1] if found is not None and found[0] == info.etag and info.etag is not None else None

    def put(self, info: ObjectInfo, fields: dict[str, Any]) -> None:
        """Remember what this version of the entry says."""
        self._fields[info.key] = (info.etag, fields)

    def keep_only(self, keys: set[str]) -> None:
        """Forget entries no longer in the bucket."""
        for key in [k for k in self._fields if k not in keys]:
            del self._fields[key]


class Listing:
    """What one scan listed of a project's part of the bucket (:class:`router.housekeeping.kinds.Listed`)."""

    def __init__(self, store: ObjectStore, cache: EntryCache) -> None:
        self._store = store
        self._cache = cache
        self._listed: dict[str, list[ObjectInfo]] = {}

    def under(self, prefix: str) -> list[ObjectInfo]:
        """The objects under ``prefix``, listed at the first ask."""
        if prefix not in self._listed:
            self._listed[prefix] = self._store.list(prefix)
        return self._listed[prefix]

    def fetch(self, entries: str, prefixes: Iterable[str]) -> None:
        """Read, in parallel, the entries under ``entries`` (within one of ``prefixes``) not read before."""
        wanted = [info for prefix in prefixes if entries.startswith(prefix)
                  for info in self.under(prefix) if info.key.startswith(entries) and self._cache.get(info) is None]
        if not wanted:
            return
        with ThreadPoolExecutor(max_workers=_READERS) as pool:
            for info, fields in zip(wanted, pool.map(self._read, wanted), strict=True):
                self._cache.put(info, fields)

    def entry(self, info: ObjectInfo) -> dict[str, Any]:
        """The fields a kind reads of an index entry (from the cache, or read now)."""
        found = self._cache.get(info)
        if found is None:
            found = self._read(info)
            self._cache.put(info, found)
        return found

    def keys(self) -> set[str]:
        """Every key listed."""
        return {info.key for infos in self._listed.values() for info in infos}

    def _read(self, info: ObjectInfo) -> dict[str, Any]:
        try:
            body = json.loads(self._store.get_bytes(info.key))
        except NotFound:  # removed since the listing
            return {}
        except ValueError:
            log.warning("index entry %s is not JSON; its item is aged by its objects", info.key)
            return {}
        return {name: body[name] for name in _KEPT if name in body} if isinstance(body, dict) else {}


@dataclass
class Holdings:
    """What one project keeps, as one scan found it."""

    project: str
    items: list[Item]
    """Every item of every kind."""
    spooled: int
    """Trajectory records waiting in the router's local spool for the bucket (not in it yet)."""
    scanned_at: float
    """When the scan began (seconds since the epoch)."""
    took_s: float
    """How long it took."""

    def bytes(self) -> int:
        """What all its items take in the bucket."""
        return sum(item.bytes for item in self.items)

    def totals(self, kinds: Iterable[Kind] = KINDS) -> dict[str, dict[str, int]]:
        """Per kind: ``count`` (records, files), ``items`` (sandboxes, runs) and ``bytes``."""
        out = {kind.name: {"count": 0, "items": 0, "bytes": 0} for kind in kinds}
        for item in self.items:
            total = out.setdefault(item.kind, {"count": 0, "items": 0, "bytes": 0})
            total["count"] += item.count
            total["items"] += 1
            total["bytes"] += item.bytes
        return out


def scan(project: str, storage: Storage, cache: EntryCache, kinds: Iterable[Kind] = KINDS) -> Holdings:
    """List ``project``'s part of the bucket (``storage``: its view) and group it into items (blocks: run it in a
    thread). An S3 failure leaves as its ``GroveError``."""
    kinds = tuple(kinds)
    started, at = time.monotonic(), time.time()
    listing = Listing(storage.objects, cache)
    for kind in kinds:
        for entries in kind.entries:
            listing.fetch(entries, kind.prefixes)
    items = [item for kind in kinds for item in kind.items(listing)]
    _together(items)
    cache.keep_only(listing.keys())
    return Holdings(project, items, storage.trajectories.pending(), at, time.monotonic() - started)


def _together(items: list[Item]) -> None:
    """Items of one owner are kept together: each takes the newest time among them (a sandbox's files stay as
    long as its record, which names them)."""
    newest: dict[Owner, float] = {}
    for item in items:
        if item.time is not None:
            newest[item.owner] = max(item.time, newest.get(item.owner, item.time))
    for item in items:
        item.time = newest.get(item.owner, item.time)
