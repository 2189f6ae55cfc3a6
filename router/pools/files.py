"""``<state>/pools``: what of the warm pools outlives a router — each pool's definition and its counters.

``<key>.json`` is the definition (a ``POST /v1/pools`` body; the key is the pool's name in the default project,
``<project>.<name>`` in another); ``<key>.counts`` holds its ``claims`` and
``misses`` so far, so that a restarted router goes on counting instead of starting again at zero. The
counters are kept apart (and not named ``*.json``) so that a definition file stays exactly a
``PoolRequest``, which any router version reads.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

from grove.core.errors import GroveError, NotFound
from grove.core.schema import parse
from grove.statedir import StateDir
from router.models import PoolRequest
from router.projects.model import DEFAULT

log = logging.getLogger("grove.router")


@dataclasses.dataclass(frozen=True)
class Counts:
    """A pool's counters."""

    claims: int = 0
    """Creates that took a ready member."""
    misses: int = 0
    """Creates that named the pool while it had no ready member."""


class PoolFiles:
    """The pool files of one state dir (the router's while it runs; ``grove down`` touches them after)."""

    def __init__(self, state_dir: Path) -> None:
        self.dir = StateDir(state_dir).pools

    def definitions(self) -> Iterator[tuple[str, PoolRequest]]:
        """Every readable definition with its project, by key; an unreadable one is set aside (renamed), never
        deleted."""
        if not self.dir.is_dir():
            return
        for path in sorted(self.dir.glob("*.json")):
            project, _, name = path.stem.rpartition(".")
            try:
                definition = parse(PoolRequest, json.loads(path.read_text()))
                if definition.name != name:
                    raise ValueError(f"it defines pool {definition.name!r}, not {name!r}")
                yield project or DEFAULT, definition
            except (ValueError, GroveError) as exc:
                path.rename(path.with_suffix(f".corrupt-{int(time.time())}"))
                log.warning("set aside unreadable pool definition %s: %s", path.name, exc)

    def definition(self, key: str) -> PoolRequest:
        """One pool's definition (NotFound if it has none here)."""
        try:
            return parse(PoolRequest, json.loads((self.dir / f"{key}.json").read_text()))
        except FileNotFoundError:
            raise NotFound(f"no pool {key!r} in {self.dir}") from None

    def save(self, key: str, definition: PoolRequest) -> None:
        """Write a definition (atomically: a reader sees the old one or the new one)."""
        self._write(f"{key}.json", dataclasses.asdict(definition))

    def counts(self, name: str) -> Counts:
        """A pool's counters as last saved (zero if never, or unreadable: they are statistics, not state)."""
        try:
            data = json.loads((self.dir / f"{name}.counts").read_text())
            return Counts(claims=int(data["claims"]), misses=int(data["misses"]))
        except (OSError, ValueError, KeyError, TypeError):
            return Counts()

    def save_counts(self, name: str, counts: Counts) -> None:
        """Write a pool's counters."""
        self._write(f"{name}.counts", dataclasses.asdict(counts))

    def remove(self, name: str) -> None:
        """Forget a pool: its definition and its counters."""
        for suffix in (".json", ".counts"):
            with contextlib.suppress(FileNotFoundError):
                (self.dir / f"{name}{suffix}").unlink()

    def _write(self, filename: str, data: object) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.dir / f".tmp-{filename}-{os.getpid()}"
        tmp.write_text(json.dumps(data))
        tmp.replace(self.dir / filename)
