"""The port proxy: a request through grove against the same request straight to the server, WebSocket round
trips, and one stream's throughput.

``python -m perf.bench_ports [--requests 300 --messages 300 --mb 200]`` starts one router and one sandbox with
an aiohttp server on port 8000 on its loopback, then runs the same measuring client (:mod:`perf.ports_client`,
aiohttp, one keep-alive session) twice in one run:

- **through grove**: ``http://router/v1/sandboxes/{id}/ports/8000/...`` with the API key (router, tunnel through
  the executor's socket, the executor's relay, the server);
- **straight**: ``http://127.0.0.1:8000/...`` from inside the sandbox's network namespace (``nsenter --net``),
  the sandbox's own address for its server, with no grove in the way.

Writes ``perf/results/ports.json`` and the "Ports" section of ``perf/README.md``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from typing import Any

from grove.client import Grove
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


def _client(argv_prefix: list[str], base: str, key: str | None, args: argparse.Namespace) -> dict[str, Any]:
    argv = [*argv_prefix, sys.executable, "-m", "perf.ports_client", base, "--requests", str(args.requests),
            "--messages", str(args.messages), "--bytes", str(args.mb * 1024 * 1024)]
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


def measure(router: Router, args: argparse.Namespace) -> dict[str, Any]:
    """Both runs of the client, the proxy's first."""
    with Grove(router.url, router.key) as grove:
        sandbox = grove.create(heartbeat=False, memory_mb=1024)
        try:
            start_server(sandbox, AIOHTTP_SERVER, PORT, ("aiohttp",))
            pid = int((router.cgroup(sandbox.id, "pids") / "cgroup.procs").read_text().split()[0])
            proxied = _client([], f"{router.url}/v1/sandboxes/{sandbox.id}/ports/{PORT}", router.key, args)
            straight = _client(["nsenter", f"--net=/proc/{pid}/ns/net"], f"http://127.0.0.1:{PORT}", None, args)
        finally:
            sandbox.close()
            drop_libs_dirs()
    through, direct = _summary(proxied), _summary(straight)
    return {"through_grove": through, "straight": direct,
            "http_p50_ratio": round(through["http_p50_ms"] / direct["http_p50_ms"], 2),
            "ws_rtt_p50_ratio": round(through["ws_rtt_p50_ms"] / direct["ws_rtt_p50_ms"], 2),
            "stream_throughput_ratio": round(through["stream_mb_s"] / direct["stream_mb_s"], 2)}


def _section(report: dict[str, Any], rows: list[Target]) -> str:
    t, s = report["through_grove"], report["straight"]
    lines = [SECTION, "", f"Measured {report['when']} on {machine_line(report['machine'])}; one run, "
             f"{t['requests']} requests and {t['messages']} WebSocket messages each way, one {report['mb']} MB "
             "download; the same aiohttp client through grove and straight to the server from inside the "
             "sandbox's network namespace.", "",
             "| figure | through grove | straight | ratio |", "|---|---|---|---|",
             f"| HTTP request p50 (ms) | {t['http_p50_ms']} | {s['http_p50_ms']} | {report['http_p50_ratio']}x |",
             f"| HTTP request p90 (ms) | {t['http_p90_ms']} | {s['http_p90_ms']} | |",
             f"| WebSocket round trip p50 (ms) | {t['ws_rtt_p50_ms']} | {s['ws_rtt_p50_ms']} | "
             f"{report['ws_rtt_p50_ratio']}x |",
             f"| one stream (MB/s) | {t['stream_mb_s']} | {s['stream_mb_s']} | {report['stream_throughput_ratio']}x |",
             "", *target_table(rows)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    """Command line."""
    parser = argparse.ArgumentParser(prog="python -m perf.bench_ports", description=__doc__)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--messages", type=int, default=300)
    parser.add_argument("--mb", type=int, default=200)
    args = parser.parse_args(argv)
    with running_router() as router:
        measured = measure(router, args)
    report = {"name": NAME, "when": utc_now(), "code": code_version(), "machine": machine(), "mb": args.mb,
              **measured}
    ratio = report["http_p50_ratio"]
    rows = [Target("proxied HTTP request p50 over the same request straight to the server", f"{ratio}x", "<= 1.5x",
                   ratio <= 1.5),
            Target("WebSocket message round trip p50 through grove",
                   f"{report['through_grove']['ws_rtt_p50_ms']} ms", "reported", None),
            Target("one proxied stream", f"{report['through_grove']['stream_mb_s']} MB/s", "reported", None)]
    publish(NAME, report, rows, _section)


if __name__ == "__main__":
    main()
