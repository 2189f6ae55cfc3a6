"""What the scripted demos share (``--gui``, ``--assistant``): a router in this process, a task file, a BAR rollout
run by the scripted policy, and a report of whether every attempt came out as the policy's coin says."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from grove.client import AsyncGrove
from grove.demo.burst import print_groups
from grove.demo.state import afterwards, shown
from grove.rollouts import Policy, RunConfig, arun_rollouts
from grove.rollouts.scripted import draws_right
from router.app import create_app
from router.auth import load_or_create
from router.settings import RouterSettings


@dataclass(frozen=True)
class Demo:
    """How one scripted demo names itself and what it counts."""

    flag: str
    """Its ``python -m grove.demo`` flag without dashes (``gui``): the run's name and the messages' prefix."""
    intro: str
    """What it says it runs (after the task file is written; ``{n}`` is the number of tasks)."""
    counted: str
    """The result field it sums over attempts (``actions``)."""
    counted_as: str
    """What that sum is called (``screen actions``)."""
    kept_as: str
    """What the stored trajectories hold (``trajectories with their screenshots``)."""
    record_as: str
    """What the viewer shows of one attempt (``filmstrip``)."""
    concurrency: int
    policy: Policy


async def run_demo(demo: Demo, state_dir: Path, lines: list[dict[str, Any]]) -> int:
    """Start a router, run ``lines`` as BAR groups with the scripted policy, print what happened; the exit code."""
    keys, _ = load_or_create(state_dir, None)
    runner = web.AppRunner(create_app(RouterSettings(state_dir=state_dir, api_keys=tuple(keys), port=0)),
                           access_log=None)
    prefix = f"grove demo --{demo.flag}"
    print(f"{prefix}: starting a router (local backend, state dir {shown(state_dir)}) ...", flush=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    run_dir = state_dir / "runs" / (f"{demo.flag}-" + time.strftime("%Y%m%dT%H%M%S"))
    run_dir.mkdir(parents=True)
    tasks_file = run_dir.parent / f"{run_dir.name}-tasks.jsonl"
    tasks_file.write_text("".join(json.dumps(line) + "\n" for line in lines))
    print(f"{prefix}: {demo.intro.format(n=len(lines))}\n  tasks: {shown(tasks_file)}\n", flush=True)
    config = RunConfig(tasks=tasks_file, out=run_dir, variants=[("scripted", None)], policy=demo.policy,
                       concurrency=demo.concurrency, url=url, api_key=keys[0])
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
    counted = sum(int(r.get(demo.counted) or 0) for r in results)
    print(f"  {len(results)} attempts, {counted} {demo.counted_as} in {elapsed:.1f}s; {len(kept)} {demo.kept_as} "
          f"in the embedded S3 server; sandboxes left behind: {len(left)}")
    for line in wrong:
        print(f"  NOT AS THE POLICY PLAYED IT: {line}")
    first = results[0]["trajectory_id"] if results else "-"
    print(f"  where to look: the run at http://127.0.0.1:8471/ui/runs/{summary['run_id']}, an attempt's "
          f"{demo.record_as} at http://127.0.0.1:8471/ui/trajectories/{first} (on the router below)")
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
