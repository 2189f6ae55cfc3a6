"""``grove rollouts progress``: how the chance of solving a task moved, step by step, along a run's attempts.

For each chosen attempt (the unresolved ones; the resolved too if asked) and each chosen turn t (the state after
the agent's first t actions; 0 is right after setup), the state is rebuilt in a fresh sandbox
(:mod:`grove.rollouts.rebuild`) and N continuations run from it: the attempt's own harness resumed from the recorded
conversation (:mod:`grove.rollouts.resume`), graded like any attempt. The share that passes estimates the chance of
solving from there, given with a 95 % **Wilson score interval** (it stays inside [0, 1] and keeps its coverage at
small N and at 0 or N successes, where the normal approximation collapses to a point).

Continuation i of every turn of an attempt runs as attempt number ``CONTINUATION_ATTEMPTS + i`` of its task: a
policy whose draws depend on the attempt number (the scripted one) makes the same draws at every turn (common random
numbers), so two turns' estimates differ by what the agent did between them, not by sampling noise.

Continuations are tries like any other: an infrastructure fault (a replay that did not reproduce the state
included) deletes what the try left and runs it again in a fresh sandbox, up to ``max_infra_retries`` times, after
which it is lost and left out of the estimate (and counted in ``lost``).

A teacher (``--teacher module:function``, called as ``function(trajectory, outcome) -> list[float]``, one value per
turn 0..T) gives the estimates instead; no continuation runs, and the lines say ``"source": "teacher"``.

``progress.jsonl`` in the run directory, one line per (attempt, turn)::

    {"run_id", "task", "attempt", "variant", "trajectory_id", "outcome", "turn", "step", "source": "monte_carlo",
     "continuations", "successes", "lost", "infra_faults", "estimate", "ci_low", "ci_high",
     "interval": "wilson-95", "rise", "rising", "span", "checkpoint", "rebuilt_by", "base_rebuilt_by", "sandboxes"}

``checkpoint`` is the one the run kept of the turn's state (``--checkpoint-every``; else null); ``rebuilt_by`` says
how the continuations' state was made: ``"checkpoint"`` (every one restored from it) or ``"replay"`` (some or all
replayed: no checkpoint, or it was gone), and ``base_rebuilt_by`` the same of the state after setup the changes are
graded against. ``sandboxes`` are the continuations' trajectories (their ``lineage`` names the checkpoint or the
replay they started from).

``infra_faults`` lists the reasons of the faults the turn's continuations met (each retried); an attempt whose
setup does not replay gets lines with ``estimate: null`` and the ``error``.

``step`` is the index in the trajectory's steps after which the state was taken. ``rise`` is the estimate minus the
previous chosen turn's, and ``rising`` says it went up by more than ``min_rise``: the turns since the previous chosen
one are then a rising span, which the credit export (:mod:`grove.rollouts.credit`) makes training targets.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grove.client import AsyncGrove, AsyncSandbox
from grove.core.errors import GroveError, Invalid
from grove.rollouts.attempt import TryIds, reason_of, run_try
from grove.rollouts.changes import Manifest, manifest
from grove.rollouts.harnesses import Harness, resolve
from grove.rollouts.hooks import resolve_function
from grove.rollouts.journal import RUN_FILE
from grove.rollouts.keeping import release
from grove.rollouts.rebuild import Continuation, restore
from grove.rollouts.resume import prefix_of, require, setup_end, state_step, turns
from grove.rollouts.tasks import Task, load_tasks

PROGRESS_FILE = "progress.jsonl"
CONTINUATION_ATTEMPTS = 1_000_000
"""Continuation i runs as this attempt number plus i (common random numbers across turns)."""
Z_95 = 1.959964


@dataclass
class ProgressConfig:
    """One ``grove rollouts progress``."""

    run: Path
    """The run directory (its ``run.json`` names the tasks and harnesses; ``results.jsonl`` the attempts)."""
    continuations: int = 4
    turns: tuple[int, ...] | None = None
    """Which turns to estimate (none: every one, or the turns the run kept checkpoints at)."""
    include_resolved: bool = False
    teacher: str | None = None
    """``module:function(trajectory, outcome) -> list[float]`` giving the estimates instead."""
    min_rise: float = 0.0
    concurrency: int = 4
    max_infra_retries: int = 2
    release: bool = False
    """Then delete the sandboxes the run kept for its checkpoints (:func:`grove.rollouts.keeping.release`)."""
    url: str | None = None
    api_key: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class Outcome:
    """What one continuation came to."""

    passed: int | None
    """1 if it passed, 0 if not, None if lost."""
    faults: list[str]
    """The reasons of the infrastructure faults its tries met."""
    made: tuple[str, str] | None
    """Its sandbox (trajectory) and how its state was made (``checkpoint`` or ``replay``); None if lost."""


def wilson(successes: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion (``(0, 1)`` with no trials)."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


class ProgressRun:
    """Estimates a run's attempts turn by turn and writes ``progress.jsonl``."""

    def __init__(self, config: ProgressConfig, client: AsyncGrove) -> None:
        self.config, self.client = config, client
        if config.continuations < 1 and config.teacher is None:
            raise Invalid("--continuations must be at least 1")
        run = json.loads((config.run / RUN_FILE).read_text())
        self.run_id: str = run["run_id"]
        spec = run["spec"]
        self.tasks: dict[str, Task] = {t.id: t for t in load_tasks(Path(spec["tasks"]))}
        self.harnesses: list[Harness] = [resolve(h, m) for h, m in spec["variants"]]
        self.teacher = resolve_function(config.teacher, "--teacher") if config.teacher else None
        if self.teacher is None:
            for harness in self.harnesses:
                require(harness.label, harness.run)  # before anything runs
        results = [json.loads(line) for line in (config.run / "results.jsonl").read_text().splitlines() if line]
        wanted = ("fail", "pass") if config.include_resolved else ("fail",)
        self.attempts = [r for r in results if r.get("outcome") in wanted and r.get("trajectory_id")]
        self._slots = asyncio.Semaphore(config.concurrency)

    async def execute(self) -> list[dict[str, Any]]:
        """Estimate every chosen attempt; the lines written to ``progress.jsonl``."""
        with ThreadPoolExecutor(max_workers=self.config.concurrency, thread_name_prefix="continuation") as pool:
            per_attempt = await asyncio.gather(*(self._attempt(row, pool) for row in self.attempts))
        lines = [line for lines in per_attempt for line in lines]
        path = self.config.run / PROGRESS_FILE
        path.with_suffix(".tmp").write_text("".join(json.dumps(line) + "\n" for line in lines))
        path.with_suffix(".tmp").replace(path)
        return lines

    async def _attempt(self, row: dict[str, Any], pool: ThreadPoolExecutor) -> list[dict[str, Any]]:
        record = await self.client.request("GET", f"/v1/trajectories/{row['trajectory_id']}")
        steps = record.get("steps") or []
        count = len(turns(steps))
        chosen = self._turns(row, count)
        head = {"run_id": self.run_id, "task": row["task"], "attempt": row["attempt"], "variant": row["variant"],
                "trajectory_id": row["trajectory_id"], "outcome": row["outcome"]}
        lines: list[dict[str, Any]] = []
        if self.teacher is not None:
            values = self.teacher(record, record.get("outcome"))
            if not isinstance(values, list) or len(values) != count + 1:
                raise Invalid(f"--teacher {self.config.teacher!r} gave {values!r} for {row['trajectory_id']}: it must "
                              f"return a list of {count + 1} numbers (turns 0..{count})")
            for turn in chosen:
                lines.append({**head, "turn": turn, "step": state_step(steps, turn), "source": "teacher",
                              "estimate": float(values[turn])})
        else:
            task = self.tasks[row["task"]]
            kept = {c["turn"]: c.get("checkpoint") for c in row.get("checkpoints") or [] if isinstance(c, dict)}
            base, head["base_rebuilt_by"] = await self._base(row, task, setup_end(steps), kept.get(0))
            for turn in chosen:
                prefix = prefix_of(record, turn)
                if isinstance(base, str):  # the setup itself did not replay: no state to continue from
                    lines.append({**head, "turn": turn, "step": prefix.step, "source": "monte_carlo",
                                  "continuations": 0, "successes": 0, "lost": 0, "estimate": None, "error": base})
                    continue
                resume = Continuation(parent=row["trajectory_id"], prefix=prefix, base=base, env=task.env,
                                      checkpoint=kept.get(turn))
                outcomes = await asyncio.gather(*(self._continue(row, task, resume, i, pool)
                                                  for i in range(self.config.continuations)))
                scored = [o.passed for o in outcomes if o.passed is not None]
                low, high = wilson(sum(scored), len(scored))
                made = [o.made for o in outcomes if o.made is not None]
                lines.append({**head, "turn": turn, "step": prefix.step, "source": "monte_carlo",
                              "continuations": len(outcomes), "successes": sum(scored),
                              "lost": len(outcomes) - len(scored),
                              "infra_faults": [r for o in outcomes for r in o.faults],
                              "checkpoint": resume.checkpoint,
                              "rebuilt_by": "checkpoint" if made and all(by == "checkpoint" for _, by in made)
                              else "replay",
                              "sandboxes": [sid for sid, _ in made],
                              "estimate": round(sum(scored) / len(scored), 4) if scored else None,
                              "ci_low": round(low, 4), "ci_high": round(high, 4), "interval": "wilson-95"})
        _mark_rises(lines, self.config.min_rise)
        return lines

    def _turns(self, row: dict[str, Any], count: int) -> list[int]:
        """The turns to estimate: as asked, else where the run kept checkpoints (and 0), else every one."""
        if self.config.turns is not None:
            return sorted(t for t in set(self.config.turns) if 0 <= t <= count)
        kept = [c["turn"] for c in row.get("checkpoints") or [] if isinstance(c, dict)]
        return sorted({0, *kept}) if kept else list(range(count + 1))

    async def _base(self, row: dict[str, Any], task: Task, until: int,
                    checkpoint: str | None) -> tuple[Manifest | str, str]:
        """The attempt's workdir right after setup (step ``until``): its changes' base, from the run's checkpoint
        there or a replay to there; or why the setup did not replay. And which of the two made it."""
        labels = {"run_id": f"{self.run_id}.progress"}
        async with self._slots:
            restored = await restore(self.client, checkpoint, {"env": task.env, "metadata": {"labels": labels}})
            if restored is not None:
                async with AsyncSandbox(self.client, restored) as sandbox:
                    return await manifest(sandbox, task.workdir), "checkpoint"
            report = await self.client.request("POST", f"/v1/trajectories/{row['trajectory_id']}/replay",
                                               json_body={"until": until, "env": task.env, "keep": True,
                                                          "labels": labels})
            sandbox = AsyncSandbox(self.client, await self.client.request(
                "GET", f"/v1/sandboxes/{report['sandbox_id']}"))
            try:
                if report["matched"] != report["total"]:
                    return f"the attempt's setup did not replay: step {report['first_mismatch']} differs", "replay"
                return await manifest(sandbox, task.workdir), "replay"
            finally:
                with contextlib.suppress(GroveError):
                    await sandbox.close()

    async def _continue(self, row: dict[str, Any], task: Task, resume: Continuation, index: int,
                        pool: ThreadPoolExecutor) -> Outcome:
        """One continuation, retried on infrastructure faults."""
        faults: list[str] = []
        harness = self.harnesses[row["variant"]]
        run_id = f"{self.run_id}.progress"
        group = f"{row['group_id']}/{row['attempt']}/t{resume.prefix.turns}"
        attempt = CONTINUATION_ATTEMPTS + index
        for try_no in range(self.config.max_infra_retries + 1):
            request_id = "pr-" + hashlib.sha256(f"{run_id}/{group}/{attempt}/{try_no}".encode()).hexdigest()[:40]
            ids = TryIds(run_id, group, attempt, try_no, request_id)
            async with self._slots:
                try:
                    out = await run_try(self.client, task, harness, ids, pool=pool, on_sandbox=lambda _: None,
                                        create=self._create, resume=resume)
                except (GroveError, OSError) as exc:
                    if isinstance(exc, GroveError) and exc.status == 401:
                        raise
                    await self._discard({"run_id": run_id, "group_id": group, "attempt": str(attempt),
                                         "try": str(try_no)})
                    faults.append(reason_of(exc))
                    continue
            made = (out["trajectory_id"], out["rebuilt_by"])
            if out["outcome"] == "harness_error":
                return Outcome(None, faults, made)
            return Outcome(1 if out["outcome"] == "pass" else 0, faults, made)
        return Outcome(None, faults, None)

    async def _create(self, body: dict[str, Any]) -> Any:
        return await self.client.request("POST", "/v1/sandboxes", json_body=body)

    async def _discard(self, labels: dict[str, str]) -> None:
        """Delete what a faulted continuation left (found by its labels)."""
        with contextlib.suppress(GroveError):
            for sandbox in await self.client.list(labels):
                with contextlib.suppress(GroveError):
                    await self.client.request("DELETE", f"/v1/sandboxes/{sandbox['id']}")


def _mark_rises(lines: Sequence[dict[str, Any]], min_rise: float) -> None:
    """``rise`` and ``rising`` of each line against the previous estimated turn of its attempt, and the span of
    turns (after the previous one, up to this one) the rise belongs to."""
    previous: dict[str, Any] | None = None
    for line in lines:
        est, before = line.get("estimate"), previous.get("estimate") if previous else None
        rise = round(est - before, 4) if est is not None and before is not None else None
        line["rise"], line["rising"] = rise, rise is not None and rise > min_rise
        line["span"] = [previous["turn"] + 1, line["turn"]] if previous is not None else None
        previous = line if est is not None else previous


async def aprogress(config: ProgressConfig) -> list[dict[str, Any]]:
    """Run ``config``; the lines of ``progress.jsonl``."""
    async with AsyncGrove(config.url, config.api_key) as client:
        try:
            return await ProgressRun(config, client).execute()
        finally:
            if config.release:
                await release(client, config.run)
