"""Grading: the task's check, run where the agent cannot reach it, recorded as grading and never as the agent's.

Two modes (``check.grading``):

- ``isolated`` (the default): the agent's changes to the workdir (:mod:`grove.rollouts.changes`) are applied
  to a fresh sandbox made from the task — its files in, its setup run again — with the task's protected paths
  left as the task has them; the check runs there (:mod:`grove.rollouts.isolated`). Nothing the agent left
  outside the workdir (site-packages, ``.pth`` files, shims on ``PATH``, ``/tmp``, ``~``), no process it left
  running, and none of its ``.git`` or ``__pycache__`` reach the check.
- ``in-place``: for tasks whose outcome is live state (a site's database, a service's mailbox): the check runs
  in the agent's own sandbox, its files written only once the agent has stopped and its processes are gone.

Either way the check runs with :data:`CHECK_ENV` (no user site-packages, no pytest plugins loaded by entry
point, no bytecode written, git without hooks or fsmonitor) and without stale ``__pycache__``; a task that
names its tests (``check.tests``; SWE-bench's FAIL_TO_PASS/PASS_TO_PASS) is decided by those tests' own
statuses, not by the exit code. The agent's trajectory gets ``grading`` events around the verdict (the
grader's steps are in the grader's own trajectory); the SFT export leaves them out of the messages.

A check that cannot give a verdict (a reward command printing no number) is a broken environment, not a
failed policy: :class:`BrokenCheck`, reported as an infrastructure fault and never scored.
"""

from __future__ import annotations

import math
import posixpath
from dataclasses import dataclass, field
from typing import Any

from grove.client import AsyncSandbox
from grove.core.api import MAX_OUTPUT_BYTES
from grove.rollouts import swebench, testlog
from grove.rollouts.harnesses import InfraFault
from grove.rollouts.services import stop_script
from grove.rollouts.tasks import Task

_TICKS = 100  # USER_HZ on Linux
_PATCH = "/tmp/.grove-test.patch"
CHECK_ENV = {
    "PYTHONNOUSERSITE": "1",
    "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
    "GIT_CONFIG_COUNT": "2",
    "GIT_CONFIG_KEY_0": "core.hooksPath",
    "GIT_CONFIG_VALUE_0": "/dev/null",
    "GIT_CONFIG_KEY_1": "core.fsmonitor",
    "GIT_CONFIG_VALUE_1": "false",
}
"""What every check runs with: no user site-packages, no entry-point pytest plugins, no bytecode, git without hooks."""
SWEBENCH_ENV = {k: v for k, v in CHECK_ENV.items() if k != "PYTEST_DISABLE_PLUGIN_AUTOLOAD"}
"""A SWE-bench instance's check: as the reference harness, whose repositories load pytest plugins by entry point."""
_NO_PYCACHE = "find . -name __pycache__ -type d -prune -exec rm -rf {} + 2>/dev/null; true"


class BrokenCheck(InfraFault):
    """The check ran but gave no verdict."""

    code = "check_broken"


@dataclass
class Grade:
    """The verdict of one attempt."""

    passed: bool
    reward: float
    detail: dict[str, Any] = field(default_factory=dict)
    cpu_s: float | None = None
    mode: str = "isolated"


async def run_check(sandbox: AsyncSandbox, task: Task) -> Grade:
    """Write the check's files and run the check in ``sandbox`` (whose workdir holds what is to be graded)."""
    check = task.check
    for path, content in check.files.items():
        await sandbox.write_file(posixpath.join(task.workdir, path), content)
    await sandbox.exec(["/bin/sh", "-c", _NO_PYCACHE], cwd=task.workdir, timeout_s=120)
    if check.swebench is not None:
        return await _swebench(sandbox, task, check.swebench)
    command = check.test or check.reward or ""
    result = await sandbox.exec(command, cwd=task.workdir, timeout_s=check.timeout_s, env=CHECK_ENV)
    detail: dict[str, Any] = {"exit_code": result.exit_code, "timed_out": result.timed_out}
    if check.tests:
        passed, named = testlog.named_verdict(testlog.statuses(result.text + "\n" + _err(result.stderr)), check.tests)
        return Grade(passed, 1.0 if passed else 0.0, {**detail, "tests": named})
    if check.test is not None:
        return Grade(result.ok, 1.0 if result.ok else 0.0, detail)
    reward = _last_number(result.text)
    if reward is None:
        raise BrokenCheck(f"the reward command {command!r} printed no number "
                          f"(exit code {result.exit_code}{', timed out' if result.timed_out else ''})")
    if not math.isfinite(reward):
        # The check gave a verdict, a meaningless one: the attempt failed, and says why.
        return Grade(False, 0.0, {**detail, "reason": f"the reward command printed {reward}, not a finite number: "
                                                      "scored as a fail with reward 0"})
    return Grade(reward >= check.pass_threshold, reward, detail)


async def _swebench(sandbox: AsyncSandbox, task: Task, spec: dict[str, Any]) -> Grade:
    """As the reference harness: the files the test patch touches reset to the base commit, the test patch applied,
    the repository's own test command run, the named tests read by the repository's own log parser."""
    workdir, base = task.workdir, spec["base_commit"]
    await sandbox.write_file(_PATCH, spec["test_patch"])
    git = ["git", "-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false"]
    for name in swebench.patched_files(spec["test_patch"]):
        # Files the patch creates do not exist at the base commit: checkout of those fails, which is fine.
        await sandbox.exec([*git, "checkout", "-q", base, "--", name], cwd=workdir, timeout_s=60, env=CHECK_ENV)
    applied = await sandbox.exec([*git, "apply", "-v", _PATCH], cwd=workdir, timeout_s=60, env=CHECK_ENV)
    if not applied.ok:
        raise BrokenCheck(f"the test patch does not apply at {base}: {_err(applied.stderr)[-500:]}")
    # As the reference harness runs it: its plugins load as the repository's configuration expects (astropy's
    # setup.cfg takes options of pytest-astropy's), and the whole log is read (an install step's output must not
    # push the end marker out of it).
    run = await sandbox.exec(swebench.test_command(spec), cwd=workdir, timeout_s=task.check.timeout_s,
                             env=SWEBENCH_ENV, max_output_bytes=MAX_OUTPUT_BYTES)
    statuses = swebench.statuses(spec, run.text + "\n" + _err(run.stderr))
    verdict = swebench.verdict(statuses, spec["FAIL_TO_PASS"], spec["PASS_TO_PASS"], eval_type=spec["eval_type"])
    detail = {"tests": {"FAIL_TO_PASS": verdict["FAIL_TO_PASS"], "PASS_TO_PASS": verdict["PASS_TO_PASS"]},
              "exit_code": run.exit_code, "timed_out": run.timed_out}
    return Grade(bool(verdict["passed"]), 1.0 if verdict["passed"] else 0.0, detail)


async def stop_processes(sandbox: AsyncSandbox, spared: list[int] | None = None) -> None:
    """End every process in the sandbox but its executor and the task's services (``spared``: their pids) — the
    agent's turn is over: nothing it left running changes the workdir while it is read, or answers the check."""
    script = stop_script(spared) if spared else "kill -9 -1 2>/dev/null; true"
    await sandbox.exec(["/bin/sh", "-c", script], timeout_s=30)


async def cpu_seconds(sandbox: AsyncSandbox) -> float | None:
    """CPU time of the sandbox's processes so far (those alive and the children they reaped), from /proc."""
    result = await sandbox.exec(["/bin/sh", "-c", "cat /proc/[0-9]*/stat 2>/dev/null"], timeout_s=30)
    total = 0
    for line in result.text.splitlines():
        fields = line.rpartition(")")[2].split()  # after the command name, which may hold spaces
        try:
            total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
        except ValueError:
            return None
    return round(total / _TICKS, 2) if result.ok else None


def _err(data: bytes) -> str:
    return data.decode("utf-8", "replace")


def _last_number(text: str) -> float | None:
    for line in reversed(text.strip().splitlines()):
        try:
            return float(line.strip())
        except ValueError:
            return None
    return None
