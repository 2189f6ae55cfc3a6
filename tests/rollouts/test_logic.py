"""Pure logic of rollouts: pass@k, BAR and fixed sampling decisions, advantages, task files, SWE-bench parsing."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from grove.rollouts.metrics import advantages, informative, ks_for, mean_pass_at_k, pass_at_k
from grove.rollouts.sampling import Policy, Sampler
from grove.rollouts.scripted import draws_right
from grove.rollouts.swebench import patched_files, read_test_statuses, verdict
from grove.rollouts.tasks import TaskFileError, load_tasks

pytestmark = pytest.mark.fast


def test_pass_at_k_matches_the_binomial_definition() -> None:
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = 1 - math.comb(n - c, k) / math.comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(exact)
    assert pass_at_k(4, 0, 2) == 0.0 and pass_at_k(4, 4, 1) == 1.0
    assert mean_pass_at_k([(4, 2), (2, 0)], 1) == pytest.approx(0.25)
    assert mean_pass_at_k([(4, 2), (2, 0)], 4) == pytest.approx(1 - 1 / math.comb(4, 4) * 0)  # only the n=4 group
    assert mean_pass_at_k([(2, 1)], 3) is None
    assert ks_for(6) == [1, 2, 4, 6] and ks_for(1) == [1]
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


def test_advantages_are_group_relative() -> None:
    assert advantages([1.0, 0.0, 1.0, 0.0]) == [1.0, -1.0, 1.0, -1.0]
    assert advantages([1.0, 1.0]) == [0.0, 0.0]
    assert advantages([0.5, 0.0, 1.0], normalize=False) == [0.0, -0.5, 0.5]
    assert informative([0.0, 1.0]) and not informative([1.0, 1.0]) and not informative([1.0])


def _drive(sampler: Sampler, outcome: dict[str, list[float]], capacity: int = 100) -> dict[str, int]:
    """Run the sampler to the end with known per-task rewards; how many attempts each task got."""
    used: dict[str, int] = {}
    while not sampler.done():
        plan = sampler.next(capacity)
        assert plan, "the sampler stalled"
        for (variant, task), attempt in plan:
            used[task] = used.get(task, 0) + 1
            sampler.finished((variant, task), attempt, outcome[task][attempt])
    return used


def test_bar_stops_easy_and_impossible_tasks_after_one_stage() -> None:
    rewards = {"easy": [1.0] * 8, "impossible": [0.0] * 8, "medium": [1, 1, 0, 1, 0, 0, 1, 1],
               "late": [0, 0, 0, 0, 0, 1, 0, 0]}
    sampler = Sampler(Policy(bar_max=8, bar_step=2), [(0, t) for t in rewards])
    used = _drive(sampler, {k: [float(x) for x in v] for k, v in rewards.items()}, capacity=3)
    # Unanimous after two stages (the default patience): filtered; split: stop at once.
    assert used == {"easy": 4, "impossible": 4, "medium": 4, "late": 4}
    late = Sampler(Policy(bar_max=8, bar_step=2, bar_patience=6), [(0, "late")])
    assert _drive(late, {"late": [0.0] * 5 + [1.0, 0.0, 0.0]}) == {"late": 6}
    assert late.status((0, "late")) == "informative"
    assert sampler.status((0, "easy")) == "uninformative" and sampler.status((0, "medium")) == "informative"


def test_bar_spends_the_whole_budget_on_a_group_that_never_splits() -> None:
    sampler = Sampler(Policy(bar_max=5, bar_step=2, bar_patience=10), [(0, "hard")])
    # Patient: stages of 2 until the budget, the last one short: 2 + 2 + 1.
    assert _drive(sampler, {"hard": [0.0] * 5}) == {"hard": 5}


def test_fixed_groups_and_target_groups() -> None:
    outcome = {f"t{i}": [1.0, 0.0, 1.0] if i % 2 else [0.0, 0.0, 0.0] for i in range(10)}
    assert _drive(Sampler(Policy(attempts=3), [(0, t) for t in outcome]), outcome) == {t: 3 for t in outcome}
    # Two informative groups wanted: tasks start one by one (capacity 3 = one group) and stop at the second.
    targeted = Sampler(Policy(attempts=3, target_groups=2), [(0, t) for t in outcome])
    used = _drive(targeted, outcome, capacity=3)
    assert used == {"t0": 3, "t1": 3, "t2": 3, "t3": 3}
    assert targeted.informative_count() == 2


def test_sampler_resumes_to_the_same_decisions() -> None:
    rewards = {"a": [1.0, 1.0, 0.0, 0.0], "b": [0.0, 1.0, 0.0, 0.0]}
    first = Sampler(Policy(bar_max=4, bar_step=2), [(0, t) for t in rewards])
    plan = first.next(10)
    assert plan == [((0, "a"), 0), ((0, "a"), 1), ((0, "b"), 0), ((0, "b"), 1)]
    # A new sampler fed from a journal: a finished 'a' stage and one attempt of 'b' in flight when it died.
    again = Sampler(Policy(bar_max=4, bar_step=2), [(0, t) for t in rewards])
    for attempt in (0, 1):
        again.launched((0, "a"), attempt)
        again.finished((0, "a"), attempt, rewards["a"][attempt])
    again.launched((0, "b"), 0)
    again.launched((0, "b"), 1)
    again.finished((0, "b"), 0, 0.0)
    assert again.next(10) == [((0, "a"), 2), ((0, "a"), 3)]  # b's stage waits for its lost attempt's rerun
    again.finished((0, "b"), 1, 1.0)
    assert again.next(10) == [] and again.status((0, "b")) == "informative"


def test_policy_needs_exactly_one_mode() -> None:
    for bad in ({}, {"attempts": 2, "bar_max": 4}, {"bar_max": 4, "bar_step": 0}, {"attempts": 2, "target_groups": 0}):
        with pytest.raises(ValueError):
            Policy(**bad)  # type: ignore[arg-type]


def test_scripted_draws_are_deterministic_and_biased() -> None:
    assert draws_right("t", 3, 0.5) == draws_right("t", 3, 0.5)
    share = sum(draws_right("t", i, 0.3) for i in range(2000)) / 2000
    assert 0.25 < share < 0.35
    assert not any(draws_right("t", i, 0.0) for i in range(50)) and all(draws_right("t", i, 1.0) for i in range(50))


def _write(tmp_path: Path, *lines: object) -> Path:
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return path


GOOD = {"id": "t1", "prompt": "fix it", "check": {"test": "true"}}


@pytest.mark.parametrize(("line", "expected"), [
    ({**GOOD, "check": {"test": "true", "reward": "echo 1"}}, "line 2: field 'check' needs exactly one"),
    ({**GOOD, "timeout_s": "soon"}, "line 2: field 'timeout_s' must be a non-negative number"),
    ({**GOOD, "id": "bad id"}, "line 2: field 'id'"),
    ({**GOOD, "resources": {"gpu": 1}}, "line 2: field 'resources.gpu' is unknown"),
    ({**GOOD, "labels": {"k": 1}}, "line 2: field 'labels.k' must be a string"),
    ({**GOOD, "promt": "x"}, "line 2: field 'promt' is unknown"),
    ({"id": "t2", "check": {"test": "true"}}, "line 2: field 'prompt' is required"),
    ({**GOOD, "files": "nowhere/"}, "line 2: field 'files' names"),
    ('{"id": "t2", ', "line 2: not valid JSON"),
    (GOOD, "line 2: field 'id': 't1' is already used at"),
])
def test_a_bad_task_file_names_line_and_field(tmp_path: Path, line: object, expected: str) -> None:
    path = _write(tmp_path, GOOD, line)
    with pytest.raises(TaskFileError) as info:
        load_tasks(path)
    assert expected in info.value.message and str(path) in info.value.message, info.value.message


def test_task_files_and_swebench_lines_load(tmp_path: Path) -> None:
    (tmp_path / "repo").mkdir()
    swe = {"instance_id": "org__repo-1", "repo": "org/repo", "base_commit": "abc", "problem_statement": "broken",
           "test_patch": "diff --git a/t.py b/t.py\n", "FAIL_TO_PASS": '["test_a (t.T)"]', "PASS_TO_PASS": [],
           "image_name": "default", "files": "repo"}
    tasks = load_tasks(_write(tmp_path, "# a comment", GOOD, "", swe))
    assert [t.id for t in tasks] == ["t1", "org__repo-1"]
    assert tasks[1].check.swebench is not None and tasks[1].check.swebench["FAIL_TO_PASS"] == ["test_a (t.T)"]
    assert tasks[1].workdir == "/testbed" and tasks[1].files == str((tmp_path / "repo").resolve())
    with pytest.raises(TaskFileError, match="field 'image' is required"):
        load_tasks(_write(tmp_path, {k: v for k, v in swe.items() if k != "image_name"}))


def test_statuses_read_from_pytest_and_unittest_output() -> None:
    out = ("test_a (t.T.test_a) ... ok\ntest_b (t.T.test_b) ... FAIL\n"
           "PASSED tests/test_x.py::test_one\nFAILED tests/test_x.py::test_two - assert 0\n")
    statuses = read_test_statuses(out)
    assert statuses["test_a (t.T)"] == "ok" and statuses["t.T.test_b"] == "FAIL"
    assert statuses["tests/test_x.py::test_one"] == "PASSED" and statuses["tests/test_x.py::test_two"] == "FAILED"
    assert verdict(statuses, ["test_a (t.T)"], ["tests/test_x.py::test_one"])["passed"]
    bad = verdict(statuses, ["test_b (t.T)", "test_c (t.T)"], [])
    assert not bad["passed"] and bad["failing"] == {"test_b (t.T)": "FAIL", "test_c (t.T)": "missing"}
    assert patched_files("diff --git a/x.py b/x.py\n+1\ndiff --git a/y/z.py b/y/z.py\n") == ["x.py", "y/z.py"]


def test_one_runner_per_run_directory(tmp_path: Path) -> None:
    from grove.core.errors import Conflict
    from grove.rollouts.journal import Journal

    first = Journal(tmp_path)
    try:
        with pytest.raises(Conflict, match="another runner"):
            Journal(tmp_path)
    finally:
        first.close()
    Journal(tmp_path).close()  # free again once the first let go
