"""``make demo``: a small but real burst evaluation on the embedded defaults.

A router with the local backend starts in this process; N sandboxes each get a tiny Python project with
one bug; a scripted agent (no model needed — some of its patches right, some wrong) reads the code, runs
the visible test, patches, runs it again; hidden tests then score each sandbox. Everything is cleaned up.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from grove.client import AsyncGrove
from grove.demo.tasks import Task, make_tasks
from router.app import create_app
from router.auth import load_or_create
from router.settings import RouterSettings

PROJECT = "/workspace/project"


@dataclass
class Outcome:
    """What happened to one task."""

    task_id: str
    sandbox_id: str | None = None
    solved: bool = False
    commands: int = 0
    latencies: list[float] = field(default_factory=list)
    error: str | None = None


class Progress:
    """A one-line progress bar on stderr."""

    def __init__(self, total: int) -> None:
        self.total, self.done, self.solved, self.failed = total, 0, 0, 0
        self.start = time.monotonic()

    def tick(self, outcome: Outcome) -> None:
        self.done += 1
        self.solved += outcome.solved
        self.failed += outcome.error is not None
        width = 30
        filled = int(width * self.done / self.total)
        bar = "#" * filled + "." * (width - filled)
        elapsed = time.monotonic() - self.start
        sys.stderr.write(
            f"\r  [{bar}] {self.done}/{self.total} sandboxes  solved {self.solved}"
            f"  errors {self.failed}  {elapsed:5.1f}s"
        )
        sys.stderr.flush()


async def solve(grove: AsyncGrove, task: Task, *, right: bool) -> Outcome:
    """The scripted agent on one task, then the hidden-test grader."""
    outcome = Outcome(task.task_id)

    async def run(sandbox: object, command: str) -> int:
        started = time.perf_counter()
        result = await sandbox.exec(command, cwd=PROJECT, timeout_s=60)  # type: ignore[attr-defined]
        outcome.latencies.append(time.perf_counter() - started)
        outcome.commands += 1
        return int(result.exit_code)

    metadata = {"task_id": task.task_id, "model": "scripted-agent", "harness": "grove-demo", "harness_version": "1"}
    try:
        # No .pyc: a same-size patch within the same second would leave a stale one valid (and the fix unseen).
        async with await grove.create("default", metadata=metadata, memory_mb=256, cpu=0.5,
                                      env={"PYTHONDONTWRITEBYTECODE": "1"}) as sandbox:
            outcome.sandbox_id = sandbox.id
            events = f"/v1/sandboxes/{sandbox.id}/events"
            ask = {"role": "user", "content": f"The test in test_visible.py fails. Fix the bug in {task.module}."}
            await grove.request("POST", events, json_body={"kind": "message", "data": ask})
            await sandbox.write_file(f"{PROJECT}/{task.module}", task.source)
            await sandbox.write_file(f"{PROJECT}/test_visible.py", task.visible_test)
            await run(sandbox, "ls -la && python3 --version")
            await run(sandbox, f"cat {task.module}")
            await run(sandbox, "python3 test_visible.py")
            # The agent "edits": read the file, replace the line it believes is wrong, write it back.
            code = (await sandbox.read_file(f"{PROJECT}/{task.module}")).decode()
            fix = task.right_fix if right else task.wrong_fix
            patched = code.replace(task.bug, fix)
            note = {"role": "assistant", "content": f"Replacing `{task.bug.strip()}` with `{fix.strip()}`."}
            await grove.request("POST", events, json_body={"kind": "message", "data": note})
            await sandbox.write_file(f"{PROJECT}/{task.module}", patched)
            await run(sandbox, "python3 test_visible.py")
            await run(sandbox, "git init -q . && git add -A && git -c user.email=a@b -c user.name=agent commit -qm fix")
            # Grading: hidden tests arrive only now, the agent never saw them.
            await sandbox.write_file("/grader/test_hidden.py", task.hidden_test)
            outcome.solved = await run(sandbox, "PYTHONPATH=. python3 /grader/test_hidden.py") == 0
            result = {"result": "pass" if outcome.solved else "fail", "reward": 1.0 if outcome.solved else 0.0}
            await grove.request("POST", events, json_body={"kind": "result", "data": result})
    except Exception as exc:
        outcome.error = f"{type(exc).__name__}: {exc}"
    return outcome


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def run_demo(count: int, state_dir: Path) -> int:
    """Start a router, run the burst, print the summary; returns the process exit code."""
    keys, _ = load_or_create(state_dir, None)
    key = keys[0]
    settings = RouterSettings(state_dir=state_dir, api_keys=tuple(keys), port=0)
    runner = web.AppRunner(create_app(settings), access_log=None)
    print(f"grove demo: starting a router (local backend, state dir {state_dir}) ...", flush=True)
    t0 = time.monotonic()
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    took = time.monotonic() - t0
    print(f"grove demo: router up at {url} in {took:.1f}s; {count} sandboxes, one task each", flush=True)
    tasks = make_tasks(count)
    progress = Progress(count)
    try:
        async with AsyncGrove(url, key) as grove:
            started = time.monotonic()

            async def one(i: int, task: Task) -> Outcome:
                outcome = await solve(grove, task, right=i % 4 != 3)
                progress.tick(outcome)
                return outcome

            outcomes = await asyncio.gather(*(one(i, t) for i, t in enumerate(tasks)))
            elapsed = time.monotonic() - started
            left = await grove.list()
            ours = {o.sandbox_id for o in outcomes if o.sandbox_id}
            stored = await grove.request("GET", "/v1/trajectories", params={"harness": "grove-demo"})
            keys = [t["key"] for t in stored["trajectories"] if t["sandbox_id"] in ours]
    finally:
        await runner.cleanup()
    sys.stderr.write("\n")
    latencies = [x for o in outcomes for x in o.latencies]
    errors = [o for o in outcomes if o.error]
    rows = [
        ("tasks solved", f"{sum(o.solved for o in outcomes)} / {count}"),
        ("sandboxes with errors", str(len(errors))),
        ("commands run", str(sum(o.commands for o in outcomes))),
        ("exec latency p50", f"{_pct(latencies, 0.5) * 1000:.1f} ms"),
        ("exec latency p99", f"{_pct(latencies, 0.99) * 1000:.1f} ms"),
        ("exec latency mean", f"{statistics.fmean(latencies) * 1000:.1f} ms" if latencies else "-"),
        ("wall time", f"{elapsed:.1f} s"),
        ("sandboxes per second", f"{count / elapsed:.2f}"),
        ("sandboxes left behind", str(len(left))),
    ]
    print("\n  grove demo summary")
    print("  " + "-" * 44)
    for name, value in rows:
        print(f"  {name:<24}{value:>20}")
    print("  " + "-" * 44)
    for o in outcomes:
        mark = "solved" if o.solved else ("ERROR " + (o.error or "") if o.error else "not solved")
        print(f"  {o.task_id:<24}{mark}")
    print(
        f"\n  {len(keys)} of {count} trajectories stored in the embedded S3 server (bucket 'grove', data in "
        f"{state_dir / 's3'}), e.g. {keys[0] if keys else '-'}\n"
        f"  browse them: .venv/bin/grove --state-dir {state_dir} up --port 8471 &\n"
        f"         then: .venv/bin/grove --state-dir {state_dir} trajectories ls --harness grove-demo\n"
        f"  and stop it: .venv/bin/grove --state-dir {state_dir} down"
    )
    return 1 if errors or left or len(keys) < count else 0


def main() -> None:
    """Entry point of ``python -m grove.demo``."""
    parser = argparse.ArgumentParser(prog="grove-demo", description=__doc__)
    parser.add_argument("--sandboxes", type=int, default=20)
    parser.add_argument("--state-dir", default=os.environ.get("GROVE_DEMO_STATE_DIR"))
    parser.add_argument("--harness", choices=("scripted", "mini-swe-agent"), default="scripted",
                        help="who drives the tasks: the built-in scripted agent, or mini-swe-agent's real agent loop "
                             "with its deterministic model")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("grove demo: the local backend needs root (namespaces, cgroups, overlay mounts); run it as root")
    state = Path(args.state_dir or Path(tempfile.gettempdir()) / "grove-demo").resolve()
    if args.harness == "mini-swe-agent":
        from grove.demo import mini

        mini.main(args.sandboxes, state)
    sys.exit(asyncio.run(run_demo(args.sandboxes, state)))


