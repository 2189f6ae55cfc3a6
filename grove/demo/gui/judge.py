"""The GUI demo's judge for its open-ended task: a rule standing in for the model that would judge a real one.

A judge is ``function(trajectory, final_screenshot) -> reward`` (:mod:`grove.rollouts.browser.judge`): here the
agent's final answer (its last message) must give Sunday's opening hours, and its final screen must be an
image. A model judging WebVoyager or Mind2Web reads the same two inputs.
"""

from __future__ import annotations

from typing import Any

_PNG = b"\x89PNG\r\n\x1a\n"


def final_answer(trajectory: dict[str, Any]) -> str:
    """The agent's last message before grading (its final answer), or ''."""
    answer = ""
    for step in trajectory.get("steps") or []:
        if not isinstance(step, dict) or step.get("type") != "event":
            continue
        raw = step.get("data")
        data: dict[str, Any] = raw if isinstance(raw, dict) else {}
        if step.get("kind") == "grading":
            break
        if step.get("kind") == "message" and data.get("role") == "assistant":
            answer = str(data.get("content") or "")
    return answer


def opening_hours(trajectory: dict[str, Any], final_screenshot: bytes | None) -> dict[str, Any]:
    """1.0 if the final answer says 10:00-16:00 (the museum's Sunday hours), else 0.0; with the reason."""
    answer = final_answer(trajectory)
    if not final_screenshot or not final_screenshot.startswith(_PNG):
        return {"reward": 0.0, "reason": "no final screen to judge", "answer": answer}
    right = "10:00" in answer and "16:00" in answer
    return {"reward": 1.0 if right else 0.0, "answer": answer,
            "reason": "the answer gives Sunday's hours" if right else "the answer does not give 10:00-16:00"}
