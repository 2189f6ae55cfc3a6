"""pass@k estimates: unbiased under BAR and fixed groups, bootstrap intervals over tasks, honest plots.

The simulations drive the real :class:`Sampler` with tasks of known chance p, so the attempts that run are the
ones a rollout run would start; one test runs a real BAR run through a router and reads its files and plots.
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
import time
from pathlib import Path

import pytest
from matplotlib.collections import LineCollection

from grove.rollouts import Policy
from grove.rollouts.estimates import BAR_FIRST_K, CHEN, Estimates, Group, Scored, estimate, policy_of
from grove.rollouts.metrics import mean_pass_at_k, pass_at_k, pass_within
from grove.rollouts.plots import pass_at_k_figure, tasks_figure, variant_name
from grove.rollouts.sampling import Sampler
from tests.rollouts.runs import results, run, write_tasks
from tests.support.router_fixtures import RouterProcess

CHANCES = (0.0, 0.05, 0.15, 0.3, 0.5, 0.7, 0.9, 1.0)
"""Each simulated task's chance of passing is drawn from these, uniformly: the population is known exactly."""


def _groups(sampler: Sampler, threshold: float = 1.0) -> list[Group]:
    """The sampler's groups as the report sees them: scored attempts in order, lost ones counted."""
    groups = []
    for (_, task), state in sampler.groups.items():
        scored = tuple(Scored(a, r >= threshold, r) for a, r in sorted(state.rewards.items()) if r is not None)
        groups.append(Group(task, scored, lost=sum(r is None for r in state.rewards.values())))
    return groups


def _drive(policy: Policy, rewards: dict[str, list[float | None]]) -> list[Group]:
    """Run the real sampler to the end with known per-attempt rewards (None: lost to infrastructure faults)."""
    sampler = Sampler(policy, [(0, t) for t in rewards])
    while not sampler.done():
        plan = sampler.next(100)
        assert plan, "the sampler stalled"
        for (_, task), attempt in plan:
            sampler.finished((0, task), attempt, rewards[task][attempt])
    return _groups(sampler)


def _simulate(policy: Policy, tasks: int, rng: random.Random) -> tuple[list[Group], list[float]]:
    """One run: tasks with chances drawn from CHANCES (returned too); the sampler decides which attempts run."""
    chance = {f"t{i:02d}": rng.choice(CHANCES) for i in range(tasks)}
    sampler = Sampler(policy, [(0, t) for t in chance])
    while not sampler.done():
        for (_, task), attempt in sampler.next(1000):
            sampler.finished((0, task), attempt, 1.0 if rng.random() < chance[task] else 0.0)
    return _groups(sampler), list(chance.values())


def _truth(k: int, chances: tuple[float, ...] | list[float] = CHANCES) -> float:
    """pass@k of tasks with these chances: of the population by default, of one run's tasks if given."""
    return statistics.fmean(1 - (1 - p) ** k for p in chances)


@pytest.mark.fast
def test_pass_within_is_chens_estimator_for_one_stage_and_sees_a_pass_in_earlier_stages() -> None:
    for n in range(1, 7):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_within([(n, c)], k) == pytest.approx(pass_at_k(n, c, k))
    # Two stages of 2, the second with one pass in unseen order: the third attempt passed with chance 1/2.
    assert pass_within([(2, 0), (2, 1)], 3) == pytest.approx(0.5)
    assert pass_within([(2, 0), (2, 1)], 2) == 0.0 and pass_within([(2, 1)], 5) == 1.0
    assert pass_within([(2, 0)], 3) is None and pass_within([(0, 0), (1, 0)], 1) == 0.0
    with pytest.raises(ValueError, match="k >= 1"):
        pass_within([(2, 1)], 0)


@pytest.mark.fast
def test_intervals_cover_the_truth_and_bar_estimates_are_unbiased_and_monotone_over_many_seeds() -> None:
    started = time.monotonic()
    seeds, tasks, ks = 200, 40, (1, 2, 4, 6)
    for policy in (Policy(bar_max=8, bar_step=2, bar_patience=6), Policy(attempts=6)):
        errors: dict[int, list[float]] = {k: [] for k in ks}  # estimate minus the pass@k of the run's own tasks
        old: dict[int, list[float]] = {k: [] for k in ks}
        covered = dict.fromkeys(ks, 0)
        for seed in range(seeds):
            groups, chances = _simulate(policy, tasks, random.Random(seed))
            found = estimate(groups, policy, resamples=300)
            assert found.estimator == (BAR_FIRST_K if policy.bar_max else CHEN)
            assert all(found.groups[k] == tasks for k in ks), found.groups
            for k in ks:
                value, (low, high) = found.values[k], found.intervals[k] or (math.nan, math.nan)
                assert value is not None and low <= value <= high, (seed, k, found)
                errors[k].append(value - _truth(k, chances))
                covered[k] += low <= _truth(k) <= high  # intervals over tasks: for the population of tasks
                counts = [(len(g.scored), sum(s.passed for s in g.scored)) for g in groups]
                old[k].append((mean_pass_at_k(counts, k) or 0.0) - _truth(k, chances))
            for a, b in itertools.pairwise(ks):  # monotone in k, the intervals too, in every run
                lo_a, hi_a = found.intervals[a] or (0, 0)
                lo_b, hi_b = found.intervals[b] or (0, 0)
                assert (found.values[a] or 0) <= (found.values[b] or 0) and lo_a <= lo_b and hi_a <= hi_b, (seed, found)
        worst_old = 0.0
        for k in ks:
            bias, error = statistics.fmean(errors[k]), statistics.stdev(errors[k]) / math.sqrt(seeds)
            assert abs(bias) < 4 * error, (policy, k, bias, error)
            worst_old = max(worst_old, abs(statistics.fmean(old[k])) / error)
            # 95% intervals over many runs: near nominal (the coverage itself is known to about +-0.015 here).
            assert 0.90 <= covered[k] / seeds <= 0.99, (policy, k, covered[k] / seeds)
        if policy.bar_max:
            # The check has teeth: Chen's estimator over the groups that reached k attempts fails it under BAR.
            assert worst_old > 8, worst_old
    assert time.monotonic() - started < 30


@pytest.mark.fast
def test_bar_figures_cover_every_group_up_to_the_patience_and_no_further() -> None:
    rewards: dict[str, list[float | None]] = {
        "easy": [1.0] * 8, "impossible": [0.0] * 8, "early": [0.0, 1.0] + [0.0] * 6,
        "late": [0.0, 0.0, 0.0, 1.0] + [0.0] * 4}
    policy = Policy(bar_max=8, bar_step=2, bar_patience=3)
    groups = _drive(policy, rewards)
    # Stages of 2, patience 3: unanimous groups run 4 attempts; 'early' split in its first stage and stopped.
    assert {g.task: len(g.scored) for g in groups} == {"easy": 4, "impossible": 4, "early": 2, "late": 4}
    found = estimate(groups, policy)
    assert found.estimator == BAR_FIRST_K and found.k_limit == 3 and found.binary
    # k=1: the first stage's share of passes; k=3: 'late' passed once in its second stage, in unseen order.
    assert found.values == {1: pytest.approx((1 + 0 + 0.5 + 0) / 4), 2: pytest.approx((1 + 0 + 1 + 0) / 4),
                            3: pytest.approx((1 + 0 + 1 + 0.5) / 4), 4: None}
    assert found.groups == {1: 4, 2: 4, 3: 4, 4: 0}
    assert "patience (3)" in found.missing[4] and set(found.missing) == {4}
    # Chen's estimator over the groups with 4 attempts would have said 2/3, dropping 'early', which passed.
    assert mean_pass_at_k([(len(g.scored), sum(s.passed for s in g.scored)) for g in groups], 4) == pytest.approx(2 / 3)
    summary = found.as_summary()
    assert summary["pass_at_k"] == {"1": 0.375, "2": 0.5, "3": 0.625, "4": None}
    assert summary["pass_at_k_ci"]["4"] is None and len(summary["pass_at_k_ci"]["3"]) == 2
    assert summary["estimator"] == "bar-first-k" and summary["pass_at_k_limit"] == 3


@pytest.mark.fast
def test_a_bar_budget_run_out_by_lost_attempts_withholds_the_figure_and_says_why() -> None:
    rewards: dict[str, list[float | None]] = {
        "easy": [1.0] * 4, "unlucky": [0.0, None, 0.0, 0.0], "broken": [None] * 4, "split": [0.0, 1.0, 0.0, 0.0]}
    policy = Policy(bar_max=4, bar_step=2)  # patience 4 = the budget: no room to make up a lost attempt
    found = estimate(_drive(policy, rewards), policy)
    assert found.values[1] == pytest.approx((1 + 0 + 0.5) / 3) and found.values[2] == pytest.approx((1 + 0 + 1) / 3)
    assert found.values[4] is None and found.groups == {1: 3, 2: 3, 4: 0}  # 'broken' scored nothing: no outcome
    assert found.missing[4].startswith("1 group(s) (unlucky) have fewer than 4 scored attempts and no pass")
    assert "1 of their attempts were lost to infrastructure faults" in found.missing[4]
    # With budget to spare, BAR makes up the lost attempt and the figure is given.
    roomy = Policy(bar_max=6, bar_step=2, bar_patience=4)
    again = estimate(_drive(roomy, {**rewards, "unlucky": [0.0, None, 0.0, 0.0, 0.0, 0.0], "broken": [None] * 6}),
                     roomy)
    assert again.values[4] == pytest.approx((1 + 0 + 1) / 3) and 4 not in again.missing


@pytest.mark.fast
def test_non_binary_rewards_under_bar_give_only_the_first_stage() -> None:
    # Rewards 0.3 and 0.5 differ, so BAR stops the group although both fail (pass_threshold 1.0).
    rewards: dict[str, list[float | None]] = {"graded": [0.3, 0.5, 0.0, 0.0], "zeros": [0.0] * 4,
                                              "good": [1.0, 0.5, 1.0, 1.0]}
    policy = Policy(bar_max=4, bar_step=2)
    groups = _drive(policy, rewards)
    assert {g.task: len(g.scored) for g in groups} == {"graded": 2, "zeros": 4, "good": 2}
    found = estimate(groups, policy)
    assert not found.binary and found.k_limit == 2
    assert found.values == {1: pytest.approx(0.5 / 3), 2: pytest.approx(1 / 3), 4: None}
    assert "first stage (2)" in found.missing[4] and "rewards differ" in found.missing[4]


@pytest.mark.fast
def test_fixed_groups_keep_chens_estimator_over_the_groups_with_k_scored_attempts() -> None:
    rewards: dict[str, list[float | None]] = {"a": [1.0, 0.0, 0.0, 1.0], "b": [0.0, 0.0, 0.0, 0.0],
                                              "c": [1.0, None, 1.0, 0.0]}
    policy = Policy(attempts=4)
    groups = _drive(policy, rewards)
    found = estimate(groups, policy)
    counts = [(len(g.scored), sum(s.passed for s in g.scored)) for g in groups]
    assert found.estimator == CHEN and found.k_limit is None
    for k in (1, 2, 4):
        assert found.values[k] == pytest.approx(mean_pass_at_k(counts, k))
    assert found.groups == {1: 3, 2: 3, 4: 2}  # 'c' lost an attempt: 3 scored, not behind pass@4
    # A run that recorded no policy (older run directories) is read as fixed groups.
    assert policy_of({"variants": []}) is None and estimate(groups, None).values == found.values
    assert policy_of({"policy": {"bar_max": 8, "bar_step": 2, "added_later": 1}}) == Policy(bar_max=8, bar_step=2)


@pytest.mark.fast
def test_intervals_are_reproducible_and_need_two_tasks() -> None:
    policy = Policy(attempts=4)
    groups, _ = _simulate(policy, 12, random.Random(7))
    first: Estimates = estimate(groups, policy)
    assert estimate(groups, policy) == first  # a rebuilt report shows the same intervals
    assert first.as_summary()["bootstrap"] == {"unit": "task", "level": 0.95, "resamples": 2000, "seed": 0}
    assert all(ci is not None and ci[0] < ci[1] for ci in first.intervals.values()), first.intervals
    single = estimate(groups[:1], policy)
    assert single.values[1] is not None and single.intervals == {k: None for k in single.values}


def test_a_bar_run_reports_unbiased_pass_at_k_with_intervals_and_plots_with_legends(router: RouterProcess,
                                                                                    tmp_path: Path) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl", ("easy", "medium", "impossible"), prefix="est")
    out = tmp_path / "run"
    variants = [("scripted", "m-a"), ("scripted", "m-b"), ("scripted", "m-c")]
    summary = run(router, tasks, out, Policy(bar_max=8, bar_step=2), concurrency=6, variants=variants)
    lines = results(out)
    for v, variant in enumerate(summary["variants"]):
        mine = sorted((r for r in lines if r["variant"] == v), key=lambda r: r["attempt"])
        by_task: dict[str, list[bool]] = {}
        for r in mine:
            by_task.setdefault(r["task"], []).append(r["outcome"] == "pass")
        assert variant["estimator"] == "bar-first-k" and variant["pass_at_k_limit"] == 4
        # pass@1: each group's first stage (attempts 0 and 1); pass@4 (the patience): any pass in the group.
        first_stage = statistics.fmean(statistics.fmean(p[:2]) for p in by_task.values())
        assert variant["pass_at_k"]["1"] == round(first_stage, 4), (variant, by_task)
        assert variant["pass_at_k"]["4"] == round(statistics.fmean(any(p) for p in by_task.values()), 4)
        values = [variant["pass_at_k"][k] for k in ("1", "2", "4")]
        assert values == sorted(values) and variant["pass_at_k_groups"] == {"1": 3, "2": 3, "4": 3}
        for k, (low, high) in variant["pass_at_k_ci"].items():
            assert low <= variant["pass_at_k"][k] <= high
    report = (out / "report.md").read_text()
    assert "This is a BAR run" in report and "Given here for k <= 4" in report
    assert "95% percentile bootstrap intervals over tasks" in report and "| pass@1 | " in report

    chart = pass_at_k_figure(summary)
    ax = chart.axes[0]
    legend = ax.get_legend()
    assert legend is not None and [t.get_text() for t in legend.get_texts()] == [
        "scripted / m-a", "scripted / m-b", "scripted / m-c"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "4"]
    assert len([c for c in ax.collections if isinstance(c, LineCollection)]) == 3  # one set of intervals each
    bars = tasks_figure(summary, lines)
    assert bars is not None
    ax = bars.axes[0]
    legend = ax.get_legend()
    assert legend is not None and [t.get_text() for t in legend.get_texts()] == [
        variant_name(v) for v in summary["variants"]]
    labels = sorted(t.get_text() for t in ax.texts)
    scored = sorted(f"n={sum(r['task'] == task and r['variant'] == v and r['outcome'] != 'infra_error' for r in lines)}"
                    for v in range(3) for task in {r["task"] for r in lines})
    assert labels == scored and all(label != "n=0" for label in labels)
    for name in ("pass_at_k.png", "tasks.png"):
        assert (out / name).stat().st_size > 1000
