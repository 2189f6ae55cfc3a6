"""One Orchard-shaped burst through the SDK: N sandboxes at once, each created, sent four commands, deleted.

Orchard's benchmark: every sandbox is created and waited for, runs
``python3 -c "print('ok')"``, ``ls /``, ``cat /etc/os-release | head -1`` and the same ``cat`` in a
login shell, and is deleted. Every step's latency and every failure is kept — an error is counted
under its kind (the phase and the error class), never dropped — and each sandbox that was created is
deleted whatever happened to its commands. The per-sandbox timestamps give the timeline of sandboxes
alive and the commands completed over time.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from grove.client import AsyncGrove, AsyncSandbox, ExecResult
from perf.common import summarize

PCTS = (50, 90, 99)
FIRST_LINE = "cat /etc/os-release | head -1"


def _ok_python(r: ExecResult) -> bool:
    return r.stdout == b"ok\n"


def _ok_ls(r: ExecResult) -> bool:
    return b"etc" in r.stdout.split()


def _ok_first_line(r: ExecResult) -> bool:
    return r.stdout.count(b"\n") == 1 and b"=" in r.stdout


COMMANDS: list[tuple[str, str, Callable[[ExecResult], bool]]] = [
    ("python", "python3 -c \"print('ok')\"", _ok_python),
    ("ls", "ls /", _ok_ls),
    ("cat", FIRST_LINE, _ok_first_line),
    ("login_cat", f"bash -lc '{FIRST_LINE}'", _ok_first_line),
]
"""(name, command as the SDK sends it — a string runs under ``/bin/sh -c`` — and its output check)."""


class WrongOutput(Exception):
    """A command exited non-zero or printed something else than it should."""


@dataclass
class SandboxRun:
    """One sandbox's life in the burst; times in seconds since the burst started."""

    index: int
    create_sent: float = 0.0
    ready: float | None = None
    delete_sent: float | None = None
    deleted: float | None = None
    server_create_s: float | None = None
    """The router's own ``ready_at - created_at``."""
    router_took: float | None = None
    """When the router took the create up (its ``created_at``, on this clock): what came before it is the
    client sending and the router's queue of requests not yet read."""
    execs: list[tuple[str, float, float]] = field(default_factory=list)
    """(command name, sent, answered) of each exec that answered."""
    errors: list[tuple[str, str]] = field(default_factory=list)
    """(kind, message)."""


@dataclass
class BurstResult:
    """Everything measured in one burst."""

    n: int
    concurrency: int
    wall_s: float
    runs: list[SandboxRun]

    def report(self) -> dict[str, Any]:
        """Success rate, end-to-end time, commands/s, latency percentiles, errors by kind."""
        runs = self.runs
        ok = [r for r in runs if not r.errors]
        creates = [r.ready - r.create_sent for r in runs if r.ready is not None]
        deletes = [r.deleted - r.delete_sent for r in runs if r.deleted is not None and r.delete_sent is not None]
        # Each sandbox's whole life in the burst, its create sent to its delete answered: the stragglers, not the
        # median, set how long a training step waits.
        lifetimes = [r.deleted - r.create_sent for r in runs if r.deleted is not None]
        execs = [end - start for r in runs for _, start, end in r.execs]
        per_command = {
            name: summarize([end - start for r in runs for n, start, end in r.execs if n == name], PCTS)
            for name, _, _ in COMMANDS
        }
        kinds = Counter(kind for r in runs for kind, _ in r.errors)
        samples: dict[str, list[str]] = {}
        for r in runs:
            for kind, message in r.errors:
                if len(samples.setdefault(kind, [])) < 3:
                    samples[kind].append(f"sandbox #{r.index}: {message[:300]}")
        commands_ok = sum(len(r.execs) for r in runs)
        first_ready = min((r.ready for r in runs if r.ready is not None), default=None)
        last_deleted = max((r.deleted for r in runs if r.deleted is not None), default=None)
        return {
            "n": self.n,
            "client_concurrency": self.concurrency or self.n,
            "succeeded": len(ok),
            "success_rate": round(len(ok) / self.n, 4) if self.n else 0.0,
            "end_to_end_s": round(self.wall_s, 3),
            "commands_ok": commands_ok,
            "commands_per_s": round(commands_ok / self.wall_s, 1) if self.wall_s else 0.0,
            "create": summarize(creates, PCTS),
            "create_server_side": summarize([r.server_create_s for r in runs if r.server_create_s is not None], PCTS),
            "create_until_taken_up": summarize(
                [r.router_took - r.create_sent for r in runs if r.router_took is not None], PCTS),
            "exec": summarize(execs, PCTS),
            "exec_by_command": per_command,
            "delete": summarize(deletes, PCTS),
            "lifetime": summarize(lifetimes, PCTS),
            "first_ready_s": round(first_ready, 3) if first_ready is not None else None,
            "last_deleted_s": round(last_deleted, 3) if last_deleted is not None else None,
            "peak_alive": peak_alive(runs),
            "errors": sum(kinds.values()),
            "errors_by_kind": dict(kinds.most_common()),
            "error_samples": samples,
        }


def peak_alive(runs: list[SandboxRun]) -> int:
    """Most sandboxes ready and not yet deleted at one moment."""
    events = sorted(
        [(r.ready, 1) for r in runs if r.ready is not None]
        + [(r.delete_sent if r.deleted is None else r.deleted, -1) for r in runs if r.ready is not None
           and (r.deleted is not None or r.delete_sent is not None)]
    )
    alive = peak = 0
    for _, step in events:
        alive += step
        peak = max(peak, alive)
    return peak


def kind(phase: str, exc: BaseException) -> str:
    code = getattr(exc, "code", None)
    return f"{phase}: {type(exc).__name__}" + (f" ({code})" if isinstance(code, str) else "")


async def _one(grove: AsyncGrove, run: SandboxRun, t0: float, gate: asyncio.Semaphore | None,
               pool: str | None = None, wall0: float = 0.0) -> None:
    if gate is not None:
        await gate.acquire()
    try:
        run.create_sent = time.perf_counter() - t0
        try:
            sandbox: AsyncSandbox = await grove.create("default", pool=pool)
        except Exception as exc:
            run.errors.append((kind("create", exc), str(exc)))
            return
        run.ready = time.perf_counter() - t0
        await drive(sandbox, run, t0, wall0)
    finally:
        if gate is not None:
            gate.release()


async def drive(sandbox: AsyncSandbox, run: SandboxRun, t0: float, wall0: float = 0.0) -> None:
    """A created sandbox's part of the burst: the router's own create times noted, the four commands, the
    delete (whatever happened to the commands)."""
    created, ready = sandbox.info.get("created_at"), sandbox.info.get("ready_at")
    if isinstance(created, float) and isinstance(ready, float):
        run.server_create_s = ready - created
    if isinstance(created, float) and wall0:
        run.router_took = created - wall0
    try:
        for name, command, check in COMMANDS:
            sent = time.perf_counter() - t0
            try:
                result = await sandbox.exec(command)
            except Exception as exc:
                run.errors.append((kind(f"exec {name}", exc), str(exc)))
                continue
            run.execs.append((name, sent, time.perf_counter() - t0))
            if result.exit_code != 0 or not check(result):
                message = f"exit {result.exit_code}, stdout {result.stdout[:200]!r}, stderr {result.stderr[:200]!r}"
                run.errors.append((f"exec {name}: WrongOutput", message))
    finally:
        run.delete_sent = time.perf_counter() - t0
        try:
            await sandbox.close()
        except Exception as exc:
            run.errors.append((kind("delete", exc), str(exc)))
        else:
            run.deleted = time.perf_counter() - t0


async def burst(url: str, key: str, n: int, *, concurrency: int = 0, pool: str | None = None) -> BurstResult:
    """Run ``n`` sandboxes through the Orchard shape; ``concurrency`` 0 launches every one at once; with
    ``pool``, each create claims from that warm pool."""
    runs = [SandboxRun(i) for i in range(n)]
    gate = asyncio.Semaphore(concurrency) if concurrency else None
    async with AsyncGrove(url, key, timeout_s=600) as grove:
        t0, wall0 = time.perf_counter(), time.time()
        outcomes = await asyncio.gather(*(_one(grove, r, t0, gate, pool, wall0) for r in runs), return_exceptions=True)
        wall = time.perf_counter() - t0
    for run, outcome in zip(runs, outcomes, strict=True):
        if isinstance(outcome, BaseException):  # a bug in this driver must show, not vanish
            run.errors.append((kind("driver", outcome), str(outcome)))
    return BurstResult(n, concurrency, wall, runs)


def timeline(runs: list[SandboxRun], step_s: float = 0.1) -> dict[str, list[float]]:
    """Sandboxes in creation and alive (ready, not yet deleted), and commands answered per second, over time."""
    end = max([r.deleted or r.delete_sent or r.ready or r.create_sent for r in runs] + [0.0])
    times = [round(i * step_s, 3) for i in range(int(end / step_s) + 2)]
    creating, alive = [0.0] * len(times), [0.0] * len(times)
    answered = [0.0] * len(times)
    for r in runs:
        ready = r.ready if r.ready is not None else (r.deleted or end)
        _add(creating, r.create_sent, ready, step_s)
        if r.ready is not None:
            _add(alive, r.ready, r.deleted if r.deleted is not None else end, step_s)
        for _, _, at in r.execs:
            answered[min(int(at / step_s), len(times) - 1)] += 1 / step_s
    return {"t_s": times, "creating": creating, "alive": alive, "commands_per_s": answered}


def _add(series: list[float], start: float, stop: float, step_s: float) -> None:
    for i in range(int(start / step_s), min(int(stop / step_s) + 1, len(series))):
        t = i * step_s
        if start <= t < stop:
            series[i] += 1


def latency_samples(runs: list[SandboxRun]) -> dict[str, list[float]]:
    """Raw seconds per kind of step, for CDF plots."""
    out: dict[str, list[float]] = {
        "create": [r.ready - r.create_sent for r in runs if r.ready is not None],
        "delete": [r.deleted - r.delete_sent for r in runs if r.deleted is not None and r.delete_sent is not None],
    }
    for name, _, _ in COMMANDS:
        out[f"exec {name}"] = [end - start for r in runs for n, start, end in r.execs if n == name]
    return out
