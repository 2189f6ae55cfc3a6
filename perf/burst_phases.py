"""The burst benchmark's measurements besides the burst itself: quiet exec latency against its floors, and
where the CPU of a burst went.

Quiet figures are taken with nothing else of grove running, so they say what a call costs; the burst's
figures say what it costs when 1,000 sandboxes want the same two CPUs.
"""

from __future__ import annotations

import asyncio
import os
import resource
import subprocess
import tempfile
import time
from typing import Any

from grove.client import AsyncGrove
from perf.burst import COMMANDS
from perf.calls import TICK_S, system_busy_ticks
from perf.common import Router, summarize
from perf.cpuacct import CpuGroup
from perf.router_phases import idle_memory
from sandbox_image.init import BASE_ENV

PCTS = (50, 90, 99)


def _floor_true() -> None:
    subprocess.run(["true"], check=True)


def _floor_shell(command: str, home: str) -> None:
    """The command as the executor runs a string: ``/bin/sh -c``, the sandbox's environment (with an empty
    home, as a sandbox's ``/root`` is: this host's dotfiles would make a login shell much slower), output piped."""
    subprocess.run(["/bin/sh", "-c", command], env={**BASE_ENV, "HOME": home}, capture_output=True, check=True)


async def quiet_exec(router: Router, calls: int, per_command: int) -> dict[str, Any]:
    """``["true"]`` through the SDK interleaved with its floor ``subprocess.run(["true"])``; then each burst
    command through the SDK interleaved with the same command run here by ``/bin/sh -c`` (its floor)."""
    samples: dict[str, list[float]] = {"floor": [], "sdk": []}
    async with AsyncGrove(router.url, router.key) as grove:
        sandbox = await grove.create("default", heartbeat=False)
        try:
            for _ in range(20):  # warm-up: connections, the sandbox's first requests
                await sandbox.exec(["true"])
                _floor_true()
            for i in range(calls):
                order = ("floor", "sdk") if i % 2 else ("sdk", "floor")
                for kind in order:
                    t0 = time.perf_counter()
                    if kind == "floor":
                        _floor_true()
                    else:
                        result = await sandbox.exec(["true"])
                        if result.exit_code != 0:
                            raise RuntimeError(f"exec of true failed: {result}")
                    samples[kind].append(time.perf_counter() - t0)
            commands: dict[str, dict[str, Any]] = {}
            home = tempfile.mkdtemp(prefix="gb-home-")
            for name, command, check in COMMANDS:
                floor, via = [], []
                cpu_s = 0.0
                for _ in range(per_command):
                    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                    t0 = time.perf_counter()
                    _floor_shell(command, home)
                    t1 = time.perf_counter()
                    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                    cpu_s += r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime
                    result = await sandbox.exec(command)
                    t2 = time.perf_counter()
                    if result.exit_code != 0 or not check(result):
                        raise RuntimeError(f"{name} failed in the sandbox: {result}")
                    floor.append(t1 - t0)
                    via.append(t2 - t1)
                f, v = summarize(floor, PCTS), summarize(via, PCTS)
                commands[name] = {
                    "floor": f,
                    "sdk": v,
                    "ratio_p50": round(v["p50_ms"] / f["p50_ms"], 2),
                    "floor_cpu_ms": round(cpu_s * 1000 / per_command, 2),
                }
            os.rmdir(home)
        finally:
            await sandbox.close()
    stats = {k: summarize(v, PCTS) for k, v in samples.items()}
    return {
        "true": {**stats, "ratio_p50": round(stats["sdk"]["p50_ms"] / stats["floor"]["p50_ms"], 2)},
        "commands": commands,
        "calls": calls,
        "per_command": per_command,
    }


def quiet_exec_sync(router: Router, calls: int, per_command: int) -> dict[str, Any]:
    """:func:`quiet_exec` from synchronous code."""
    return asyncio.run(quiet_exec(router, calls, per_command))


class CpuMeter:
    """CPU spent between two readings: grove's processes by role (``cpuacct``), this client, the machine."""

    def __init__(self, group: CpuGroup | None) -> None:
        self.group = group
        self._start: dict[str, float] = {}

    def _read(self) -> dict[str, float]:
        out = {"client": time.process_time(), "machine": system_busy_ticks() * TICK_S, "wall": time.perf_counter()}
        if self.group is not None:
            out.update({f"grove_{k}": v for k, v in self.group.snapshot().items()})
        return out

    def start(self) -> None:
        """Take the first reading."""
        self._start = self._read()

    def stop(self, sandboxes: int) -> dict[str, Any]:
        """CPU seconds since :meth:`start` by role, per sandbox (ms) and as a share of the machine's capacity."""
        end = self._read()
        used = {k: end[k] - self._start[k] for k in end}
        wall = used.pop("wall")
        capacity = wall * len(os.sched_getaffinity(0))
        grove_total = used.get("grove_total", 0.0)
        used["others"] = max(0.0, used["machine"] - grove_total - used["client"])
        return {
            "cpu_s": {k: round(v, 2) for k, v in used.items()},
            "cpu_ms_per_sandbox": {k: round(v * 1000 / max(sandboxes, 1), 1) for k, v in used.items()},
            "share_of_capacity": {k: round(v / capacity, 3) for k, v in used.items()},
            "wall_s": round(wall, 2),
            "accounted": self.group is not None,
        }


async def idle_sandboxes(router: Router, group: CpuGroup | None, n: int, settle_s: float) -> dict[str, Any]:
    """``n`` sandboxes left idle: their memory (USS/PSS/RSS per sandbox) and the CPU they burn per second."""
    async with AsyncGrove(router.url, router.key) as grove:
        sandboxes = await asyncio.gather(*(grove.create("default", heartbeat=False) for _ in range(n)))
        try:
            await asyncio.sleep(settle_s)
            memory = idle_memory(router, [s.id for s in sandboxes])
            cpu = await asyncio.to_thread(_idle_cpu, group, n)
        finally:
            await asyncio.gather(*(s.close() for s in sandboxes), return_exceptions=True)
    return {"memory": memory, "cpu": cpu}


def _idle_cpu(group: CpuGroup | None, sandboxes: int, seconds: float = 10.0) -> dict[str, float] | None:
    """CPU idle sandboxes burn per second (their executors' timers), measured over ``seconds``."""
    if group is None or sandboxes == 0:
        return None
    before = group.usage_s("sandboxes")
    time.sleep(seconds)
    used = group.usage_s("sandboxes") - before
    return {"ms_per_sandbox_per_s": round(used * 1000 / sandboxes / seconds, 3), "sandboxes": sandboxes}
