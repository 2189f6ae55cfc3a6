"""``make demo``: a real rollout run on the embedded defaults.

A router with the local backend starts in this process. The demo's tasks — tiny Python projects with
one bug each, of known difficulty (easy to impossible) — go through :mod:`grove.rollouts` with the
scripted agent (no model needed: it reads the code, runs the visible test, patches right or wrong with
the task's odds, runs the test again) in Balanced Adaptive Rollout groups: two attempts at a time per
task until the group holds both a pass and a fail; a group still all-pass or all-fail after four is
filtered as easy or impossible for this policy. Hidden tests grade each
attempt after the agent is done. The run's groups, pass@k and report are printed; every sandbox is deleted.
The state (images, trajectories, the run's files) stays in ``.state/demo`` of the checkout; the demo's last lines
say how to look at it (CLI and viewer) and how to remove it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

from aiohttp import web

from grove.client import AsyncGrove
from grove.demo.state import afterwards, demo_state_dir, shown
from grove.demo.tasks import task_lines
from grove.rollouts import Policy, RunConfig, arun_rollouts
from router.app import create_app
from router.auth import load_or_create
from router.settings import RouterSettings

DEMO_POOL = "grove-demo"
WARM = 8
"""Sandboxes the warm pool keeps ready: the run's concurrency (a claimed one is replaced at once)."""


async def fill_pool(grove: AsyncGrove) -> None:
    """A warm pool of the demo tasks' spec, filled before the run: the run's creates match it exactly and
    claim from it (what a trainer does during a training step)."""
    await grove.create_pool(DEMO_POOL, size=WARM, resources={"cpu": 0.5, "memory_mb": 256})
    started = time.monotonic()
    while (pool := await grove.pool(DEMO_POOL))["ready"] < WARM:
        if pool["error"]:
            raise RuntimeError(f"the demo pool stopped filling: {pool['error']}")
        await asyncio.sleep(0.2)
    print(f"grove demo: warm pool of {WARM} filled in {time.monotonic() - started:.1f}s", flush=True)


async def run_demo(count: int, state_dir: Path, *, warm: bool = False) -> int:
    """Start a router, run the rollouts, print groups and the report; the process exit code."""
    keys, _ = load_or_create(state_dir, None)
    settings = RouterSettings(state_dir=state_dir, api_keys=tuple(keys), port=0)
    runner = web.AppRunner(create_app(settings), access_log=None)
    print(f"grove demo: starting a router (local backend, state dir {shown(state_dir)}) ...", flush=True)
    t0 = time.monotonic()
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    print(f"grove demo: router up at {url} in {time.monotonic() - t0:.1f}s", flush=True)
    run_dir = state_dir / "runs" / time.strftime("%Y%m%dT%H%M%S")
    run_dir.mkdir(parents=True)
    tasks_file = run_dir.parent / f"{run_dir.name}-tasks.jsonl"
    tasks_file.write_text("".join(json.dumps(line) + "\n" for line in task_lines(count)))
    print(f"grove demo: {count} tasks, scripted agent, BAR groups (2 attempts at a time until a group has a pass "
          f"and a fail; unanimous after 4: filtered), 8 at once\n  tasks: {tasks_file}\n", flush=True)
    config = RunConfig(tasks=tasks_file, out=run_dir, variants=[("scripted", None)],
                       policy=Policy(bar_max=6, bar_step=2), concurrency=8, url=url, api_key=keys[0])
    try:
        if warm:
            async with AsyncGrove(url, keys[0]) as grove:
                await fill_pool(grove)
        started = time.monotonic()
        summary = await arun_rollouts(config)
        elapsed = time.monotonic() - started
        async with AsyncGrove(url, keys[0]) as grove:
            if warm:
                pool = await grove.delete_pool(DEMO_POOL)
                print(f"grove demo: {pool['claims']} creates claimed from the warm pool", flush=True)
            left = await grove.list()
            stored = await grove.request("GET", "/v1/trajectories", params={"harness": "scripted"})
    finally:
        await runner.cleanup()
    print_groups(run_dir)
    print((run_dir / "report.md").read_text())
    ours = {line["trajectory_id"] for line in map(json.loads, (run_dir / "results.jsonl").read_text().splitlines())}
    kept = [t for t in stored["trajectories"] if t["sandbox_id"] in ours]
    print(f"  {summary['attempts']} attempts in {elapsed:.1f}s; {len(kept)} trajectories in the embedded S3 server "
          f"(labelled run_id={summary['run_id']}); run files in S3 under runs/{summary['run_id']}/ "
          f"and locally in {shown(run_dir)}; sandboxes left behind: {len(left)}")
    print(afterwards(state_dir, keys[0], filters=f"--run {summary['run_id']}"))
    return 1 if left or summary["lost_attempts"] or len(kept) < summary["attempts"] else 0


def print_groups(run_dir: Path) -> None:
    """The run's groups: rewards in attempt order, and whether each is informative."""
    groups = [json.loads(line) for line in (run_dir / "groups.jsonl").read_text().splitlines()]
    print("\n  groups (rewards in attempt order; advantages are group-relative)")
    for g in groups:
        rewards = " ".join(f"{a['reward']:.0f}" for a in g["attempts"])
        why = "informative" if g["informative"] else ("all pass" if all(a["reward"] for a in g["attempts"])
                                                      else "all fail")
        print(f"  {g['task']:<26} {rewards:<14} {why}")
    print()


def main() -> None:
    """Entry point of ``python -m grove.demo``."""
    parser = argparse.ArgumentParser(prog="grove-demo", description=__doc__)
    parser.add_argument("--tasks", "--sandboxes", dest="tasks", type=int, default=10,
                        help="how many tasks (default 10)")
    parser.add_argument("--state-dir", help="where the demo's router keeps its state (default $GROVE_DEMO_STATE_DIR, "
                                            "else .state/demo of the current directory: `make demo` runs in the "
                                            "checkout)")
    parser.add_argument("--harness", choices=("scripted", "mini-swe-agent"), default="scripted",
                        help="who drives the tasks: the built-in scripted agent, or mini-swe-agent's real agent loop "
                             "with its deterministic model")
    parser.add_argument("--warm-pool", action="store_true",
                        help=f"fill a warm pool of {WARM} first; the rollouts' creates claim from it")
    parser.add_argument("--gui", action="store_true",
                        help="offline web tasks instead: sites served in browser sandboxes, a scripted browser "
                             "policy acting through the computer API (--tasks: the first N of the ten)")
    parser.add_argument("--assistant", action="store_true",
                        help="offline personal-assistant tasks instead: a mail, calendar and notes service beside "
                             "the agent, a scripted policy calling it over HTTP, graded by the service's final state "
                             "(--tasks: the first N of the ten)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("grove demo: the local backend needs root (namespaces, cgroups, overlay mounts); run it as root")
    state = demo_state_dir(args.state_dir)
    if args.gui:
        from grove.demo.gui import demo

        demo.main(args.tasks, state)
    if args.assistant:
        from grove.demo.assistant import demo as assistant

        assistant.main(args.tasks, state)
    if args.harness == "mini-swe-agent":
        from grove.demo import mini

        mini.main(args.tasks, state)
    sys.exit(asyncio.run(run_demo(args.tasks, state, warm=args.warm_pool)))
