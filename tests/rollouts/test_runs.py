"""Rollout runs against a real router and real sandboxes: fixed groups, BAR, the record and the reports, a
SWE-bench-format instance with a ``module:function`` harness, mini-swe-agent with its deterministic model."""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

from artifacts.export import to_chat
from artifacts.trajectory import meta
from grove.client import Sandbox
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

CALC = "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n"
TESTS = ("import unittest\n\nfrom calc import add, mul\n\n\nclass TestCalc(unittest.TestCase):\n"
         "    def test_mul(self):\n        self.assertEqual(mul(2, 3), 6)\n")
NEW_TEST = "\n    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n"


def fix_even_attempts(task: dict[str, Any], sandbox: Sandbox) -> None:
    """A ``module:function`` harness: the right fix on even attempts, a no-op on odd ones."""
    source = sandbox.read_file(f"{task['workdir']}/calc.py").decode()
    if task["attempt"] % 2 == 0:
        sandbox.write_file(f"{task['workdir']}/calc.py", source.replace("a - b", "a + b"))


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def _instance(tmp_path: Path) -> Path:
    """A small repository at a base commit, and a SWE-bench line whose test patch adds the failing test."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "calc.py").write_text(CALC)
    (repo / "test_calc.py").write_text(TESTS)
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.email=t@example.com", "-c", "user.name=t", "commit", "-qm", "base")
    base = _git(repo, "rev-parse", "HEAD").strip()
    (repo / "test_calc.py").write_text(TESTS + NEW_TEST)
    patch = _git(repo, "diff")
    _git(repo, "checkout", "-q", "--", "test_calc.py")
    line = {"instance_id": "demo__calc-1", "repo": "demo/calc", "base_commit": base,
            "problem_statement": "add() subtracts instead of adding.", "test_patch": patch,
            "FAIL_TO_PASS": json.dumps(["test_add (test_calc.TestCalc.test_add)"]),
            "PASS_TO_PASS": ["test_mul (test_calc.TestCalc.test_mul)"], "image_name": "default", "files": "repo",
            # Not a repository the swebench package knows: the command and the parser of its output are named.
            "test_cmd": "python3 -m unittest -v test_calc", "log_parser": "parse_log_django",
            "resources": {"cpu": 0.5, "memory_mb": 256}}
    tasks = tmp_path / "swebench.jsonl"
    tasks.write_text(json.dumps(line) + "\n")
    return tasks


def test_a_swebench_instance_is_graded_by_its_test_patch(router: RouterProcess, tmp_path: Path) -> None:
    tasks = _instance(tmp_path)
    out = tmp_path / "run"
    summary = run(router, tasks, out, Policy(attempts=2), concurrency=2,
                  variants=[("tests.rollouts.test_runs:fix_even_attempts", "none")])
    lines = sorted(results(out), key=lambda r: r["attempt"])
    assert [(r["outcome"], r["reward"]) for r in lines] == [("pass", 1.0), ("fail", 0.0)], lines
    assert lines[0]["check"]["tests"] == {"FAIL_TO_PASS": {"test_add (test_calc.TestCalc.test_add)": "PASSED"},
                                          "PASS_TO_PASS": {"test_mul (test_calc.TestCalc.test_mul)": "PASSED"}}
    assert lines[1]["check"]["tests"]["FAIL_TO_PASS"] == {"test_add (test_calc.TestCalc.test_add)": "FAILED"}
    assert summary["variants"][0]["harness"] == "tests.rollouts.test_runs:fix_even_attempts"
    with router.client() as grove:
        record = grove.request("GET", f"/v1/trajectories/{lines[0]['trajectory_id']}")
        graded = [s for s in record["steps"] if s.get("kind") == "grading"]
        assert [g["data"]["status"] for g in graded] == ["started", "finished"]
        assert graded[1]["data"]["result"] == "pass" and graded[1]["data"]["mode"] == "isolated"
        # The test patch was applied where the grading ran: in the grader's own trajectory, not the agent's.
        grader = grove.request("GET", f"/v1/trajectories/{graded[1]['data']['grader']}")
    assert not any("apply" in str(s.get("command")) for s in record["steps"])
    assert any("git" in str(s.get("command")) and "apply" in str(s.get("command")) for s in grader["steps"])


def test_mini_swe_agent_with_its_deterministic_model(router: RouterProcess, tmp_path: Path) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl", ("easy", "impossible"), prefix="mini")
    out = tmp_path / "run"
    summary = run(router, tasks, out, Policy(attempts=1), concurrency=2, variants=[("mini-swe-agent", None)])
    lines = results(out)
    assert len(lines) == 2 and [r["outcome"] for r in lines] == ["pass", "fail"]
    assert all(r["reward"] == expected_reward(tasks, r["task"], r["attempt"]) for r in lines)
    assert all(r["commands"] == 6 and r["agent_error"] is None for r in lines), lines
    variant = summary["variants"][0]
    assert variant["harness"] == "mini-swe-agent" and variant["model"] == "deterministic"
    with router.client() as grove:
        record = grove.request("GET", f"/v1/trajectories/{lines[0]['trajectory_id']}")
    assert record["sandbox"]["harness"] == "mini-swe-agent" and record["sandbox"]["model"] == "deterministic"
    assert record["sandbox"]["harness_version"] == lines[0]["harness_version"] != ""


def test_variants_side_by_side_from_the_command_line(router: RouterProcess, tmp_path: Path) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl", ("easy", "impossible"), prefix="cmp")
    out = tmp_path / "run"
    done = router.cli("rollouts", "run", str(tasks), "--harness", "scripted", "--model", "ckpt-a", "--model",
                      "ckpt-b", "--attempts", "1", "--concurrency", "4", "--out", str(out), "--quiet", timeout=120)
    assert done.returncode == 0, done.stderr
    lines = results(out)
    assert sorted((r["model"], r["task"]) for r in lines) == [
        ("ckpt-a", "cmp-demo-000-mathops"), ("ckpt-a", "cmp-demo-001-seq"),
        ("ckpt-b", "cmp-demo-000-mathops"), ("ckpt-b", "cmp-demo-001-seq")]
    assert len({r["group_id"] for r in lines}) == 4
    # The report: one column per variant, on the same tasks; the CLI printed it and where the files went.
    assert b"| | scripted / ckpt-a | scripted / ckpt-b |" in done.stdout
    assert b"| cmp-demo-000-mathops | 1/1 | 1/1 |" in done.stdout and b"files in S3 under runs/" in done.stdout
    report = router.cli("rollouts", "report", str(out))
    assert report.returncode == 0 and report.stdout == (out / "report.md").read_bytes()


def test_reward_checks_and_broken_tasks_never_become_rewards(router: RouterProcess, tmp_path: Path) -> None:
    base = {"prompt": "p", "workdir": "/workspace", "resources": {"cpu": 0.5, "memory_mb": 128}}
    lines = [
        {**base, "id": "half", "check": {"reward": "echo scoring; echo 0.5"}},
        {**base, "id": "no-number", "check": {"reward": "echo n/a"}},
        {**base, "id": "bad-setup", "setup": ["exit 3"], "check": {"test": "true"}},
    ]
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "run"
    summary = run(router, tasks, out, Policy(attempts=1), concurrency=3, max_infra_retries=1)
    by_task = {r["task"]: r for r in results(out)}
    assert (by_task["half"]["outcome"], by_task["half"]["reward"]) == ("fail", 0.5)  # below pass_threshold 1.0
    for task, reason in (("no-number", "check_broken"), ("bad-setup", "setup_failed")):
        r = by_task[task]
        assert (r["outcome"], r["reward"], r["infra_errors"], r["tries"]) == ("infra_error", None, [reason] * 2, 2), r
    assert summary["lost_attempts"] == 2 and summary["variants"][0]["scored"] == 1
    assert summary["variants"][0]["pass_at_k"] == {"1": 0.0}
    assert not [g for g in (json.loads(x) for x in (out / "groups.jsonl").read_text().splitlines())
                if g["task"] != "half" and g["attempts"]]
