"""How a streamed batch cuts its claims into parts, and the collector held off while it claims: pure logic
(the streamed answer itself runs through a real router in test_batch_stream.py)."""

from __future__ import annotations

import asyncio
import gc
import itertools

import pytest

from router.api.batch_stream import PART, gc_held, parts

pytestmark = pytest.mark.fast


@pytest.mark.parametrize("count", [1, 2, 3, 7, PART, PART + 1, 2 * PART + 1, 1000])
def test_parts_cover_the_group_once_in_order_with_the_median_in_the_first(count: int) -> None:
    cut = parts(count)
    assert cut[0][0] == 0 and cut[-1][1] == count
    assert all(end == start for (_, end), (start, _) in itertools.pairwise(cut)), cut
    assert all(start < end for start, end in cut), cut
    # The median as percentiles take it (between the two middle ones of an even count) is in the first part.
    first = cut[0][1]
    assert first > count // 2, f"the median sandbox of {count} must be in the first part, not after {first}"
    assert all(end - start <= PART for start, end in cut[1:]), cut


def test_a_thousand_claims_are_answered_as_more_than_half_then_parts_of_part() -> None:
    assert parts(1000) == [(0, 501), (501, 751), (751, 1000)]
    assert parts(0) == []


def test_the_collector_is_held_off_while_claiming_and_back_after() -> None:
    async def claiming() -> None:
        assert gc.isenabled()
        with gc_held():
            assert not gc.isenabled()
            with gc_held():  # a second batch claiming at the same time
                assert not gc.isenabled()
            assert not gc.isenabled(), "the first batch still claims: the collector stays off"
        assert gc.isenabled()
        with pytest.raises(RuntimeError), gc_held():
            raise RuntimeError("a claim failed")
        assert gc.isenabled(), "a failed batch must still turn the collector back on"

    asyncio.run(claiming())


def test_a_batch_held_up_holds_the_collector_off_no_longer_than_its_bound() -> None:
    # A client that does not read its stream holds its batch up; the collector comes back on all the same.
    async def stuck() -> None:
        with gc_held(max_s=0.05):
            assert not gc.isenabled()
            await asyncio.sleep(0.3)
            assert gc.isenabled(), "the collector must be back on once the bound has passed"
            with gc_held(max_s=0.05):  # another batch meanwhile: the bound has passed, it stays on
                assert gc.isenabled()
        assert gc.isenabled()

    asyncio.run(stuck())


def test_a_collector_turned_off_by_someone_else_stays_off() -> None:
    async def claiming() -> None:
        with gc_held():
            assert not gc.isenabled()

    gc.disable()
    try:
        asyncio.run(claiming())
        assert not gc.isenabled()
    finally:
        gc.enable()
