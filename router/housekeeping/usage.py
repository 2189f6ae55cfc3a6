"""Per project, the bytes it keeps in object storage, as last measured: what a ``stored_bytes`` quota reads."""

from __future__ import annotations

import time
from collections.abc import Callable

MAX_AGE_S = 300.0
"""A figure older than this asks for a new measurement (in the background: the caller gets the old one)."""


class StorageUsage:
    """The stored bytes of each project — trajectories, pushed files, full outputs, run files — as the last report,
    collection pass or measurement found them. Reading is free (a create's admission asks it); a figure missing or
    older than :data:`MAX_AGE_S` asks ``measure`` for a new one, at most once per :data:`MAX_AGE_S` a project."""

    def __init__(self, measure: Callable[[str], None], max_age_s: float = MAX_AGE_S) -> None:
        self._measure = measure
        """Starts a measurement of a project in the background (it ends with :meth:`record`)."""
        self.max_age_s = max_age_s
        self._figures: dict[str, tuple[int, float]] = {}
        self._asked: dict[str, float] = {}

    def bytes(self, project: str) -> int | None:
        """The project's stored bytes as last measured; None before its first measurement (asked for now)."""
        found = self._figures.get(project)
        now = time.monotonic()
        stale = found is None or now - found[1] > self.max_age_s
        if stale and now - self._asked.get(project, float("-inf")) > self.max_age_s:
            self._asked[project] = now
            self._measure(project)
        return found[0] if found is not None else None

    def add(self, project: str, stored: int) -> None:
        """Bytes the router just stored for the project (a sandbox's record and artifacts as it ended, a run file):
        counted at once, so a quota holds between measurements. Nothing before the first measurement (which
        will list them)."""
        found = self._figures.get(project)
        if found is not None and stored > 0:
            self._figures[project] = (found[0] + stored, found[1])

    def record(self, project: str, stored: int) -> None:
        """A new measurement of the project."""
        self._figures[project] = (stored, time.monotonic())

    def measured_at(self, project: str) -> float | None:
        """``time.monotonic()`` of the project's last measurement, or None."""
        found = self._figures.get(project)
        return found[1] if found is not None else None
