"""The noisy-neighbour benchmark: one sandbox's exec latency while another spins, fills memory, fork-bombs, floods.

``python -m perf.bench_noisy [--rounds 4 --window 2.5]`` starts a real router (``grove up``, local backend)
with two sandboxes of default resources, as a user would create them. The victim runs ``["true"]``
through the SDK (``Grove.exec``) back to back, all the time. The neighbour takes turns: in every round,
each behaviour (:mod:`perf.noisy`: CPU spin on every CPU, memory filled to its limit again and again, a
fork bomb held at pids_max, an output flood, all of them at once) gets a window of its own, right after a
quiet window (the neighbour idle); the order rotates each round. Quiet and noisy windows alternate, so
load from other tenants of a shared machine hits both alike, and each behaviour's victim p50 is compared
with the quiet p50 of the same run. Writes ``perf/results/noisy.json``, ``perf/results/noisy_cdf.png``
and the "Noisy neighbours" section of ``perf/README.md``. Both sandboxes are deleted, also on failure.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
from typing import Any

from grove.client import Grove
from grove.client.sync import Sandbox
from perf import cpuacct
from perf.calls import TICK_S, child_pids, system_busy_ticks
from perf.common import RESULTS_DIR, Router, code_version, machine, running_router, sigterm_as_exit, summarize
from perf.noisy import BEHAVIOURS, Evidence, Neighbour
from perf.noisy_report import markdown, targets
from perf.plots import latency_cdf

NAME = "noisy"
PLOT = RESULTS_DIR / "noisy_cdf.png"
RAMP_S = 0.5
"""Seconds a behaviour gets to reach its steady state (memory filled, pids at the limit) before measuring."""


class Meter:
    """The machine's busy CPU between two readings, split into grove (``cpuacct``), this client and the rest."""

    def __init__(self, group: cpuacct.CpuGroup | None) -> None:
        self.group = group
        self.nproc = len(os.sched_getaffinity(0))
        self._start = self._read()

    def _read(self) -> tuple[float, float, float, float]:
        grove = self.group.usage_s() if self.group is not None else 0.0
        return time.perf_counter(), system_busy_ticks() * TICK_S, grove, time.process_time()

    def shares(self) -> dict[str, float]:
        """Shares of the machine's capacity since the last call (or creation), then restart."""
        end = self._read()
        wall, busy, grove, client = (e - s for e, s in zip(end, self._start, strict=True))
        self._start = end
        capacity = max(wall * self.nproc, 1e-9)
        out = {"machine_busy": busy / capacity, "client": client / capacity}
        if self.group is not None:
            out["grove"] = grove / capacity
            out["others"] = max(0.0, busy - grove - client) / capacity
        return {k: round(v, 3) for k, v in out.items()}


class Victim:
    """``["true"]`` through the SDK, back to back; each call checked."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox
        self.errors: list[str] = []

    def until(self, deadline: float, phase: str) -> list[float]:
        """Calls until ``deadline`` (``time.monotonic``); their latencies in seconds."""
        samples: list[float] = []
        while time.monotonic() < deadline:
            t0 = time.perf_counter()
            try:
                result = self.sandbox.exec(["true"])
                failure = None if result.exit_code == 0 else f"exit code {result.exit_code}"
            except Exception as exc:  # a failed call is a finding, counted, not a crash
                failure = f"{type(exc).__name__}: {exc}"
            took = time.perf_counter() - t0
            if failure is None:
                samples.append(took)
            else:
                self.errors.append(f"{phase}: {failure[:200]}")
        return samples


def _cgroups_of(router: Router, sandbox_id: str) -> Evidence:
    return Evidence(
        router.cgroup(sandbox_id, "cpu"), router.cgroup(sandbox_id, "memory"), router.cgroup(sandbox_id, "pids")
    )


def run_windows(router: Router, group: cpuacct.CpuGroup | None, args: argparse.Namespace) -> dict[str, Any]:
    """Both sandboxes, the warm-up, every round of quiet and noisy windows; the sandboxes deleted at the end."""
    victim_client, neighbour_client = Grove(router.url, router.key), Grove(router.url, router.key)
    neighbour: Neighbour | None = None
    ids: list[str] = []
    out: dict[str, Any] = {}
    try:
        victim_sb = victim_client.create(heartbeat=False)
        ids.append(victim_sb.id)
        neighbour_sb = neighbour_client.create(heartbeat=False)
        ids.append(neighbour_sb.id)
        if group is not None:  # grove's account: the router, its helpers, both sandboxes (their children follow)
            procs = [(router.cgroup(i, "pids") / "cgroup.procs").read_text().split() for i in ids]
            for pid in [router.pid, *child_pids(router.pid), *(int(p) for ps in procs for p in ps)]:
                group.add(pid)
        neighbour = Neighbour(neighbour_client, neighbour_sb.id, _cgroups_of(router, neighbour_sb.id))
        victim = Victim(victim_sb)
        victim.until(time.monotonic() + args.warmup, "warm-up")
        idle_processes = neighbour.processes()
        samples: dict[str, list[float]] = {phase: [] for phase in ("quiet", *BEHAVIOURS)}
        paired: dict[str, list[float]] = {b: [] for b in BEHAVIOURS}
        """The quiet windows right before each behaviour's windows: what it is compared with."""
        windows: list[dict[str, Any]] = []
        meter = Meter(group)
        for rnd in range(args.rounds):
            order = BEHAVIOURS[rnd % len(BEHAVIOURS) :] + BEHAVIOURS[: rnd % len(BEHAVIOURS)]
            for behaviour in order:
                meter.shares()
                quiet = victim.until(time.monotonic() + args.window, "quiet")
                samples["quiet"] += quiet
                paired[behaviour] += quiet
                windows.append(_window(rnd, "quiet", quiet, meter.shares()))
                until = time.monotonic() + RAMP_S + args.window
                neighbour.start(behaviour, until)
                victim.until(until - args.window, f"{behaviour} (ramp)")  # not kept
                meter.shares()
                noisy = victim.until(until, behaviour)
                load = meter.shares()
                did = neighbour.stop()
                if behaviour in ("flood", "all"):
                    neighbour.cleanup_files()
                did["settle_s"] = round(neighbour.settle(idle_processes), 3)
                samples[behaviour] += noisy
                windows.append({**_window(rnd, behaviour, noisy, load), "neighbour": did})
                windows[-1]["ratio_to_quiet_before"] = round(windows[-1]["p50_ms"] / windows[-2]["p50_ms"], 3)
        out.update(samples=samples, paired=paired, windows=windows, errors=victim.errors)
        out["victim_cpu_stat"] = _cgroups_of(router, victim_sb.id).counters()
    finally:
        if neighbour is not None:
            neighbour.abort()
        for sandbox_id in ids:  # every neighbour process dies with its sandbox
            with contextlib.suppress(Exception):
                victim_client.request("DELETE", f"/v1/sandboxes/{sandbox_id}")
        out["cgroups_left_after_delete"] = left_over(router, ids)
        victim_client.close()
        neighbour_client.close()
    return out


def _window(rnd: int, phase: str, samples: list[float], load: dict[str, float]) -> dict[str, Any]:
    p50 = statistics.median(samples) * 1000 if samples else float("nan")
    return {"round": rnd, "phase": phase, "n": len(samples), "p50_ms": round(p50, 3), "load": load}


def left_over(router: Router, sandbox_ids: list[str]) -> list[str]:
    """Cgroup directories of the benchmark's sandboxes still there after their deletion (should be none)."""
    return [f"{c}/{s}" for s in sandbox_ids for c in ("cpu", "memory", "pids") if router.cgroup(s, c).exists()]


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """The whole run on one router; the statistics, each window, and the plot."""
    load_before = os.getloadavg()
    with cpuacct.bench_group() as group, running_router() as router:
        run = run_windows(router, group, args)
    samples, paired = run.pop("samples"), run.pop("paired")
    quiet = samples["quiet"]
    stats = {phase: summarize(s, (50, 90, 99)) for phase, s in samples.items()}
    paired_stats = {b: summarize(s, (50, 90, 99)) for b, s in paired.items()}
    # Each behaviour against the quiet windows just before its own: the same minutes of the shared machine.
    ratio_p50 = {b: round(stats[b]["p50_ms"] / paired_stats[b]["p50_ms"], 3) for b in BEHAVIOURS if samples[b]}
    ratio_p99 = {b: round(stats[b]["p99_ms"] / paired_stats[b]["p99_ms"], 3) for b in BEHAVIOURS if samples[b]}
    pairs = {
        b: round(statistics.median(w["ratio_to_quiet_before"] for w in run["windows"] if w["phase"] == b), 3)
        for b in BEHAVIOURS
    }
    quiet_p50 = stats["quiet"]["p50_ms"] / 1000
    latency_cdf(
        {("quiet (neighbour idle)" if p == "quiet" else f"neighbour: {p}"): s for p, s in samples.items()},
        PLOT,
        title=f'victim exec of ["true"] via the SDK while a neighbour misbehaves — {machine()["nproc"]} CPUs',
        marks={"2x quiet p50 (target)": 2 * quiet_p50},
    )
    return {
        **run,
        "stats": stats,
        "paired_quiet_stats": paired_stats,
        "ratio_p50": ratio_p50,
        "ratio_p99": ratio_p99,
        "median_pair_ratio_p50": pairs,
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "quiet_calls": len(quiet),
        "cleanup": router.cleanup,
    }


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark, print the section, write the JSON, the plot and the README section."""
    from perf.common import publish, utc_now

    parser = argparse.ArgumentParser(prog="python -m perf.bench_noisy", description=__doc__)
    parser.add_argument("--rounds", type=int, default=4, help="rounds of every behaviour (default 4)")
    parser.add_argument("--window", type=float, default=2.5, help="seconds of each measured window (default 2.5)")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of victim calls first, not kept (default 2)")
    args = parser.parse_args(argv)
    sigterm_as_exit()
    report: dict[str, Any] = {
        "benchmark": "noisy neighbours: a victim sandbox's exec latency while another misbehaves",
        "date": utc_now(),
        "rounds": args.rounds,
        "window_s": args.window,
        "ramp_s": RAMP_S,
        "machine": machine(),
        "code": code_version(),
    }
    report.update(measure(args))
    rows = targets(report)
    publish(NAME, report, rows, markdown)


if __name__ == "__main__":
    main()
