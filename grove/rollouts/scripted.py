"""The scripted agent (``--harness scripted``): a stochastic policy with no model, for demos, tests and
benchmarks.

It follows the task's ``scripted`` field::

    {"p_solve": 0.75,                      # chance that an attempt applies the right edit
     "inspect": ["cat mathops.py", "python3 test_visible.py"],
     "edit": {"path": "mathops.py", "find": "return a - b", "right": "return a + b", "wrong": "return b"},
     "verify": ["python3 test_visible.py"],
     "think_s": 0.0,                       # a pause before each action, like a model thinking
     "seed": 0}

The draw is a pure function of (task id, attempt number, seed): a retried or resumed attempt makes the
same choice, so faults never change what the policy did. Its file edits go through the file API (and so
appear in the SFT export as ``write_file`` tool calls), its commands through exec. A browser task (one with a
``start_url``) is driven by the scripted browser policy instead (:mod:`grove.rollouts.browser.policy`), and a
task whose plan has ``calls`` by the scripted assistant policy (:mod:`grove.rollouts.assistant`), with the same
draw.

It can resume (:mod:`grove.rollouts.resume`): given a prefix of ``turns`` actions, it skips that many of its actions
(inspections, the read, the edit, the checks, in that order) and does the rest, with its own draw.
"""

from __future__ import annotations

import functools
import hashlib
import posixpath
import time
from collections.abc import Callable
from typing import Any

from grove.client import Sandbox
from grove.rollouts.assistant import run_assistant
from grove.rollouts.browser.policy import run_browser
from grove.rollouts.harnesses import PolicyError
from grove.rollouts.resume import Prefix


def draws_right(task_id: str, attempt: int, p_solve: float, seed: int = 0) -> bool:
    """Whether this attempt applies the right edit: a deterministic coin with bias ``p_solve``."""
    digest = hashlib.sha256(f"{seed}/{task_id}/{attempt}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < p_solve


def run_scripted(task: dict[str, Any], sandbox: Sandbox, resume: Prefix | None = None) -> None:
    """Act on one task in ``sandbox`` as the task's ``scripted`` policy says; with ``resume``, skip the actions the
    prefix already holds (the sandbox holds their effects) and go on from there."""
    policy = task.get("scripted") or {}
    right = draws_right(str(task["id"]), int(task.get("attempt", 0)), float(policy.get("p_solve", 1.0)),
                        int(policy.get("seed", 0)))
    if task.get("start_url") or "steps" in policy:
        if resume is not None:
            raise PolicyError("the scripted browser policy cannot resume from a step")
        run_browser(task, sandbox, right=right)
        return
    if "calls" in policy:
        run_assistant(task, sandbox, right=right)
        return
    workdir = str(task.get("workdir") or "/workspace")
    think = float(policy.get("think_s", 0.0))
    actions = [_command(sandbox, c, workdir) for c in policy.get("inspect", [])]
    edit = policy.get("edit")
    if edit:
        path = posixpath.join(workdir, edit["path"])
        read: list[str] = []  # what the read turn saw; a resume past it reads the file again

        def look() -> None:
            read.append(sandbox.read_file(path).decode())

        def patch(fix: str) -> None:
            code = read[-1] if read else sandbox.read_file(path).decode()
            sandbox.post_event("message", {"role": "assistant",
                                           "content": f"Replacing `{edit['find'].strip()}` with `{fix.strip()}`."})
            sandbox.write_file(path, code.replace(edit["find"], fix))

        actions.append(look)
        fix = edit["right"] if right else edit.get("wrong")
        if fix is not None:
            actions.append(functools.partial(patch, fix))
    actions += [_command(sandbox, c, workdir) for c in policy.get("verify", [])]
    for action in actions[resume.turns if resume is not None else 0:]:
        if think:
            time.sleep(think)
        action()


def _command(sandbox: Sandbox, command: str, workdir: str) -> Callable[[], None]:
    def run() -> None:
        sandbox.exec(command, cwd=workdir, timeout_s=60)

    return run
