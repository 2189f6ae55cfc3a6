"""The burst benchmark: Orchard's 1,000 sandboxes at once, through the SDK, on this machine.

``python -m perf.bench_burst [--sizes 100,500,1000] [--concurrency 0]`` starts a real router (``grove up``,
local backend) and, on it: the quiet exec latency of ``["true"]`` and of each burst command against
their floors; idle sandboxes' memory and CPU; sandboxes scaled to zero and their cold start; the
sequential create latency; then one burst per size (:mod:`perf.burst`), with the CPU of each by role and a
leak check around the largest; the largest again with a warm pool filled first (:mod:`perf.pooled`), its
creates one request each, then all in one batch create; and
the floor, the same work in bare isolated shells with no grove (:mod:`perf.floor`), in the same run.
Writes ``perf/results/burst.json``, ``burst_timeline.png``,
``burst_cdf.png`` and the "Burst" section of ``perf/README.md``. Everything it started is removed, also
when it fails or is interrupted (SIGINT, SIGTERM).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections.abc import Iterator
from typing import Any

from perf import burst_phases, cpuacct, leaks, router_phases
from perf.burst import BurstResult, burst, latency_samples, timeline
from perf.burst_report import markdown, targets
from perf.common import (
    RESULTS_DIR,
    Router,
    code_version,
    machine,
    publish,
    running_router,
    sigterm_as_exit,
    utc_now,
)
from perf.floor import floor
from perf.plots import burst_timeline, latency_cdf
from perf.pooled import pooled_burst

NAME = "burst"
TIMELINE_PNG = RESULTS_DIR / "burst_timeline.png"
CDF_PNG = RESULTS_DIR / "burst_cdf.png"


def _wait_empty(router: Router, timeout_s: float = 120.0) -> None:
    """Until the router lists no sandbox (a burst's deletes all done)."""
    api = router.api()
    try:
        deadline = time.monotonic() + timeout_s
        while api.call("GET", "/v1/sandboxes")["sandboxes"]:
            if time.monotonic() > deadline:
                raise RuntimeError("sandboxes still listed after the burst")
            time.sleep(0.2)
    finally:
        api.close()


def one_burst(
    router: Router, group: cpuacct.CpuGroup | None, n: int, concurrency: int
) -> tuple[dict[str, Any], BurstResult]:
    """One burst of ``n``: its report, its CPU by role, and the leak check around it."""
    _wait_empty(router)
    time.sleep(2.0)  # let the previous phase's teardown (kernel work included) finish
    before = leaks.snapshot(router)
    meter = burst_phases.CpuMeter(group)
    meter.start()
    result = asyncio.run(burst(router.url, router.key, n, concurrency=concurrency))
    cpu = meter.stop(n)
    _wait_empty(router)
    time.sleep(2.0)
    after = leaks.snapshot(router)
    report = result.report()
    report["cpu"] = cpu
    report["leak_check"] = leaks.compare(before, after)
    print(
        f"burst of {n}: {report['success_rate'] * 100:.1f}% ok in {report['end_to_end_s']:.1f} s, "
        f"{report['commands_per_s']:.0f} commands/s, errors {report['errors_by_kind']}",
        flush=True,
    )
    return report, result


@contextlib.contextmanager
def warm_router() -> Iterator[tuple[Router, cpuacct.CpuGroup | None]]:
    """A router whose processes' CPU is accounted by role (where ``cpuacct`` is mounted), its zygote and S3
    already started by a small burst that is not measured."""
    with cpuacct.bench_group() as group, running_router() as router:
        if group is not None:
            group.add(router.pid, "router")
        asyncio.run(burst(router.url, router.key, 3))
        if group is not None:
            cpuacct.assign_router_helpers(router.pid, group)
        yield router, group


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Every phase on one router."""
    sizes = [int(s) for s in args.sizes.split(",") if s]
    with warm_router() as (router, group):
        quiet = burst_phases.quiet_exec_sync(router, args.calls, args.per_command)
        idle = asyncio.run(burst_phases.idle_sandboxes(router, group, args.idle, args.settle))
        zero = router_phases.scale_to_zero(router, args.cold)
        sequential = router_phases.sequential_lifecycle(router, args.creates)
        bursts: dict[str, Any] = {}
        results: dict[int, BurstResult] = {}
        for n in sizes:
            bursts[str(n)], results[n] = one_burst(router, group, n, args.concurrency)
        largest = max(sizes)
        pooled = pooled_burst(router, group, largest, args.concurrency) if args.pooled else None
        # The same again with every claim in one batch create: what per-request claims cost shows in the gap.
        pooled_batch = pooled_burst(router, group, largest, args.concurrency, batched=True) if args.pooled else None
        _wait_empty(router)
        time.sleep(2.0)
        # The same work with no grove at all, in the same run (the router idle meanwhile).
        bare = asyncio.run(floor(largest)) if args.floor else None
    if bare is not None:
        print(f"floor of {largest}: {bare['wall_s']:.1f} s, {bare['cpu_ms_per_shell']:.1f} ms CPU per shell; "
              f"the burst took {bursts[str(largest)]['end_to_end_s'] / bare['wall_s']:.2f}x the floor", flush=True)
    _plots(results, largest, quiet)
    for n, result in results.items():
        bursts[str(n)]["timeline_step_s"] = 0.1
        if n == largest:
            bursts[str(n)]["timeline"] = timeline(result.runs)
    return {
        "quiet_exec": quiet,
        "idle": idle,
        "scale_to_zero": zero,
        "sequential": sequential,
        "bursts": bursts,
        "floor": bare,
        "pooled": pooled,
        "pooled_batch": pooled_batch,
        "cleanup": router.cleanup,
        "cpu_accounting": group is not None,
    }


def _plots(results: dict[int, BurstResult], largest: int, quiet: dict[str, Any]) -> None:
    nproc = machine()["nproc"]
    burst_timeline(
        {f"{n} sandboxes at once": timeline(r.runs) for n, r in sorted(results.items())},
        TIMELINE_PNG,
        title=f"Orchard-shaped bursts through the SDK, local backend — {nproc} CPUs",
    )
    samples = latency_samples(results[largest].runs)
    floor = quiet["true"]["floor"]["p50_ms"] / 1000
    latency_cdf(
        samples,
        CDF_PNG,
        title=f"latencies in the {largest}-sandbox burst (client round trips, SDK) — {nproc} CPUs",
        marks={"4x floor p50 (quiet)": 4 * floor},
    )


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark; write the JSON, the plots and the README section."""
    parser = argparse.ArgumentParser(prog="python -m perf.bench_burst", description=__doc__)
    parser.add_argument("--sizes", default="100,500,1000", help="burst sizes, comma-separated (default 100,500,1000)")
    parser.add_argument("--concurrency", type=int, default=0,
                        help="most sandboxes the client drives at once; 0 (default): all of them, as Orchard did")
    parser.add_argument("--calls", type=int, default=300, help="quiet exec calls of `true` (default 300)")
    parser.add_argument("--per-command", type=int, default=30, help="quiet calls of each burst command (default 30)")
    parser.add_argument("--idle", type=int, default=50, help="idle sandboxes measured for memory and CPU (default 50)")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds idle before they are measured (default 5)")
    parser.add_argument("--cold", type=int, default=20, help="sandboxes scaled to zero, then woken (default 20)")
    parser.add_argument("--creates", type=int, default=30, help="sequential create/delete pairs (default 30)")
    parser.add_argument("--no-floor", dest="floor", action="store_false",
                        help="skip the floor: the largest burst's work in bare isolated shells (perf/floor.py)")
    parser.add_argument("--no-pooled", dest="pooled", action="store_false",
                        help="skip the pooled bursts: a warm pool of the largest size filled, then claimed "
                             "(one request per create, then one batch create)")
    args = parser.parse_args(argv)
    sigterm_as_exit()
    report: dict[str, Any] = {
        "benchmark": "Orchard's burst: N sandboxes at once, each create+wait, 4 commands, delete (SDK)",
        "date": utc_now(),
        "sizes": args.sizes,
        "machine": machine(),
        "code": code_version(),
    }
    report.update(measure(args))
    rows = targets(report)
    publish(NAME, report, rows, markdown)


if __name__ == "__main__":
    main()
