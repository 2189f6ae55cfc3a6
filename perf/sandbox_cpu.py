"""Where a burst's CPU goes, per sandbox, by role — kernel threads included, by kind.

``python -m perf.sandbox_cpu --n 200`` starts a router (local backend), runs one Orchard-shaped burst of
``n`` sandboxes (:mod:`perf.burst`) and prints, per sandbox, the CPU of the router, of the sandboxes (the
zygote, every sandbox's processes and the commands they ran; user and system time), of the embedded S3
server and of this client, of the kernel's threads by kind (``kworker``: namespace and cgroup teardown,
``rcu``, ``ksoftirqd``, ...) and of the rest of the machine (other tenants). A small burst is enough to
compare two versions of grove: run it from each checkout in turn, alternating, on the same machine.

The kernel threads' CPU is read from ``/proc/<pid>/stat`` of every child of ``kthreadd`` before and after
the burst: machine-wide, so work of other tenants' namespaces counts too (quiet machines only tell it
apart), and a kernel thread that exits during the burst loses its share (few do).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import time
from typing import Any

from perf import cpuacct
from perf.burst import burst
from perf.calls import TICK_S, system_busy_ticks
from perf.common import code_version, comparison_options, emit_comparison, running_router, sigterm_as_exit


def _kthread_kind(comm: str) -> str:
    """A kernel thread's kind from its name: ``kworker/u8:3-events_unbound`` → ``kworker``."""
    head = re.split(r"[/:\-]", comm, maxsplit=1)[0]
    return re.sub(r"\d+$", "", head) or comm


def kernel_threads() -> dict[int, tuple[str, int]]:
    """Every kernel thread now: pid → (kind, utime + stime in clock ticks)."""
    found: dict[int, tuple[str, int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as fh:
                raw = fh.read()
        except OSError:
            continue
        comm = raw[raw.find(b"(") + 1 : raw.rfind(b")")].decode(errors="replace")
        fields = raw[raw.rfind(b")") + 2 :].split()
        if fields[1] == b"2" or entry.name == "2":
            found[int(entry.name)] = (_kthread_kind(comm), int(fields[11]) + int(fields[12]))
    return found


def kernel_threads_used(before: dict[int, tuple[str, int]], after: dict[int, tuple[str, int]]) -> dict[str, float]:
    """CPU seconds by kind between two :func:`kernel_threads` readings (threads born meanwhile count whole)."""
    used: dict[str, float] = {}
    for pid, (kind, ticks) in after.items():
        start = before.get(pid, (kind, 0))[1]
        used[kind] = used.get(kind, 0.0) + (ticks - start) * TICK_S
    return used


def measure(n: int, rounds: int) -> dict[str, Any]:
    """``rounds`` bursts of ``n`` on one router; CPU per sandbox by role, summed over the rounds."""
    with cpuacct.bench_group() as group, running_router() as router:
        if group is None:
            raise SystemExit("no writable cgroup v1 cpuacct hierarchy here: cannot tell roles apart")
        group.add(router.pid, "router")
        asyncio.run(burst(router.url, router.key, 3))  # starts the zygote and S3; not measured
        cpuacct.assign_router_helpers(router.pid, group)
        time.sleep(2.0)
        totals: dict[str, float] = {}
        ok = 0
        wall = 0.0
        for _ in range(rounds):
            stats = {k: group.user_sys_s(k) for k in ("sandboxes", "router")}
            usage, kthreads, busy = group.snapshot(), kernel_threads(), system_busy_ticks()
            client, t0 = time.process_time(), time.perf_counter()
            result = asyncio.run(burst(router.url, router.key, n))
            wall += time.perf_counter() - t0
            client = time.process_time() - client
            # Teardown the kernel defers (namespaces, cgroups) lands after the last delete answered.
            time.sleep(3.0)
            used = {k: v - usage[k] for k, v in group.snapshot().items()}
            for role in ("sandboxes", "router"):
                (u0, s0), (u1, s1) = stats[role], group.user_sys_s(role)
                used[f"{role}_user"], used[f"{role}_sys"] = u1 - u0, s1 - s0
            used["client"] = client
            kernel = kernel_threads_used(kthreads, kernel_threads())
            used.update({f"kernel_{k}": v for k, v in kernel.items()})
            used["kernel"] = sum(kernel.values())
            used["machine"] = (system_busy_ticks() - busy) * TICK_S
            used["others"] = used["machine"] - used["total"] - client - used["kernel"]
            for key, value in used.items():
                totals[key] = totals.get(key, 0.0) + value
            ok += sum(1 for r in result.runs if not r.errors)
    count = n * rounds
    per = {k: round(v * 1000 / count, 2) for k, v in sorted(totals.items()) if abs(v) * 1000 / count >= 0.05}
    return {"n": n, "rounds": rounds, "ok": ok, "wall_s": round(wall, 2), "cpu_ms_per_sandbox": per,
            "code": code_version()}


def main(argv: list[str] | None = None) -> None:
    """Print the measurement as JSON (and append it to ``--out`` if given)."""
    parser = argparse.ArgumentParser(prog="python -m perf.sandbox_cpu", description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200, help="sandboxes per burst (default 200)")
    parser.add_argument("--rounds", type=int, default=1, help="bursts, one after another (default 1)")
    comparison_options(parser)
    args = parser.parse_args(argv)
    sigterm_as_exit()
    report = {"label": args.label, **measure(args.n, args.rounds)}
    emit_comparison(report, args.out)


if __name__ == "__main__":
    main()
