"""Rollouts: a task set through one or more harness/model variants, in fixed or BAR groups, with
infrastructure faults retried and never scored, and pass@k reports — the loop every trainer and
evaluation otherwise writes for itself.

    from grove.rollouts import RunConfig, Policy, run_rollouts
    summary = run_rollouts(RunConfig(tasks=Path("tasks.jsonl"), out=Path("runs/r1"),
                                     variants=[("scripted", None)], policy=Policy(attempts=4)))

The command line is ``grove rollouts run|status|report`` (:mod:`grove.cli.rollouts`).
"""

from __future__ import annotations

from grove.rollouts.api import arun_rollouts, run_rollouts, upload_run
from grove.rollouts.harnesses import Harness, InfraFault, PolicyError
from grove.rollouts.resume import Prefix
from grove.rollouts.runner import RunConfig
from grove.rollouts.sampling import Policy
from grove.rollouts.tasks import Task, TaskFileError, load_tasks

__all__ = ["Harness", "InfraFault", "Policy", "PolicyError", "Prefix", "RunConfig", "Task", "TaskFileError",
           "arun_rollouts", "load_tasks", "run_rollouts", "upload_run"]
