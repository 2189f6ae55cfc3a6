"""What the rollout tests share: task files of the demo's tasks, running a config, reading a run dir."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from grove.demo.tasks import task_lines
from grove.rollouts import Policy, RunConfig, run_rollouts
from grove.rollouts.scripted import draws_right
from tests.support.router_fixtures import RouterProcess


def write_tasks(path: Path, difficulties: tuple[str, ...], *, prefix: str, think_s: float = 0.0) -> Path:
    """A task file of the demo's tasks with the given difficulties; ids start with ``prefix``."""
    lines = task_lines(len(difficulties), difficulties, think_s=think_s)
    for line in lines:
        line["id"] = f"{prefix}-{line['id']}"
        line["resources"] = {"cpu": 0.5, "memory_mb": 128}
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def run(router: RouterProcess, tasks: Path, out: Path, policy: Policy, **options: Any) -> dict[str, Any]:
    """Run rollouts against ``router`` in this process; the summary."""
    config = RunConfig(tasks=tasks, out=out, policy=policy, url=router.url, api_key=router.key, quiet=True,
                       **{"variants": [("scripted", None)], **options})
    return run_rollouts(config)


def results(out: Path) -> list[dict[str, Any]]:
    """The run's results.jsonl."""
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def expected_reward(tasks: Path, task_id: str, attempt: int) -> float:
    """What the scripted policy must score on an attempt (its draw is a pure function)."""
    line = next(json.loads(x) for x in tasks.read_text().splitlines() if json.loads(x)["id"] == task_id)
    return 1.0 if draws_right(task_id, attempt, line["scripted"]["p_solve"]) else 0.0


def journal(out: Path) -> list[dict[str, Any]]:
    """Every parseable journal entry."""
    entries = []
    for line in (out / "journal.jsonl").read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            entries.append(json.loads(line))
    return entries
