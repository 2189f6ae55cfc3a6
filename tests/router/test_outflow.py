"""The byte budget that paces storing truncated commands' full outputs (router/trajectory/outflow.py).

Pure arithmetic on a clock the test moves, plus the release on close; storing a full output through a
real router is tests/router/test_record.py's ``test_a_truncated_output_is_kept_whole_in_s3``.
"""

from __future__ import annotations

import asyncio

import pytest

from grove.core.errors import Invalid, Unavailable
from router.trajectory.outflow import ByteBudget

pytestmark = pytest.mark.fast  # pure logic: `make test-fast`

MiB = 1024 * 1024


class Clock:
    """A monotonic clock the test advances."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_within_the_burst_nothing_waits_beyond_it_the_debt_is_paid_at_the_rate() -> None:
    clock = Clock()
    budget = ByteBudget(8 * MiB, 64 * MiB, clock=clock)
    assert budget.reserve(3 * MiB) == 0.0
    assert budget.reserve(61 * MiB) == 0.0  # the burst is used up exactly
    assert budget.reserve(16 * MiB) == pytest.approx(2.0)  # 16 MiB of debt at 8 MiB/s
    assert budget.reserve(8 * MiB) == pytest.approx(3.0)  # queued behind the first debt
    clock.now += 3.0  # the debt is paid off
    assert budget.reserve(0) == pytest.approx(0.0)
    clock.now += 3600.0  # a long quiet spell refills the burst, never beyond it
    assert budget.reserve(64 * MiB) == 0.0
    assert budget.reserve(1) > 0.0


def test_a_closed_budget_releases_its_waiters_and_refuses_new_spends() -> None:
    async def scenario() -> None:
        budget = ByteBudget(1.0, 0.0)  # one byte a second: a 1,000-byte spend would wait 17 minutes
        waiter = asyncio.create_task(budget.spend(1000))
        await asyncio.sleep(0.05)
        assert not waiter.done()
        budget.close()
        with pytest.raises(Unavailable):
            await asyncio.wait_for(waiter, 5)
        with pytest.raises(Unavailable):
            await budget.spend(0)

    asyncio.run(scenario())


def test_a_spend_within_the_burst_returns_at_once() -> None:
    async def scenario() -> float:
        return await ByteBudget(1.0, 10.0).spend(10)

    assert asyncio.run(scenario()) == 0.0


@pytest.mark.parametrize(("rate", "burst"), [(0, 1), (-1, 1), (1, -1)])
def test_nonsense_settings_are_refused(rate: float, burst: float) -> None:
    with pytest.raises(Invalid):
        ByteBudget(rate, burst)
