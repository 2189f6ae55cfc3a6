"""What many idle sandboxes cost the router: its CPU per second, and how long its event loop stalls.

``python -m perf.idle_router --n 1000`` starts a router (local backend), fills a warm pool of ``n``, claims
all of them in one batch (no heartbeats, an hour's heartbeat timeout), resizes the pool to 0 (no refill)
and lets it settle. Then, with nothing asked of it, it reads the router's CPU over ``--idle-s`` seconds;
then it times a cheap call (``GET /v1/pools/<name>``) every 5 ms for ``--calls-s`` seconds, whose
slowest answers are the loop's stalls (a reaper pass, a hog-watch tick). This is what a training step
costs while a burst's sandboxes wait for their agents. Run it from two checkouts in turn, alternating,
to compare versions; raw figures: one JSON object printed (and appended to ``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import time
import urllib.parse
from typing import Any

from grove.client import AsyncGrove
from perf.common import (
    Api,
    code_version,
    comparison_options,
    emit_comparison,
    percentile,
    running_router,
    sigterm_as_exit,
)

_POOL = "idle"


def _cpu_s(pid: int) -> float:
    """The process's user and system CPU so far, in seconds."""
    with open(f"/proc/{pid}/stat", "rb") as fh:
        fields = fh.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100


def _fill(api: Api, n: int, timeout_s: float = 1800.0) -> None:
    deadline = time.monotonic() + timeout_s
    while (state := api.call("GET", f"/v1/pools/{_POOL}"))["ready"] < n:
        if state.get("error"):
            raise RuntimeError(f"the pool cannot fill: {state['error']}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the pool reached {state['ready']} of {n} in {timeout_s:.0f} s")
        time.sleep(0.5)


async def _claim(url: str, key: str, n: int) -> int:
    async with AsyncGrove(url, key, timeout_s=600) as grove:
        made = await grove.create_many(n, pool=_POOL, heartbeat=False, heartbeat_timeout_s=3600)
        return len(made)


def measure(n: int, idle_s: float, calls_s: float, settle_s: float) -> dict[str, Any]:
    """One router, ``n`` claimed sandboxes idle: its CPU per second idle, and a cheap call's latency."""
    with running_router() as router:
        api = router.api(timeout_s=120)
        api.call("POST", "/v1/pools", {"name": _POOL, "size": n})
        _fill(api, n)
        claimed = asyncio.run(_claim(router.url, router.key, n))
        api.call("PATCH", f"/v1/pools/{_POOL}", {"size": 0})
        time.sleep(settle_s)
        before, t0 = _cpu_s(router.pid), time.monotonic()
        time.sleep(idle_s)
        idle_ms_per_s = (_cpu_s(router.pid) - before) / (time.monotonic() - t0) * 1000
        parts = urllib.parse.urlsplit(router.url)
        conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port)
        latencies: list[float] = []
        end = time.monotonic() + calls_s
        while time.monotonic() < end:
            start = time.perf_counter()
            conn.request("GET", f"/v1/pools/{_POOL}", headers={"Authorization": f"Bearer {router.key}"})
            conn.getresponse().read()
            latencies.append((time.perf_counter() - start) * 1000)
            time.sleep(0.005)
        conn.close()
        live = len(api.call("GET", "/v1/sandboxes")["sandboxes"])
    return {"n": n, "claimed": claimed, "live": live, "idle_router_cpu_ms_per_s": round(idle_ms_per_s, 2),
            "calls": len(latencies), "call_ms": {"p50": round(percentile(latencies, 50), 3),
                                                 "p99": round(percentile(latencies, 99), 3),
                                                 "max": round(max(latencies), 3)},
            "code": code_version()}


def main(argv: list[str] | None = None) -> None:
    """Print the measurement as JSON (and append it to ``--out`` if given)."""
    parser = argparse.ArgumentParser(prog="python -m perf.idle_router", description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000, help="idle claimed sandboxes (default 1000)")
    parser.add_argument("--idle-s", type=float, default=20.0, help="seconds of idle CPU measured (default 20)")
    parser.add_argument("--calls-s", type=float, default=20.0, help="seconds of timed calls (default 20)")
    parser.add_argument("--settle-s", type=float, default=15.0, help="quiet before measuring (default 15)")
    comparison_options(parser)
    args = parser.parse_args(argv)
    sigterm_as_exit()
    report = {"label": args.label, **measure(args.n, args.idle_s, args.calls_s, args.settle_s)}
    emit_comparison(report, args.out)


if __name__ == "__main__":
    main()
