"""Back-pressure: a router that turns creates away (503 + Retry-After) slows the run; nothing fails.

The run is sized to the router first: each attempt holds two sandboxes while it grades (its own, and the fresh
one that grades it), so on a router of 4 a concurrency of 3 runs 2 at a time. Then someone else's sandbox
takes a place for a while, and the run's creates meet a full router.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from aiohttp import web

from grove.client import AsyncGrove
from grove.rollouts import Policy, RunConfig, arun_rollouts
from router.app import create_app
from router.settings import RouterSettings
from tests.rollouts.runs import expected_reward, results, write_tasks
from tests.support.router_fixtures import router_state


def test_a_full_router_slows_the_run_and_fails_nothing(tmp_path: Path) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl", ("easy", "medium", "impossible"), prefix="bp")
    out = tmp_path / "run"
    with router_state(start=False) as proc:  # its state dir and leak checks; the router runs in this process

        async def main() -> dict[str, Any]:
            settings = RouterSettings(state_dir=proc.state_dir, api_keys=(proc.key,), port=0, max_sandboxes=4)
            app = web.AppRunner(create_app(settings), access_log=None)
            await app.setup()
            site = web.TCPSite(app, "127.0.0.1", 0)
            await site.start()
            url = f"http://127.0.0.1:{app.addresses[0][1]}"
            try:
                async with AsyncGrove(url, proc.key) as other:
                    # Another user's sandbox holds a place while the run's first attempts want all four.
                    squatter = await other.create(heartbeat=False)
                    config = RunConfig(tasks=tasks, out=out, variants=[("scripted", None)],
                                       policy=Policy(attempts=1), concurrency=3, url=url, api_key=proc.key,
                                       upload=False, quiet=True)
                    run = asyncio.create_task(arun_rollouts(config))
                    await asyncio.sleep(3.0)
                    await squatter.close()
                    return await run
            finally:
                await app.cleanup()

        summary = asyncio.run(main())
    lines = results(out)
    assert len(lines) == 3 and summary["throttled_creates"] > 0, summary
    assert summary["infra_faults"] == {} and all(r["tries"] == 1 for r in lines)
    assert all(r["reward"] == expected_reward(tasks, r["task"], r["attempt"]) for r in lines)
    assert "back-pressure" in (out / "report.md").read_text()
