"""A router SIGKILLed mid-run (issue 31): no sandbox of the run outlives it, and the run says what happened.

Before: the killed router's in-flight tries left their sandboxes ``ready`` until the heartbeat reaper took them
(a restart reset their clocks), the report said they were deleted, and counted the dead router's refusals as
"503 back-pressure". Now the runner waits for the router (journaled as ``unreachable``), deletes the sandboxes
of the tries it cut short once it answers again, and reports the outage as such.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.rollouts.runs import journal, results, write_tasks
from tests.support.router_fixtures import GROVE_BIN, RouterProcess, wait_for

pytestmark = pytest.mark.local_only


def test_a_router_killed_mid_run_leaves_no_sandbox_of_the_run(fresh_router: RouterProcess, tmp_path: Path) -> None:
    router = fresh_router
    tasks = write_tasks(tmp_path / "tasks.jsonl", ("easy", "medium", "hard", "impossible"), prefix="crash",
                        think_s=0.4)
    out = tmp_path / "run"
    env = {**os.environ, "GROVE_API_KEY": router.key}
    argv = [GROVE_BIN, "--url", router.url, "rollouts", "run", str(tasks), "--harness", "scripted", "--attempts",
            "2", "--concurrency", "4", "--out", str(out), "--no-upload"]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        def under_way() -> bool:
            if not (out / "run.json").exists():
                return False
            run_id = json.loads((out / "run.json").read_text())["run_id"]
            with router.client() as grove:
                return len(grove.list({"run_id": run_id})) >= 2
        wait_for(under_way, 90, interval=0.05, what="tries under way")
        router.stop(signal.SIGKILL)
        time.sleep(4.0)  # the runner meets a router that is not there
        router.start()
        _, stderr = proc.communicate(timeout=300)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    assert proc.returncode == 0, stderr.decode()[-3000:]
    run_id = json.loads((out / "run.json").read_text())["run_id"]
    with router.client() as grove:
        left = grove.list({"run_id": run_id})
    assert left == [], f"sandboxes of the run outlived it: {[s['id'] for s in left]}"
    entries = journal(out)
    assert not any(e["e"] == "throttled" for e in entries), "a dead router was counted as back-pressure"
    reasons = [r for row in results(out) for r in row["infra_errors"]]
    unreachable = [e for e in entries if e["e"] == "unreachable"]
    assert unreachable or "router_unreachable" in reasons, (reasons, [e["e"] for e in entries])
    assert len(results(out)) == 8 and all(r["outcome"] in ("pass", "fail") for r in results(out))
    report = (out / "report.md").read_text()
    assert "unreachable" in report and "back-pressure" not in report
    assert "router unreachable" in stderr.decode()
