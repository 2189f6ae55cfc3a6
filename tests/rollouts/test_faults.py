"""Faults during rollout runs: the runner SIGKILLed and resumed, executors killed during attempts."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from grove.rollouts import Policy
from grove.rollouts.journal import read_journal
from tests.rollouts.runs import expected_reward, journal, results, run, write_tasks
from tests.support.router_fixtures import GROVE_BIN, RouterProcess, cgroup_procs, wait_for


def _cli_run(router: RouterProcess, tasks: Path, out: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "GROVE_API_KEY": router.key}
    argv = [GROVE_BIN, "--url", router.url, "rollouts", "run", str(tasks), "--harness", "scripted",
            "--attempts", "2", "--concurrency", "3", "--out", str(out), "--quiet", "--no-upload"]
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def _labels_of_stored(router: RouterProcess, task_ids: set[str]) -> list[dict[str, Any]]:
    with router.client() as grove:
        ids = [t["sandbox_id"] for task in task_ids
               for t in grove.request("GET", "/v1/trajectories", params={"task_id": task})["trajectories"]]
        return [grove.request("GET", f"/v1/trajectories/{sid}")["sandbox"]["labels"] for sid in ids]


def test_resume_after_the_runner_is_sigkilled(router: RouterProcess, tmp_path: Path) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl", ("easy", "medium", "impossible"), prefix="resume",
                        think_s=0.25)
    out = tmp_path / "run"
    proc = _cli_run(router, tasks, out)
    try:
        def mid_run() -> bool:
            state = read_journal(out) if (out / "journal.jsonl").exists() else None
            return bool(state and len(state.done) >= 2 and any("sandbox_id" in t for t in state.open_tries.values()))

        wait_for(mid_run, 90, interval=0.05, what="two attempts done and one under way")
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    before = read_journal(out)
    run_id = (out / "run.json").read_text().split('"run_id": "')[1].split('"')[0]
    with router.client() as grove:
        left = grove.list({"run_id": run_id})
    assert left, "the killed runner left no sandbox under way (the test killed it too late)"

    again = _cli_run(router, tasks, out)
    stdout, stderr = again.communicate(timeout=180)
    assert again.returncode == 0, stderr.decode()
    assert b"pass@1" in stdout

    lines = results(out)
    keys = [(r["task"], r["attempt"]) for r in lines]
    assert len(keys) == 6 and len(set(keys)) == 6
    assert all(r["reward"] == expected_reward(tasks, r["task"], r["attempt"]) for r in lines)
    entries = journal(out)
    done = Counter((e["task"], e["attempt"]) for e in entries if e["e"] == "done")
    assert set(done.values()) == {1}, "an attempt was finished twice"
    tries = Counter((e["task"], e["attempt"]) for e in entries if e["e"] == "try")
    for (_, task, attempt) in before.done:
        assert tries[(task, attempt)] == 1, f"{task}#{attempt} finished before the kill and ran again"
    interrupted = [e for e in entries if e["e"] == "interrupted"]
    assert len(interrupted) == len(before.open_tries) >= 1
    with router.client() as grove:
        assert grove.list({"run_id": run_id}) == [], "sandboxes of the dead runner were left"
    # No duplicate sandbox: at most one per (group, attempt, try), across both runner lives.
    task_ids = {r["task"] for r in lines}
    created = sum(1 for e in entries if e["e"] == "sandbox")

    def all_stored() -> list[dict[str, Any]] | None:
        labels = _labels_of_stored(router, task_ids)
        return labels if len(labels) >= created else None

    stored = wait_for(all_stored, 30, what="every trajectory stored")
    ours = [s for s in stored if s.get("run_id") == run_id]
    per_try = Counter((s["group_id"], s["attempt"], s["try"]) for s in ours if s.get("role") != "grader")
    assert per_try and set(per_try.values()) == {1}, per_try
    # Each try that reached grading had one grader (labelled as such), never two.
    graders = Counter((s["group_id"], s["attempt"], s["try"]) for s in ours if s.get("role") == "grader")
    assert set(graders.values()) <= {1} and set(graders) <= set(per_try), graders


def test_executors_killed_during_attempts_are_retried_and_never_scored(router: RouterProcess, tmp_path: Path) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl", ("easy", "medium", "impossible"), prefix="kill", think_s=0.3)
    out = tmp_path / "run"
    killed: set[str] = set()
    stop = threading.Event()

    def killer() -> None:
        # The first try of every attempt 0 loses its executor (and its commands) mid-agent.
        seen: dict[str, float] = {}
        with router.client() as grove:
            while not stop.is_set() and len(killed) < 3:
                for sb in grove.list():
                    labels = sb["metadata"]["labels"]
                    if not sb["metadata"]["task_id"].startswith("kill-") or sb["id"] in killed:
                        continue
                    if labels.get("role") == "grader":  # the agents' sandboxes are the ones attacked here
                        continue
                    if (labels["attempt"], labels["try"]) != ("0", "0") or sb["status"] != "ready":
                        continue
                    if time.monotonic() - seen.setdefault(sb["id"], time.monotonic()) < 0.6:
                        continue
                    for pid in cgroup_procs(router.state_dir, sb["id"]):
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGKILL)
                    killed.add(sb["id"])
                time.sleep(0.05)

    thread = threading.Thread(target=killer)
    thread.start()
    try:
        summary = run(router, tasks, out, Policy(attempts=2), concurrency=6)
    finally:
        stop.set()
        thread.join(10)
    assert len(killed) == 3
    lines = results(out)
    assert len(lines) == 6 and summary["lost_attempts"] == 0
    # Same rewards as without faults; the faulted tries show as infra faults, never as fails.
    assert all(r["reward"] == expected_reward(tasks, r["task"], r["attempt"]) for r in lines)
    hit = [r for r in lines if r["sandbox_id"] not in killed and r["attempt"] == 0]
    assert len(hit) == 3 and all(r["tries"] == 2 and len(r["infra_errors"]) == 1 for r in hit), hit
    assert all(r["tries"] == 1 and not r["infra_errors"] for r in lines if r["attempt"] == 1)
    reasons = Counter(reason for r in hit for reason in r["infra_errors"])
    assert set(reasons) <= {"executor_lost", "unavailable"}, reasons
    assert sum(summary["infra_faults"].values()) == 3
    report = (out / "report.md").read_text()
    assert "## Infrastructure faults" in report and "executor_lost" in report
