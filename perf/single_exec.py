"""One exec of ``true``, three ways side by side: through grove (SDK → router → executor in a sandbox), as
``subprocess.run(["true"])`` in this process (the floor), and through SWE-ReX's own server (``swerex.server``,
its FastAPI app under uvicorn, unisolated, on loopback) driven by SWE-ReX's own client (``RemoteRuntime``).

Calls alternate between the three (their order rotating call by call) so that a busy moment of the machine
hits all three alike; ``rounds`` such runs give each ratio as a median with its spread.
"""

from __future__ import annotations

import asyncio
import secrets
import subprocess
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from swerex.runtime.abstract import Command
from swerex.runtime.remote import RemoteRuntime

from grove.client import AsyncGrove
from perf.calls import floor
from perf.common import Router, interleaved, spread, summarize, terminate
from tests.conftest import free_tcp_port

WAYS = ("grove", "subprocess", "swerex")
WARMUP = 20


async def _floor() -> None:
    floor()


async def _measure(calls: dict[str, Callable[[], Awaitable[object]]], rounds: int,
                   per_round: int) -> list[dict[str, list[float]]]:
    await interleaved(calls, WARMUP)  # the warm-up: its durations dropped
    return [await interleaved(calls, per_round) for _ in range(rounds)]


async def single_exec(router: Router, rounds: int, per_round: int) -> dict[str, Any]:
    """p50 of each way per round, and grove's ratio to the other two: each the median of the rounds."""
    token, port = secrets.token_hex(16), free_tcp_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "swerex.server", "--host", "127.0.0.1", "--port", str(port), "--auth-token", token],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        swerex = RemoteRuntime(host="http://127.0.0.1", port=port, auth_token=token)
        await swerex.wait_until_alive(timeout=60.0)
        async with AsyncGrove(router.url, router.key) as grove:
            sandbox = await grove.create("default", heartbeat=False)
            try:
                async def via_grove() -> None:
                    if (await sandbox.exec(["true"])).exit_code != 0:
                        raise RuntimeError("true failed in the sandbox")

                async def via_swerex() -> None:
                    if (await swerex.execute(Command(command=["true"]))).exit_code != 0:
                        raise RuntimeError("true failed on the SWE-ReX server")

                samples = await _measure({"grove": via_grove, "subprocess": _floor, "swerex": via_swerex},
                                         rounds, per_round)
            finally:
                await sandbox.close()
    finally:
        terminate(server)
    p50s = {way: [summarize(s[way])["p50_ms"] for s in samples] for way in WAYS}
    return {
        "rounds": rounds,
        "calls_per_round": per_round,
        "p50_ms": {way: spread(v) for way, v in p50s.items()},
        "p99_ms": {way: spread([summarize(s[way])["p99_ms"] for s in samples]) for way in WAYS},
        "grove_over_subprocess": spread([g / f for g, f in zip(p50s["grove"], p50s["subprocess"], strict=True)]),
        "grove_over_swerex": spread([g / r for g, r in zip(p50s["grove"], p50s["swerex"], strict=True)]),
        "swerex_client": "swerex.runtime.remote.RemoteRuntime (a new connection per call, as it always does)",
    }


def single_exec_sync(router: Router, rounds: int, per_round: int) -> dict[str, Any]:
    """:func:`single_exec` from synchronous code."""
    return asyncio.run(single_exec(router, rounds, per_round))
