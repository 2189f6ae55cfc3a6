"""Memory of processes and of local sandboxes, from ``/proc/<pid>/smaps_rollup`` and the sandboxes' cgroups.

USS (unique set size: ``Private_Clean + Private_Dirty``) is what a process alone costs — what would be
freed if it exited. PSS splits every shared page evenly among its sharers, so PSS summed over all
processes is the machine's real total. RSS counts shared pages fully in every process and overstates.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

KIB = 1024


@dataclass(frozen=True)
class ProcMemory:
    """One process: who it is and what it costs, in bytes."""

    pid: int
    ppid: int
    comm: str
    ns_init: bool
    """Whether it is PID 1 of its own PID namespace (a local sandbox's init)."""
    rss: int
    pss: int
    uss: int
    role: str = ""
    """What it is within its group (set by :func:`group_memory`)."""


def process_memory(pid: int) -> ProcMemory | None:
    """Memory of one process, or None if it is gone (or a kernel thread with no mappings)."""
    fields: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as fh:
            for line in fh:
                name, _, rest = line.partition(":")
                parts = rest.split()
                if len(parts) == 2 and parts[1] == "kB":
                    fields[name] = int(parts[0]) * KIB
    except OSError:
        return None
    if "Rss" not in fields:
        return None
    comm, ppid, ns_init = "?", 0, False
    with contextlib.suppress(OSError):
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    with contextlib.suppress(OSError, ValueError), open(f"/proc/{pid}/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("PPid:"):
                ppid = int(line.split()[1])
            elif line.startswith("NSpid:"):
                # One pid per nested PID namespace, innermost last: 1 there means that namespace's init.
                nspids = line.split()[1:]
                ns_init = len(nspids) > 1 and nspids[-1] == "1"
    return ProcMemory(
        pid=pid,
        ppid=ppid,
        comm=comm,
        ns_init=ns_init,
        rss=fields["Rss"],
        pss=fields.get("Pss", 0),
        uss=fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0),
    )


def cgroup_pids(cgroup_dir: Path) -> list[int]:
    """Processes in a cgroup (v1 ``cgroup.procs``); empty if the cgroup is gone."""
    try:
        return sorted(int(p) for p in (cgroup_dir / "cgroup.procs").read_text().split())
    except OSError:
        return []


@dataclass(frozen=True)
class GroupMemory:
    """Every process of one cgroup, and the sums."""

    processes: list[ProcMemory]
    charged: int | None
    """The memory cgroup's own ``memory.usage_in_bytes`` (includes page cache it was charged for)."""

    @property
    def rss(self) -> int:
        """Sum of RSS (overstates: shared pages counted in every process)."""
        return sum(p.rss for p in self.processes)

    @property
    def pss(self) -> int:
        """Sum of PSS."""
        return sum(p.pss for p in self.processes)

    @property
    def uss(self) -> int:
        """Sum of USS: what deleting the sandbox frees."""
        return sum(p.uss for p in self.processes)


def group_memory(cgroup_dir: Path) -> GroupMemory:
    """Memory of every process in a memory cgroup."""
    procs = [m for pid in cgroup_pids(cgroup_dir) if (m := process_memory(pid)) is not None]
    inits = {p.pid for p in procs if p.ns_init}
    procs = [dataclasses.replace(p, role=_role(p, inits)) for p in procs]
    charged = None
    with contextlib.suppress(OSError, ValueError):
        charged = int((cgroup_dir / "memory.usage_in_bytes").read_text())
    return GroupMemory(procs, charged)


def _role(proc: ProcMemory, inits: set[int]) -> str:
    if proc.ns_init:
        return "pid1"
    if proc.ppid in inits:
        return "child of pid1"
    return proc.comm


def disk_usage(path: Path) -> int:
    """Bytes of disk blocks used under ``path`` (like ``du -s``, without following links)."""
    total = 0
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
    return total


def vm_rss(pid: int) -> int | None:
    """A process's resident memory (``VmRSS``), or None if it is gone."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * KIB
    return None


def private_by_mapping(pid: int, top: int = 6) -> dict[str, float]:
    """Where a process's USS sits: private KiB per mapping (file name, ``[heap]``, ``[anon]``, ...), largest first."""
    totals: dict[str, int] = {}
    name = "?"
    try:
        with open(f"/proc/{pid}/smaps", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                head = line.split(maxsplit=5)
                if "-" in head[0] and len(head) >= 5 and ":" not in head[0]:
                    # A mapping's first line: address perms offset dev inode [path].
                    path = head[5].strip() if len(head) > 5 else "[anon]"
                    name = os.path.basename(path) if path.startswith("/") else path
                elif head[0] in ("Private_Clean:", "Private_Dirty:"):
                    totals[name] = totals.get(name, 0) + int(head[1])
    except OSError:
        return {}
    ranked = sorted(totals.items(), key=lambda kv: -kv[1])
    out = {k: round(v / 1024, 2) for k, v in ranked[:top] if v}
    rest = sum(v for _, v in ranked[top:])
    if rest:
        out["(rest)"] = round(rest / 1024, 2)
    return out
