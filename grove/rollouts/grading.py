"""Grading: the task's check, run after the agent is done, recorded as grading and never as the agent's.

The trajectory gets ``{"kind": "grading", "data": {"status": "started"}}`` before the first grading call
and ``{"kind": "grading", "data": {"status": "finished", "result", "reward", ...}}`` after the last, so
every step between them is known to be the grader's: the SFT export leaves them out of the messages
(a model must not learn to run graders it will never have). The ``result`` event sets the outcome.

A check that cannot give a verdict (a reward command printing no number) is a broken environment, not a
failed policy: :class:`BrokenCheck`, reported as an infrastructure fault and never scored.
"""

from __future__ import annotations

import math
import posixpath
from dataclasses import dataclass, field
from typing import Any

from grove.client import AsyncSandbox
from grove.rollouts import swebench
from grove.rollouts.harnesses import InfraFault
from grove.rollouts.tasks import Task

_TICKS = 100  # USER_HZ on Linux
_PATCH = "/tmp/.grove-test.patch"


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


async def grade(sandbox: AsyncSandbox, task: Task) -> Grade:
    """Run the check of ``task`` in ``sandbox`` (the agent has finished), bracketed as grading."""
    await sandbox.post_event("grading", {"status": "started", "task_id": task.id})
    cpu = await cpu_seconds(sandbox)
    check = task.check
    for path, content in check.files.items():
        await sandbox.write_file(posixpath.join(task.workdir, path), content)
    if check.swebench is not None:
        verdict = await _swebench(sandbox, task, check.swebench)
    else:
        command = check.test or check.reward or ""
        result = await sandbox.exec(command, cwd=task.workdir, timeout_s=check.timeout_s)
        detail: dict[str, Any] = {"exit_code": result.exit_code, "timed_out": result.timed_out}
        if check.test is not None:
            verdict = Grade(result.ok, 1.0 if result.ok else 0.0, detail)
        else:
            reward = _last_number(result.text)
            if reward is None:
                raise BrokenCheck(f"the reward command {command!r} printed no number "
                                  f"(exit code {result.exit_code}{', timed out' if result.timed_out else ''})")
            if not math.isfinite(reward):
                # The check gave a verdict, a meaningless one: the attempt failed, and says why.
                verdict = Grade(False, 0.0, {**detail, "reason": f"the reward command printed {reward}, "
                                                                 "not a finite number: scored as a fail with reward 0"})
            else:
                verdict = Grade(reward >= check.pass_threshold, reward, detail)
    verdict.cpu_s = cpu
    outcome = "pass" if verdict.passed else "fail"
    events = [{"kind": "result", "data": {"result": outcome, "reward": verdict.reward}},
              {"kind": "grading", "data": {"status": "finished", "result": outcome, "reward": verdict.reward,
                                           **verdict.detail}}]
    await sandbox.client.request("POST", f"/v1/sandboxes/{sandbox.id}/events", json_body={"events": events})
    return verdict


async def _swebench(sandbox: AsyncSandbox, task: Task, spec: dict[str, Any]) -> Grade:
    """Reset the test files to the base commit, apply the test patch, run the tests, read the named ones."""
    workdir, base = task.workdir, spec["base_commit"]
    await sandbox.write_file(_PATCH, spec["test_patch"])
    touched = swebench.patched_files(spec["test_patch"])
    if touched:
        # Files the patch creates do not exist at the base commit: checkout of those fails, which is fine.
        for name in touched:
            await sandbox.exec(["git", "checkout", "-q", base, "--", name], cwd=workdir, timeout_s=60)
    applied = await sandbox.exec(["git", "apply", "-v", _PATCH], cwd=workdir, timeout_s=60)
    if not applied.ok:
        raise BrokenCheck(f"the test patch does not apply at {base}: {applied.stderr[-500:].decode(errors='replace')}")
    run = await sandbox.exec(spec["test_cmd"], cwd=workdir, timeout_s=task.check.timeout_s)
    statuses = swebench.read_test_statuses(run.text + "\n" + run.stderr.decode("utf-8", "replace"))
    verdict = swebench.verdict(statuses, spec["FAIL_TO_PASS"], spec["PASS_TO_PASS"])
    detail = {"tests": {"FAIL_TO_PASS": verdict["FAIL_TO_PASS"], "PASS_TO_PASS": verdict["PASS_TO_PASS"]},
              "exit_code": run.exit_code, "timed_out": run.timed_out}
    return Grade(bool(verdict["passed"]), 1.0 if verdict["passed"] else 0.0, detail)


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


def _last_number(text: str) -> float | None:
    for line in reversed(text.strip().splitlines()):
        try:
            return float(line.strip())
        except ValueError:
            return None
    return None

