"""What the rollout tests share: task files of the demo's tasks, running a config, reading a run dir."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from grove.demo.tasks import task_lines
from grove.rollouts import Policy, RunConfig, run_rollouts
from grove.rollouts.scripted import draws_right
from tests.support.router_fixtures import RouterProcess, force_cleanup, leaks


def write_tasks(path: Path, difficulties: tuple[str, ...], *, prefix: str, think_s: float = 0.0) -> Path:
    """A task file of the demo's tasks with the given difficulties; ids start with ``prefix``."""
    lines = task_lines(len(difficulties), difficulties, think_s=think_s)
    for line in lines:
        line["id"] = f"{prefix}-{line['id']}"
        line["resources"] = {"cpu": 0.5, "memory_mb": 128}
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def right_and_wrong(path: Path, line_of: Callable[[str, float], dict[str, Any]], names: Sequence[str]) -> Path:
    """A task file holding each named task twice: its right plan (id ``...-right``, ``p_solve`` 1) and its wrong
    one (``...-wrong``, ``p_solve`` 0); ``line_of(name, p_solve)`` makes a task line."""
    lines = []
    for name in names:
        for verdict, p_solve in (("right", 1.0), ("wrong", 0.0)):
            line = line_of(name, p_solve)
            lines.append({**line, "id": f"{line['id']}-{verdict}"})
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


def demo_output(*flags: str) -> str:
    """Run ``python -m grove.demo FLAGS`` in a scratch directory as a user would; insist that it exits 0, that
    ``grove down`` on its state dir works after it and that nothing of it is left; its stdout."""
    checkout = Path(tempfile.mkdtemp(prefix="gt-"))
    state = checkout / ".state" / "demo"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GROVE_")}
    try:
        done = subprocess.run([sys.executable, "-m", "grove.demo", *flags], cwd=checkout, env=env,
                              capture_output=True, text=True, timeout=600, check=False, stdin=subprocess.DEVNULL)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        down = subprocess.run([str(Path(sys.executable).with_name("grove")), "--state-dir", ".state/demo", "down"],
                              cwd=checkout, env=env, capture_output=True, text=True, timeout=120, check=False)
        assert down.returncode == 0, down.stdout + down.stderr
        assert leaks(state) == []
        return done.stdout
    finally:
        force_cleanup(state)
        shutil.rmtree(checkout, ignore_errors=True)
