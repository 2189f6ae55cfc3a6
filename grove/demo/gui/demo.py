"""``python -m grove.demo --gui``: offline web tasks in browser sandboxes, a BAR rollout run end to end.

A router with the local backend starts in this process. Each of the ten tasks (:mod:`grove.demo.gui.tasks`) is a
small site served inside its sandbox, with a screen and Chromium open at its start page. The scripted browser
policy (:mod:`grove.rollouts.browser.policy`) reads where the page's elements are and acts through the computer
API with screen coordinates, following the right plan with the task's odds (so groups hold passes and fails);
each attempt is graded in place from the site's own log once the agent has stopped, or, for the open-ended
task, by a judge reading the trajectory and the final screen. Every action is a trajectory step with its
screenshot: the viewer shows each attempt as a filmstrip.

This proves the plumbing — sandboxes with screens, actions, the record, grading, BAR — not a model's skill: the
policy's plans are written by hand and its successes are coin flips. The demo exits 0 when every attempt was
scored as the policy's coin says it should be, every trajectory was stored and no sandbox was left behind.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from grove.client import AsyncGrove
from grove.demo.burst import print_groups
from grove.demo.gui.tasks import SITES, task_lines
from grove.demo.state import afterwards, shown
from grove.rollouts import Policy, RunConfig, arun_rollouts
from grove.rollouts.scripted import draws_right
from router.app import create_app
from router.auth import load_or_create
from router.settings import RouterSettings

CONCURRENCY = 2
"""Attempts at once: each runs Chromium in its sandbox, and the demo should fit a 2-core machine."""
POLICY = Policy(bar_max=4, bar_step=2)
"""Two attempts at a time until a group holds a pass and a fail; unanimous after four: filtered."""


async def run_gui_demo(state_dir: Path, count: int = len(SITES)) -> int:
    """Start a router, run the first ``count`` GUI tasks in BAR groups, print what happened; the exit code."""
    keys, _ = load_or_create(state_dir, None)
    runner = web.AppRunner(create_app(RouterSettings(state_dir=state_dir, api_keys=tuple(keys), port=0)),
                           access_log=None)
    print(f"grove demo --gui: starting a router (local backend, state dir {shown(state_dir)}) ...", flush=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    run_dir = state_dir / "runs" / ("gui-" + time.strftime("%Y%m%dT%H%M%S"))
    run_dir.mkdir(parents=True)
    tasks_file = run_dir.parent / f"{run_dir.name}-tasks.jsonl"
    lines = task_lines([s.name for s in SITES[:count]])
    tasks_file.write_text("".join(json.dumps(line) + "\n" for line in lines))
    print(f"grove demo --gui: {len(lines)} offline web tasks, each site served inside its own sandbox with a screen "
          f"and Chromium; a scripted browser policy (no model: it reads the page's layout, then clicks, types, "
          f"scrolls and drags through the computer API); BAR groups, {CONCURRENCY} attempts at once.\n"
          f"  This proves the plumbing, not a model's skill: the plans are written by hand, their success a coin "
          f"with the task's odds.\n  tasks: {shown(tasks_file)}\n", flush=True)
    config = RunConfig(tasks=tasks_file, out=run_dir, variants=[("scripted", None)], policy=POLICY,
                       concurrency=CONCURRENCY, url=url, api_key=keys[0])
    try:
        started = time.monotonic()
        summary = await arun_rollouts(config)
        elapsed = time.monotonic() - started
        async with AsyncGrove(url, keys[0]) as grove:
            left = await grove.list()
            stored = await grove.request("GET", "/v1/trajectories", params={"harness": "scripted"})
    finally:
        await runner.cleanup()
    results = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    print_groups(run_dir)
    print((run_dir / "report.md").read_text())
    wrong = mismatches(results, lines)
    kept = {t["sandbox_id"] for t in stored["trajectories"]} & {r["trajectory_id"] for r in results}
    actions = sum(int(r.get("actions") or 0) for r in results)
    print(f"  {len(results)} attempts, {actions} screen actions in {elapsed:.1f}s; {len(kept)} trajectories with "
          f"their screenshots in the embedded S3 server; sandboxes left behind: {len(left)}")
    for line in wrong:
        print(f"  NOT AS THE POLICY PLAYED IT: {line}")
    first = results[0]["trajectory_id"] if results else "-"
    print(f"  where to look: the run at http://127.0.0.1:8471/ui/runs/{summary['run_id']}, an attempt's filmstrip "
          f"at http://127.0.0.1:8471/ui/trajectories/{first} (on the router below)")
    print(afterwards(state_dir, keys[0], filters=f"--run {summary['run_id']}"))
    return 1 if left or wrong or len(kept) < len(results) or not results else 0


def mismatches(results: list[dict[str, Any]], lines: list[dict[str, Any]]) -> list[str]:
    """Attempts whose outcome is not what the policy's coin chose (right plan: pass; wrong plan: fail), or that
    were never scored: each one is the plumbing's failure, not the policy's."""
    odds = {line["id"]: float(line["scripted"]["p_solve"]) for line in lines}
    wrong = []
    for r in results:
        expected = "pass" if draws_right(r["task"], int(r["attempt"]), odds[r["task"]]) else "fail"
        if r["outcome"] != expected:
            why = r.get("agent_error") or (r.get("harness_error") or {}).get("error") or r.get("infra_errors")
            wrong.append(f"{r['task']} attempt {r['attempt']}: {r['outcome']}, the policy played for {expected} "
                         f"({why or r.get('check')})")
    return wrong


def main(count: int, state_dir: Path) -> None:
    """Run the GUI demo and exit with its status."""
    sys.exit(asyncio.run(run_gui_demo(state_dir, count)))
