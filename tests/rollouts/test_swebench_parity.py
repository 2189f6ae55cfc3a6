"""grove grades SWE-bench instances exactly as the ``swebench`` package does, on real instances and recorded runs.

Each recorded run (tests/rollouts/data/swebench, with its sources) is framed by grove's own test command, as
grove's grader would read it; then grove's ``statuses`` + ``verdict`` and the package's ``get_eval_report``
(given a ``TestSpec`` the package builds from the dataset row itself) grade the same log.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
from swebench.harness.grading import get_eval_report, get_logs_eval, get_resolution_status
from swebench.harness.utils import make_test_spec

from grove.rollouts import swebench
from grove.rollouts.tasks import Task, load_tasks

pytestmark = pytest.mark.fast

DATA = Path(__file__).parent / "data" / "swebench"
EXPECTED = {
    "django__django-16950": "RESOLVED_FULL",
    "django__django-15902": "RESOLVED_NO",
    "sympy__sympy-14817": "RESOLVED_NO",
    "sympy__sympy-16988": "RESOLVED_PARTIAL",
    "pytest-dev__pytest-5227": "RESOLVED_FULL",
    "pylint-dev__pylint-4661": "RESOLVED_FULL",
    "astropy__astropy-12907": "RESOLVED_NO",
    "matplotlib__matplotlib-26020": "RESOLVED_NO",
    "mwaskom__seaborn-3190": "RESOLVED_NO",
}
"""What the package decides on each recorded run: pinned, so grove and the package cannot drift together."""


@pytest.fixture(scope="module")
def tasks() -> dict[str, Task]:
    """The real dataset rows, loaded by grove's task loader."""
    return {task.raw["instance_id"]: task for task in load_tasks(DATA / "instances.jsonl")}


def _sh(command: str) -> str:
    """Run ``command`` as the grader's exec runs a string (``/bin/sh -c``); its stdout, then its stderr."""
    done = subprocess.run(["/bin/sh", "-c", command], capture_output=True, timeout=120, check=False)
    return done.stdout.decode("utf-8", "replace") + "\n" + done.stderr.decode("utf-8", "replace")


def _grove_log(spec: dict[str, Any], recorded: Path) -> str:
    """The log grove's grader reads when the instance's test command prints ``recorded``: grove's own test
    command, with a stand-in printing the recorded output where the tests would run (the rest of the eval
    script needs the instance's image)."""
    return _sh(swebench.test_command({**spec, "eval_script": None, "test_cmd": f"cat {shlex.quote(str(recorded))}"}))


def _package_report(row: dict[str, Any], log: str, tmp_path: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """The package's report on ``log`` for the dataset row ``row``, and the statuses it read."""
    path = tmp_path / "test_output.txt"
    path.write_text(log)
    spec = make_test_spec(row)
    prediction = {"instance_id": row["instance_id"], "model_patch": "diff", "model_name_or_path": "grove"}
    report = get_eval_report(spec, prediction, str(path), include_tests_status=True)[row["instance_id"]]
    return report, get_logs_eval(spec, str(path))[0]


def _recorded(instance_id: str, suffix: str = ".txt") -> Path:
    return DATA / "logs" / f"{instance_id}{suffix}"


@pytest.mark.parametrize("instance_id", sorted(EXPECTED))
def test_grove_grades_a_recorded_run_as_the_package_does(tasks: dict[str, Task], instance_id: str,
                                                          tmp_path: Path) -> None:
    task = tasks[instance_id]
    spec = task.check.swebench
    assert spec is not None and spec["repo"] == task.raw["repo"] and spec["version"] == task.raw["version"]
    log = _grove_log(spec, _recorded(instance_id))
    found = swebench.statuses(spec, log)
    mine = swebench.verdict(found, spec["FAIL_TO_PASS"], spec["PASS_TO_PASS"], eval_type=spec["eval_type"])
    theirs, their_statuses = _package_report(task.raw, log, tmp_path)
    assert theirs["patch_successfully_applied"] and found, "the package read no test statuses from grove's log"
    assert found == their_statuses
    assert mine["passed"] == theirs["resolved"]
    assert mine["resolution"] == get_resolution_status(theirs["tests_status"]) == EXPECTED[instance_id]
    named = {*spec["FAIL_TO_PASS"], *spec["PASS_TO_PASS"]}
    counted = {*theirs["tests_status"]["FAIL_TO_PASS"]["success"], *theirs["tests_status"]["PASS_TO_PASS"]["success"]}
    assert set(mine["failing"]) == named - counted
    assert all(mine["FAIL_TO_PASS"][name] == found[name] for name in spec["FAIL_TO_PASS"] if name in found)


def test_a_log_the_harness_rejects_grove_rejects(tasks: dict[str, Task], tmp_path: Path) -> None:
    # The harness's own log of django__django-16950, from before it printed output markers: swebench 5 reads
    # no statuses from a log without them, and neither does grove; nor from a run's output without grove's frame.
    task = tasks["django__django-16950"]
    spec = task.check.swebench
    assert spec is not None
    for recorded in (_recorded("django__django-16950", ".harness.log"), _recorded("django__django-16950")):
        log = recorded.read_bytes().decode("utf-8")
        theirs, _ = _package_report(task.raw, log, tmp_path)
        assert swebench.statuses(spec, log) == {} and not theirs["patch_successfully_applied"]
        assert not swebench.verdict({}, spec["FAIL_TO_PASS"], spec["PASS_TO_PASS"])["passed"]


def test_a_run_that_fails_while_printing_passes_is_not_graded(tasks: dict[str, Task], tmp_path: Path) -> None:
    # Code under test can print PASSED lines of its own (a conftest hook); the harness cross-checks the test
    # command's exit code, which grove's test command records as the harness's does.
    task = tasks["pytest-dev__pytest-5227"]
    spec = task.check.swebench
    assert spec is not None
    printed = "".join(f"PASSED {name}\n" for name in [*spec["FAIL_TO_PASS"], *spec["PASS_TO_PASS"]])
    for exit_code, graded in ((0, True), (1, False)):
        stand_in = {**spec, "eval_script": None, "test_cmd": f"(printf %s {shlex.quote(printed)}; exit {exit_code})"}
        log = _sh(swebench.test_command(stand_in))
        assert f">>>>> Test Exit Code: {exit_code}" in log
        mine = swebench.verdict(swebench.statuses(spec, log), spec["FAIL_TO_PASS"], spec["PASS_TO_PASS"])
        theirs, _ = _package_report(task.raw, log, tmp_path)
        assert mine["passed"] is theirs["resolved"] is graded


@pytest.mark.parametrize("instance_id", sorted(EXPECTED))
def test_the_test_command_is_the_eval_script_less_the_graders_own_steps(tasks: dict[str, Task],
                                                                        instance_id: str) -> None:
    task = tasks[instance_id]
    spec = task.check.swebench
    assert spec is not None
    argv = shlex.split(swebench.test_command(spec))
    assert argv[:2] == ["/bin/bash", "-c"] and argv[3:] == ["2>&1"]
    ours = argv[2].split("\n")
    theirs = make_test_spec(task.raw).eval_script_list  # the lines the package's harness runs, in order
    assert ours[0] == "set -uxo pipefail" and _is_subsequence(ours[1:], theirs)
    left_out = list(theirs)
    for line in ours[1:]:
        left_out.remove(line)
    # Exactly the test-file resets and the heredoc applying the test patch: the grader does both itself.
    resets = [line for line in left_out if line.startswith(f"git checkout {spec['base_commit']} ")]
    heredoc = [line for line in left_out if line not in resets]
    assert len(resets) == 2 and heredoc[0].startswith("git apply") and heredoc[-1] in heredoc[0]
    assert "\n".join(heredoc[1:-1]).strip() == spec["test_patch"].strip()
    start = ours.index(": '>>>>> Start Test Output'")
    assert ours[start + 1] == theirs[theirs.index(": '>>>>> Start Test Output'") + 1]  # the repository's test command


def test_a_test_cmd_replaces_only_the_test_command(tasks: dict[str, Task]) -> None:
    spec = tasks["django__django-15902"].check.swebench
    assert spec is not None
    plain = shlex.split(swebench.test_command(spec))[2].split("\n")
    ours = shlex.split(swebench.test_command({**spec, "test_cmd": "./tests/runtests.py forms_tests"}))[2].split("\n")
    start = plain.index(": '>>>>> Start Test Output'")
    assert ours[start + 1] == "./tests/runtests.py forms_tests" and plain[start + 1].startswith("./tests/runtests.py ")
    assert ours[:start + 1] == plain[:start + 1] and ours[start + 2:] == plain[start + 2:]


def test_an_older_row_takes_its_parser_from_the_package_and_needs_a_test_cmd(tmp_path: Path) -> None:
    row = json.loads((DATA / "instances.jsonl").read_text().splitlines()[0])
    old = {k: v for k, v in row.items() if k not in ("eval_script", "log_parser", "eval_type")}
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps({**old, "test_cmd": "./tests/runtests.py --verbosity 2 model_formsets.test_uuid"}))
    spec = load_tasks(path)[0].check.swebench
    assert spec is not None and (spec["log_parser"], spec["eval_type"]) == ("parse_log_django", "pass_and_fail")
    log = _grove_log(spec, _recorded(row["instance_id"]))
    assert swebench.verdict(swebench.statuses(spec, log), spec["FAIL_TO_PASS"], spec["PASS_TO_PASS"])["passed"]


def _is_subsequence(short: list[str], long: list[str]) -> bool:
    rest = iter(long)
    return all(any(item == other for other in rest) for item in short)
