"""MCP tool calls through grove: a stdio server behind the router's bridge against the same tool on a server
serving streamable HTTP in the sandbox (through the port proxy).

``python -m perf.bench_mcp [--calls 200]`` starts one router and one sandbox, runs the ``mcp`` package's own
server twice in it — on port 8765 as streamable HTTP, and as a stdio process published with a command — and
times ``call_tool("add")`` with the package's own client (one session each, the same calls, in one run). Both
forms record every call as an ``mcp_call`` step.

Writes ``perf/results/mcp.json`` and the "MCP" section of ``perf/README.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import time
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
from tests.support.sandbox_servers import (
    MCP_SERVER,
    STDIO_COMMAND,
    drop_libs_dirs,
    install_stdio_server,
    mcp_session,
    start_server,
)

NAME = "mcp"
SECTION = "## MCP: a stdio server through the bridge against one serving HTTP"
PORT = 8765


async def _timed_calls(config: dict[str, Any], calls: int) -> list[float]:
    """Seconds of each ``add`` call in one session (after a few untimed ones)."""
    async with mcp_session(config) as session:
        for i in range(5):
            await session.call_tool("add", {"a": i, "b": 1})
        times = []
        for i in range(calls):
            began = time.perf_counter()
            result = await session.call_tool("add", {"a": i, "b": 1})
            times.append(time.perf_counter() - began)
            if result.is_error:
                raise RuntimeError(f"the tool failed: {result}")
        return times


def measure(router: Router, calls: int) -> dict[str, Any]:
    """Both forms' call times, the HTTP form's first."""
    with Grove(router.url, router.key) as grove:
        sandbox = grove.create(heartbeat=False, memory_mb=1024)
        try:
            start_server(sandbox, MCP_SERVER, PORT, ("mcp",))
            install_stdio_server(sandbox)
            http = asyncio.run(_timed_calls(sandbox.mcp_server("http", PORT), calls))
            stdio_config = sandbox.mcp_server("stdio", command=STDIO_COMMAND)
            stdio = asyncio.run(_timed_calls(stdio_config, calls))
        finally:
            sandbox.close()
            drop_libs_dirs()
    summary = {form: {"p50_ms": round(percentile(times, 50) * 1000, 3),
                      "p90_ms": round(percentile(times, 90) * 1000, 3)} for form, times in
               (("http", http), ("stdio", stdio))}
    return {**summary, "calls": calls,
            "stdio_over_http_p50": round(summary["stdio"]["p50_ms"] / summary["http"]["p50_ms"], 2)}


def _section(report: dict[str, Any], rows: list[Target]) -> str:
    h, s = report["http"], report["stdio"]
    lines = [SECTION, "", f"Measured {report['when']} on {machine_line(report['machine'])}; one run, "
             f"{report['calls']} `call_tool` round trips per form with the `mcp` package's client (one session "
             "each), the same server code in the same sandbox.", "",
             "| figure | stdio through the bridge | HTTP through the port proxy | ratio |", "|---|---|---|---|",
             f"| tool call p50 (ms) | {s['p50_ms']} | {h['p50_ms']} | {report['stdio_over_http_p50']}x |",
             f"| tool call p90 (ms) | {s['p90_ms']} | {h['p90_ms']} | |", "", *target_table(rows)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    """Command line."""
    parser = argparse.ArgumentParser(prog="python -m perf.bench_mcp", description=__doc__)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args(argv)
    with running_router() as router:
        measured = measure(router, args.calls)
    report = {"name": NAME, "when": utc_now(), "code": code_version(), "machine": machine(), **measured}
    rows = [Target("stdio tool call p50 over the same call to the server serving HTTP",
                   f"{report['stdio_over_http_p50']}x", "reported", None)]
    publish(NAME, report, rows, _section)


if __name__ == "__main__":
    main()
