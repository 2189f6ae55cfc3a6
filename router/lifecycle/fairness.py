"""Starting sandboxes, shared fairly between projects.

A host starts only a few sandboxes at once (the backend's ``start_slots``); a burst of 2,000 creates from one
training run would otherwise queue every other project's create behind all of them. :class:`FairStarts` hands
out the slots round-robin over the projects that wait: each project's own creates start in the order they
came, and a project with one create waiting gets the next free slot after at most one turn of every other
waiting project. So another project's create waits for at most (number of busy projects) starts, whatever
the size of the burst in front of it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator


class FairStarts:
    """``slots`` starts at once, shared round-robin between the projects waiting for one."""

    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError(f"a start gate needs at least one slot, got {slots}")
        self.slots = slots
        self._busy = 0
        self._waiting: collections.OrderedDict[str, collections.deque[asyncio.Future[None]]] = \
            collections.OrderedDict()
        """Per project, its waiters in arrival order; the projects in the order their turn comes."""

    @contextlib.asynccontextmanager
    async def turn(self, project: str) -> AsyncIterator[None]:
        """Hold one of the slots for a start of ``project``'s, waiting for its turn if all are busy."""
        if self._busy < self.slots and not self._waiting:
            self._busy += 1
        else:
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiting.setdefault(project, collections.deque()).append(waiter)
            try:
                await waiter  # the slot is handed over with the result: _busy already counts it
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._release()  # given a slot in the same instant it was cancelled: pass it on
                else:
                    self._forget(project, waiter)
                raise
        try:
            yield
        finally:
            self._release()

    def waiting(self, project: str | None = None) -> int:
        """How many starts wait for a slot (of one project, or of all)."""
        if project is not None:
            return len(self._waiting.get(project, ()))
        return sum(len(queue) for queue in self._waiting.values())

    def _release(self) -> None:
        """A slot is free: the next project in turn gets it (then goes to the back of the line), else it idles."""
        while self._waiting:
            project, queue = next(iter(self._waiting.items()))
            waiter = queue.popleft()
            if queue:
                self._waiting.move_to_end(project)
            else:
                del self._waiting[project]
            if not waiter.done():
                waiter.set_result(None)  # the slot passes straight to it: _busy stays as it is
                return
        self._busy -= 1

    def _forget(self, project: str, waiter: asyncio.Future[None]) -> None:
        queue = self._waiting.get(project)
        if queue is None:
            return
        with contextlib.suppress(ValueError):
            queue.remove(waiter)
        if not queue:
            del self._waiting[project]
