"""The lines creates wait in (starts, and room on the host): woken one at a time, round-robin between
projects, each project's in the order they came; a waiter woken and still short keeps its turn."""

from __future__ import annotations

import asyncio

from router.lifecycle.fairness import FairStarts, ProjectLines


def test_wakes_go_round_robin_between_projects_and_in_order_within_one() -> None:
    async def order() -> list[str]:
        lines = ProjectLines()
        waiters = [(name, lines.join(name.split("-")[0])) for name in ("a-1", "a-2", "a-3", "b-1", "c-1", "b-2")]
        woken: list[str] = []
        while lines.wake_next():
            woken += [name for name, waiter in waiters if waiter.done() and name not in woken]
        return woken

    assert asyncio.run(order()) == ["a-1", "b-1", "c-1", "a-2", "b-2", "a-3"]


def test_a_waiter_that_keeps_its_turn_is_woken_next_and_a_forgotten_one_never() -> None:
    async def order() -> tuple[list[str], int]:
        lines = ProjectLines()
        a1, b1 = lines.join("a"), lines.join("b")
        assert lines.wake_next() and a1.done() and not b1.done()
        again = lines.join("a", keep_turn=True)  # woken, still short: waits again, first
        b2 = lines.join("b")
        lines.forget("b", b1)
        woken = []
        while lines.wake_next():
            woken += [name for name, w in (("a-again", again), ("b-2", b2)) if w.done() and name not in woken]
        return woken, lines.count()

    assert asyncio.run(order()) == (["a-again", "b-2"], 0)


def test_a_burst_of_one_project_holds_anothers_start_back_by_one_turn() -> None:
    """With one slot: project a's ten starts wait in line; b's one start comes right after a's first."""
    async def order() -> list[str]:
        gate, go = FairStarts(1), asyncio.Event()
        started: list[str] = []

        async def start(name: str) -> None:
            async with gate.turn(name.split("-")[0]):
                started.append(name)
                await go.wait()

        tasks = [asyncio.create_task(start(f"a-{i}")) for i in range(10)]
        await asyncio.sleep(0)  # a-0 holds the slot, the rest of a's burst waits
        tasks.append(asyncio.create_task(start("b-0")))
        await asyncio.sleep(0)
        assert gate.waiting("a") == 9 and gate.waiting("b") == 1 and gate.waiting() == 10
        go.set()
        await asyncio.gather(*tasks)
        return started

    started = asyncio.run(order())
    assert started[:3] == ["a-0", "a-1", "b-0"] and len(started) == 11, started
