"""Isolated grading's cost per attempt against in-place grading, in one run.

``python -m perf.bench_grading [--tasks 10 --attempts 2 --rounds 2]`` runs the demo's task set (the scripted
agent; ten small Python projects) through ``grove.rollouts`` on one router, alternately with every task's check
isolated (the default: the attempt's changes applied to a fresh sandbox made from the task, graded there) and
in-place (graded in the agent's own sandbox once its processes are gone), ``--rounds`` times each. Reported
per attempt: wall time, the grading phase's time, and the router's and the sandboxes' CPU (from the results'
``cpu_s``, the agent sandbox's own) — as medians over the rounds, with the ratio isolated / in-place. The
grading phase of an isolated attempt holds a whole second sandbox's start, setup, the transfer of the changes and
its delete; that is what the ratio prices. Writes ``perf/results/grading.json`` and the "Grading" section of
``perf/README.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from grove.demo.tasks import task_lines
from grove.rollouts import Policy, RunConfig, run_rollouts
from perf.common import Target, code_version, machine, machine_line, publish, running_router, target_table, utc_now

NAME = "grading"
SECTION = "## Grading: isolated against in-place, per attempt"


def _tasks(path: Path, count: int, mode: str) -> Path:
    lines = task_lines(count)
    for line in lines:
        line["check"]["grading"] = mode
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def _one(url: str, key: str, work: Path, count: int, attempts: int, mode: str, label: str) -> dict[str, float]:
    out = work / label
    config = RunConfig(tasks=_tasks(work / f"{label}.jsonl", count, mode), out=out, variants=[("scripted", None)],
                       policy=Policy(attempts=attempts), concurrency=2, url=url, api_key=key, upload=False, quiet=True)
    started = time.monotonic()
    run_rollouts(config)
    wall = time.monotonic() - started
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert all(r["grading"] == mode for r in rows), "a task was graded in another mode than asked"
    return {"run_s": wall, "attempts": len(rows),
            "wall_s_per_attempt": statistics.fmean(r["wall_s"] for r in rows),
            "grading_s_per_attempt": statistics.fmean(r["grading_s"] for r in rows),
            "pass_rate": sum(r["outcome"] == "pass" for r in rows) / len(rows)}


def measure(count: int, attempts: int, rounds: int) -> dict[str, Any]:
    """Both modes, alternating, on one router."""
    runs: dict[str, list[dict[str, float]]] = {"isolated": [], "in-place": []}
    with running_router() as router, tempfile.TemporaryDirectory(prefix="grove-bench-grading-") as tmp:
        work = Path(tmp)
        for i in range(rounds):
            for mode in ("in-place", "isolated") if i % 2 else ("isolated", "in-place"):
                runs[mode].append(_one(router.url, router.key, work, count, attempts, mode, f"{mode}-{i}"))
    medians = {mode: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for mode, rs in runs.items()}
    ratio = {k: medians["isolated"][k] / medians["in-place"][k]
             for k in ("wall_s_per_attempt", "grading_s_per_attempt", "run_s")}
    return {"runs": runs, "median": medians, "isolated_over_in_place": ratio}


def _section(report: dict[str, Any], rows: list[Target]) -> str:
    m, r = report["median"], report["isolated_over_in_place"]
    lines = [SECTION, "", machine_line(report["machine"]), "",
             f"The demo's {report['tasks']} tasks, {report['attempts']} attempts each, scripted agent, 2 at a time; "
             f"{report['rounds']} runs of each mode, alternating; medians. Raw figures: `perf/results/grading.json`.",
             "", "| per attempt | isolated | in-place | isolated / in-place |", "|---|---|---|---|"]
    for key, label in (("wall_s_per_attempt", "wall time (s)"), ("grading_s_per_attempt", "grading phase (s)")):
        lines.append(f"| {label} | {m['isolated'][key]:.2f} | {m['in-place'][key]:.2f} | {r[key]:.2f} |")
    lines.append(f"| whole run (s) | {m['isolated']['run_s']:.1f} | {m['in-place']['run_s']:.1f} | "
                 f"{r['run_s']:.2f} |")
    lines += ["", "What an isolated grade adds is one more sandbox per attempt: its create (or a pool's claim), the "
              "task's setup again, the changes read out of the agent's sandbox and put into the grader, its delete. "
              "The pass rates of both modes are the scripted policy's, the same in both (a check that passes in "
              "place passes isolated for an honest agent).", "", *target_table(rows)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    """Command line."""
    parser = argparse.ArgumentParser(prog="python -m perf.bench_grading", description=__doc__)
    parser.add_argument("--tasks", type=int, default=10)
    parser.add_argument("--attempts", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    report = {"name": NAME, "when": utc_now(), "code": code_version(), "machine": machine(), "tasks": args.tasks,
              "attempts": args.attempts, "rounds": args.rounds, **measure(args.tasks, args.attempts, args.rounds)}
    rates = report["median"]["isolated"]["pass_rate"], report["median"]["in-place"]["pass_rate"]
    wall = report["isolated_over_in_place"]["wall_s_per_attempt"]
    rows = [Target("pass rate, isolated = in-place (honest scripted agent)", f"{rates[0]:.2f} / {rates[1]:.2f}",
                   "equal", abs(rates[0] - rates[1]) < 1e-9),
            Target("isolated grading, wall time per attempt", f"{wall:.2f}x in-place", "reported", None)]
    publish(NAME, report, rows, _section)


if __name__ == "__main__":
    main()
