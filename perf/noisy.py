"""Noisy neighbours for ``perf.bench_noisy``: what a hostile sandbox does, kept up for a window, and proof it did.

Each behaviour is one or more commands run in the neighbour sandbox through the SDK, as a user would,
each repeated until the window ends (its server-side ``timeout_s`` is the time left, so the executor
kills the whole tree when the window closes). :class:`Neighbour` runs them on threads; its
:class:`Evidence` reads the neighbour's host cgroups to show the behaviour really happened (throttled
CPU periods, OOM kills, refused forks, bytes written) — a quiet neighbour must not pass for a harmless one.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grove.client import Grove
from grove.core.errors import GroveError

MEMORY_FILL = (
    "while :; do python3 -c '\n"
    "b = []\n"
    'while True: b.append(b"x" * (32 << 20))  # touched: bytes * n writes every page\n'
    "'; done"
)
COMMANDS: dict[str, tuple[str, ...]] = {
    # Every CPU the sandbox can see, spinning in the shell.
    "cpu": ("for i in $(seq $(nproc)); do (while :; do :; done) & done; wait",),
    # Allocate and touch until the OOM killer ends it, again and again.
    "memory": (MEMORY_FILL,),
    # A self-replicating fork bomb: it runs into pids_max and stays there until the window closes.
    "fork": ("b() { b | b & }; b; wait",),
    # 256 MiB of stdout per exec through the executor's capture (spilled to its output file, which the
    # router then stores in S3), and a writer rewriting a 128 MiB file: page cache, dirty pages, writeback.
    # Both are removed after each window (CLEANUP), or the runs would fill the disk.
    "flood": (
        "head -c 256M /dev/zero",
        "while :; do head -c 128M /dev/zero > /tmp/flood.bin; done",
    ),
}
BEHAVIOURS = ("cpu", "memory", "fork", "flood", "all")
# Started in this order for "all": the fork bomb last, or it takes the pids the others need to start.
ALL_ORDER = ("cpu", "memory", "flood", "fork")
CLEANUP = "rm -rf /tmp/grove-output /tmp/flood.bin"


def commands(behaviour: str) -> list[str]:
    """The commands a behaviour runs side by side."""
    if behaviour == "all":
        return [c for name in ALL_ORDER for c in COMMANDS[name]]
    return list(COMMANDS[behaviour])


@dataclass
class Evidence:
    """Counters of the neighbour's cgroups over one window (host paths; read by the benchmark, not the sandbox)."""

    cpu_dir: Path
    memory_dir: Path
    pids_dir: Path
    start: dict[str, int] = field(default_factory=dict)
    peak_pids: int = 0
    peak_memory_mib: float = 0.0
    min_cpu_shares: int = 0
    """The lowest ``cpu.shares`` seen (the router demotes a sandbox that uses up its quota)."""

    def counters(self) -> dict[str, int]:
        """CPU throttling, OOM kills and refused forks so far."""
        out: dict[str, int] = {}
        with contextlib.suppress(OSError, ValueError):
            for line in (self.cpu_dir / "cpu.stat").read_text().splitlines():
                name, value = line.split()
                out[f"cpu_{name}"] = int(value)
        with contextlib.suppress(OSError, ValueError):
            for line in (self.memory_dir / "memory.oom_control").read_text().splitlines():
                if line.startswith("oom_kill "):
                    out["oom_kills"] = int(line.split()[1])
        with contextlib.suppress(OSError, ValueError):
            out["forks_refused"] = int((self.pids_dir / "pids.events").read_text().split()[1])
        return out

    def begin(self) -> None:
        """Start a window: remember the counters."""
        self.start = self.counters()
        self.peak_pids, self.peak_memory_mib, self.min_cpu_shares = 0, 0.0, 0

    def sample(self) -> None:
        """Note the current process count and memory charge (peaks over the window)."""
        with contextlib.suppress(OSError, ValueError):
            self.peak_pids = max(self.peak_pids, int((self.pids_dir / "pids.current").read_text()))
        with contextlib.suppress(OSError, ValueError):
            shares = int((self.cpu_dir / "cpu.shares").read_text())
            self.min_cpu_shares = min(self.min_cpu_shares or shares, shares)
        with contextlib.suppress(OSError, ValueError):
            usage = int((self.memory_dir / "memory.usage_in_bytes").read_text()) / 2**20
            self.peak_memory_mib = max(self.peak_memory_mib, round(usage, 1))

    def end(self) -> dict[str, Any]:
        """What changed since :meth:`begin`, and the peaks."""
        now = self.counters()
        delta = {k: v - self.start.get(k, 0) for k, v in now.items() if k != "cpu_nr_periods"}
        if "cpu_throttled_time" in delta:
            delta["cpu_throttled_ms"] = round(delta.pop("cpu_throttled_time") / 1e6)
        return {
            **delta,
            "peak_pids": self.peak_pids,
            "peak_memory_mib": self.peak_memory_mib,
            "min_cpu_shares": self.min_cpu_shares,
        }


class Neighbour:
    """Runs a behaviour's commands in one sandbox on threads until told to stop or the window ends."""

    def __init__(self, client: Grove, sandbox_id: str, evidence: Evidence) -> None:
        self.sandbox = client.attach(sandbox_id)
        self.evidence = evidence
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.execs = 0
        self.refused = 0
        """Neighbour execs answered 503 (its own pids exhausted by its own fork bomb)."""
        self.output_bytes = 0
        self._lock = threading.Lock()

    def start(self, behaviour: str, until: float) -> None:
        """Start the behaviour's commands; each repeats until ``until`` (``time.monotonic``)."""
        self._stop.clear()
        self.execs = self.refused = self.output_bytes = 0
        self.evidence.begin()
        self._threads = [
            threading.Thread(target=self._keep_running, args=(cmd, until), name=f"neighbour-{behaviour}", daemon=True)
            for cmd in commands(behaviour)
        ]
        for thread in self._threads:
            thread.start()
            time.sleep(0.02)  # in order: see ALL_ORDER
        threading.Thread(target=self._sample, args=(until,), name="neighbour-sampler", daemon=True).start()

    def _keep_running(self, command: str, until: float) -> None:
        while not self._stop.is_set() and (left := until - time.monotonic()) > 0.05:
            try:
                result = self.sandbox.exec(command, timeout_s=left)
            except GroveError:  # 503: out of pids (its own fork bomb); anything else: try again
                with self._lock:
                    self.refused += 1
                self._stop.wait(0.05)
                continue
            with self._lock:
                self.execs += 1
                self.output_bytes += result.stdout_bytes + result.stderr_bytes

    def _sample(self, until: float) -> None:
        while not self._stop.is_set() and time.monotonic() < until:
            self.evidence.sample()
            self._stop.wait(0.05)

    def stop(self, timeout_s: float = 30.0) -> dict[str, Any]:
        """Wait for the commands to end (the window is over or :meth:`abort` was called); what they did."""
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._stop.set()
        alive = sum(t.is_alive() for t in self._threads)
        if alive:
            raise RuntimeError(f"{alive} neighbour commands did not end {timeout_s:g}s after their window")
        return {
            "execs": self.execs,
            "execs_refused": self.refused,
            "exec_output_mib": round(self.output_bytes / 2**20, 1),
            **self.evidence.end(),
        }

    def abort(self) -> None:
        """Stop starting commands (a failing benchmark; deleting the sandbox ends the running ones)."""
        self._stop.set()

    def processes(self) -> int:
        """Processes (not threads: the executor's pool grows) in the sandbox's cgroup."""
        return len((self.evidence.pids_dir / "cgroup.procs").read_text().split())

    def settle(self, idle_processes: int, timeout_s: float = 15.0) -> float:
        """Wait until the sandbox is back to its idle process count; the seconds it took."""
        started = time.monotonic()
        while (left := self.processes()) > idle_processes:
            if time.monotonic() - started > timeout_s:
                raise RuntimeError(f"the neighbour still has {left} processes {timeout_s:g}s after its window")
            time.sleep(0.02)
        return time.monotonic() - started

    def cleanup_files(self) -> None:
        """Remove what the flood wrote (its spill files and its file), so windows do not fill the disk."""
        self.sandbox.exec(CLEANUP, timeout_s=60)
