"""The floor of a burst: the same work with no grove at all, to hold grove's burst against.

N bare isolated shells, each in fresh mount, PID, net, IPC and UTS namespaces
(``unshare --mount --pid --net --ipc --uts --fork``), in a sandbox-like environment (``env -i``, a plain
PATH, HOME an empty directory: no login profile of the host's user), each running Orchard's four
commands — the burst's own (:data:`perf.burst.COMMANDS`) — with 2 x CPU count of them at once. No image,
no overlay, no cgroups, no executor, no HTTP, no record: what is left is what any isolated run of those
commands costs.

``python -m perf.floor [--n 1000]`` prints the measurement; :mod:`perf.bench_burst` runs it in the same
run as the grove bursts and reports each burst as a multiple of it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import tempfile
import time
from typing import Any

from perf.burst import COMMANDS, PCTS
from perf.common import summarize

PLAIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SCRIPT = "; ".join(f"{command} || exit 1" for _, command, _ in COMMANDS)
"""The four commands in one shell, as one sandbox runs them (a failing one fails the shell)."""


def argv(home: str) -> list[str]:
    """One isolated shell; ``home`` an empty directory, so the login shell reads no profile of the host's user."""
    return ["unshare", "--mount", "--pid", "--net", "--ipc", "--uts", "--fork",
            "env", "-i", f"PATH={PLAIN_PATH}", f"HOME={home}", "/bin/sh", "-c", SCRIPT]


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


async def _one(gate: asyncio.Semaphore, command: list[str], durations: list[float], failures: list[str]) -> None:
    async with gate:
        started = time.perf_counter()
        proc = await asyncio.create_subprocess_exec(*command, stdin=asyncio.subprocess.DEVNULL,
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await proc.communicate()
        durations.append(time.perf_counter() - started)
        # The same output checks as the burst's: ok, a listing with etc, two first lines of os-release.
        if proc.returncode != 0 or not out.startswith(b"ok\n") or out.count(b"=") < 2:
            failures.append(f"exit {proc.returncode}: {err.decode(errors='replace')[-200:]}")


async def floor(n: int, concurrency: int = 0) -> dict[str, Any]:
    """Run ``n`` isolated shells, ``concurrency`` (default 2 x CPUs) at once; wall time, CPU, latencies."""
    width = concurrency or 2 * len(os.sched_getaffinity(0))
    gate = asyncio.Semaphore(width)
    durations: list[float] = []
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="grove-floor-home-") as home:
        command = argv(home)
        cpu_before = _children_cpu_s()
        started = time.perf_counter()
        await asyncio.gather(*(_one(gate, command, durations, failures) for _ in range(n)))
        wall = time.perf_counter() - started
        cpu = _children_cpu_s() - cpu_before
    return {
        "n": n,
        "concurrency": width,
        "argv": argv("<an empty directory>"),
        "wall_s": wall,
        "shells_per_s": n / wall,
        "success_rate": (n - len(failures)) / n if n else 0.0,
        "failures": failures[:5],
        "cpu_ms_per_shell": cpu * 1000 / n if n else 0.0,
        "shell_s": summarize(durations, PCTS),
    }


def main(argv: list[str] | None = None) -> None:
    """Print one floor measurement as JSON."""
    parser = argparse.ArgumentParser(prog="python -m perf.floor", description=__doc__)
    parser.add_argument("--n", type=int, default=1000, help="isolated shells (default 1000)")
    parser.add_argument("--concurrency", type=int, default=0, help="at once (default 2 x CPU count)")
    args = parser.parse_args(argv)
    print(json.dumps(asyncio.run(floor(args.n, args.concurrency)), indent=2))


if __name__ == "__main__":
    main()
