"""Rollout runs against a real router and real sandboxes: fixed groups, BAR, the record and the reports."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from artifacts.export import to_chat
from artifacts.trajectory import meta
from grove.rollouts import Policy
from tests.rollouts.runs import expected_reward, results, run, write_tasks
from tests.support.router_fixtures import RouterProcess


def test_fixed_groups_score_every_attempt_and_report_pass_at_k(router: RouterProcess, tmp_path: Path) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl", ("easy", "medium", "impossible"), prefix="fixed")
    out = tmp_path / "run"
    summary = run(router, tasks, out, Policy(attempts=3), concurrency=6)
    lines = results(out)
    assert sorted((r["task"], r["attempt"]) for r in lines) == sorted(
        (t, a) for t in {r["task"] for r in lines} for a in range(3))
    assert len(lines) == 9 and {r["outcome"] for r in lines} <= {"pass", "fail"}
    for r in lines:
        assert r["reward"] == expected_reward(tasks, r["task"], r["attempt"]), r
        assert r["infra_errors"] == [] and r["tries"] == 1 and r["commands"] == 4, r
        assert r["harness"] == "scripted" and r["harness_version"] and r["model"] == "scripted-policy"
        assert r["sandbox_s"] > 0 and r["setup_s"] >= 0 and r["cpu_s"] is not None
    passes = Counter(r["task"] for r in lines if r["outcome"] == "pass")
    assert passes["fixed-demo-000-mathops"] == 3 and passes["fixed-demo-002-text"] == 0
    variant = summary["variants"][0]
    assert variant["pass_at_k"]["1"] == round(sum(r["reward"] for r in lines) / 9, 4)
    assert set(variant["pass_at_k"]) == {"1", "2", "3"}

    groups = [json.loads(x) for x in (out / "groups.jsonl").read_text().splitlines()]
    assert len(groups) == 3
    for g in groups:
        rewards = [a["reward"] for a in g["attempts"]]
        assert g["informative"] == (len(set(rewards)) > 1)
        assert abs(sum(a["advantage"] for a in g["attempts"])) < 1e-6
    report = (out / "report.md").read_text()
    assert "pass@1" in report and "pass@3" in report and "fixed-demo-000-mathops | 3/3" in report
    assert (out / "pass_at_k.png").stat().st_size > 1000

    # The record: labels for artifact retrieval, grading kept out of the agent's messages, file edits as calls.
    first = next(r for r in lines if r["task"] == "fixed-demo-000-mathops")
    with router.client() as grove:
        record = grove.request("GET", f"/v1/trajectories/{first['trajectory_id']}")
        stored = grove.request("GET", f"/v1/runs/{summary['run_id']}/files")["files"]
    labels = meta(record, "labels")  # the create's metadata.labels
    assert labels["run_id"] == summary["run_id"] and labels["group_id"] == first["group_id"]
    assert labels["attempt"] == str(first["attempt"]) and labels["difficulty"] == "easy"
    assert record["outcome"]["result"] == "pass"
    chat = to_chat(record)
    calls = [c["function"] for m in chat["messages"] for c in m.get("tool_calls") or []]
    assert [c["name"] for c in calls] == ["bash", "bash", "bash", "read_file", "write_file", "bash"], calls
    assert "return a + b" in json.loads(calls[4]["arguments"])["content"]
    text = json.dumps(chat["messages"])
    assert "test_hidden" not in text and "/proc/" not in text, "grading leaked into the agent's messages"
    assert chat["messages"][0] == {"role": "user", "content": "The test in test_visible.py fails. Fix the bug in "
                                                               "mathops.py."}
    assert chat["metadata"]["labels"]["run_id"] == summary["run_id"] and chat["metadata"]["reward"] == 1.0
    assert {f["key"].rsplit("/", 1)[1] for f in stored} >= {"results.jsonl", "summary.json", "report.md",
                                                             "groups.jsonl", "pass_at_k.png"}
    assert all(f["key"].startswith(f"runs/{summary['run_id']}/") for f in stored)


def test_bar_stops_easy_and_impossible_tasks_early(router: RouterProcess, tmp_path: Path) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl", ("easy", "impossible", "medium"), prefix="bar")
    out = tmp_path / "run"
    summary = run(router, tasks, out, Policy(bar_max=8, bar_step=2), concurrency=6)
    used = Counter(r["task"] for r in results(out))
    assert used["bar-demo-000-mathops"] == 4 and used["bar-demo-001-seq"] == 4, used  # filtered, not 8
    medium = [r["reward"] for r in sorted(results(out), key=lambda r: r["attempt"]) if r["task"] == "bar-demo-002-text"]
    # The medium task stops at the end of the first stage whose results split (or when its patience ran out).
    split = next((i for i in range(2, 9, 2) if len(set(medium[:i])) > 1), None)
    assert len(medium) == (split or 4), medium
    assert summary["informative_groups"] == (1 if split else 0)
    status = router.cli("rollouts", "status", str(out))
    assert status.returncode == 0 and b"finished" in status.stdout and b"BAR" in status.stdout, status


def test_a_bad_task_file_is_refused_naming_line_and_field(router: RouterProcess, tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"id": "ok", "prompt": "p", "check": {"test": "true"}}\n'
                     '{"id": "broken", "prompt": "p", "check": {"test": "true"}, "resources": {"cpu": "lots"}}\n')
    before = router.live_ids()
    done = router.cli("rollouts", "run", str(tasks), "--harness", "scripted", "--attempts", "2",
                      "--out", str(tmp_path / "run"))
    assert done.returncode == 1
    assert f"{tasks}, line 2: field 'resources.cpu' must be a positive number".encode() in done.stderr, done.stderr
    assert router.live_ids() == before


def test_run_files_refuse_names_outside_the_run(router: RouterProcess) -> None:
    for path in ("/v1/runs/r1/files/.hidden", "/v1/runs/r%2F..%2Fx/files/a.json", "/v1/runs/r1/files/a%20b"):
        reply = router.http("PUT", path, b"{}")
        assert reply.status in (400, 404), (path, reply.status, reply.body)
    assert router.http("PUT", "/v1/runs/r1/files/ok.json", b"{}").status == 201
