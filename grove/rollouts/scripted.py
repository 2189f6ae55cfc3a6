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
"""

from __future__ import annotations

import hashlib
import posixpath
import time
from typing import Any

from grove.client import Sandbox
from grove.rollouts.assistant import run_assistant
from grove.rollouts.browser.policy import run_browser


def draws_right(task_id: str, attempt: int, p_solve: float, seed: int = 0) -> bool:
    """Whether this attempt applies the right edit: a deterministic coin with bias ``p_solve``."""
    digest = hashlib.sha256(f"{seed}/{task_id}/{attempt}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < p_solve


def run_scripted(task: dict[str, Any], sandbox: Sandbox) -> None:
    """Act on one task in ``sandbox`` as the task's ``scripted`` policy says."""
    policy = task.get("scripted") or {}
    right = draws_right(str(task["id"]), int(task.get("attempt", 0)), float(policy.get("p_solve", 1.0)),
                        int(policy.get("seed", 0)))
    if task.get("start_url") or "steps" in policy:
        run_browser(task, sandbox, right=right)
        return
    if "calls" in policy:
        run_assistant(task, sandbox, right=right)
        return
    workdir = str(task.get("workdir") or "/workspace")
    think = float(policy.get("think_s", 0.0))

    def act() -> None:
        if think:
            time.sleep(think)

    for command in policy.get("inspect", []):
        act()
        sandbox.exec(command, cwd=workdir, timeout_s=60)
    edit = policy.get("edit")
    if edit:
        path = posixpath.join(workdir, edit["path"])
        act()
        code = sandbox.read_file(path).decode()
        fix = edit["right"] if right else edit.get("wrong")
        if fix is not None:
            sandbox.post_event("message", {"role": "assistant",
                                           "content": f"Replacing `{edit['find'].strip()}` with `{fix.strip()}`."})
            act()
            sandbox.write_file(path, code.replace(edit["find"], fix))
    for command in policy.get("verify", []):
        act()
        sandbox.exec(command, cwd=workdir, timeout_s=60)
