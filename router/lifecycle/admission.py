"""Admission: whether a new sandbox may start now — within its project's quotas, and on a host with room.

**Quotas** (:class:`~router.projects.model.Quotas`, per project, none by default) count what the project
reserves: its live sandboxes (warm-pool members included), those starting at once, and the sums of their
``cpu``, ``memory_mb`` and ``disk_mb``; and the bytes it keeps in object storage. A create past one is a 429
naming the quota, with a ``Retry-After``; nothing of it was made.

**The host** (the local backend; a cluster's scheduler does this for Knative) is asked for what sandboxes
actually take, not what their limits allow: a coding sandbox's 1 GiB limit costs a few MiB, a desktop's
hundreds. A create is admitted while the host's available memory (``MemAvailable``), less what the starts in
flight are about to take (each counted at ``min(memory_mb, START_MEMORY_MB)``, a desktop's at up to
``DESKTOP_START_MB``, until it runs and shows in
``MemAvailable`` itself), keeps ``memory_reserve_mb`` for the host; and while the state dir's file system
keeps ``disk_reserve_mb`` free (a reserve of 0 turns that check off: an operator who watches the host
by other means, or a test that fills the disk on purpose). Past that the create is a 503 with
``Retry-After`` saying which and how much: a burst is refused before the host runs out, never
half-started, and its clients retry as the sandboxes before them end.

A create that the host refuses *only* for the room promised to starts still in flight (it would fit were they
done) waits for them instead, in its project's line (woken round-robin between projects, as starts are), for up
to :data:`HOST_WAIT_S`
(:meth:`Admission.wait_for_room`): a start's promise (64 MiB) is far more than the few MiB a ready sandbox then
shows, so a 1,000 burst on a 24 GiB host would otherwise have most of its creates refused while the host had
room for all of them (measured: 563 of 1,000, perf/README.md). A host short of memory with nothing starting still
refuses at once, and so is a create over its project's quotas: those are checked before the wait (counting
nothing) and again when it is admitted (creates admitted while it waited may have taken them).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from grove.core.errors import QuotaExceeded, Unavailable
from router.lifecycle.fairness import ProjectLines
from router.models import CreateRequest
from router.projects.files import ProjectFiles
from router.projects.model import Quotas, Usage
from router.records.registry import Registry

START_MEMORY_MB = 64
"""What a starting sandbox is counted at (or its ``memory_mb``, if less) until it runs: about what an
interpreter and a shell take; what it grows to afterwards shows in the host's available memory."""
DESKTOP_START_MB = 400
"""The same for a sandbox made with a ``desktop``: Xvfb, a window manager and Chromium with one tab take
~250-350 MiB once up (perf/results/desktop.json), most of it while the browser starts."""


def start_memory_mb(req: CreateRequest) -> float:
    """What a starting sandbox is counted at until it runs (see :data:`START_MEMORY_MB`)."""
    return min(req.memory_mb, DESKTOP_START_MB if req.desktop is not None else START_MEMORY_MB)
START_DISK_MB = 8
"""The same for its disk: a writable layer starts as a sparse copy of its image's template (under 1 MiB
written, measured with ``du`` on a fresh sandbox), and grows as the sandbox writes."""
_SAMPLE_S = 0.05
"""How long one reading of the host's memory and disk serves (a batch of 1,000 creates reads it a few times)."""
_QUOTA_RETRY_S = 5.0
_STARTING_RETRY_S = 1.0
_STORED_RETRY_S = 60.0
_HOST_RETRY_S = 2.0
HOST_WAIT_S = 60.0
"""How long a create waits while the host's room is promised to starts in flight, before its 503."""
MIB = 1 << 20


@dataclass(frozen=True)
class HostReading:
    """The host's memory and the state dir's file system, as last read (MiB)."""

    memory_total_mb: float
    memory_available_mb: float
    disk_total_mb: float
    disk_free_mb: float


def read_host(state_dir: Path) -> HostReading:
    """``/proc/meminfo``'s MemTotal and MemAvailable, and the state dir's file system's size and free space."""
    fields: dict[str, float] = {}
    with open("/proc/meminfo", encoding="ascii") as fh:
        for line in fh:
            name, _, rest = line.partition(":")
            if name in ("MemTotal", "MemAvailable"):
                fields[name] = int(rest.split()[0]) / 1024
    st = os.statvfs(state_dir)
    return HostReading(fields["MemTotal"], fields["MemAvailable"], st.f_blocks * st.f_frsize / MIB,
                       st.f_bavail * st.f_frsize / MIB)


@dataclass(frozen=True)
class Reserves:
    """What the host keeps for itself (MiB): creates stop short of it."""

    memory_mb: float
    disk_mb: float

    @classmethod
    def default(cls, host: HostReading, memory_mb: float | None = None, disk_mb: float | None = None) -> Reserves:
        """The given reserves, else 5 % of memory (at least 1 GiB) and 5 % of the disk (at least 2 GiB)."""
        return cls(memory_mb if memory_mb is not None else max(1024.0, 0.05 * host.memory_total_mb),
                   disk_mb if disk_mb is not None else max(2048.0, 0.05 * host.disk_total_mb))


class Admission:
    """Admits creates: the project's quotas, then the host's room (see the module's docstring)."""

    def __init__(self, registry: Registry, projects: ProjectFiles, state_dir: Path, *, host: bool,
                 memory_reserve_mb: float | None = None, disk_reserve_mb: float | None = None,
                 stored_bytes: Callable[[str], int | None] | None = None,
                 checkpoint_mb: Callable[[str], float] | None = None) -> None:
        self._registry = registry
        self.projects = projects
        self._state_dir = state_dir
        self._host = host
        self._reserve_args = (memory_reserve_mb, disk_reserve_mb)
        self._reserves: Reserves | None = None
        self._stored_bytes = stored_bytes
        self._checkpoint_mb = checkpoint_mb
        """What a project's checkpoints hold (MiB): counted in its ``disk_mb`` quota beside its sandboxes'."""
        self._reading: tuple[float, HostReading] | None = None
        self.starting: dict[str, int] = {}
        """Per project, its creates admitted and not yet started (records being written, starts waiting or
        running): what the ``starting`` quota counts, and what the host has yet to see."""
        self._writing: dict[str, Usage] = {}
        """Per project, creates admitted whose records are not in the registry yet (counted as live too)."""
        self._starting_mb = 0.0
        self._starting_disk_mb = 0.0
        self._waiters = ProjectLines()
        """Creates waiting for starts in flight to end (:meth:`wait_for_room`), round-robin between projects."""

    # -- the checks ----------------------------------------------------------------------------------

    def admit(self, project: str, req: CreateRequest) -> None:
        """Raise :class:`QuotaExceeded` (429) or :class:`Unavailable` (503), naming why, unless a sandbox of
        ``project`` made as ``req`` asks may start now."""
        self.check_quotas(project, req)
        if self._host:
            self._check_host(req)

    async def wait_for_room(self, project: str, req: CreateRequest, timeout_s: float = HOST_WAIT_S) -> None:
        """Wait, in ``project``'s line, while the host refuses ``req`` only for the room promised to starts in
        flight; return once it fits, or at ``timeout_s`` (then :meth:`admit` refuses it). Lines are woken
        round-robin between projects, so another project's burst holds a create back by one turn, not by all
        of it. Call :meth:`admit` and :meth:`started` right after, with no await between: the next waiter is
        woken now and runs only after them, so it sees this create counted. Call :meth:`check_quotas` before:
        a create over its project's quotas is refused at once, not after the wait."""
        if not self._host:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        behind = bool(self._waiters)
        keep_turn = False
        try:
            while behind or self._held_by_starts(req):
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                woken = self._waiters.join(project, keep_turn=keep_turn)
                behind, keep_turn = False, True  # woken and still short: it keeps its turn
                try:
                    await asyncio.wait_for(asyncio.shield(woken), remaining)
                except TimeoutError:
                    pass
                finally:
                    self._waiters.forget(project, woken)
        finally:
            self._waiters.wake_next()  # this one goes (or gives up): the next may fit too

    def _held_by_starts(self, req: CreateRequest) -> bool:
        """Whether the host refuses ``req`` only for the room promised to starts in flight."""
        if self._starting_mb <= 0:
            return False
        host = self.host()
        reserves = self.reserves(host)
        free = host.memory_available_mb - reserves.memory_mb
        memory = start_memory_mb(req)
        return reserves.memory_mb > 0 and free - self._starting_mb < memory <= free

    def why_not(self, project: str, req: CreateRequest) -> str | None:
        """:meth:`admit`'s refusal as text, or None (a warm pool's filler asks before each member)."""
        try:
            self.admit(project, req)
        except (QuotaExceeded, Unavailable) as exc:
            return exc.message
        return None

    def check_quotas(self, project: str, req: CreateRequest) -> None:
        """Raise :class:`QuotaExceeded` (429) naming the quota unless ``project`` may hold one more sandbox made as
        ``req``: what it holds, what it has admitted and not yet recorded, and what is starting. Counts nothing."""
        quotas = self.projects.get(project).quotas
        if quotas == Quotas():
            return
        usage = self._registry.usage(project)
        writing = self._writing.get(project, Usage())  # admitted, records not in the registry yet
        usage.sandboxes += writing.sandboxes
        usage.cpu += writing.cpu
        usage.memory_mb += writing.memory_mb
        usage.disk_mb += writing.disk_mb
        disk_mb = usage.disk_mb + (self._checkpoint_mb(project) if self._checkpoint_mb is not None else 0.0)
        starting = self.starting.get(project, 0)
        for name, have, want, limit, unit in (
            ("sandboxes", usage.sandboxes, 1, quotas.sandboxes, ""),
            ("cpu", usage.cpu, req.cpu, quotas.cpu, " cores"),
            ("memory_mb", usage.memory_mb, req.memory_mb, quotas.memory_mb, " MiB"),
            ("disk_mb", disk_mb, req.disk_mb, quotas.disk_mb, " MiB"),
        ):
            if limit is not None and have + want > limit:
                raise QuotaExceeded(
                    f"project {project} is at its '{name}' quota: it holds {_fmt(have)}{unit} of {_fmt(limit)}{unit}, "
                    f"and this sandbox asks for {_fmt(want)}{unit} more; delete some of its sandboxes (or pool "
                    f"members), or ask an operator to raise it (grove project set {project} --{_flag(name)} N)",
                    retry_after=_QUOTA_RETRY_S)
        if quotas.starting is not None and starting + 1 > quotas.starting:
            raise QuotaExceeded(
                f"project {project} is at its 'starting' quota: {starting} of its sandboxes are starting, at most "
                f"{quotas.starting} may at once; retry as they become ready", retry_after=_STARTING_RETRY_S)
        if quotas.stored_bytes is not None and self._stored_bytes is not None:
            stored = self._stored_bytes(project)
            if stored is not None and stored >= quotas.stored_bytes:
                raise QuotaExceeded(
                    f"project {project} is at its 'stored_bytes' quota: it keeps {stored:,} bytes in object storage "
                    f"of {quotas.stored_bytes:,}; collect old trajectories and artifacts (grove storage gc, or a "
                    f"retention: grove project set {project} --retention-days N) or ask for a larger quota",
                    retry_after=_STORED_RETRY_S)

    def _check_host(self, req: CreateRequest) -> None:
        host = self.host()
        reserves = self.reserves(host)
        memory = start_memory_mb(req)
        room = host.memory_available_mb - self._starting_mb - reserves.memory_mb
        if reserves.memory_mb > 0 and memory > room:
            raise Unavailable(
                f"the host is short of memory: {host.memory_available_mb:,.0f} MiB available, "
                f"{self._starting_mb:,.0f} MiB promised to the sandboxes starting now, {reserves.memory_mb:,.0f} MiB "
                f"kept for the host (grove up --memory-reserve-mb); retry after {_HOST_RETRY_S:.0f} s, as sandboxes "
                f"end (a create kept out only by the starts in flight waits for them, up to {HOST_WAIT_S:.0f} s)",
                retry_after=_HOST_RETRY_S)
        disk = min(req.disk_mb, START_DISK_MB)
        if reserves.disk_mb > 0 and disk > host.disk_free_mb - self._starting_disk_mb - reserves.disk_mb:
            raise Unavailable(
                f"the host is short of disk: {host.disk_free_mb:,.0f} MiB free on the state dir's file system "
                f"({self._state_dir}), "
                f"{reserves.disk_mb:,.0f} MiB kept free (grove up --disk-reserve-mb); delete sandboxes or images "
                f"(retry after {_HOST_RETRY_S:.0f} s)", retry_after=_HOST_RETRY_S)

    def host(self) -> HostReading:
        """The host's memory and disk, read at most every :data:`_SAMPLE_S` seconds."""
        now = time.monotonic()
        if self._reading is None or now - self._reading[0] > _SAMPLE_S:
            self._reading = (now, read_host(self._state_dir))
        return self._reading[1]

    def reserves(self, host: HostReading | None = None) -> Reserves:
        """What the host keeps for itself."""
        if self._reserves is None:
            self._reserves = Reserves.default(host or self.host(), *self._reserve_args)
        return self._reserves

    # -- bookkeeping of starts -----------------------------------------------------------------------

    def started(self, project: str, req: CreateRequest) -> None:
        """A create of ``project`` was admitted: count it as starting (until :meth:`ended`) and as being
        written (until :meth:`registered`)."""
        self.starting[project] = self.starting.get(project, 0) + 1
        self._writing.setdefault(project, Usage()).add(req.cpu, req.memory_mb, req.disk_mb)
        self._starting_mb += start_memory_mb(req)
        self._starting_disk_mb += min(req.disk_mb, START_DISK_MB)

    def registered(self, project: str, req: CreateRequest) -> None:
        """Its record is in the registry (which counts it from now on), or it never will be."""
        writing = self._writing.get(project)
        if writing is not None:
            writing.add(req.cpu, req.memory_mb, req.disk_mb, sign=-1)
            if writing.sandboxes <= 0:
                del self._writing[project]

    def ended(self, project: str, req: CreateRequest) -> None:
        """That start is over (ready, failed, or never began): the host shows what it takes from now on."""
        left = self.starting.get(project, 0) - 1
        if left > 0:
            self.starting[project] = left
        else:
            self.starting.pop(project, None)
        self._starting_mb = max(0.0, self._starting_mb - start_memory_mb(req))
        self._starting_disk_mb = max(0.0, self._starting_disk_mb - min(req.disk_mb, START_DISK_MB))
        self._reading = None  # read the host afresh: what it started shows there now
        self._waiters.wake_next()  # its promise is given back: the first waiting create may fit now

    def usage(self, project: str) -> dict[str, object]:
        """What ``project`` holds and reserves now, with its starting count, its creates waiting for the host's
        room (:meth:`wait_for_room`) and its stored bytes (for the API)."""
        usage: Usage = self._registry.usage(project)
        return {**usage.to_dict(), "starting": self.starting.get(project, 0), "waiting": self._waiters.count(project),
                "stored_bytes": self._stored_bytes(project) if self._stored_bytes is not None else None}


def _fmt(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else f"{value:,}"


def _flag(quota: str) -> str:
    return quota.replace("_", "-")
