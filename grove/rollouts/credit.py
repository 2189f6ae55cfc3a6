"""The credit-assignment SFT export (``grove rollouts export RUN --sft credit``): the rising spans of a run's
attempts as training targets, from the estimates of ``grove rollouts progress`` (:mod:`grove.rollouts.continuations`).

One JSONL line per rising span (a run of the agent's turns after which the chance of solving went up)::

    {"prompt":     [the conversation before the span: the task, earlier turns, their tool answers],
     "completion": [the span's assistant turns (with their tool calls); tool answers between them],
     "messages":   prompt + completion,
     "loss_mask":  [0 or 1 per message of "messages"]: 1 for the span's assistant turns, 0 for everything else
                   (context, and every tool answer: tool responses are never trained on),
     "tools":      the tool schemas (as in the plain export),
     "metadata":   {"run_id", "task", "attempt", "trajectory_id", "outcome", "span": [first, last turn],
                    "estimate_before", "estimate_after", "source"}}

``prompt``/``completion`` is TRL's conversational prompt-completion format: ``SFTTrainer`` trains on the completion
only. A span of one turn (the usual case) has no tool answer inside its completion; for longer spans, ``messages``
with ``loss_mask`` says which messages to train on. The conversation is the plain export's
(:func:`artifacts.export.to_chat`): setup and grading are in no message.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import IO, Any

from grove.core.errors import Invalid
from grove.rollouts.resume import prefix_of


def examples(record: dict[str, Any], lines: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """The training lines of one trajectory, from its ``progress.jsonl`` lines."""
    from artifacts.export import to_chat

    tools = to_chat(record)["tools"]
    for line in lines:
        if not line.get("rising"):
            continue
        first, last = line["span"]
        before = prefix_of(record, first - 1).messages
        upto = prefix_of(record, last).messages
        if upto[: len(before)] != before:
            raise Invalid(f"trajectory {line['trajectory_id']}: its conversation before turn {first} is not a prefix "
                          "of the one after it")
        completion = upto[len(before):]
        while completion and completion[-1].get("role") == "tool":  # the target ends with the agent's own turn
            completion.pop()
        if not any(m.get("role") == "assistant" for m in completion):
            continue
        yield {"prompt": before, "completion": completion, "messages": before + completion,
               "loss_mask": [0] * len(before) + [int(m.get("role") == "assistant") for m in completion],
               "tools": tools,
               "metadata": {"run_id": line["run_id"], "task": line["task"], "attempt": line["attempt"],
                            "trajectory_id": line["trajectory_id"], "outcome": line["outcome"],
                            "span": [first, last], "estimate_before": _before(line),
                            "estimate_after": line["estimate"], "source": line["source"]}}


def _before(line: dict[str, Any]) -> float | None:
    rise, estimate = line.get("rise"), line.get("estimate")
    return round(estimate - rise, 4) if isinstance(rise, float | int) and isinstance(estimate, float | int) else None


def write_credit(records: Iterable[dict[str, Any]], progress: list[dict[str, Any]], out: IO[str]) -> int:
    """Write the credit lines of ``records`` (the run's trajectories with progress lines); how many."""
    by_trajectory: dict[str, list[dict[str, Any]]] = {}
    for line in progress:
        by_trajectory.setdefault(str(line["trajectory_id"]), []).append(line)
    count = 0
    for record in records:
        sandbox = record.get("sandbox") or {}
        for example in examples(record, by_trajectory.get(str(sandbox.get("id")), [])):
            out.write(json.dumps(example) + "\n")
            count += 1
    return count
