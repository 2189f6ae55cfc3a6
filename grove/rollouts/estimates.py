"""pass@k of a variant from its groups: an estimator its sampling policy cannot bias, with bootstrap intervals.

Each attempt of a group passes independently with its task's chance p, so the task's pass@k is
1 - (1 - p)^k and a variant's pass@k is its mean over tasks. Let Y_k be "one of the group's first k scored
attempts passed". E[Y_k] is pass@k whatever the sampler did after those k attempts, so the mean of Y_k over
all groups is unbiased wherever every group's Y_k is known, and it cannot fall as k grows (Y_k <= Y_k+1).
The sampler decides on whole stages and never looks at the order of results inside one, so the figure used
is E[Y_k | passes per stage] (:func:`~grove.rollouts.metrics.pass_within`): as unbiased and as monotone,
less noisy, and for one stage exactly Chen et al.'s 1 - C(n-c, k)/C(n, k).

What is given, and what is not:

- **Fixed groups** (``--attempts N``): one stage of N; Chen's estimator averaged over the groups with at
  least k scored attempts. A group has fewer only by losing attempts to infrastructure faults, which do not
  depend on outcomes, so leaving it out biases nothing (the figure covers the tasks that had k).
- **BAR with binary rewards**: stages of S. BAR stops a group early only once it holds a pass, or after P
  (the patience) agreeing results, so Y_k is known for every group when k <= P: the mean over every group
  is given for k <= P. Above P, a group stopped after P failures may have passed later: not given. (Chen's
  estimator averaged over the groups that reached k attempts drops exactly the groups that stopped because
  they passed: biased, and not monotone.)
- **BAR with other rewards** (a ``reward`` check and its ``pass_threshold``): BAR calls a group informative
  when its rewards differ, not its outcomes, so a group whose rewards differ but all fail stops after one
  stage: only k <= S is given. A run counts as binary when every reward is 1 on a pass and 0 on a fail.
- **Lost attempts under BAR**: BAR counts only scored results and makes up for a lost attempt while budget
  remains. A group whose budget ran out with fewer than k scored attempts and no pass leaves Y_k unknown,
  and pass@k is then not given at that k: averaging over the other groups would drop a failing group only.
  (Whether that happens depends on outcomes, so in a run that lost attempts a figure that is given is
  unbiased except through that rare event.) A group with no scored attempt carries no outcome: left out.
- **--target-groups**: no group starts once enough are informative, so the figures cover the groups that
  started (the first tasks in order), and where the cut fell depends on results: not the whole task set.

Intervals are percentile bootstraps over tasks: tasks resampled with replacement, the same resamples for
every k (so the bounds rise with k too), from a fixed seed so a rebuilt report shows the same intervals.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from grove.rollouts.journal import UNSCORED
from grove.rollouts.metrics import ks_for, pass_within
from grove.rollouts.sampling import Policy

CHEN = "chen"
"""Fixed groups: Chen et al.'s unbiased estimator over the groups with at least k scored attempts."""
BAR_FIRST_K = "bar-first-k"
"""BAR: a pass among each group's first k scored attempts (per stage), over every group."""
LEVEL = 0.95
RESAMPLES = 2000
SEED = 0


class Scored(NamedTuple):
    """One scored attempt of a group."""

    attempt: int
    passed: bool
    reward: float


@dataclass(frozen=True)
class Group:
    """One task under one variant: its scored attempts, and how many were lost to infrastructure faults."""

    task: str
    scored: tuple[Scored, ...]
    lost: int = 0

    def stages(self, size: int | None) -> list[tuple[int, int]]:
        """``(scored attempts, passes)`` per sampling stage of ``size`` attempts (None: one stage), in order."""
        tally: dict[int, list[int]] = defaultdict(lambda: [0, 0])
        for s in self.scored:
            stage = tally[s.attempt // size if size else 0]
            stage[0] += 1
            stage[1] += s.passed
        return [(n, c) for _, (n, c) in sorted(tally.items())]


@dataclass(frozen=True)
class Estimates:
    """A variant's pass@k figures, their intervals, and what they cover."""

    estimator: str
    """:data:`CHEN` or :data:`BAR_FIRST_K`."""
    k_limit: int | None
    """The largest k the sampling policy lets the estimator give (None: whatever the groups hold)."""
    binary: bool
    """Every reward is 1 on a pass and 0 on a fail."""
    target_groups: int | None
    """The run stopped starting groups once this many were informative: the figures cover started groups."""
    values: dict[int, float | None]
    intervals: dict[int, tuple[float, float] | None]
    groups: dict[int, int]
    """k → the number of groups behind the figure."""
    missing: dict[int, str]
    """k → why its figure is not given."""
    resamples: int = RESAMPLES
    level: float = LEVEL
    seed: int = SEED

    def as_summary(self) -> dict[str, Any]:
        """The keys of a variant in ``summary.json`` (k as strings; ``pass_at_k`` keeps its old shape)."""
        return {
            "pass_at_k": {str(k): _round(v) for k, v in self.values.items()},
            "pass_at_k_ci": {str(k): None if ci is None else [_round(ci[0]), _round(ci[1])]
                             for k, ci in self.intervals.items()},
            "pass_at_k_groups": {str(k): n for k, n in self.groups.items()},
            "pass_at_k_missing": {str(k): why for k, why in self.missing.items()},
            "pass_at_k_limit": self.k_limit, "estimator": self.estimator, "binary_rewards": self.binary,
            "target_groups": self.target_groups,
            "bootstrap": {"unit": "task", "level": self.level, "resamples": self.resamples, "seed": self.seed},
        }


def policy_of(spec: dict[str, Any]) -> Policy | None:
    """The sampling policy a run recorded in its spec; None for a run that recorded none (fixed groups)."""
    raw = spec.get("policy")
    if not isinstance(raw, dict):
        return None
    known = {f.name for f in dataclasses.fields(Policy)}
    return Policy(**{k: v for k, v in raw.items() if k in known})


def groups_from_results(rows: Sequence[dict[str, Any]]) -> list[Group]:
    """The groups of results rows (one variant's), attempts in order; infra_error and harness_error attempts are
    not scored."""
    by_group: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_group[str(row["group_id"])].append(row)
    groups = []
    for members in by_group.values():
        members.sort(key=lambda r: int(r["attempt"]))
        scored = tuple(Scored(int(r["attempt"]), r["outcome"] == "pass", float(r["reward"] or 0.0))
                       for r in members if r["outcome"] not in UNSCORED)
        groups.append(Group(str(members[0]["task"]), scored, lost=len(members) - len(scored)))
    return sorted(groups, key=lambda g: g.task)


def estimate(groups: Sequence[Group], policy: Policy | None, *, resamples: int = RESAMPLES, level: float = LEVEL,
             seed: int = SEED) -> Estimates:
    """pass@k at k = 1, 2, 4, ... (and the policy's limit) with bootstrap intervals over tasks."""
    tasks = [g for g in groups if g.scored]
    binary = all(s.reward == (1.0 if s.passed else 0.0) for g in tasks for s in g.scored)
    bar = policy is not None and policy.bar_max > 0
    limit = stage = None
    if policy is not None and bar:
        stage = policy.bar_step
        limit = policy.patience if binary else min(policy.bar_step, policy.bar_max)
    max_n = max((len(g.scored) for g in tasks), default=0)
    ks = sorted(set(ks_for(max_n)) | ({limit} if limit is not None and limit <= max_n else set()))

    per_task: dict[int, list[float | None]] = {}
    missing: dict[int, str] = {}
    for k in ks:
        if limit is not None and k > limit:
            missing[k] = _above_limit(limit, binary)
            continue
        if not bar:
            values = [pass_within(g.stages(None), k) if len(g.scored) >= k else None for g in tasks]
            if all(v is None for v in values):
                missing[k] = f"no group has {k} scored attempts"
                continue
        else:
            values = [pass_within(g.stages(stage), k) for g in tasks]
            unknown = [g for g, v in zip(tasks, values, strict=True) if v is None]
            if unknown:
                missing[k] = _unknown(unknown, k, binary)
                continue
        per_task[k] = values
    intervals = _bootstrap(per_task, len(tasks), resamples, level, seed)
    return Estimates(
        estimator=BAR_FIRST_K if bar else CHEN, k_limit=limit, binary=binary,
        target_groups=policy.target_groups if policy is not None else None,
        values={k: _mean(per_task[k]) if k in per_task else None for k in ks},
        intervals={k: intervals.get(k) for k in ks},
        groups={k: sum(v is not None for v in per_task.get(k, [])) for k in ks},
        missing=missing, resamples=resamples, level=level, seed=seed)


def _above_limit(limit: int, binary: bool) -> str:
    if binary:
        return (f"above BAR's patience ({limit}): a group that failed its first {limit} attempts stopped there, "
                "and whether it would have passed later is unknown")
    return (f"above BAR's first stage ({limit}): rewards are not only 0 and 1 here, and BAR stops a group once "
            "its rewards differ, even if none passed")


def _unknown(groups: list[Group], k: int, binary: bool) -> str:
    names = ", ".join(g.task for g in groups[:3]) + (", ..." if len(groups) > 3 else "")
    lost = sum(g.lost for g in groups)
    if not lost:
        cause = "the run has not finished them"
    elif binary:
        cause = (f"{lost} of their attempts were lost to infrastructure faults and the budget ran out; a "
                 "--max-attempts above the patience leaves BAR room to make up lost attempts")
    else:
        cause = f"{lost} of their attempts were lost to infrastructure faults"
    return (f"{len(groups)} group(s) ({names}) have fewer than {k} scored attempts and no pass ({cause}); "
            "the mean over the other groups would leave out failing groups only")


def _mean(values: list[float | None]) -> float:
    known = [v for v in values if v is not None]
    return math.fsum(known) / len(known)


def _bootstrap(per_task: dict[int, list[float | None]], n: int, resamples: int, level: float,
               seed: int) -> dict[int, tuple[float, float]]:
    """Percentile intervals: tasks resampled with replacement, one set of resamples shared by every k."""
    if n < 2 or not per_task:
        return {}  # one task cannot show the spread between tasks
    values = {k: [v or 0.0 for v in vs] for k, vs in per_task.items()}
    present = {k: [int(v is not None) for v in vs] for k, vs in per_task.items()}
    means: dict[int, list[float]] = {k: [] for k in per_task}
    rng = random.Random(seed)
    population = range(n)
    for _ in range(resamples):
        picks = rng.choices(population, k=n)
        for k in per_task:
            weight = sum(map(present[k].__getitem__, picks))
            if weight:  # fixed groups: a resample may hold no task with k scored attempts
                means[k].append(sum(map(values[k].__getitem__, picks)) / weight)
    tail = (1 - level) / 2
    return {k: (_quantile(sorted(ms), tail), _quantile(sorted(ms), 1 - tail)) for k, ms in means.items() if ms}


def _quantile(ordered: list[float], q: float) -> float:
    """Linear interpolation between the closest ranks."""
    at = q * (len(ordered) - 1)
    low = math.floor(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
