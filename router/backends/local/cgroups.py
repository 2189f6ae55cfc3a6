"""cgroup v1 limits for local sandboxes: memory, pids and CPU, one directory per sandbox per controller.

Layout: ``/sys/fs/cgroup/<controller>/grove-<instance>/<sandbox id>``. The instance part (derived from
the router's state dir) keeps two routers on one machine from collecting each other's sandboxes.

A sandbox's CPU time is read from the cgroup v2 hierarchy a hybrid host mounts beside the v1 controllers
(``/sys/fs/cgroup/unified``, no controller enabled: its ``cpu.stat`` counts every group's usage all the same),
not from v1 ``cpuacct``: the benchmarks put the router's process tree in ``cpuacct`` groups of their own
(:mod:`perf.cpuacct`), and a sandbox moved into a ``cpuacct`` group of grove's would leave theirs. Where no v2
hierarchy is mounted a sandbox's CPU is not known (None), and nothing else changes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from grove.core.errors import Invalid, Unavailable
from router.backends.local import kernfiles

CGROUP_ROOT = Path("/sys/fs/cgroup")
CONTROLLERS = ("memory", "pids", "cpu")
ACCOUNTING = "unified"
"""The cgroup v2 hierarchy of a hybrid host, under :data:`CGROUP_ROOT`: joined only to count CPU time."""
HIERARCHIES = (*CONTROLLERS, ACCOUNTING)
CFS_PERIOD_US = 100_000
# Tasks the executor itself needs beyond the user's pids_max (gunicorn arbiter, worker, its threads).
EXECUTOR_TASKS = 48
# TCP buffers are kernel memory cgroup v1 does not charge to memory.limit_in_bytes: unread loopback pairs
# queued 630 MiB in a 128 MiB sandbox. memory.kmem.tcp.limit_in_bytes charges them to a counter of the
# sandbox's own; past it, sends block and receive windows shrink, as under the host-wide tcp_mem
# pressure. A quarter of the memory limit (at least 16 MiB: a few bulk transfers at full window).
TCP_MEMORY_SHARE = 4
TCP_MEMORY_FLOOR = 16 << 20


@dataclass(frozen=True)
class Limits:
    """What a sandbox may use."""

    memory_mb: int
    pids_max: int
    cpu: float


class CgroupSet:
    """The cgroups of one sandbox."""

    def __init__(self, instance: str, sandbox_id: str, root: Path = CGROUP_ROOT) -> None:
        self.instance = instance
        self.sandbox_id = sandbox_id
        self._root = root

    def path(self, controller: str) -> Path:
        """The sandbox's directory under one controller."""
        return self._root / controller / f"grove-{self.instance}" / self.sandbox_id

    def procs_files(self) -> list[str]:
        """The ``cgroup.procs`` files a process writes its pid to, to join every controller (and the CPU
        accounting group, where :meth:`create` made one)."""
        accounted = (ACCOUNTING,) if self.path(ACCOUNTING).is_dir() else ()
        return [str(self.path(c) / "cgroup.procs") for c in (*CONTROLLERS, *accounted)]

    def create(self, limits: Limits) -> None:
        """Make the directories and write the limits (idempotent)."""
        for controller in CONTROLLERS:
            if not (self._root / controller).is_dir():
                raise Unavailable(f"cgroup v1 controller {controller!r} is not mounted at {self._root / controller}")
            self.path(controller).mkdir(parents=True, exist_ok=True)
        if (self._root / ACCOUNTING / "cgroup.controllers").exists():
            self.path(ACCOUNTING).mkdir(parents=True, exist_ok=True)
        mem = limits.memory_mb * 1024 * 1024
        self._write("memory", "memory.limit_in_bytes", str(mem))
        with contextlib.suppress(OSError):  # absent when swap accounting is off
            self._write("memory", "memory.memsw.limit_in_bytes", str(mem))
        # Only sockets made after this is set are charged: it is set before any process joins.
        self._write("memory", "memory.kmem.tcp.limit_in_bytes", str(tcp_memory_bytes(limits.memory_mb)))
        self._write("pids", "pids.max", str(limits.pids_max + EXECUTOR_TASKS))
        self._write("cpu", "cpu.cfs_period_us", str(CFS_PERIOD_US))
        self._write("cpu", "cpu.cfs_quota_us", str(max(1000, int(limits.cpu * CFS_PERIOD_US))))

    def _write(self, controller: str, name: str, value: str) -> None:
        try:
            kernfiles.write(self.path(controller) / name, value)
        except OSError as exc:
            raise Invalid(f"cannot set {controller}/{name}={value}: {exc.strerror}") from exc

    def pids(self) -> set[int]:
        """Every process in any of the sandbox's cgroups."""
        found: set[int] = set()
        for controller in HIERARCHIES:
            with contextlib.suppress(OSError):
                found.update(int(p) for p in kernfiles.read(self.path(controller) / "cgroup.procs").split())
        return found

    def oom_control(self) -> str:
        """Host path of the memory cgroup's ``memory.oom_control`` (its ``oom_kill`` counter)."""
        return str(self.path("memory") / "memory.oom_control")

    def oom_kills(self) -> int:
        """How many processes the OOM killer ended in this cgroup so far (0 if it cannot be read)."""
        try:
            text = kernfiles.read(self.oom_control()).decode("ascii")
        except (OSError, UnicodeDecodeError):
            return 0
        for line in text.splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
        return 0

    def cpu_usec(self) -> int | None:
        """CPU time (microseconds, user and system) the sandbox's processes used since its accounting group was
        made, those gone included; None where it has none (no v2 hierarchy here, or it is removed)."""
        try:
            text = kernfiles.read(self.path(ACCOUNTING) / "cpu.stat").decode("ascii")
        except (OSError, UnicodeDecodeError):
            return None
        for line in text.splitlines():
            if line.startswith("usage_usec "):
                return int(line.split()[1])
        return None

    def memory_peak_bytes(self) -> int | None:
        """The most memory the sandbox's cgroup was charged at once since :meth:`reset_memory_peak` (its
        processes and the page cache of its files); None if it cannot be read."""
        try:
            return int(kernfiles.read(self.path("memory") / "memory.max_usage_in_bytes"))
        except (OSError, ValueError):
            return None

    def reset_memory_peak(self) -> None:
        """Start the memory peak over (at each start: a run's peak is its own)."""
        with contextlib.suppress(OSError):
            kernfiles.write(self.path("memory") / "memory.max_usage_in_bytes", "0")

    def destroy(self, timeout_s: float = 5.0) -> None:
        """Kill whatever is left in the cgroups and remove them."""
        deadline = time.monotonic() + timeout_s
        while (pids := self.remove_once()) is not None:
            if time.monotonic() > deadline:
                raise Unavailable(f"sandbox {self.sandbox_id} is not deleted yet: its processes {sorted(pids)} have "
                                  f"not exited {timeout_s:g} s after being killed (a busy host, or a process that "
                                  "cannot take the signal yet); the router finishes the delete in the background: "
                                  "retry it to see it done", retry_after=1)
            time.sleep(0.01)

    def remove_once(self) -> set[int] | None:
        """One try: kill whatever is left in the cgroups and remove them; None once they are all gone, else the
        pids found in them (a group with tasks being reaped refuses ``rmdir`` for a moment: try again)."""
        pids = self.pids()
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        removed = True
        for controller in HIERARCHIES:
            try:
                self.path(controller).rmdir()
            except FileNotFoundError:
                pass
            except OSError:
                removed = False
        return None if removed else pids


def tcp_memory_bytes(memory_mb: int) -> int:
    """The TCP buffer memory a sandbox of ``memory_mb`` may queue."""
    return max(TCP_MEMORY_FLOOR, (memory_mb << 20) // TCP_MEMORY_SHARE)


def instance_ids(instance: str, root: Path = CGROUP_ROOT) -> set[str]:
    """Sandbox ids that have a cgroup under this router instance."""
    ids: set[str] = set()
    for controller in HIERARCHIES:
        with contextlib.suppress(OSError):
            ids.update(p.name for p in (root / controller / f"grove-{instance}").iterdir() if p.is_dir())
    return ids


def remove_instance(instance: str, root: Path = CGROUP_ROOT) -> None:
    """Remove the instance's parent directories once they are empty (the router's clean shutdown)."""
    for controller in HIERARCHIES:
        with contextlib.suppress(OSError):
            (root / controller / f"grove-{instance}").rmdir()
