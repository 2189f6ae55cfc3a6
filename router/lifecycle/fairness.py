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


class ProjectLines:
    """Waiters (futures a wake resolves), one line per project in arrival order, woken round-robin between
    projects: after each wake, that project goes to the back."""

    def __init__(self) -> None:
        self._lines: collections.OrderedDict[str, collections.deque[asyncio.Future[None]]] = \
            collections.OrderedDict()
        """Per project, its waiters in arrival order; the projects in the order their turn comes."""

    def __bool__(self) -> bool:
        return bool(self._lines)

    def count(self, project: str | None = None) -> int:
        """How many wait (of one project, or of all)."""
        if project is not None:
            return len(self._lines.get(project, ()))
        return sum(len(line) for line in self._lines.values())

    def join(self, project: str, *, keep_turn: bool = False) -> asyncio.Future[None]:
        """A new waiter of ``project``'s, at the back of its line; ``keep_turn`` (one woken before that must
        wait again): at the front of its line, and its project's turn next."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        line = self._lines.setdefault(project, collections.deque())
        if keep_turn:
            line.appendleft(waiter)
            self._lines.move_to_end(project, last=False)
        else:
            line.append(waiter)
        return waiter

    def wake_next(self) -> bool:
        """Wake the first waiter of the project whose turn it is (that project goes to the back); False if
        none waits."""
        while self._lines:
            project, line = next(iter(self._lines.items()))
            waiter = line.popleft()
            if line:
                self._lines.move_to_end(project)
            else:
                del self._lines[project]
            if not waiter.done():
                waiter.set_result(None)
                return True
        return False

    def forget(self, project: str, waiter: asyncio.Future[None]) -> None:
        """Take ``waiter`` out of its line (it timed out or was cancelled), if it is still there."""
        line = self._lines.get(project)
        if line is None:
            return
        with contextlib.suppress(ValueError):
            line.remove(waiter)
        if not line:
            del self._lines[project]


class FairStarts:
    """``slots`` starts at once, shared round-robin between the projects waiting for one."""

    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError(f"a start gate needs at least one slot, got {slots}")
        self.slots = slots
        self._busy = 0
        self._waiting = ProjectLines()

    @contextlib.asynccontextmanager
    async def turn(self, project: str) -> AsyncIterator[None]:
        """Hold one of the slots for a start of ``project``'s, waiting for its turn if all are busy."""
        if self._busy < self.slots and not self._waiting:
            self._busy += 1
        else:
            waiter = self._waiting.join(project)
            try:
                await waiter  # the slot is handed over with the result: _busy already counts it
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._release()  # given a slot in the same instant it was cancelled: pass it on
                else:
                    self._waiting.forget(project, waiter)
                raise
        try:
            yield
        finally:
            self._release()

    def waiting(self, project: str | None = None) -> int:
        """How many starts wait for a slot (of one project, or of all)."""
        return self._waiting.count(project)

    def _release(self) -> None:
        """A slot is free: the next project in turn gets it (then goes to the back of the line), else it idles."""
        if not self._waiting.wake_next():  # the slot passes straight to the woken: _busy stays as it is
            self._busy -= 1
