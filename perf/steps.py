"""The pooled burst as a trainer lives it: bursts back to back with a training step between them.

A pool of ``n`` is filled once (not counted: it happens before training starts). Then ``bursts`` bursts of
``n`` run through ``create_as_ready(n, pool=...)`` exactly as the README recommends, each sandbox's four
commands started as it arrives and the sandbox closed after them, with ``gap_s`` of idle "training step"
between bursts. The pool refills and the claimed sandboxes are torn down during those gaps — or, when the gap
is too short for them, during the next burst: the last burst is the one reported, so a pool cannot win by
pushing its cost past the stopwatch. After the last burst, the time until the pool is full again says how long
a step must be for the refill to fit in it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from perf import burst_phases, cpuacct
from perf.common import Router
from perf.pooled import POOL, fill, streamed_burst, wait_full, wait_gone

REFILL_TIMEOUT_S = 600.0


def _brief(report: dict[str, Any]) -> dict[str, Any]:
    """The figures of a burst before the reported one."""
    return {
        "end_to_end_s": report["end_to_end_s"],
        "success_rate": report["success_rate"],
        "lifetime": report["lifetime"],
        "create": report["create"],
        "pool_ready_at_start": report["pool_ready_at_start"],
        "cpu_ms_per_sandbox": report["cpu"]["cpu_ms_per_sandbox"],
    }


def pooled_steps(router: Router, group: cpuacct.CpuGroup | None, n: int, *, bursts: int = 3,
                 gap_s: float = 15.0) -> dict[str, Any]:
    """Fill a pool of ``n``, run ``bursts`` as-ready bursts of ``n`` with ``gap_s`` between them; the last
    one's full report (``reported``), the earlier ones in brief, and the refill after the last."""
    if bursts < 1:
        raise ValueError("at least one burst")
    reports: list[dict[str, Any]] = []
    api = router.api(timeout_s=120)
    try:
        fill_s = fill(api, n)
        for k in range(bursts):
            if k:
                time.sleep(gap_s)  # the training step: refill and teardown may run now, or spill into the burst
            ready = api.call("GET", f"/v1/pools/{POOL}")["ready"]
            api.close()  # idle through the burst, longer than the router's keep-alive: a new connection next
            meter = burst_phases.CpuMeter(group)
            meter.start()
            result = asyncio.run(streamed_burst(router.url, router.key, n, POOL, as_ready=True))
            report = result.report()
            report.update(cpu=meter.stop(n), pool_ready_at_start=ready)
            reports.append(report)
            life = report["lifetime"]
            print(f"pooled step burst {k + 1}/{bursts} of {n}: pool had {ready} ready; "
                  f"{report['success_rate'] * 100:.1f}% ok in {report['end_to_end_s']:.1f} s, lifetime p50 "
                  f"{life.get('p50_ms', 0) / 1000:.2f} s p99 {life.get('p99_ms', 0) / 1000:.2f} s", flush=True)
        refilled = wait_full(api, n, REFILL_TIMEOUT_S)
        shown = api.call("GET", f"/v1/pools/{POOL}")
        api.call("DELETE", f"/v1/pools/{POOL}")
        wait_gone(router)
    finally:
        api.close()
    return {
        "n": n,
        "bursts": bursts,
        "gap_s": gap_s,
        "fill_s": round(fill_s, 3),
        "earlier": [_brief(r) for r in reports[:-1]],
        "reported": reports[-1],
        "refilled_after_last_s": None if refilled is None else round(refilled, 2),
        "claims": shown["claims"],
        "misses": shown["misses"],
    }
