"""mini-swe-agent resumed at step k: its ``DefaultAgent`` with the recorded conversation put after its own system
and task messages, so the model continues from there (:mod:`grove.rollouts.resume`).

grove's record is in the chat-messages shape of :func:`artifacts.export.to_chat` (``bash`` tool calls and ``tool``
answers); mini-swe-agent's text-based loop keeps a turn as an assistant message whose ``extra.actions`` hold the
commands, answered by a user message with the output. The prefix is turned into that shape. A deterministic model
(scripted replies) also skips the replies the prefix already holds.
"""

from __future__ import annotations

import json
from typing import Any

from minisweagent.agents.default import DefaultAgent

from grove.rollouts.resume import Prefix


class ResumedAgent(DefaultAgent):
    """``DefaultAgent`` whose conversation starts with a recorded prefix."""

    def __init__(self, model: Any, env: Any, *, resume: Prefix, **kwargs: Any) -> None:
        super().__init__(model, env, **kwargs)
        self._prefix = mini_messages(resume.messages)
        if hasattr(model, "current_index"):  # the deterministic model: its replies are the turns, in order
            model.current_index = resume.turns - 1

    def add_messages(self, *messages: dict[str, Any]) -> list[dict[str, Any]]:
        """As ever; right after ``run`` put its system and task messages in, the prefix follows them."""
        fresh = not self.messages
        added: list[dict[str, Any]] = super().add_messages(*messages)
        if fresh and self._prefix:
            self.messages.extend(self._prefix)
            self._prefix = []
        return added


def mini_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """grove's exported turns as mini-swe-agent's: the task's own prompt left out (mini renders its own)."""
    out: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        if role == "assistant":
            actions = [{"command": _command(call)} for call in message.get("tool_calls") or []]
            out.append({"role": "assistant", "content": str(message.get("content") or ""),
                        "extra": {"actions": actions}})
        elif role == "tool":
            out.append({"role": "user", "content": str(message.get("content") or "")})
    return out


def _command(call: dict[str, Any]) -> str:
    function = call.get("function") or {}
    try:
        arguments = json.loads(function.get("arguments") or "{}")
    except json.JSONDecodeError:
        arguments = {}
    if function.get("name") == "bash":
        return str(arguments.get("command", ""))
    return f"# {function.get('name')} {json.dumps(arguments)[:2000]}"  # a file call of another harness: said, not run
