"""A trajectory's phases: setup, the agent's turn, grading — read from the bracket events a rollout posts.

``{"type": "event", "kind": "setup"|"grading", "data": {"status": "started"}}`` opens a phase and the same
kind with ``"finished"`` closes it (both events belong to it); every other step is the agent's. (An
attempt's ``changes`` and ``result`` events come inside its grading bracket, as ``grove rollouts`` posts them.) The
viewer folds grading away and compares two attempts phase by phase, so a step's phase is decided here,
once, from the whole record (a page of steps cannot know what opened before it).
"""

from __future__ import annotations

from typing import Any

PHASES = ("setup", "agent", "grading")
"""Every phase, in the order a rollout goes through them."""
AGENT = "agent"
_BRACKETS = ("setup", "grading")
_FACT_CHARS = 200
_SEGMENT_FACTS = ("mode", "result", "reward")
"""What a bracket event's data may say about its phase (grading: ``mode`` isolated or in-place, its verdict)."""


def _bracket(step: Any) -> tuple[str, str] | None:
    """(phase, "started"|"finished") if ``step`` is a bracket event."""
    if not isinstance(step, dict) or step.get("type") != "event" or step.get("kind") not in _BRACKETS:
        return None
    data = step.get("data")
    status = data.get("status") if isinstance(data, dict) else None
    return (str(step["kind"]), status) if status in ("started", "finished") else None


def phase_of_each(steps: list[Any]) -> list[str]:
    """The phase of every step, by index. Brackets nest (an isolated grader runs the task's setup inside its
    grading): the outermost open one names the phase, so all of a grading is grading, its setup too."""
    out: list[str] = []
    open_: list[str] = []
    for step in steps:
        bracket = _bracket(step)
        if bracket is not None and bracket[1] == "started":
            open_.append(bracket[0])
        out.append(open_[0] if open_ else bracket[0] if bracket is not None else AGENT)
        if bracket is not None and bracket[1] == "finished" and bracket[0] in open_:
            del open_[len(open_) - 1 - open_[::-1].index(bracket[0])]  # the innermost of its kind closes
    return out


def segments(steps: list[Any], phases: list[str]) -> list[dict[str, Any]]:
    """Runs of consecutive steps of one phase: ``{phase, start, end (exclusive), mode?, result?, reward?}``
    (the facts from the phase's own bracket events, the finish's winning)."""
    out: list[dict[str, Any]] = []
    for index, phase in enumerate(phases):
        bracket = _bracket(steps[index])
        own = bracket is not None and bracket[0] == phase
        # A phase that starts again right after it finished (two gradings) is a segment of its own.
        again = (own and bracket == (phase, "started") and index > 0
                 and _bracket(steps[index - 1]) == (phase, "finished"))
        if not out or out[-1]["phase"] != phase or again:
            out.append({"phase": phase, "start": index, "end": index})
        segment = out[-1]
        segment["end"] = index + 1
        if own:
            data = steps[index]["data"]
            for name in _SEGMENT_FACTS:
                value = data.get(name)
                if isinstance(value, str):
                    segment[name] = value[:_FACT_CHARS]
                elif isinstance(value, int | float) and not isinstance(value, bool):
                    segment[name] = value
    return out


def counts(phases: list[str]) -> dict[str, int]:
    """Steps per phase."""
    return {name: phases.count(name) for name in PHASES}


def changes_index(steps: list[Any]) -> int | None:
    """The index of the record's last ``changes`` event (the attempt's final diff), if it has one."""
    for index in range(len(steps) - 1, -1, -1):
        step = steps[index]
        if isinstance(step, dict) and step.get("type") == "event" and step.get("kind") == "changes":
            return index
    return None


def summary(steps: list[Any], phases: list[str]) -> dict[str, Any]:
    """What a trajectory page needs of its phases: the segments, the steps per phase, and where the final
    diff is (``changes``: its step index, the grader's sandbox id and how many files, or None)."""
    found = changes_index(steps)
    changes = None
    if found is not None:
        data = steps[found].get("data")
        data = data if isinstance(data, dict) else {}
        grader, listed = data.get("grader"), data.get("files")
        changes = {"i": found, "grader": grader[:_FACT_CHARS] if isinstance(grader, str) else None,
                   "files": len(listed) if isinstance(listed, list) else 0}
    return {"phases": segments(steps, phases), "phase_counts": counts(phases), "changes": changes}
