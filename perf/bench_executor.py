"""Exec round-trip latency of a real executor against the floor, ``subprocess.run(["true"])``, in one run.

``python -m perf.bench_executor [--calls 500]`` starts ``python -m executor`` on a loopback port, sends
``["true"]`` (argv form) over one keep-alive connection — plain and with ``?stream=1`` — interleaved with
``subprocess.run(["true"])`` in this process, and writes ``perf/results/executor.json`` and the
"Executor exec latency" section of ``perf/README.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

from perf.common import (
    machine,
    machine_line,
    sigterm_as_exit,
    summarize,
    terminate,
    update_readme,
    utc_now,
    write_results,
)
from tests.conftest import free_tcp_port

NAME = "executor"
SECTION = "## Executor exec latency"
TOKEN = "bench-token"
TARGET_RATIO = 3.5
BODY = json.dumps({"command": ["true"]}).encode()
HEADERS = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}


@contextlib.contextmanager
def running_executor() -> Iterator[tuple[str, int]]:
    """A real executor subprocess on a free loopback port; killed by PID on exit."""
    tmp = tempfile.mkdtemp(prefix="grove-bench-")
    port = free_tcp_port()
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "GROVE_EXECUTOR_TOKEN": TOKEN,
        "GROVE_EXECUTOR_ROOT": tmp,
        "GROVE_EXECUTOR_OUTPUT_DIR": "/grove-output",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "executor", "--bind", f"127.0.0.1:{port}"],
        env=env,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"executor exited with {proc.returncode}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
                conn.request("GET", "/healthz")
                if conn.getresponse().status == 200:
                    conn.close()
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.05)
        yield "127.0.0.1", port
    finally:
        terminate(proc)
        shutil.rmtree(tmp, ignore_errors=True)


class Exec:
    """Exec calls over one keep-alive connection; counts reconnects so a dropped keep-alive shows."""

    def __init__(self, host: str, port: int) -> None:
        self.conn = http.client.HTTPConnection(host, port, timeout=30)
        self.conn.connect()
        self.sock = self.conn.sock
        self.reconnects = 0
        self.server_s: list[float] = []

    def _post(self, path: str) -> bytes:
        self.conn.request("POST", path, body=BODY, headers=HEADERS)
        resp = self.conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"exec failed: {resp.status} {data[:300]!r}")
        if self.conn.sock is not self.sock:
            self.reconnects += 1
            self.sock = self.conn.sock
        return data

    def plain(self) -> None:
        """One non-streaming exec of ``["true"]``."""
        result = json.loads(self._post("/v1/exec"))
        assert result["exit_code"] == 0
        self.server_s.append(result["duration_s"])

    def streamed(self) -> None:
        """One ``?stream=1`` exec of ``["true"]`` (ndjson frames, the result last)."""
        last = json.loads(self._post("/v1/exec?stream=1").splitlines()[-1])
        assert last["type"] == "result" and last["result"]["exit_code"] == 0


def floor() -> None:
    """The floor: start and wait for ``true`` from this process."""
    subprocess.run(["true"], check=True)


def measure(calls: int, warmup: int) -> dict[str, Any]:
    """Interleave the three kinds of call, rotating their order every round so none always goes first."""
    with running_executor() as (host, port):
        client = Exec(host, port)
        kinds: dict[str, Callable[[], None]] = {
            "subprocess_run_true": floor,
            "executor_exec": client.plain,
            "executor_exec_stream": client.streamed,
        }
        names = list(kinds)
        for _ in range(warmup):
            for name in names:
                kinds[name]()
        client.server_s.clear()
        samples: dict[str, list[float]] = {name: [] for name in names}
        started = time.monotonic()
        for i in range(calls):
            for k in range(len(names)):
                name = names[(i + k) % len(names)]
                t0 = time.perf_counter()
                kinds[name]()
                samples[name].append(time.perf_counter() - t0)
        wall = time.monotonic() - started
        client.conn.close()
    stats = {name: summarize(values) for name, values in samples.items()}
    floor_p50 = stats["subprocess_run_true"]["p50_ms"]
    return {
        "stats": stats,
        "server_side_duration": summarize(client.server_s),
        "ratio_p50": {
            "executor_exec": round(stats["executor_exec"]["p50_ms"] / floor_p50, 2),
            "executor_exec_stream": round(stats["executor_exec_stream"]["p50_ms"] / floor_p50, 2),
        },
        "reconnects": client.reconnects,
        "wall_s": round(wall, 2),
    }


def markdown(report: dict[str, Any]) -> str:
    """The README section for this report."""
    m, stats, ratio = report["machine"], report["stats"], report["ratio_p50"]
    rows = [
        ('`subprocess.run(["true"])` (floor)', "subprocess_run_true", "1.00x"),
        ('executor `POST /v1/exec` `["true"]`', "executor_exec", f"{ratio['executor_exec']:.2f}x"),
        ("executor `POST /v1/exec?stream=1`", "executor_exec_stream", f"{ratio['executor_exec_stream']:.2f}x"),
    ]
    lines = [
        SECTION,
        "",
        f"`python -m perf.bench_executor --calls {report['calls']}` — {report['date']}. {machine_line(m)}",
        "",
        "One executor (gunicorn `gthread`, 1 worker) on loopback TCP, one keep-alive `http.client` connection, "
        "JSON bodies; the three kinds of call interleaved in one run (order rotated each round) after "
        f"{report['warmup']} warm-up rounds. Reconnects during the run: {report['reconnects']}.",
        "",
        "| call | p50 (ms) | p99 (ms) | mean (ms) | p50 vs floor |",
        "|---|---:|---:|---:|---:|",
    ]
    for label, key, rel in rows:
        s = stats[key]
        lines.append(f"| {label} | {s['p50_ms']:.3f} | {s['p99_ms']:.3f} | {s['mean_ms']:.3f} | {rel} |")
    server = report["server_side_duration"]
    verdict = "met" if ratio["executor_exec"] <= TARGET_RATIO else "NOT met"
    lines += [
        "",
        f"Target: executor p50 ≤ {TARGET_RATIO}x the floor — **{verdict}** ({ratio['executor_exec']:.2f}x). "
        f"Of the round trip, the command itself (spawn to exit, the executor's `duration_s`) takes "
        f"p50 {server['p50_ms']:.3f} ms; the rest is HTTP, Flask, JSON and pipe handling. "
        "Raw figures: `perf/results/executor.json`.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark, print the table, write the JSON and the README section."""
    parser = argparse.ArgumentParser(prog="python -m perf.bench_executor", description=__doc__)
    parser.add_argument("--calls", type=int, default=500, help="measured calls of each kind (default 500)")
    parser.add_argument("--warmup", type=int, default=50, help="warm-up rounds, not measured (default 50)")
    args = parser.parse_args(argv)
    sigterm_as_exit()
    report: dict[str, Any] = {
        "benchmark": "executor exec round trip vs subprocess.run(['true'])",
        "date": utc_now(),
        "calls": args.calls,
        "warmup": args.warmup,
        "machine": machine(),
        "target_ratio_p50": TARGET_RATIO,
        **measure(args.calls, args.warmup),
    }
    write_results(NAME, report)
    section = markdown(report)
    update_readme(section)
    print(section)


if __name__ == "__main__":
    main()
