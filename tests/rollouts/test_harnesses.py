"""Harnesses on real sandboxes: a SWE-bench-format instance with a ``module:function`` harness, and
mini-swe-agent's real agent loop with its deterministic model."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from grove.client import Sandbox
from grove.rollouts import Policy
from tests.rollouts.runs import expected_reward, results, run, write_tasks
from tests.support.router_fixtures import RouterProcess

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
            "FAIL_TO_PASS": json.dumps(["test_add (test_calc.TestCalc)"]),
            "PASS_TO_PASS": ["test_mul (test_calc.TestCalc)"], "image_name": "default", "files": "repo",
            "test_cmd": "python3 -m unittest -v test_calc", "resources": {"cpu": 0.5, "memory_mb": 256}}
    tasks = tmp_path / "swebench.jsonl"
    tasks.write_text(json.dumps(line) + "\n")
    return tasks


def test_a_swebench_instance_is_graded_by_its_test_patch(router: RouterProcess, tmp_path: Path) -> None:
    tasks = _instance(tmp_path)
    out = tmp_path / "run"
    summary = run(router, tasks, out, Policy(attempts=2), concurrency=2,
                  variants=[("tests.rollouts.test_harnesses:fix_even_attempts", "none")])
    lines = sorted(results(out), key=lambda r: r["attempt"])
    assert [(r["outcome"], r["reward"]) for r in lines] == [("pass", 1.0), ("fail", 0.0)], lines
    assert lines[0]["check"]["tests"] == {"FAIL_TO_PASS": {"test_add (test_calc.TestCalc)": "ok"},
                                          "PASS_TO_PASS": {"test_mul (test_calc.TestCalc)": "ok"}}
    assert lines[1]["check"]["tests"]["FAIL_TO_PASS"] == {"test_add (test_calc.TestCalc)": "FAIL"}
    assert summary["variants"][0]["harness"] == "tests.rollouts.test_harnesses:fix_even_attempts"
    with router.client() as grove:
        record = grove.request("GET", f"/v1/trajectories/{lines[0]['trajectory_id']}")
    graded = [s for s in record["steps"] if s.get("kind") == "grading"]
    assert [g["data"]["status"] for g in graded] == ["started", "finished"]
    assert graded[1]["data"]["result"] == "pass"
    assert any("git" in str(s.get("command")) and "apply" in str(s.get("command")) for s in record["steps"])


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
