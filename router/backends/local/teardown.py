"""The remains of deleted local sandboxes, removed in batches off the delete's path.

A delete answers once the sandbox can no longer run: its PID 1 is dead (and with it every process of its PID
namespace), nothing is left in its cgroups, its network links are gone and its record is safe. What is left
then is bookkeeping the kernel finishes at its own pace — empty cgroups that refuse ``rmdir`` until their last
task is reaped, a loop device the kernel detaches once the dead mount namespace lets go of the disk image —
and files: the sandbox's directory and its host id range.

Each delete used to wait for all of it on its own, polling: its cgroups every 10 ms, its loop device every
10 ms after a scan of every loop device of the host (a thousand files to read with a thousand sandboxes
alive: the scan cost grows with the burst, once per delete), and three thread hops. Here the deletes hand their
sandboxes to one :class:`Teardown`, which removes everything pending in one pass on one worker thread: one
scan of the loop devices for all of them, each cgroup tried once, each directory removed once its disk is
free. What the kernel has not let go of yet waits for the next pass.

Nothing is lost on a crash: the delete has forgotten the sandbox's record before it answers, so a router
that starts again finds whatever was still pending as an orphan (a cgroup or a directory with no record) and
removes it (:meth:`router.backends.local.backend.LocalBackend.collect_orphans`). A router closing cleanly
waits for the passes to finish (:meth:`Teardown.drain`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from grove.core.errors import Unavailable

log = logging.getLogger("grove.router")

PASS_INTERVAL_S = 0.1
"""Between two passes while something is pending: long enough that a burst's deletes share a pass, short
enough that a test waiting for a sandbox's files to go does not wait long."""
STUCK_AFTER_S = 60.0
"""A sandbox still pending this long is reported in the log, once (it is kept trying)."""

Sweep = Callable[[list[str]], set[str]]
"""One pass over the pending sandboxes on a worker thread: the ids whose remains are all gone."""


class Teardown:
    """Sandboxes deleted and answered for, their remains removed by :data:`Sweep` passes until none is left."""

    def __init__(self, sweep: Sweep, done: Callable[[str], None], interval_s: float = PASS_INTERVAL_S) -> None:
        self._sweep = sweep
        self._done = done
        """Called on the event loop for each sandbox once its remains are gone (its host id range released)."""
        self._interval_s = interval_s
        self._pending: dict[str, float] = {}
        """Sandbox id → ``time.monotonic()`` when it was handed over."""
        self._task: asyncio.Task[None] | None = None
        self._sweeping: asyncio.Future[set[str]] | None = None
        """The pass on the worker thread now, if any."""
        self._idle = asyncio.Event()
        self._idle.set()
        self._warned: set[str] = set()
        self.passes = 0
        """Passes made (for the benchmarks and tests)."""

    def add(self, sandbox_id: str) -> None:
        """Remove this (killed, emptied) sandbox's remains in the next passes."""
        self._pending.setdefault(sandbox_id, time.monotonic())
        self._idle.clear()
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run())

    def pending(self) -> int:
        """How many sandboxes' remains are not removed yet."""
        return len(self._pending)

    def __contains__(self, sandbox_id: object) -> bool:
        return sandbox_id in self._pending

    async def _run(self) -> None:
        try:
            while self._pending:
                await asyncio.sleep(self._interval_s)
                await self.sweep_once()
        finally:
            if not self._pending:
                self._idle.set()

    async def sweep_once(self) -> None:
        """One pass over everything pending now."""
        batch = list(self._pending)
        self._sweeping = asyncio.ensure_future(asyncio.to_thread(self._sweep, batch))
        try:
            gone = await asyncio.shield(self._sweeping)
        except Exception:  # a bug must not end the passes: what is pending stays, and is tried again
            log.exception("removing the remains of %d deleted sandbox(es) failed; trying again", len(batch))
            return
        finally:
            self._sweeping = None
        self.passes += 1
        now = time.monotonic()
        for sandbox_id in batch:
            if sandbox_id not in self._pending:  # taken over by finish() meanwhile
                continue
            if sandbox_id in gone:
                del self._pending[sandbox_id]
                self._warned.discard(sandbox_id)
                self._done(sandbox_id)
            elif now - self._pending[sandbox_id] > STUCK_AFTER_S and sandbox_id not in self._warned:
                self._warned.add(sandbox_id)
                log.warning("sandbox %s was deleted %.0f s ago and its cgroups, loop device or files are still "
                            "there; still trying", sandbox_id, now - self._pending[sandbox_id])

    async def finish(self, sandbox_id: str, timeout_s: float) -> None:
        """Remove this sandbox's remains now, if it has any pending (its id is about to be started again: a
        create a crash left half-made starts over under the same id). Unavailable if they outlast the wait."""
        if sandbox_id not in self._pending:
            return
        while self._sweeping is not None:  # a pass working on it must not remove what the new start makes
            with contextlib.suppress(Exception):
                await asyncio.shield(self._sweeping)
        if self._pending.pop(sandbox_id, None) is None:  # that pass removed them
            return
        self._warned.discard(sandbox_id)
        deadline = time.monotonic() + timeout_s
        while not await asyncio.to_thread(self._sweep, [sandbox_id]):
            if time.monotonic() > deadline:
                self._pending[sandbox_id] = time.monotonic()  # the passes keep trying
                raise Unavailable(f"sandbox {sandbox_id} cannot start yet: the cgroups, loop device or files of its "
                                  f"previous run are still there {timeout_s:g} s after it was killed; try again",
                                  retry_after=1)
            await asyncio.sleep(0.01)
        self._done(sandbox_id)

    async def drain(self, timeout_s: float) -> bool:
        """Wait (at most ``timeout_s``) until nothing is pending; whether nothing is."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        return not self._pending

    async def close(self) -> None:
        """Stop the passes (what is still pending is an orphan the next start removes)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
