"""How a streamed batch cuts its claims into parts, and the collector held off while it claims: pure logic
(the streamed answer itself runs through a real router in test_batch_stream.py)."""

from __future__ import annotations

import gc
import itertools

import pytest

from router.batch_stream import PART, gc_held, parts

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


def test_a_collector_turned_off_by_someone_else_stays_off() -> None:
    gc.disable()
    try:
        with gc_held():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
