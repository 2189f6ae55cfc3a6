"""A soak-free leak check: what a router holds before and after a burst, compared.

Counted: the router's open file descriptors, threads and RSS; its zygote's descriptors; lines of
``/proc/mounts`` (the host's mount table: a sandbox mounts only inside its own namespace, so any line
it adds is a leak); the router's sandbox cgroups (every controller); the kernel's count of memory
cgroups (``/proc/cgroups`` — it includes *dying* ones, removed but still pinned by charged pages,
shared with everything else on the machine); the state dir's sandbox directories, records and journals.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from perf.calls import child_pids
from perf.common import CGROUP_CONTROLLERS, CGROUP_ROOT, MIB, Router
from perf.memory import vm_rss


def _count(path: Path, pattern: str = "*") -> int:
    with contextlib.suppress(OSError):
        return sum(1 for _ in path.glob(pattern))
    return 0


def _fds(pid: int) -> int:
    with contextlib.suppress(OSError):
        return len(os.listdir(f"/proc/{pid}/fd"))
    return -1


def _kernel_memcgs() -> int:
    with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/cgroups", encoding="ascii") as fh:
        for line in fh:
            fields = line.split()
            if fields[0] == "memory":
                return int(fields[2])
    return -1


def snapshot(router: Router) -> dict[str, Any]:
    """Everything the check compares."""
    helpers = child_pids(router.pid)
    with open("/proc/mounts", encoding="utf-8") as fh:
        mounts = sum(1 for _ in fh)
    cgroups = sum(
        _count(CGROUP_ROOT / c / f"grove-{router.instance}", "sb-*") for c in CGROUP_CONTROLLERS
    )
    return {
        "router_fds": _fds(router.pid),
        "router_threads": _count(Path(f"/proc/{router.pid}/task")),
        "router_rss_mib": round((vm_rss(router.pid) or 0) / MIB, 1),
        "helper_processes": len(helpers),
        "helper_fds": sum(_fds(p) for p in helpers),
        "host_mounts": mounts,
        "sandbox_cgroups": cgroups,
        "kernel_memory_cgroups": _kernel_memcgs(),
        "sandbox_dirs": _count(router.layout.sandboxes, "sb-*"),
        "records": _count(router.layout.records, "sb-*"),
        "journals": _count(router.layout.journals, "sb-*"),
    }


EXPECTED_GROWTH = {"router_rss_mib", "kernel_memory_cgroups"}
"""Figures that may move without a leak: RSS (allocator high-water mark, the tombstones of deleted
sandboxes the router keeps so their ids answer 409) and the kernel's dying memory cgroups."""


FD_SLACK = 8
"""Descriptors come and go without a leak (pooled keep-alive connections to the S3 server, its own
sockets); a leak grows with the burst — one per sandbox — so only growth beyond this counts."""


def compare(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Each figure before, after and the difference; ``leaked`` lists counts that grew and must not."""
    rows = {k: {"before": before[k], "after": after[k], "delta": round(after[k] - before[k], 1)} for k in before}
    leaked = [
        k
        for k, row in rows.items()
        if k not in EXPECTED_GROWTH and row["delta"] > (FD_SLACK if k.endswith("_fds") else 0)
    ]
    return {"figures": rows, "leaked": leaked, "fd_slack": FD_SLACK}
