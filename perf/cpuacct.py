"""CPU accounting of a process tree through the cgroup v1 ``cpuacct`` hierarchy, which grove does not use.

grove's local backend moves each sandbox into its own ``memory``, ``pids`` and ``cpu`` cgroups, but
never touches ``cpuacct``: a process put in a ``cpuacct`` group here keeps every descendant in it —
the router's zygote, the sandboxes it forks, every command they run, the embedded S3 server. So
``cpuacct.usage`` of the group is the CPU all of grove spent, however short-lived its processes
were, and on a machine shared with other work (what the whole machine's busy time cannot give).
Sub-groups split it by role once the processes exist (:meth:`CpuGroup.split`).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

from perf.calls import child_pids

CPUACCT = Path("/sys/fs/cgroup/cpuacct")


def available() -> bool:
    """Whether a cgroup v1 ``cpuacct`` hierarchy is mounted and writable here."""
    return (CPUACCT / "cgroup.procs").exists() and os.access(CPUACCT, os.W_OK)


class CpuGroup:
    """One ``cpuacct`` group (and sub-groups); removed, with its processes moved back to the root, on close."""

    def __init__(self, name: str) -> None:
        self.path = CPUACCT / name
        self.path.mkdir(exist_ok=True)
        self.subgroups: dict[str, Path] = {}

    def add(self, pid: int, subgroup: str | None = None) -> None:
        """Move a process (all its threads) into the group or one of its sub-groups."""
        target = self.path if subgroup is None else self._sub(subgroup)
        with contextlib.suppress(ProcessLookupError, OSError):
            (target / "cgroup.procs").write_text(str(pid))

    def _sub(self, name: str) -> Path:
        if name not in self.subgroups:
            sub = self.path / name
            sub.mkdir(exist_ok=True)
            self.subgroups[name] = sub
        return self.subgroups[name]

    def usage_s(self, subgroup: str | None = None) -> float:
        """CPU seconds used by the group (sub-groups included) or one sub-group."""
        path = self.path if subgroup is None else self._sub(subgroup)
        try:
            return int((path / "cpuacct.usage").read_text()) / 1e9
        except (OSError, ValueError):
            return 0.0

    def user_sys_s(self, subgroup: str | None = None) -> tuple[float, float]:
        """(user, system) CPU seconds of the group or a sub-group (``cpuacct.stat``, in clock ticks)."""
        path = self.path if subgroup is None else self._sub(subgroup)
        values: dict[str, int] = {}
        with contextlib.suppress(OSError, ValueError):
            for line in (path / "cpuacct.stat").read_text().splitlines():
                name, value = line.split()
                values[name] = int(value)
        tick = os.sysconf("SC_CLK_TCK")
        return values.get("user", 0) / tick, values.get("system", 0) / tick

    def snapshot(self) -> dict[str, float]:
        """CPU seconds of the whole group and of each sub-group."""
        out = {"total": self.usage_s()}
        for name in self.subgroups:
            out[name] = self.usage_s(name)
        return out

    def close(self) -> None:
        """Move whatever is left back to the root group, then remove the sub-groups and the group."""
        for path in [*self.subgroups.values(), self.path]:
            deadline = time.monotonic() + 5
            while True:
                with contextlib.suppress(OSError):
                    for pid in (path / "cgroup.procs").read_text().split():
                        with contextlib.suppress(OSError):
                            (CPUACCT / "cgroup.procs").write_text(pid)
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.02)


BENCH_PREFIX = "grove-bench-"


def sweep_stale_groups() -> list[str]:
    """Remove ``grove-bench-<pid>`` groups whose benchmark process is gone (it was killed before its cleanup)."""
    removed = []
    for path in CPUACCT.glob(BENCH_PREFIX + "*"):
        pid = path.name[len(BENCH_PREFIX) :]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            group = CpuGroup(path.name)
            group.subgroups = {p.name: p for p in path.iterdir() if p.is_dir()}
            group.close()
            removed.append(path.name)
    return removed


@contextlib.contextmanager
def bench_group() -> Iterator[CpuGroup | None]:
    """A group for one benchmark's router process tree (to tell grove's CPU from other tenants'), or
    None where this machine has no ``cpuacct`` hierarchy; stale groups of dead benchmarks are swept first."""
    if not available():
        yield None
        return
    sweep_stale_groups()
    group = CpuGroup(f"{BENCH_PREFIX}{os.getpid()}")
    try:
        yield group
    finally:
        group.close()


def assign_router_helpers(router_pid: int, group: CpuGroup) -> None:
    """Put the router's helpers in their sub-groups: the embedded S3 server, and the zygote (whose
    sandboxes, forked from it, stay in its group with every command they run)."""
    for pid in child_pids(router_pid):
        try:
            with open(f"/proc/{pid}/comm", encoding="utf-8") as fh:
                comm = fh.read().strip()
        except OSError:
            continue
        group.add(pid, "s3" if comm == "weed" else "sandboxes")
