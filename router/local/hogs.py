"""CPU hogs yield to their neighbours: a sandbox that uses up its CPU quota gets the lowest ``cpu.shares``.

Every sandbox of a router sits in one parent cpu cgroup with the same weight, so when one of them spins on
every CPU its quota allows, the others wait behind it at each wake-up: on a loaded 2-CPU machine a
neighbour spinning one CPU's worth doubled another sandbox's exec p50 (``perf.bench_noisy``). The CFS
quota bounds how much a hog gets, not when. So a sandbox that was throttled (it ran out of quota in a
period: it wants more CPU than it may have) gets ``cpu.shares`` :data:`HOG_SHARES` until it has gone
:data:`RELEASE_S` without being throttled. It keeps its whole quota whenever the CPUs are otherwise idle
(shares only weigh contenders); it merely yields to sandboxes that wake for short work. Two hogs are
both demoted, so between them nothing changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from pathlib import Path

from router.local import kernfiles
from router.local.cgroups import CGROUP_ROOT

log = logging.getLogger("grove.router")
NORMAL_SHARES = 1024
HOG_SHARES = 2
"""The kernel's minimum: a demoted hog runs when nothing else of the router's sandboxes wants the CPU."""
RELEASE_S = 10.0
"""Seconds without throttling before a hog gets its normal weight back."""
INTERVAL_S = 0.5
"""How often the sandboxes' throttling counters are read."""


class HogWatch:
    """Watches the cpu cgroups of one router instance's sandboxes and sets their ``cpu.shares``."""

    def __init__(self, instance: str, root: Path = CGROUP_ROOT) -> None:
        self.parent = root / "cpu" / f"grove-{instance}"
        self._throttled: dict[str, int] = {}
        self._last_throttled: dict[str, float] = {}
        """Demoted sandboxes: when they were last seen throttled."""

    def tick(self, now: float | None = None) -> None:
        """Read every sandbox's ``nr_throttled``; demote the newly throttled, restore the long unthrottled."""
        now = time.monotonic() if now is None else now
        seen: set[str] = set()
        # os.scandir and kernfiles: with a warm pool of 1,000 this reads 1,000 files every tick, and pathlib's
        # reads (nine system calls each, every one a GIL hand-off) cost the event loop's claims beside it.
        with contextlib.suppress(FileNotFoundError), os.scandir(self.parent) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    seen.add(entry.name)
                    self._check(Path(entry.path), now)
        for gone in set(self._throttled) - seen:
            self._throttled.pop(gone, None)
            self._last_throttled.pop(gone, None)

    def _check(self, group: Path, now: float) -> None:
        name = group.name
        throttled = _nr_throttled(group)
        if throttled is None:
            return
        before = self._throttled.get(name)
        self._throttled[name] = throttled
        if before is None:  # first sight (a restarted router): a demoted sandbox stays so for a while
            if _shares(group) == HOG_SHARES:
                self._last_throttled[name] = now
            return
        if throttled > before:
            if name not in self._last_throttled:
                _set_shares(group, HOG_SHARES)
            self._last_throttled[name] = now
        elif name in self._last_throttled and now - self._last_throttled[name] >= RELEASE_S:
            _set_shares(group, NORMAL_SHARES)
            del self._last_throttled[name]

    def demoted(self) -> set[str]:
        """Sandboxes currently running with :data:`HOG_SHARES`."""
        return set(self._last_throttled)

    async def run(self, interval_s: float = INTERVAL_S) -> None:
        """Tick forever (cancel to stop); file reads happen off the event loop."""
        while True:
            try:
                await asyncio.to_thread(self.tick)
            except Exception:  # a watch that dies would leave hogs demoted forever: log and go on
                log.exception("hog watch tick failed")
            await asyncio.sleep(interval_s)


def _nr_throttled(group: Path) -> int | None:
    try:
        stat = kernfiles.read(f"{group}/cpu.stat")
        at = stat.find(b"nr_throttled ")
        if at < 0 or (at > 0 and stat[at - 1] != 0x0A):
            return None
        return int(stat[at + len(b"nr_throttled ") :].split(b"\n", 1)[0])
    except (OSError, ValueError):
        return None


def _shares(group: Path) -> int | None:
    try:
        return int((group / "cpu.shares").read_text())
    except (OSError, ValueError):
        return None


def _set_shares(group: Path, shares: int) -> None:
    with contextlib.suppress(OSError):  # the sandbox went away between the read and the write
        (group / "cpu.shares").write_text(str(shares))
