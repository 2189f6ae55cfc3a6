"""Which attempts to run next: fixed groups, or Balanced Adaptive Rollout (BAR) stages (pure logic).

A *group* is one task under one harness/model variant; its attempts are numbered 0, 1, 2, ...

- **fixed** (``--attempts N``): every group gets N attempts.
- **BAR** (``--bar --max-attempts M --step S [--patience P]``): a group gets S attempts; when all of
  them are graded, it stops if it is informative (its rewards differ), else gets S more, until M are
  spent — or until P attempts (default 2·S) all agree: a group that is still all-pass or all-fail by
  then is taken as easy or impossible for this policy and filtered, and the budget goes to other
  tasks. (Under a Beta(1, 1) prior, P = 2·S unanimous results leave about a 1-in-4 to 1-in-3 chance
  that the next stage would split; easy and impossible tasks stop after P attempts instead of M.)
- **target groups** (``--target-groups K``): no new group starts once K groups are informative, or
  once the informative ones and those still undecided could make K; budget flows to the next tasks only
  while it is needed.

Decisions depend only on graded results, so a resumed run reproduces them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from grove.rollouts.metrics import informative

GroupKey = tuple[int, str]
"""(variant index, task id)."""


@dataclass(frozen=True)
class Policy:
    """How many attempts a group gets."""

    attempts: int = 0
    """Fixed mode: attempts per group (0 in BAR mode)."""
    bar_max: int = 0
    """BAR mode: the per-group budget."""
    bar_step: int = 2
    """BAR mode: attempts per stage."""
    bar_patience: int = 0
    """BAR mode: a group whose first this-many attempts all agree stops (0: two stages' worth)."""
    target_groups: int | None = None
    """Stop starting groups once this many are informative."""

    def __post_init__(self) -> None:
        if (self.attempts > 0) == (self.bar_max > 0):
            raise ValueError("give either a fixed number of attempts or a BAR budget, not both")
        if self.bar_max and self.bar_step < 1:
            raise ValueError("the BAR step must be at least 1")
        if self.target_groups is not None and self.target_groups < 1:
            raise ValueError("the target number of groups must be at least 1")

    @property
    def patience(self) -> int:
        """Unanimous attempts after which a BAR group is filtered."""
        return min(self.bar_max, self.bar_patience or 2 * self.bar_step)

    @property
    def budget(self) -> int:
        """Most attempts one group may get."""
        return self.attempts or self.bar_max


@dataclass
class GroupState:
    """What the sampler knows of one group."""

    launched: int = 0
    stage_end: int = 0
    rewards: dict[int, float | None] = field(default_factory=dict)
    """attempt → reward, or None for an attempt lost to infra faults (no reward, budget spent)."""

    @property
    def graded(self) -> list[float]:
        """Rewards of the attempts that were scored."""
        return [r for _, r in sorted(self.rewards.items()) if r is not None]

    @property
    def settled(self) -> bool:
        """Every launched attempt has finished."""
        return len(self.rewards) >= self.launched


class Sampler:
    """Plans attempts group by group under a :class:`Policy`."""

    def __init__(self, policy: Policy, groups: list[GroupKey]) -> None:
        self.policy = policy
        self.order = list(groups)
        self.groups: dict[GroupKey, GroupState] = {g: GroupState() for g in groups}

    def launched(self, group: GroupKey, attempt: int) -> None:
        """An attempt was started (now, or in an earlier life of the run)."""
        state = self.groups[group]
        state.launched = max(state.launched, attempt + 1)
        if state.stage_end < state.launched:
            step = self.policy.attempts or self.policy.bar_step
            state.stage_end = min(self.policy.budget, -(-state.launched // step) * step)

    def finished(self, group: GroupKey, attempt: int, reward: float | None) -> None:
        """An attempt ended: its reward, or None if infra faults used up its retries."""
        self.groups[group].rewards[attempt] = reward

    def status(self, group: GroupKey) -> str:
        """``pending``, ``running``, ``informative`` or ``uninformative`` (finished without signal)."""
        state = self.groups[group]
        if state.launched == 0:
            return "pending"
        if self._wants(state) or not state.settled:
            return "running"
        return "informative" if informative(state.graded) else "uninformative"

    def informative_count(self) -> int:
        """Groups whose rewards already differ (finished or not)."""
        return sum(informative(s.graded) for s in self.groups.values())

    def _wants(self, state: GroupState) -> bool:
        """Whether this started group will still launch attempts."""
        if state.launched < state.stage_end:
            return True
        if self.policy.attempts or not state.settled:
            return False
        if informative(state.graded) or state.launched >= self.policy.bar_max:
            return False
        return len(state.graded) < self.policy.patience

    def next(self, capacity: int) -> list[tuple[GroupKey, int]]:
        """Up to ``capacity`` attempts to start now, started groups first."""
        plan: list[tuple[GroupKey, int]] = []
        for group in self.order:
            state = self.groups[group]
            if state.launched == 0:
                continue
            if state.launched >= state.stage_end and self._wants(state):
                state.stage_end = min(self.policy.bar_max, state.launched + self.policy.bar_step)
            while state.launched < state.stage_end and len(plan) < capacity:
                plan.append((group, state.launched))
                self.launched(group, state.launched)
        for group in self.order:
            if len(plan) >= capacity or not self._may_start():
                break
            if self.groups[group].launched == 0:
                state = self.groups[group]
                state.stage_end = self.policy.attempts or min(self.policy.bar_step, self.policy.bar_max)
                while state.launched < state.stage_end and len(plan) < capacity:
                    plan.append((group, state.launched))
                    self.launched(group, state.launched)
        return plan

    def _may_start(self) -> bool:
        target = self.policy.target_groups
        if target is None:
            return True
        undecided = sum(1 for s in self.groups.values()
                        if s.launched and not informative(s.graded) and (self._wants(s) or not s.settled))
        return self.informative_count() + undecided < target

    def done(self) -> bool:
        """Nothing running and nothing left to start."""
        if any(s.launched and (self._wants(s) or not s.settled) for s in self.groups.values()):
            return False
        return not self._may_start() or all(s.launched for s in self.groups.values())
