"""An idle router refills a pool a few starts at a time (``IDLE_STARTS``: a training step's gap is when a pool must
become full again), and never makes more members than the pool's size."""

from __future__ import annotations

import time

from grove.client import Grove
from router.pools.filler import IDLE_STARTS
from tests.router.test_pools import SMALL, _members
from tests.support.router_fixtures import RouterProcess, wait_for


def test_an_idle_router_refills_a_few_at_a_time_and_never_past_the_size(router: RouterProcess, grove: Grove) -> None:
    size = 8
    grove.create_pool("refill-two", size=size, resources={**SMALL, "memory_mb": 288})
    try:
        starting_seen: set[int] = set()
        most_members = 0
        deadline = time.monotonic() + 120
        while (shown := grove.pool("refill-two"))["ready"] < size:  # pool reads are not users' work: still idle
            assert time.monotonic() < deadline, f"the pool did not fill: {shown}"
            starting_seen.add(shown["starting"])
            most_members = max(most_members, len(_members(router, "refill-two")))
            time.sleep(0.05)
        assert max(starting_seen) == IDLE_STARTS, f"starts at once seen: {sorted(starting_seen)}"
        assert most_members <= size and len(_members(router, "refill-two")) == size
        assert grove.pool("refill-two")["starting"] == 0
    finally:
        grove.delete_pool("refill-two")  # its members with it, however the test ended
    wait_for(lambda: not _members(router, "refill-two"), 30, what="the unclaimed members gone")
