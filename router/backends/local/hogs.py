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
import resource
import threading
import time
from pathlib import Path

from router.backends.local import kernfiles
from router.backends.local.cgroups import CGROUP_ROOT

log = logging.getLogger("grove.router")
NORMAL_SHARES = 1024
HOG_SHARES = 2
"""The kernel's minimum: a demoted hog runs when nothing else of the router's sandboxes wants the CPU."""
RELEASE_S = 10.0
"""Seconds without throttling before a hog gets its normal weight back."""
INTERVAL_S = 0.5
"""How often the sandboxes' throttling counters are read."""
OPEN_SHARE = 8
"""At most 1/8 of the process's descriptor limit is kept open on ``cpu.stat`` files (the router leaves
that share out of its connection cap); past it, the others are opened at each read."""


class HogWatch:
    """Watches the cpu cgroups of one router instance's sandboxes and sets their ``cpu.shares``."""

    def __init__(self, instance: str, root: Path = CGROUP_ROOT) -> None:
        self.parent = root / "cpu" / f"grove-{instance}"
        self._throttled: dict[str, int] = {}
        self._last_throttled: dict[str, float] = {}
        """Demoted sandboxes: when they were last seen throttled."""
        self._stats: dict[str, int] = {}
        """Each sandbox's ``cpu.stat``, kept open: with a warm pool of 1,000 every tick reads 1,000 of them,
        and a ``pread`` of an open one costs 2 us against 9-10 us for opening it again (the path walk)."""
        self._max_open: int | None = None
        self._lock = threading.Lock()
        """Held by a tick (in a worker thread) and by :meth:`close`: no descriptor is closed mid-read."""

    def tick(self, now: float | None = None) -> None:
        """Read every sandbox's ``nr_throttled``; demote the newly throttled, restore the long unthrottled."""
        with self._lock:
            self._tick(time.monotonic() if now is None else now)

    def _tick(self, now: float) -> None:
        seen: set[str] = set()
        with contextlib.suppress(FileNotFoundError), os.scandir(self.parent) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    seen.add(entry.name)
                    self._check(entry.name, entry.path, now)
        for gone in set(self._throttled) - seen:
            self._throttled.pop(gone, None)
            self._last_throttled.pop(gone, None)
        for gone in set(self._stats) - seen:
            os.close(self._stats.pop(gone))

    def close(self) -> None:
        """Close the kept ``cpu.stat`` files (the watch is stopping; a tick in flight ends first)."""
        with self._lock:
            for fd in self._stats.values():
                os.close(fd)
            self._stats.clear()

    def _check(self, name: str, path: str, now: float) -> None:
        throttled = self._nr_throttled(name, path)
        if throttled is None:
            return
        before = self._throttled.get(name)
        self._throttled[name] = throttled
        if before is None:  # first sight (a restarted router): a demoted sandbox stays so for a while
            if _shares(Path(path)) == HOG_SHARES:
                self._last_throttled[name] = now
            return
        if throttled > before:
            if name not in self._last_throttled:
                _set_shares(Path(path), HOG_SHARES)
            self._last_throttled[name] = now
        elif name in self._last_throttled and now - self._last_throttled[name] >= RELEASE_S:
            _set_shares(Path(path), NORMAL_SHARES)
            del self._last_throttled[name]

    def demoted(self) -> set[str]:
        """Sandboxes currently running with :data:`HOG_SHARES`."""
        return set(self._last_throttled)

    def _nr_throttled(self, name: str, path: str) -> int | None:
        try:
            return _parse_throttled(self._read_stat(name, path))
        except (OSError, ValueError):
            return None

    def _read_stat(self, name: str, path: str) -> bytes:
        """The group's ``cpu.stat`` as it is now: ``pread`` at 0 of a cgroup file renders it afresh."""
        fd = self._stats.get(name)
        if fd is not None:
            try:
                return os.pread(fd, 4096, 0)
            except OSError:  # the group was removed (and maybe made again under the same name)
                os.close(self._stats.pop(name))
        if self._max_open is None:
            self._max_open = resource.getrlimit(resource.RLIMIT_NOFILE)[0] // OPEN_SHARE
        if len(self._stats) >= self._max_open:
            return kernfiles.read(f"{path}/cpu.stat")
        fd = os.open(f"{path}/cpu.stat", os.O_RDONLY | os.O_CLOEXEC)
        self._stats[name] = fd
        return os.pread(fd, 4096, 0)

    async def run(self, interval_s: float = INTERVAL_S) -> None:
        """Tick forever (cancel to stop); file reads happen off the event loop."""
        try:
            while True:
                try:
                    await asyncio.to_thread(self.tick)
                except Exception:  # a watch that dies would leave hogs demoted forever: log and go on
                    log.exception("hog watch tick failed")
                await asyncio.sleep(interval_s)
        finally:
            self.close()


def _parse_throttled(stat: bytes) -> int | None:
    at = stat.find(b"nr_throttled ")
    if at < 0 or (at > 0 and stat[at - 1] != 0x0A):
        return None
    return int(stat[at + len(b"nr_throttled ") :].split(b"\n", 1)[0])


def _shares(group: Path) -> int | None:
    try:
        return int((group / "cpu.shares").read_text())
    except (OSError, ValueError):
        return None


def _set_shares(group: Path, shares: int) -> None:
    with contextlib.suppress(OSError):  # the sandbox went away between the read and the write
        (group / "cpu.shares").write_text(str(shares))
