"""The numbers of a run: unbiased pass@k, informative groups, group-relative advantages (pure functions)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one task with ``c`` passes in ``n`` samples: 1 - C(n-c, k) / C(n, k)
    (Chen et al., 2021). Needs ``k <= n``."""
    if not 0 < k <= n or not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 < k <= n and 0 <= c <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    # The product form avoids huge binomials: prod_{i=n-c+1}^{n} (1 - k/i).
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def mean_pass_at_k(groups: Sequence[tuple[int, int]], k: int) -> float | None:
    """Mean pass@k over the groups ``(n, c)`` that have at least ``k`` samples; None if none has."""
    values = [pass_at_k(n, c, k) for n, c in groups if n >= k]
    return statistics.fmean(values) if values else None


def pass_within(stages: Sequence[tuple[int, int]], k: int) -> float | None:
    """Chance that one of the first ``k`` attempts passed, given ``(attempts, passes)`` per stage in order and the
    order inside each stage unseen: 1 - C(n-c, k)/C(n, k) for one stage. None (unknown) when there are fewer
    than ``k`` attempts and none passed."""
    if k < 1:
        raise ValueError(f"pass@k needs k >= 1, got k={k}")
    seen = 0
    for n, c in stages:
        if k - seen <= n:
            return pass_at_k(n, c, k - seen)
        if c:
            return 1.0  # a pass among whole earlier stages: one of the first k passed, whatever came after
        seen += n
    return None


def ks_for(max_n: int) -> list[int]:
    """The k worth reporting for groups of up to ``max_n`` samples: 1, 2, 4, 8, ... and ``max_n``."""
    ks, k = [], 1
    while k <= max_n:
        ks.append(k)
        k *= 2
    if max_n >= 1 and ks[-1] != max_n:
        ks.append(max_n)
    return ks


def informative(rewards: Sequence[float]) -> bool:
    """A group teaches a policy-gradient learner something only if its rewards differ."""
    return len(rewards) >= 2 and max(rewards) > min(rewards)


def advantages(rewards: Sequence[float], *, normalize: bool = True, eps: float = 1e-6) -> list[float]:
    """Group-relative advantages: reward minus the group mean, divided by the group's standard deviation
    (GRPO) when ``normalize``; all zero for a group whose rewards are equal."""
    if not rewards:
        return []
    mean = statistics.fmean(rewards)
    centred = [r - mean for r in rewards]
    if not normalize:
        return centred
    std = statistics.pstdev(rewards)
    return [0.0 if std < eps else c / std for c in centred]
