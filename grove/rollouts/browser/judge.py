"""Judged grading (``check.judge``): for open-ended tasks, whose outcome no command in the sandbox can read
(WebVoyager and Mind2Web are judged by a model).

The judge is ``module:function``, called on the runner's side — out of the agent's reach, like any grader — as
``function(trajectory, final_screenshot) -> reward``: the agent's trajectory record as the router keeps it (its
``steps``: commands, screen actions with their screenshots' hashes, messages such as a final answer) and the
screen's PNG once the agent stopped (None for a task without a screen). The answer is a number (``True`` and
``False`` are 1 and 0), or an object with ``reward`` and anything else worth keeping (a model's reasons); the
attempt passes at ``check.pass_threshold``. The judge's inputs, summarized, and its answer are recorded as a
``judge`` event inside the grading bracket. A judge that raises or answers no number gave no verdict: an
infrastructure fault (:class:`~grove.rollouts.grading.BrokenCheck`), retried and never scored.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable
from typing import Any

from grove.client import AsyncSandbox
from grove.core.errors import GroveError
from grove.rollouts.grading import BrokenCheck, Grade
from grove.rollouts.hooks import resolve_function
from grove.rollouts.tasks import Task

Judge = Callable[[dict[str, Any], bytes | None], Any]
"""``function(trajectory, final_screenshot) -> reward``."""
_ANSWER_CHARS = 4000


def resolve(spec: str) -> Judge:
    """The function ``module:function`` names (a module beside the task files imports, as with ``python -m``)."""
    return resolve_function(spec, "judge")


async def grade(sandbox: AsyncSandbox, task: Task, record: dict[str, Any]) -> Grade:
    """The final screen taken (before the agent's processes stop), the judge asked in a worker thread, its
    verdict recorded as a grading step."""
    spec = str(task.check.judge)
    png: bytes | None = None
    shot: dict[str, Any] | None = None
    if task.desktop is not None:
        try:
            screen = await sandbox.computer.screenshot()
        except GroveError as exc:
            raise BrokenCheck(f"the final screen could not be taken for the judge: {exc.message}") from exc
        png, shot = screen.png, {"sha256": screen.sha256, "width": screen.width, "height": screen.height}
    try:
        fn = resolve(spec)
        answer = await asyncio.wait_for(asyncio.to_thread(fn, record, png), task.check.timeout_s)
    except TimeoutError as exc:
        raise BrokenCheck(f"the judge {spec} gave no answer in {task.check.timeout_s:g}s") from exc
    except Exception as exc:
        raise BrokenCheck(f"the judge {spec} raised {type(exc).__name__}: {exc}") from exc
    reward, said = _reward(spec, answer)
    detail: dict[str, Any] = {"judge": spec, "final_screenshot": shot, "answer": said}
    if math.isfinite(reward):
        passed = reward >= task.check.pass_threshold
    else:
        passed, reward = False, 0.0
        detail["reason"] = "the judge answered a reward that is not a finite number: scored as a fail with reward 0"
    steps = [s for s in record.get("steps") or [] if isinstance(s, dict)]
    inputs = {"trajectory_steps": len(steps), "screen_actions": sum(s.get("type") == "computer" for s in steps),
              "final_screenshot": shot}
    await sandbox.post_event("judge", {"judge": spec, "inputs": inputs, "answer": said, "reward": reward,
                                       "result": "pass" if passed else "fail"})
    return Grade(passed, reward, detail)


def _reward(spec: str, answer: Any) -> tuple[float, Any]:
    """The reward in a judge's answer, and the answer as the record keeps it (JSON, long text cut)."""
    value = answer.get("reward") if isinstance(answer, dict) else answer
    if isinstance(value, bool):
        value = float(value)
    if not isinstance(value, int | float):
        raise BrokenCheck(f"the judge {spec} answered {type(answer).__name__} {str(answer)[:200]!r}: a number, or "
                          "an object with a numeric 'reward', is needed")
    try:
        kept = json.loads(json.dumps(answer, default=str, allow_nan=False))
    except ValueError:
        kept = str(answer)
    if isinstance(kept, dict):
        kept = {k: v[:_ANSWER_CHARS] if isinstance(v, str) else v for k, v in kept.items()}
    return float(value), kept
