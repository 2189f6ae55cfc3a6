"""The port proxy: a request through grove against the same request straight to the server, WebSocket round
trips, and one stream's throughput.

``python -m perf.bench_ports [--requests 300 --messages 300 --mb 200 --rounds 3 --cpu-requests 3000]`` starts
one router and one sandbox with an aiohttp server on port 8000 on its loopback, then runs the same measuring
client (:mod:`perf.ports_client`, aiohttp, one keep-alive session) both ways, alternating for ``--rounds``:

- **through grove**: ``http://router/v1/sandboxes/{id}/ports/8000/...`` with the API key (router, tunnel through
  the executor's socket, the executor's relay, the server);
- **straight**: ``http://127.0.0.1:8000/...`` from inside the sandbox's network namespace (``nsenter --net``),
  the sandbox's own address for its server, with no grove in the way.

Writes ``perf/results/ports.json`` and the "Ports" section of ``perf/README.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grove.client import Grove
from perf.calls import TICK_S, cpu_ticks
from perf.common import (
    Router,
    Target,
    code_version,
    machine,
    machine_line,
    percentile,
    publish,
    running_router,
    target_table,
    utc_now,
)
from tests.support.sandbox_servers import AIOHTTP_SERVER, drop_libs_dirs, start_server

NAME = "ports"
SECTION = "## Ports: the proxy against the server straight"
PORT = 8000


def _client(argv_prefix: list[str], base: str, key: str | None, args: argparse.Namespace,
            *more: str) -> dict[str, Any]:
    argv = [*argv_prefix, sys.executable, "-m", "perf.ports_client", base, "--requests", str(args.requests),
            "--messages", str(args.messages), "--bytes", str(args.mb * 1024 * 1024), *more]
    if key:
        argv += ["--key", key]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=1800, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the measuring client failed: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def _summary(raw: dict[str, Any]) -> dict[str, Any]:
    return {"http_p50_ms": round(percentile(raw["http_s"], 50) * 1000, 3),
            "http_p90_ms": round(percentile(raw["http_s"], 90) * 1000, 3),
            "ws_rtt_p50_ms": round(percentile(raw["ws_s"], 50) * 1000, 3),
            "ws_rtt_p90_ms": round(percentile(raw["ws_s"], 90) * 1000, 3),
            "stream_mb_s": round(raw["stream_bytes"] / raw["stream_s"] / 2**20, 1),
            "requests": len(raw["http_s"]), "messages": len(raw["ws_s"])}


def _merged(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"http_s": [s for r in runs for s in r["http_s"]], "ws_s": [s for r in runs for s in r["ws_s"]],
            "stream_s": sum(r["stream_s"] for r in runs), "stream_bytes": sum(r["stream_bytes"] for r in runs)}


def _cpu_s(pids: list[int]) -> float:
    """User and system CPU seconds the processes spent so far (``/proc/PID/stat``, all their threads)."""
    return sum(cpu_ticks(pid, children=False) for pid in pids) * TICK_S


def _cpu_per_request(roles: dict[str, list[int]], run: Callable[[], dict[str, Any]],
                     idle_s: float = 5.0) -> dict[str, float]:
    """CPU microseconds per request of each role's processes, and of the measuring client, over ``run()``; each
    role's own CPU rate while idle (its background threads, timers), measured for ``idle_s`` first, taken off."""
    began, before = time.monotonic(), {role: _cpu_s(pids) for role, pids in roles.items()}
    time.sleep(idle_s)
    idle = {role: (_cpu_s(pids) - before[role]) / (time.monotonic() - began) for role, pids in roles.items()}
    began, before = time.monotonic(), {role: _cpu_s(pids) for role, pids in roles.items()}
    client = resource.getrusage(resource.RUSAGE_CHILDREN)
    requests = len(run()["http_s"])
    took = time.monotonic() - began
    spent = {role: _cpu_s(pids) - before[role] - idle[role] * took for role, pids in roles.items()}
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    spent["client"] = after.ru_utime + after.ru_stime - client.ru_utime - client.ru_stime
    return {f"{role}_us": round(seconds / requests * 1e6, 1) for role, seconds in spent.items()}


def measure(router: Router, args: argparse.Namespace) -> dict[str, Any]:
    """The client through grove and straight, alternating for ``args.rounds`` rounds (the machine's load
    falls on both alike); then, for the HTTP requests alone, the CPU each process spends per request."""
    with Grove(router.url, router.key) as grove:
        sandbox = grove.create(heartbeat=False, memory_mb=1024)
        try:
            start_server(sandbox, AIOHTTP_SERVER, PORT, ("aiohttp",))
            pids = [int(p) for p in (router.cgroup(sandbox.id, "pids") / "cgroup.procs").read_text().split()]
            server = [p for p in pids if f"server-{PORT}.py" in Path(f"/proc/{p}/cmdline").read_text()]
            executor = [p for p in pids if p not in server]
            proxied_base = f"{router.url}/v1/sandboxes/{sandbox.id}/ports/{PORT}"
            netns = ["nsenter", f"--net=/proc/{pids[0]}/ns/net"]
            proxied: list[dict[str, Any]] = []
            straight: list[dict[str, Any]] = []
            for _ in range(args.rounds):
                proxied.append(_client([], proxied_base, router.key, args))
                straight.append(_client(netns, f"http://127.0.0.1:{PORT}", None, args))
            alone = ("--http-only", "--requests", str(args.cpu_requests))
            cpu = {
                "through_grove": _cpu_per_request(
                    {"router": [router.pid], "executor": executor, "server": server},
                    lambda: _client([], proxied_base, router.key, args, *alone)),
                "straight": _cpu_per_request(
                    {"server": server}, lambda: _client(netns, f"http://127.0.0.1:{PORT}", None, args, *alone)),
            }
        finally:
            sandbox.close()
            drop_libs_dirs()
    through, direct = _summary(_merged(proxied)), _summary(_merged(straight))
    return {"through_grove": through, "straight": direct, "cpu_per_request": cpu,
            "http_p50_ratio": round(through["http_p50_ms"] / direct["http_p50_ms"], 2),
            "ws_rtt_p50_ratio": round(through["ws_rtt_p50_ms"] / direct["ws_rtt_p50_ms"], 2),
            "stream_throughput_ratio": round(through["stream_mb_s"] / direct["stream_mb_s"], 2)}


def _section(report: dict[str, Any], rows: list[Target]) -> str:
    t, s, cpu = report["through_grove"], report["straight"], report["cpu_per_request"]
    lines = [SECTION, "", f"Measured {report['when']} on {machine_line(report['machine'])}; one run, "
             f"{t['requests']} requests and {t['messages']} WebSocket messages each way, {report['rounds']} downloads "
             f"of {report['mb']} MB; the same aiohttp client through grove and straight to the server from inside "
             f"the sandbox's network namespace, alternating in {report['rounds']} rounds; the machine's 1-minute load "
             f"average {report['load_avg_1m'][0]} at the start and {report['load_avg_1m'][1]} at the end (shared with "
             "other work: compare ratios, and CPU per request, not times).", "",
             "| figure | through grove | straight | ratio |", "|---|---|---|---|",
             f"| HTTP request p50 (ms) | {t['http_p50_ms']} | {s['http_p50_ms']} | {report['http_p50_ratio']}x |",
             f"| HTTP request p90 (ms) | {t['http_p90_ms']} | {s['http_p90_ms']} | |",
             f"| WebSocket round trip p50 (ms) | {t['ws_rtt_p50_ms']} | {s['ws_rtt_p50_ms']} | "
             f"{report['ws_rtt_p50_ratio']}x |",
             f"| one stream (MB/s) | {t['stream_mb_s']} | {s['stream_mb_s']} | {report['stream_throughput_ratio']}x |",
             "", "CPU per HTTP request (µs, user + system, from `/proc/PID/stat` over a run of requests alone, each "
             "process's idle rate taken off):", "",
             "| process | through grove | straight |", "|---|---|---|",
             *(f"| {role} | {cpu['through_grove'].get(f'{role}_us', '')} | {cpu['straight'].get(f'{role}_us', '')} |"
               for role in ("client", "router", "executor", "server")),
             "", _remaining(cpu), "", *target_table(rows)]
    return "\n".join(lines) + "\n"


def _remaining(cpu: dict[str, dict[str, float]]) -> str:
    """What the CPU figures say the gap is made of."""
    t, s = cpu["through_grove"], cpu["straight"]
    return (f"Through grove a request costs {t['router_us']} µs of the router's CPU and {t['executor_us']} µs of the "
            f"executor's relay, against {s['server_us']} µs for the server to answer it: the router's aiohttp "
            "server and client (parse, route, authenticate, re-send, parse the answer, re-send it) are the gap.")


def main(argv: list[str] | None = None) -> None:
    """Command line."""
    parser = argparse.ArgumentParser(prog="python -m perf.bench_ports", description=__doc__)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--messages", type=int, default=300)
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3, help="alternations of the two clients")
    parser.add_argument("--cpu-requests", type=int, default=3000, help="requests of the CPU accounting runs")
    args = parser.parse_args(argv)
    load = os.getloadavg()[0]
    with running_router() as router:
        measured = measure(router, args)
    report = {"name": NAME, "when": utc_now(), "code": code_version(), "machine": machine(), "mb": args.mb,
              "rounds": args.rounds, "load_avg_1m": [round(load, 1), round(os.getloadavg()[0], 1)], **measured}
    ratio = report["http_p50_ratio"]
    rows = [Target("proxied HTTP request p50 over the same request straight to the server", f"{ratio}x", "<= 1.5x",
                   ratio <= 1.5),
            Target("WebSocket message round trip p50 through grove",
                   f"{report['through_grove']['ws_rtt_p50_ms']} ms", "reported", None),
            Target("one proxied stream", f"{report['through_grove']['stream_mb_s']} MB/s", "reported", None)]
    publish(NAME, report, rows, _section)


if __name__ == "__main__":
    main()
