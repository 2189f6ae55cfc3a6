"""The burst with a warm pool: the pool filled first (as during a training step), then the burst's creates
claim from it — one request per create, or all of them in one streamed batch create (``create_in_parts``).
Reports the fill, the idle memory of a pooled sandbox, and the burst as :mod:`perf.burst` measures it, with
its CPU by role."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from grove.client import AsyncGrove, AsyncSandbox
from grove.core.errors import GroveError
from perf import burst_phases, cpuacct
from perf.burst import BurstResult, SandboxRun, burst, drive, kind
from perf.common import Api, Router
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


def wait_gone(router: Router, timeout_s: float = 300.0) -> None:
    """Until the deleted pool's members (refilled during the burst) are gone, and a little longer for the
    kernel's part: their teardown (a thousand cgroups removed) ran on into the next run's burst and took
    ~1 CPU of this 2-CPU machine from it (the pooled batch's create p50 23.0 ms in the bench, 7.3-8.8 ms
    on a router with nothing else to do)."""
    deadline = time.monotonic() + timeout_s
    while _members(router):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the deleted pool's members were not gone after {timeout_s:.0f} s")
        time.sleep(0.5)
    time.sleep(2.0)


async def streamed_burst(url: str, key: str, n: int, pool: str, *, as_ready: bool = False) -> BurstResult:
    """The burst's creates as one streamed batch: ``create_in_parts(n, pool=pool)``, or (``as_ready``)
    ``create_as_ready(n, pool=pool)`` as the README recommends a trainer write it. Each sandbox's create
    latency runs from the batch sent to the moment the SDK hands it over (a whole part at once, or one
    sandbox at a time), and its four commands and delete (as :func:`perf.burst.burst` runs them) start
    right then, while later ones are still coming."""
    runs = [SandboxRun(i) for i in range(n)]
    drives: dict[int, asyncio.Task[None]] = {}
    async with AsyncGrove(url, key, timeout_s=600) as grove:
        # A trainer's client is long-lived: its connection to the router is up when the burst comes (a
        # fresh one cost the batch ~2 ms before its first byte reached the router).
        await grove.pool(pool)
        t0, wall0 = time.perf_counter(), time.time()

        def take(i: int, outcome: AsyncSandbox | GroveError, ready: float) -> None:
            if isinstance(outcome, GroveError):
                runs[i].errors.append((kind("create", outcome), str(outcome)))
                return
            runs[i].ready = ready
            drives[i] = asyncio.create_task(drive(outcome, runs[i], t0, wall0))

        if as_ready:
            async for i, outcome in grove.create_as_ready(n, pool=pool):
                take(i, outcome, time.perf_counter() - t0)
        else:
            async for part in grove.create_in_parts(n, pool=pool):
                ready = time.perf_counter() - t0  # the whole part is the caller's at once
                for i, outcome in part:
                    take(i, outcome, ready)
        ended = await asyncio.gather(*drives.values(), return_exceptions=True)
        wall = time.perf_counter() - t0
    for i, end in zip(drives, ended, strict=True):
        if isinstance(end, BaseException):  # a bug in this driver must show, not vanish
            runs[i].errors.append((kind("driver", end), str(end)))
    return BurstResult(n, 0, wall, runs)


def fill(api: Api, n: int) -> float:
    """Make the bench pool of ``n`` (default resources, as the burst's creates) and wait until it is full;
    the seconds that took."""
    api.call("POST", "/v1/pools", {"name": POOL, "size": n})
    timeout_s = max(300.0, 2.0 * n)
    took = wait_full(api, n, timeout_s, error_fails=True)
    if took is None:
        raise RuntimeError(f"the pool did not fill within {timeout_s:.0f} s: {api.call('GET', f'/v1/pools/{POOL}')}")
    return took


def wait_full(api: Api, n: int, timeout_s: float, *, error_fails: bool = False) -> float | None:
    """Seconds until the bench pool holds ``n`` ready members; None if it did not within ``timeout_s``.
    With ``error_fails``, a failed refill the pool reports raises RuntimeError at once."""
    started = time.monotonic()
    while (shown := api.call("GET", f"/v1/pools/{POOL}"))["ready"] < n:
        if error_fails and shown["error"]:
            raise RuntimeError(f"the pool did not fill: {shown}")
        if time.monotonic() - started > timeout_s:
            return None
        time.sleep(0.5)
    return time.monotonic() - started


def pooled_burst(router: Router, group: cpuacct.CpuGroup | None, n: int, concurrency: int,
                 settle_s: float = 5.0, *, batched: bool = False) -> dict[str, Any]:
    """Fill a pool of ``n`` (default resources, as the burst's creates), then burst ``n`` claims on it: one
    request per create, or (``batched``) one batch create of all ``n``."""
    api = router.api(timeout_s=120)
    try:
        fill_s = fill(api, n)
        time.sleep(settle_s)
        memory = idle_memory(router, _members(router))
        meter = burst_phases.CpuMeter(group)
        meter.start()
        if batched:
            result = asyncio.run(streamed_burst(router.url, router.key, n, POOL))
        else:
            result = asyncio.run(burst(router.url, router.key, n, concurrency=concurrency, pool=POOL))
        cpu = meter.stop(n)
        api.close()  # idle through the burst, longer than the router's keep-alive: a new connection
        shown = api.call("GET", f"/v1/pools/{POOL}")
        api.call("DELETE", f"/v1/pools/{POOL}")
        wait_gone(router)
    finally:
        api.close()
    report = result.report()
    report.update(cpu=cpu, fill_s=round(fill_s, 3), idle_memory_per_pooled_sandbox=memory,
                  claims=shown["claims"], misses=shown["misses"], batched=batched)
    how = " (one batch create)" if batched else ""
    print(f"pooled burst of {n}{how}: pool filled in {fill_s:.1f} s; {report['success_rate'] * 100:.1f}% ok in "
          f"{report['end_to_end_s']:.1f} s, create p50 {report['create']['p50_ms']:.1f} ms (taken up by the router "
          f"after {report['create_until_taken_up'].get('p50_ms', 0):.1f} ms p50), "
          f"{shown['claims']} claims, {shown['misses']} misses", flush=True)
    return report
