"""``python -m grove.demo --gui``: offline web tasks in browser sandboxes, a BAR rollout run end to end.

A router with the local backend starts in this process. Each of the ten tasks (:mod:`grove.demo.gui.tasks`) is a
small site served inside its sandbox, with a screen and Chromium open at its start page. The scripted browser
policy (:mod:`grove.rollouts.browser.policy`) reads where the page's elements are and acts through the computer
API with screen coordinates, following the right plan with the task's odds (so groups hold passes and fails);
each attempt is graded in place from the site's own log once the agent has stopped, or, for the open-ended
task, by a judge reading the trajectory and the final screen. Every action is a trajectory step with its
screenshot: the viewer shows each attempt as a filmstrip.

This proves the plumbing — sandboxes with screens, actions, the record, grading, BAR — not a model's skill: the
policy's plans are written by hand and its successes are coin flips. The demo exits 0 when every attempt was
scored as the policy's coin says it should be, every trajectory was stored and no sandbox was left behind
(:mod:`grove.demo.scripted_demo`).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from grove.demo.gui.tasks import SITES, task_lines
from grove.demo.scripted_demo import Demo, run_demo
from grove.rollouts import Policy

CONCURRENCY = 2
"""Attempts at once: each runs Chromium in its sandbox, and the demo should fit a 2-core machine."""
POLICY = Policy(bar_max=4, bar_step=2)
"""Two attempts at a time until a group holds a pass and a fail; unanimous after four: filtered."""
GUI = Demo(
    flag="gui", counted="actions", counted_as="screen actions", kept_as="trajectories with their screenshots",
    record_as="filmstrip", concurrency=CONCURRENCY, policy=POLICY,
    intro=("{n} offline web tasks, each site served inside its own sandbox with a screen and Chromium; a scripted "
           "browser policy (no model: it reads the page's layout, then clicks, types, scrolls and drags through "
           f"the computer API); BAR groups, {CONCURRENCY} attempts at once.\n  This proves the plumbing, not a "
           "model's skill: the plans are written by hand, their success a coin with the task's odds."))


async def run_gui_demo(state_dir: Path, count: int = len(SITES)) -> int:
    """Start a router, run the first ``count`` GUI tasks in BAR groups, print what happened; the exit code."""
    return await run_demo(GUI, state_dir, task_lines([s.name for s in SITES[:count]]))


def main(count: int, state_dir: Path) -> None:
    """Run the GUI demo and exit with its status."""
    sys.exit(asyncio.run(run_gui_demo(state_dir, count)))
