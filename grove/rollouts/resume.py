"""Resuming an agent at step k: the recorded conversation up to there (:class:`Prefix`), which steps of a trajectory
are the agent's turns, and whether a harness can take a prefix at all.

The harness contract, extended: a harness that can resume takes a keyword argument ``resume``::

    def my_harness(task: dict, sandbox: grove.Sandbox, resume: Prefix | None = None) -> None: ...

With ``resume`` given, ``sandbox`` already holds the state after the prefix's last step (rebuilt by replay, or
from a checkpoint), and the harness continues the conversation in ``resume.messages`` instead of starting from the
prompt. A harness without the ``resume`` parameter cannot resume: progress runs refuse it (:func:`require`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from grove.core.errors import Invalid

ACTIONS = ("exec", "file_read", "file_write", "file_delete", "computer")
"""Step types that are an agent's turn (a tool call in the exported conversation)."""


@dataclass(frozen=True)
class Prefix:
    """The recorded conversation up to a step: what a resumed harness continues from."""

    messages: list[dict[str, Any]]
    """The chat messages of the trajectory up to and including ``step`` (the task's prompt first; the shape of
    :func:`artifacts.export.to_chat`); setup and grading are not in them."""
    step: int
    """The index, in the recorded trajectory's steps, of the last step the prefix holds (the state is after it)."""
    turns: int
    """How many of the agent's turns (tool calls) the prefix holds: a scripted policy skips that many actions."""


def resumable(fn: Callable[..., Any]) -> bool:
    """Whether a harness function takes ``resume=``."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return "resume" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def require(name: str, fn: Callable[..., Any]) -> None:
    """Refuse a harness that cannot resume, saying how to make it able to."""
    if not resumable(fn):
        raise Invalid(f"the harness {name!r} cannot resume from a step: a progress run continues each attempt from "
                      "its step k, so its harness must take `resume=Prefix(messages, step, turns)` "
                      "(def harness(task, sandbox, resume=None)); scripted and mini-swe-agent can")


def setup_end(steps: list[dict[str, Any]]) -> int:
    """The index of the step that ends the task's setup (the state before the agent's first turn)."""
    for index, step in enumerate(steps):
        if step.get("type") == "event" and step.get("kind") == "setup" and \
                (step.get("data") or {}).get("status") == "finished":
            return index
    raise Invalid("the trajectory has no finished setup: it was not made by a rollout run")


def turns(steps: list[dict[str, Any]]) -> list[int]:
    """The indices of the agent's turns: its actions after setup and before grading."""
    found, start = [], setup_end(steps)
    for index in range(start + 1, len(steps)):
        step = steps[index]
        if step.get("type") == "event" and step.get("kind") == "grading":
            break
        if step.get("type") in ACTIONS and "error" not in step:
            found.append(index)
    return found


def state_step(steps: list[dict[str, Any]], turn: int) -> int:
    """The step index after which the state is the one after ``turn`` turns (0: right after setup)."""
    indices = turns(steps)
    if not 0 <= turn <= len(indices):
        raise Invalid(f"turn {turn} is out of range: the trajectory has {len(indices)} turns")
    return setup_end(steps) if turn == 0 else indices[turn - 1]


def prefix_of(record: dict[str, Any], turn: int) -> Prefix:
    """The conversation of ``record`` after ``turn`` of its agent's turns."""
    from artifacts.export import to_chat

    steps = record.get("steps") or []
    step = state_step(steps, turn)
    messages = to_chat({**record, "steps": steps[: step + 1]})["messages"]
    return Prefix(messages=messages, step=step, turns=turn)

