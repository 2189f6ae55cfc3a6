"""The burst with a warm pool: the pool filled first (as during a training step), then the burst's creates
claim from it. Reports the fill, the idle memory of a pooled sandbox, and the burst as :mod:`perf.burst`
measures it, with its CPU by role."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from perf import burst_phases, cpuacct
from perf.burst import burst
from perf.common import Router
from perf.router_phases import idle_memory

POOL = "bench"


def _members(router: Router) -> list[str]:
    """Ids of the pool's unclaimed sandboxes, from the router's records (the API does not show them)."""
    ids = []
    for path in router.layout.records.glob("sb-*.json"):
        try:
            if json.loads(path.read_text()).get("pool") == POOL:
                ids.append(path.stem)
        except (OSError, ValueError):
            continue
    return ids


def pooled_burst(router: Router, group: cpuacct.CpuGroup | None, n: int, concurrency: int,
                 settle_s: float = 5.0) -> dict[str, Any]:
    """Fill a pool of ``n`` (default resources, as the burst's creates), then burst ``n`` claims on it."""
    api = router.api(timeout_s=120)
    try:
        api.call("POST", "/v1/pools", {"name": POOL, "size": n})
        started = time.monotonic()
        deadline = started + max(300.0, 2.0 * n)
        while (shown := api.call("GET", f"/v1/pools/{POOL}"))["ready"] < n:
            if shown["error"] or time.monotonic() > deadline:
                raise RuntimeError(f"the pool did not fill: {shown}")
            time.sleep(0.5)
        fill_s = time.monotonic() - started
        time.sleep(settle_s)
        memory = idle_memory(router, _members(router))
        meter = burst_phases.CpuMeter(group)
        meter.start()
        result = asyncio.run(burst(router.url, router.key, n, concurrency=concurrency, pool=POOL))
        cpu = meter.stop(n)
        api.close()  # idle through the burst, longer than the router's keep-alive: a new connection
        shown = api.call("GET", f"/v1/pools/{POOL}")
        api.call("DELETE", f"/v1/pools/{POOL}")
    finally:
        api.close()
    report = result.report()
    report.update(cpu=cpu, fill_s=round(fill_s, 3), idle_memory_per_pooled_sandbox=memory,
                  claims=shown["claims"], misses=shown["misses"])
    print(f"pooled burst of {n}: pool filled in {fill_s:.1f} s; {report['success_rate'] * 100:.1f}% ok in "
          f"{report['end_to_end_s']:.1f} s, create p50 {report['create']['p50_ms']:.1f} ms (taken up by the router "
          f"after {report['create_until_taken_up'].get('p50_ms', 0):.1f} ms p50), "
          f"{shown['claims']} claims, {shown['misses']} misses", flush=True)
    return report
