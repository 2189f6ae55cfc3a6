"""Faults of the harness are their own outcome (issue 31): never scored, said at once, and a run of them stops.

Before: ``--harness badharness:boom`` (its function raises KeyError) completed silently with pass@1 0.000 and
"Infrastructure faults: None"; the traceback was only in results.jsonl. Every such attempt poisons a training
batch with a false zero. Also here: the policy's own failures (:class:`PolicyError`) stay scored, and a task set
naming an image the router does not have is refused before the first attempt.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from grove.client import Sandbox
from grove.core.errors import Invalid
from grove.rollouts import Policy, PolicyError
from grove.rollouts.journal import read_journal
from grove.rollouts.runner import HarnessBroken
from tests.rollouts.runs import results, run
from tests.support.router_fixtures import RouterProcess

BASE = {"prompt": "p", "workdir": "/workspace", "resources": {"cpu": 0.5, "memory_mb": 128},
        "files": {"answer.txt": "wrong\n"}, "check": {"test": "grep -q right answer.txt"}}


def boom(task: dict[str, Any], sandbox: Sandbox) -> None:
    """A harness with a bug of its own."""
    sandbox.exec("true")
    raise KeyError("model_output")


def unparseable(task: dict[str, Any], sandbox: Sandbox) -> None:
    """A policy whose answer cannot be parsed: its failure, scored."""
    raise PolicyError("the model's answer had no tool call")


def right_then_boom(task: dict[str, Any], sandbox: Sandbox) -> None:
    """Right on even attempts, a harness bug on odd ones."""
    if task["attempt"] % 2:
        raise RuntimeError("harness bug")
    sandbox.write_file("/workspace/answer.txt", "right\n")


def _tasks(tmp_path: Path, *ids: str, image: str = "default") -> Path:
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps({**BASE, "id": i, "image": image}) + "\n" for i in ids))
    return path


def test_a_raising_harness_is_harness_error_never_scored(router: RouterProcess, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    summary = run(router, _tasks(tmp_path, "a"), out, Policy(attempts=4), concurrency=2,
                  variants=[("tests.rollouts.test_harness_errors:right_then_boom", None)])
    by_attempt = {r["attempt"]: r for r in results(out)}
    for attempt in (1, 3):
        r = by_attempt[attempt]
        assert (r["outcome"], r["reward"]) == ("harness_error", None), r
        assert "RuntimeError: harness bug" in r["harness_error"]["error"]
        assert "Traceback" in r["harness_error"]["traceback"] and "right_then_boom" in r["harness_error"]["traceback"]
    assert [by_attempt[a]["outcome"] for a in (0, 2)] == ["pass", "pass"]
    # Never scored: pass@1 is 1.0 over the two scored attempts, not 0.5 over four.
    variant = summary["variants"][0]
    assert variant["scored"] == 2 and variant["pass_at_k"]["1"] == 1.0
    assert summary["harness_errors"] == 2 and summary["lost_attempts"] == 0
    report = (out / "report.md").read_text()
    assert "## Harness errors" in report and "RuntimeError: harness bug" in report
    # Said on stderr as it happened.
    assert capsys.readouterr().err.count("harness error in a attempt") == 2
    # In the trajectory.
    with router.client() as grove:
        record = grove.request("GET", f"/v1/trajectories/{by_attempt[1]['trajectory_id']}")
    events = [s for s in record["steps"] if s.get("kind") == "harness_error"]
    assert len(events) == 1 and "Traceback" in events[0]["data"]["traceback"]
    # `grove rollouts status` counts them too.
    status = router.cli("rollouts", "status", str(out))
    assert status.returncode == 0 and "harness errors: 2" in status.stdout.decode(), status.stdout.decode()


def test_a_policy_error_is_the_policys_and_scored(router: RouterProcess, tmp_path: Path) -> None:
    out = tmp_path / "run"
    summary = run(router, _tasks(tmp_path, "p"), out, Policy(attempts=1),
                  variants=[("tests.rollouts.test_harness_errors:unparseable", None)])
    (r,) = results(out)
    assert (r["outcome"], r["reward"]) == ("fail", 0.0) and "PolicyError" in r["agent_error"], r
    assert summary["variants"][0]["scored"] == 1 and summary["harness_errors"] == 0


def test_a_run_of_failing_harnesses_stops_early(router: RouterProcess, tmp_path: Path) -> None:
    out = tmp_path / "run"
    with pytest.raises(HarnessBroken, match="raised on 3 attempts in a row") as caught:
        run(router, _tasks(tmp_path, *[f"t{i}" for i in range(6)]), out, Policy(attempts=2), concurrency=1,
            max_harness_errors=3, variants=[("tests.rollouts.test_harness_errors:boom", None)])
    assert "KeyError: 'model_output'" in str(caught.value)
    done = read_journal(out).done
    assert len(done) == 3, "the run went on after the harness had failed three times in a row"
    assert (out / "report.md").exists() and "## Harness errors" in (out / "report.md").read_text()
    with router.client() as grove:
        assert grove.list({"run_id": json.loads((out / "run.json").read_text())["run_id"]}) == []


def test_a_missing_image_is_refused_before_the_first_attempt(router: RouterProcess, tmp_path: Path) -> None:
    out = tmp_path / "run"
    with pytest.raises(Invalid) as caught:
        run(router, _tasks(tmp_path, "x", "y", image="pyimgg"), out, Policy(attempts=2))
    message = str(caught.value)
    assert "x, y" in message and "'pyimgg'" in message and "known images: " in message and "default" in message
    assert not (out / "journal.jsonl").exists() or read_journal(out).tries == {}, "an attempt started"
