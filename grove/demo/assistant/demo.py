"""``python -m grove.demo --assistant``: offline personal-assistant tasks, a BAR rollout run end to end.

A router with the local backend starts in this process. Each of the ten tasks (:mod:`grove.demo.assistant.tasks`)
runs the office service — mail, calendar and notes behind a tiny HTTP API — as a task service in a sibling sandbox
on a private network with the agent's, started and checked healthy before the agent, reachable from its sandbox as
``http://office:8025``. The scripted assistant policy (:mod:`grove.rollouts.assistant`) calls it with ``curl``
inside the agent's sandbox, following the right plan with the task's odds (so groups hold passes and fails); once
the agent has stopped, every process it left is ended, and the check queries the service's final state.

This proves the plumbing — services started before the agent, an agent's HTTP tool calls recorded, grading by a
service's state, BAR — not a model's skill. The demo exits 0 when every attempt was scored as the policy's coin
says it should be, every trajectory was stored and no sandbox was left behind (:mod:`grove.demo.scripted_demo`).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from grove.demo.assistant.tasks import CHORES, task_lines
from grove.demo.scripted_demo import Demo, run_demo
from grove.rollouts import Policy

CONCURRENCY = 2
"""Attempts at once, for a 2-core machine."""
ASSISTANT = Demo(
    flag="assistant", counted="commands", counted_as="calls to the office service", kept_as="trajectories",
    record_as="record", concurrency=CONCURRENCY, policy=Policy(bar_max=4, bar_step=2),
    intro=("{n} offline assistant tasks on a mail, calendar and notes service in a sibling sandbox of the agent's "
           "(a task service on a private network, checked healthy first); a scripted assistant policy (no model: "
           "it calls the service's HTTP API with curl inside the agent's sandbox); graded by the service's final "
           f"state; BAR groups, {CONCURRENCY} attempts at once.\n  This proves the plumbing, not a model's skill: "
           "the plans are written by hand, their success a coin with the task's odds."))


async def run_assistant_demo(state_dir: Path, count: int = len(CHORES)) -> int:
    """Start a router, run the first ``count`` assistant tasks in BAR groups, print what happened; the exit code."""
    return await run_demo(ASSISTANT, state_dir, task_lines([c.name for c in CHORES[:count]]))


def main(count: int, state_dir: Path) -> None:
    """Run the assistant demo and exit with its status."""
    sys.exit(asyncio.run(run_assistant_demo(state_dir, count)))
