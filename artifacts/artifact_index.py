"""Artifacts in the bucket by their index: record one, look one up, list them a page at a time.

Synchronous like :class:`artifacts.store.ObjectStore` (the router calls it through ``asyncio.to_thread``).
The layout and the entry's fields are in :mod:`artifacts.catalog`.
"""

from __future__ import annotations

import itertools
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from artifacts import catalog
from artifacts.catalog import Query
from artifacts.store import ObjectStore
from grove.core.artifact import Artifact
from grove.core.errors import Invalid, NotFound

log = logging.getLogger(__name__)
MAX_PAGE = 1000
DEFAULT_PAGE = 100
_SCAN_FACTOR = 20  # index keys read per page at most, per entry asked for, when some filter is not in the prefix
_READERS = 8  # entry bodies fetched in parallel


@dataclass(frozen=True)
class Page:
    """One page of a listing."""

    entries: list[Artifact]
    """The artifacts on this page, in index key order."""
    next_token: str | None
    """Pass it back to get the next page; None: this was the last."""


class ArtifactIndex:
    """The index entries of the artifacts in one bucket."""

    def __init__(self, store: ObjectStore) -> None:
        self.objects = store
        """The bucket."""

    def record(self, entry: Artifact) -> None:
        """Write the entry under every index it belongs to (overwriting an earlier push of the same path)."""
        body = entry.to_json()
        for key in catalog.entry_keys(entry):  # by-sandbox last: a lookup never finds bytes not yet stored
            self.objects.put_bytes(key, body, content_type="application/json")

    def entry(self, sandbox_id: str, path: str) -> Artifact:
        """The entry of one artifact; NotFound naming it if it was never stored (or has expired)."""
        try:
            return Artifact.from_json(self.objects.get_bytes(catalog.by_sandbox_key(sandbox_id, path)))
        except NotFound:
            raise NotFound(f"sandbox {sandbox_id} has no stored artifact {path} (list them with "
                           f"GET /v1/sandboxes/{sandbox_id}/artifacts)") from None

    def page(self, query: Query, limit: int = DEFAULT_PAGE, token: str | None = None) -> Page:
        """Up to ``limit`` entries matching ``query``, after where ``token`` left off.

        The listing walks the narrowest index prefix; fields it does not cover are checked per entry, and
        at most 20 times ``limit`` keys are read per call, so a page may hold fewer than ``limit`` entries
        and still have a next one.
        """
        if not 1 <= limit <= MAX_PAGE:
            raise Invalid(f"page size must be between 1 and {MAX_PAGE}, got {limit}")
        prefix = query.prefix()
        after = catalog.after_key(token, prefix) if token else None
        narrow = self._prefix_covers(query)
        budget = limit if narrow else limit * _SCAN_FACTOR
        keys = list(itertools.islice(self.objects.list_after(prefix, after), budget + 1))
        more = len(keys) > budget
        keys = keys[:budget]
        entries: list[Artifact] = []
        last: str | None = None
        with ThreadPoolExecutor(max_workers=_READERS) as pool:
            # Bodies are read a page's worth at a time: a full page stops the reading.
            for start in range(0, len(keys), limit):
                chunk = keys[start:start + limit]
                for key, entry in zip(chunk, pool.map(self._read, chunk), strict=True):
                    last = key
                    if entry is not None and query.matches(entry):
                        entries.append(entry)
                    if len(entries) == limit:
                        break
                if len(entries) == limit:
                    break
        more = more or (last is not None and last != keys[-1])
        return Page(entries, catalog.page_token(last) if more and last is not None else None)

    @staticmethod
    def _prefix_covers(query: Query) -> bool:
        # The prefix names the run (and sandbox), else the task (and sandbox), else the sandbox: any
        # other field given must be checked entry by entry.
        if query.run_id:
            return query.task_id is None
        return True

    def _read(self, key: str) -> Artifact | None:
        try:
            return Artifact.from_json(self.objects.get_bytes(key))
        except NotFound:  # expired between the listing and the read
            return None
        except Invalid as exc:  # not written by grove: skipped, so one bad object cannot hide the others
            log.warning("skipping %s in the artifact index: %s", key, exc.message)
            return None
