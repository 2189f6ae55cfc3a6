"""Exec p50 and create p50 of the checkout this runs from: for "unchanged, old against new, in one run".

``python perf/versions.py --label new --out ab.jsonl`` measures the router of whatever ``grove`` code is
imported (the checkout on ``PYTHONPATH`` first, else this venv's), with the same phases as
``perf.bench_router``: ``["true"]`` through the router interleaved with the floor ``subprocess.run(["true"])``
on one sandbox, then sequential create/delete pairs. Run it from two checkouts in turn, alternating, and
compare the lines it appends (each p50 beside its own run's floor): this machine is shared and noisy, so
only figures from one sitting, taken in turn, compare. Run by path (``python perf/versions.py``) so that an
older checkout without this file can be measured: everything it imports exists there.

``--ab OLD_CHECKOUT [--new CHECKOUT]`` does the alternation itself: ``--rounds`` times old then new, each a
process of its own with the right ``PYTHONPATH``, and prints the p50s side by side.

``--burst N`` measures a fresh Orchard-shaped burst of ``N`` instead (:mod:`perf.burst`, on a router whose CPU is
accounted by role): its wall time, each role's CPU per sandbox, the delete's p50 and the sandboxes' lifetimes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent


def measure(calls: int, warmup: int, creates: int) -> dict[str, Any]:
    """One router of the imported code: exec latency by the JSON route and the SDK, then create/delete."""
    from perf import router_phases
    from perf.common import code_version, running_router

    with running_router() as router:
        exec_report, _ = asyncio.run(router_phases.exec_latency(router, calls, warmup))
        lifecycle = router_phases.sequential_lifecycle(router, creates)
    stats = exec_report["stats"]
    return {
        "code": code_version(),
        "exec_p50_ms": {k: stats[k]["p50_ms"] for k in ("floor", "router_json", "sdk")},
        "exec_ratio_p50": {k: exec_report["ratio_p50"][k] for k in ("router_json", "sdk")},
        "create_p50_ms": lifecycle["create"]["p50_ms"],
        "delete_p50_ms": lifecycle["delete"]["p50_ms"],
        "router_cpu_per_create_ms": lifecycle["cpu_per_create_ms"]["router"],
    }


BURST_FIGURES = ("wall_s", "cpu_ms.grove_router", "cpu_ms.grove_sandboxes", "cpu_ms.grove_s3", "cpu_ms.others",
                 "delete_p50_ms", "lifetime_p50_ms", "lifetime_p99_ms")
EXEC_FIGURES = ("exec_ratio_p50.router_json", "exec_ratio_p50.sdk", "exec_p50_ms.router_json", "exec_p50_ms.floor",
                "create_p50_ms", "delete_p50_ms", "router_cpu_per_create_ms")


def measure_burst(n: int) -> dict[str, Any]:
    """One router of the imported code: a fresh burst of ``n`` after a small warm-up one."""
    from perf import burst_phases
    from perf.bench_burst import warm_router
    from perf.burst import burst
    from perf.common import code_version

    with warm_router() as (router, group):
        meter = burst_phases.CpuMeter(group)
        meter.start()
        report = asyncio.run(burst(router.url, router.key, n)).report()
        cpu = meter.stop(n)
    return {
        "code": code_version(),
        "success_rate": report["success_rate"],
        "wall_s": report["end_to_end_s"],
        "cpu_ms": cpu["cpu_ms_per_sandbox"],
        "delete_p50_ms": report["delete"]["p50_ms"],
        "lifetime_p50_ms": report["lifetime"]["p50_ms"],
        "lifetime_p99_ms": report["lifetime"]["p99_ms"],
    }


def alternate(old: Path, new: Path, rounds: int, extra: list[str]) -> list[dict[str, Any]]:
    """``rounds`` times old then new, each in its own process; every line they wrote."""
    with tempfile.TemporaryDirectory(prefix="grove-ab-") as tmp:
        out = Path(tmp) / "ab.jsonl"
        for i in range(rounds):
            for label, checkout in (("old", old), ("new", new)):
                env = {**os.environ, "PYTHONPATH": str(checkout)}
                argv = [sys.executable, str(Path(__file__).resolve()), "--label", f"{label}-{i}", "--out", str(out),
                        *extra]
                subprocess.run(argv, env=env, cwd=checkout, check=True, stdout=subprocess.DEVNULL)
        return [json.loads(line) for line in out.read_text().splitlines()]


def side_by_side(lines: list[dict[str, Any]], figures: tuple[str, ...] = EXEC_FIGURES) -> dict[str, Any]:
    """Median over the rounds of each figure, old and new, and new/old."""
    out: dict[str, Any] = {}
    for figure in figures:
        values: dict[str, list[float]] = {"old": [], "new": []}
        for line in lines:
            value: Any = line
            for part in figure.split("."):
                value = value[part]
            values[line["label"].split("-")[0]].append(float(value))
        old, new = statistics.median(values["old"]), statistics.median(values["new"])
        out[figure] = {"old": values["old"], "new": values["new"], "new_over_old": round(new / old, 3)}
    return out


def main(argv: list[str] | None = None) -> None:
    """Command line."""
    parser = argparse.ArgumentParser(prog="python perf/versions.py", description=__doc__)
    parser.add_argument("--calls", type=int, default=300, help="measured execs per kind (default 300)")
    parser.add_argument("--warmup", type=int, default=30, help="warm-up rounds (default 30)")
    parser.add_argument("--creates", type=int, default=30, help="sequential create/delete pairs (default 30)")
    parser.add_argument("--label", default="", help="a name for this run in the output")
    parser.add_argument("--out", help="append the result as one JSON line to this file")
    parser.add_argument("--ab", metavar="OLD_CHECKOUT", help="alternate an older checkout with this one")
    parser.add_argument("--new", metavar="CHECKOUT", help="with --ab: the newer checkout (default: this one; a "
                                                          "worktree of it leaves this one free to edit meanwhile)")
    parser.add_argument("--rounds", type=int, default=2, help="with --ab: old/new pairs (default 2)")
    parser.add_argument("--burst", type=int, metavar="N", help="measure a fresh burst of N instead of exec/create")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path.cwd()))
    if args.ab:
        extra = ["--calls", str(args.calls), "--warmup", str(args.warmup), "--creates", str(args.creates)]
        extra += ["--burst", str(args.burst)] if args.burst else []
        lines = alternate(Path(args.ab).resolve(), Path(args.new).resolve() if args.new else HERE, args.rounds, extra)
        figures = BURST_FIGURES if args.burst else EXEC_FIGURES
        print(json.dumps({"runs": lines, "median": side_by_side(lines, figures)}, indent=1))
        return
    measured = measure_burst(args.burst) if args.burst else measure(args.calls, args.warmup, args.creates)
    report = {"label": args.label, **measured}
    print(json.dumps(report, indent=1))
    if args.out:
        with open(args.out, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(report) + "\n")


if __name__ == "__main__":
    main()
