"""``make demo-mini`` (``python -m grove.demo --harness mini-swe-agent``): the demo's tasks through a real harness.

Each task runs mini-swe-agent's own agent loop (``DefaultAgent`` with its builtin ``default.yaml`` prompts)
driven by its deterministic test model — a scripted policy, no model server — with every command executed
by :class:`grove.integrations.minisweagent.GroveEnvironment` in a sandbox of a router started here. The
agent reads the code, runs the visible test (it fails), patches (some patches right, some wrong), runs the
test again and submits; hidden tests grade each sandbox and the result goes into its trajectory.
"""

from __future__ import annotations

import asyncio
import functools
import os
import shlex
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from grove.client import AsyncGrove
from grove.demo.state import afterwards
from grove.demo.tasks import Task, make_tasks
from router.app import create_app
from router.auth import load_or_create
from router.settings import RouterSettings

PROJECT = "/workspace/project"
HARNESS_WORKERS = 8


@dataclass
class MiniOutcome:
    """What one agent run did."""

    task_id: str
    sandbox_id: str | None = None
    exit_status: str | None = None
    solved: bool = False
    steps: int = 0
    seconds: float = 0.0
    error: str | None = None


def scripted_outputs(task: Task, *, right: bool) -> list[dict[str, Any]]:
    """The deterministic model's replies: what a (scripted) policy would answer, turn by turn."""
    from minisweagent.models.test_models import make_output

    fix = task.right_fix if right else task.wrong_fix
    patch = (f"python3 - <<'EOF'\nimport pathlib\np = pathlib.Path({task.module!r})\n"
             f"p.write_text(p.read_text().replace({task.bug!r}, {fix!r}))\nEOF")
    return [
        make_output("THOUGHT: First I look at the project and the module under test.",
                    [{"command": f"ls -la && cat {shlex.quote(task.module)}"}]),
        make_output("THOUGHT: Let me reproduce the failure with the visible test.",
                    [{"command": "python3 test_visible.py"}]),
        make_output(f"THOUGHT: The bug is `{task.bug.strip()}`; I replace it with `{fix.strip()}`.",
                    [{"command": patch}]),
        make_output("THOUGHT: Run the visible test again.", [{"command": "python3 test_visible.py"}]),
        make_output("THOUGHT: The test passes; submitting.",
                    [{"command": f"echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && cat {shlex.quote(task.module)}"}]),
    ]


def run_one(url: str, key: str, task: Task, *, right: bool) -> MiniOutcome:
    """One task: mini-swe-agent's loop in a fresh sandbox, then the hidden-test grader."""
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.config import get_config_from_spec
    from minisweagent.models.test_models import DeterministicModel

    from grove.integrations.minisweagent import GroveEnvironment

    outcome = MiniOutcome(task.task_id)
    started = time.monotonic()
    try:
        with GroveEnvironment(url=url, api_key=key, image="default", cwd=PROJECT, timeout=60, memory_mb=256,
                              cpu=0.5, task_id=task.task_id, model="deterministic-scripted",
                              # A same-size patch within the second keeps a stale .pyc valid: write none.
                              env={"PYTHONDONTWRITEBYTECODE": "1"}) as env:
            outcome.sandbox_id = env.sandbox.id
            env.post_event("setup", {"status": "started"})  # the task's files: not the agent's writes
            env.write_file(f"{PROJECT}/{task.module}", task.source)
            env.write_file(f"{PROJECT}/test_visible.py", task.visible_test)
            env.post_event("setup", {"status": "finished"})
            config = {**get_config_from_spec("default.yaml")["agent"], "step_limit": 10}
            model = DeterministicModel(  # type: ignore[no-untyped-call]
                outputs=scripted_outputs(task, right=right), model_name="deterministic-scripted")
            agent = DefaultAgent(model, env, **config)
            info = agent.run(f"The test in test_visible.py fails. Fix the bug in {task.module}.")
            outcome.exit_status = info.get("exit_status")
            outcome.steps = agent.n_calls
            # Grading: hidden tests arrive only now, the agent never saw them; bracketed as grading, so the
            # SFT export leaves it out of the agent's messages.
            env.post_event("grading", {"status": "started"})
            env.write_file("/grader/test_hidden.py", task.hidden_test)
            graded = env.sandbox.exec("PYTHONPATH=. python3 /grader/test_hidden.py", cwd=PROJECT, timeout_s=60)
            outcome.solved = graded.exit_code == 0
            env.post_result("pass" if outcome.solved else "fail", reward=1.0 if outcome.solved else 0.0)
            env.post_event("grading", {"status": "finished", "result": "pass" if outcome.solved else "fail"})
    except Exception as exc:
        outcome.error = f"{type(exc).__name__}: {exc}"
    outcome.seconds = time.monotonic() - started
    return outcome


async def run_mini_demo(count: int, state_dir: Path) -> int:
    """Start a router, run the tasks through mini-swe-agent, print the summary; the process exit code."""
    os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")  # mini-swe-agent's banner and config dir: not ours
    os.environ.setdefault("MSWEA_GLOBAL_CONFIG_DIR", str(state_dir / "mini-swe-agent"))
    import minisweagent

    keys, _ = load_or_create(state_dir, None)
    runner = web.AppRunner(create_app(RouterSettings(state_dir=state_dir, api_keys=tuple(keys), port=0)),
                           access_log=None)
    print(f"grove demo: mini-swe-agent {minisweagent.__version__} with its deterministic model, "
          f"{count} tasks; starting a router (state dir {state_dir}) ...", flush=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    tasks = make_tasks(count)
    started = time.monotonic()
    try:
        loop = asyncio.get_running_loop()
        with ThreadPoolExecutor(max_workers=min(HARNESS_WORKERS, count)) as pool:
            outcomes = await asyncio.gather(*(
                loop.run_in_executor(pool, functools.partial(run_one, url, keys[0], t, right=i % 4 != 3))
                for i, t in enumerate(tasks)))
        elapsed = time.monotonic() - started
        async with AsyncGrove(url, keys[0]) as grove:
            left = await grove.list()
            stored = await grove.request("GET", "/v1/trajectories", params={"harness": "mini-swe-agent"})
    finally:
        await runner.cleanup()
    ours = {o.sandbox_id for o in outcomes}
    kept = [t for t in stored["trajectories"] if t["sandbox_id"] in ours]
    errors = [o for o in outcomes if o.error]
    print("\n  grove demo (mini-swe-agent) summary")
    print("  " + "-" * 52)
    rows = [
        ("tasks solved", f"{sum(o.solved for o in outcomes)} / {count}"),
        ("agents that submitted", str(sum(o.exit_status == "Submitted" for o in outcomes))),
        ("runs with errors", str(len(errors))),
        ("model turns", str(sum(o.steps for o in outcomes))),
        ("mean seconds per task", f"{sum(o.seconds for o in outcomes) / max(1, count):.2f}"),
        ("wall time", f"{elapsed:.1f} s"),
        ("trajectories stored", f"{len(kept)} / {count}"),
        ("sandboxes left behind", str(len(left))),
    ]
    for name, value in rows:
        print(f"  {name:<28}{value:>24}")
    print("  " + "-" * 52)
    for o in outcomes:
        mark = "solved" if o.solved else ("ERROR " + (o.error or "") if o.error else "not solved")
        print(f"  {o.task_id:<28}{o.exit_status or '-':<12}{mark}")
    print(f"\n  trajectories (harness mini-swe-agent {minisweagent.__version__}) are in the embedded S3 server; "
          f"e.g. {kept[0]['key'] if kept else '-'}")
    print(afterwards(state_dir, keys[0], filters="--harness mini-swe-agent"))
    return 1 if errors or left or len(kept) < count else 0


def main(count: int, state_dir: Path) -> None:
    """Run the mini-swe-agent demo and exit with its status."""
    sys.exit(asyncio.run(run_mini_demo(count, state_dir)))
