"""Pure logic of rollouts: pass@k, BAR and fixed sampling decisions, advantages, task files, SWE-bench parsing."""

from __future__ import annotations

import json
import math
import shlex
import subprocess
from pathlib import Path

import pytest

from grove.rollouts import swebench
from grove.rollouts.metrics import advantages, informative, ks_for, mean_pass_at_k, pass_at_k
from grove.rollouts.sampling import Policy, Sampler
from grove.rollouts.scripted import draws_right
from grove.rollouts.tasks import TaskFileError, load_tasks, parse_task

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


SWE = {"instance_id": "org__repo-1", "repo": "org/repo", "version": "1.0", "base_commit": "abc",
       "problem_statement": "broken", "test_patch": "diff --git a/t.py b/t.py\n",
       "FAIL_TO_PASS": '["test_a (t.T.test_a)"]', "PASS_TO_PASS": [], "image_name": "default",
       "test_cmd": "python3 -m unittest -v t", "log_parser": "parse_log_django"}


def test_task_files_and_swebench_lines_load(tmp_path: Path) -> None:
    (tmp_path / "repo").mkdir()
    tasks = load_tasks(_write(tmp_path, "# a comment", GOOD, "", {**SWE, "files": "repo"}))
    assert [t.id for t in tasks] == ["t1", "org__repo-1"]
    spec = tasks[1].check.swebench
    assert spec is not None and spec["FAIL_TO_PASS"] == ["test_a (t.T.test_a)"]
    assert (spec["repo"], spec["version"], spec["log_parser"], spec["eval_type"]) == \
        ("org/repo", "1.0", "parse_log_django", "pass_and_fail")
    assert tasks[1].workdir == "/testbed" and tasks[1].files == str((tmp_path / "repo").resolve())
    # A repository the package knows needs no parser named: the package's own is taken.
    known = load_tasks(_write(tmp_path, {**SWE, "repo": "sympy/sympy", "log_parser": None}))[0].check.swebench
    assert known is not None and known["log_parser"] == "parse_log_sympy"


@pytest.mark.parametrize(("change", "expected"), [
    ({"image_name": None}, "line 1: field 'image' is required"),
    ({"test_cmd": None}, "line 1: field 'eval_script' is required, or 'test_cmd'"),
    ({"log_parser": None}, "line 1: field 'log_parser' is required: swebench 5.0.2 has no log parser for repo"),
    ({"log_parser": "parse_log_nose"}, "line 1: field 'log_parser': 'parse_log_nose' is not a parser of swebench"),
    ({"eval_type": "strict"}, "line 1: field 'eval_type' must be one of pass_and_fail, fail_only"),
    ({"version": 3.1}, "line 1: field 'version' must be a string"),
    ({"FAIL_TO_PASS": "[]"}, "line 1: field 'FAIL_TO_PASS' must name at least one test"),
    ({"eval_script": "cd /testbed\n: '>>>>> Start Test Output'\npytest\n: '>>>>> End Test Output'\n"},
     "line 1: field 'eval_script' has 0 steps applying a patch from a heredoc"),
    ({"eval_script": "git apply -v - <<'EOF_1'\ndiff\nEOF_1\npytest\n"},
     "line 1: field 'eval_script' has no : '>>>>> Start Test Output' ... : '>>>>> End Test Output' pair"),
])
def test_a_bad_swebench_line_names_line_and_field(tmp_path: Path, change: dict[str, object], expected: str) -> None:
    line = {k: v for k, v in {**SWE, **change}.items() if v is not None}
    path = _write(tmp_path, line)
    with pytest.raises(TaskFileError) as info:
        load_tasks(path)
    assert expected in info.value.message and str(path) in info.value.message, info.value.message


def _graded_log(tmp_path: Path, parser: str, printed: str) -> tuple[dict[str, object], str]:
    """A spec reading ``parser``'s format, and the log of grove's test command for it when the tests print
    ``printed``."""
    (tmp_path / "printed.txt").write_text(printed)
    line = {**SWE, "log_parser": parser, "test_cmd": f"cat {shlex.quote(str(tmp_path / 'printed.txt'))}"}
    spec = parse_task(line, "line 1", base=Path.cwd()).check.swebench
    assert spec is not None
    done = subprocess.run(["/bin/sh", "-c", swebench.test_command(spec)], capture_output=True, timeout=60, check=False)
    return spec, done.stdout.decode() + "\n" + done.stderr.decode()


def test_swebench_statuses_are_read_by_the_repositorys_own_parser(tmp_path: Path) -> None:
    spec, log = _graded_log(tmp_path, "parse_log_django", "test_a (t.T.test_a) ... ok\ntest_b (t.T.test_b) ... FAIL\n")
    assert swebench.statuses(spec, log) == {"test_a (t.T.test_a)": "PASSED", "test_b (t.T.test_b)": "FAILED"}
    spec, log = _graded_log(tmp_path, "parse_log_pytest",
                            "PASSED tests/test_x.py::test_one\nFAILED tests/test_x.py::test_two - assert 0\n")
    assert swebench.statuses(spec, log) == {"tests/test_x.py::test_one": "PASSED",
                                            "tests/test_x.py::test_two": "FAILED"}
    # The same lines outside the harness's markers are no run at all.
    assert swebench.statuses(spec, "PASSED tests/test_x.py::test_one\n") == {}


def test_swebench_verdicts_decide_as_the_package_does() -> None:
    found = {"a": "PASSED", "b": "FAILED", "s": "SKIPPED", "x": "XFAIL", "t[p1-long]": "PASSED"}
    assert swebench.verdict(found, ["a", "x"], ["s"])["passed"]  # a skipped PASS_TO_PASS test is no regression
    bad = swebench.verdict(found, ["b", "s", "c"], ["a"])
    assert not bad["passed"] and bad["resolution"] == "RESOLVED_NO"
    assert bad["failing"] == {"b": "FAILED", "s": "SKIPPED", "c": "missing"}  # skipped FAIL_TO_PASS: not resolved
    partial = swebench.verdict(found, ["a", "b"], [])
    assert not partial["passed"] and partial["resolution"] == "RESOLVED_PARTIAL"
    # An id the dataset truncated mid-parameter matches by prefix (SWE-bench issue #290).
    assert swebench.verdict(found, ["t[p1-lo"], [])["FAIL_TO_PASS"] == {"t[p1-lo": "PASSED"}
    # fail_only repositories' parsers report failures only: a test not reported did not fail.
    assert swebench.verdict(found, ["c"], ["a"], eval_type="fail_only")["passed"]
    assert not swebench.verdict(found, ["b"], [], eval_type="fail_only")["passed"]
    assert swebench.patched_files("diff --git a/x.py b/x.py\n+1\ndiff --git a/y/z.py b/y/z.py\n") == ["x.py", "y/z.py"]


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
