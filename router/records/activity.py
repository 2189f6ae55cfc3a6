"""When each sandbox was last used, kept across router restarts (``<state>/activity.json``).

A sandbox's activity clock (its last API call or heartbeat) decides heartbeat expiry and scale-to-zero. It
changes on every call, so it is not in the record (whose writes are durable, one fsync each): the reaper writes
all of them to one file every few seconds instead, and a restarted router reads them back. Before this, a
restart set every clock to "now", and the sandboxes a killed client had left lived a whole heartbeat timeout
more. A client that was alive but could not reach the router while it was down gets :data:`RESTART_GRACE_S`
to come back (the SDK beats at least every 30 s).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

from grove.statedir import StateDir
from router.records.registry import SandboxRecord

RESTART_GRACE_S = 120.0
"""After a restart, how long a live client has to heartbeat before an expired clock deletes its sandbox."""


class ActivityClocks:
    """The file of last-activity times, written when they changed."""

    def __init__(self, state_dir: Path) -> None:
        self._path = StateDir(state_dir).activity
        self._written: dict[str, float] = {}

    def load(self) -> dict[str, float]:
        """The clocks last written (empty if none were, or the file is unreadable: then every clock restarts)."""
        with contextlib.suppress(OSError, ValueError):
            data = json.loads(self._path.read_text())
            if isinstance(data, dict):
                return {str(k): float(v) for k, v in data.items() if isinstance(v, int | float)}
        return {}

    def save(self, records: Iterable[SandboxRecord]) -> None:
        """Write the clocks of ``records`` if any changed since the last write (atomically; no fsync: a clock
        lost to a crash only restarts, as it always did)."""
        clocks = {r.id: round(r.last_activity, 3) for r in records if r.pool is None}
        if clocks == self._written:
            return
        tmp = self._path.with_name(self._path.name + ".tmp")
        tmp.write_text(json.dumps(clocks, separators=(",", ":")))
        os.replace(tmp, self._path)
        self._written = clocks


def restored(saved: float | None, now: float, timeout_s: float) -> float:
    """A sandbox's clock after a restart: as last written, but never so old that its heartbeat expires within
    :data:`RESTART_GRACE_S` of the restart (its client may just not have reached the router meanwhile)."""
    if saved is None:
        return now
    return max(saved, now - timeout_s + RESTART_GRACE_S)
