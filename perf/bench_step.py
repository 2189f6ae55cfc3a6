"""The burst against its floor, as a trainer runs it (issue 38): ``make bench-burst``.

``python -m perf.bench_step [--n 1000] [--rounds 3] [--gap 15]`` starts a real router (``grove up``, local
backend) and measures, in one run:

- one exec of ``true`` through grove against ``subprocess.run(["true"])`` and against SWE-ReX's own server,
  interleaved (:mod:`perf.single_exec`);
- then ``rounds`` rounds, each in turn: the floor (the burst's work in ``n`` bare isolated shells,
  :mod:`perf.floor`), the fresh burst (``n`` sandboxes created, four commands each, deleted, all at once,
  :mod:`perf.burst`), and the pooled burst (a pool of ``n`` filled, then three bursts through
  ``create_as_ready`` with a training-step gap between them, the third reported, :mod:`perf.steps`).

Each ratio is the median of the rounds with its spread; lifetimes (create sent to delete answered) and the
CPU by role per sandbox are given for each burst. Writes ``perf/results/step.json`` and the "Burst against
its floor" section of ``perf/README.md``. Everything it started is removed, also when it fails or is
interrupted (SIGINT, SIGTERM).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from perf import cpuacct
from perf.bench_burst import one_burst, warm_router
from perf.common import code_version, machine, publish, sigterm_as_exit, spread, utc_now
from perf.floor import floor
from perf.single_exec import single_exec_sync
from perf.step_report import markdown, targets
from perf.steps import pooled_steps

NAME = "step"


def one_round(router: Any, group: cpuacct.CpuGroup | None, args: argparse.Namespace, k: int) -> dict[str, Any]:
    """The floor, the fresh burst and the pooled steps, one after the other."""
    bare = asyncio.run(floor(args.n))
    print(f"round {k}: floor of {args.n} in {bare['wall_s']:.1f} s", flush=True)
    fresh, _ = one_burst(router, group, args.n, 0)
    pooled = pooled_steps(router, group, args.n, bursts=args.bursts, gap_s=args.gap)
    time.sleep(2.0)
    return {"floor": bare, "fresh": fresh, "pooled": pooled}


def summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure as the median of the rounds, with its spread."""
    fresh = [r["fresh"] for r in rounds]
    pooled = [r["pooled"]["reported"] for r in rounds]
    walls = [r["floor"]["wall_s"] for r in rounds]

    def per_role(reports: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
        roles = reports[0]["cpu"]["cpu_ms_per_sandbox"]
        return {role: spread([r["cpu"]["cpu_ms_per_sandbox"][role] for r in reports]) for role in roles}

    return {
        "floor_s": spread(walls),
        "floor_cpu_ms_per_shell": spread([r["floor"]["cpu_ms_per_shell"] for r in rounds]),
        "fresh_s": spread([b["end_to_end_s"] for b in fresh]),
        "pooled_s": spread([b["end_to_end_s"] for b in pooled]),
        "fresh_over_floor": spread([b["end_to_end_s"] / w for b, w in zip(fresh, walls, strict=True)]),
        "pooled_over_floor": spread([b["end_to_end_s"] / w for b, w in zip(pooled, walls, strict=True)]),
        "claim_p50_ms": spread([b["create"]["p50_ms"] for b in pooled]),
        "claim_p99_ms": spread([b["create"]["p99_ms"] for b in pooled]),
        "lifetime_ms": {
            "fresh": {q: spread([b["lifetime"][q] for b in fresh]) for q in ("p50_ms", "p99_ms")},
            "pooled": {q: spread([b["lifetime"][q] for b in pooled]) for q in ("p50_ms", "p99_ms")},
        },
        "success_rate": min([r["floor"]["success_rate"] for r in rounds] + [b["success_rate"] for b in fresh]
                            + [b["success_rate"] for r in rounds for b in [r["pooled"]["reported"],
                                                                            *r["pooled"]["earlier"]]]),
        "refilled_after_last_s": [r["pooled"]["refilled_after_last_s"] for r in rounds],
        "cpu_ms_per_sandbox": {"fresh": per_role(fresh), "pooled": per_role(pooled)},
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Every phase on one router."""
    with warm_router() as (router, group):
        single = single_exec_sync(router, args.rounds, args.calls)
        print(f"single exec p50: grove {single['grove_over_subprocess']['median']:.2f}x subprocess.run, "
              f"{single['grove_over_swerex']['median']:.2f}x SWE-ReX's server", flush=True)
        rounds = [one_round(router, group, args, k + 1) for k in range(args.rounds)]
    return {"single_exec": single, "rounds": rounds, "summary": summary(rounds), "cleanup": router.cleanup,
            "cpu_accounting": group is not None}


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark; write the JSON and the README section."""
    parser = argparse.ArgumentParser(prog="python -m perf.bench_step", description=__doc__)
    parser.add_argument("--n", type=int, default=1000, help="sandboxes per burst (default 1000)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds, each ratio their median (default 3)")
    parser.add_argument("--bursts", type=int, default=3, help="pooled bursts per round, the last reported (default 3)")
    parser.add_argument("--gap", type=float, default=15.0, help="seconds of training step between bursts (default 15)")
    parser.add_argument("--calls", type=int, default=200, help="single-exec calls of each way per round (default 200)")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.n < 1:
        parser.error("--rounds and --n must be at least 1")
    sigterm_as_exit()
    report: dict[str, Any] = {
        "benchmark": "the burst against its floor: fresh, pooled as a trainer runs it, single exec (issue 38)",
        "date": utc_now(),
        "n": args.n,
        "gap_s": args.gap,
        "machine": machine(),
        "code": code_version(),
    }
    report.update(measure(args))
    publish(NAME, report, targets(report), markdown)


if __name__ == "__main__":
    main()
