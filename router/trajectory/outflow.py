"""A router-wide byte budget for storing the full outputs of truncated commands in the background.

Storing a full output costs CPU outside the sandbox's cgroups, where its CPU quota does not reach: the
router relays the file (a sandbox with egress denied cannot reach the object store) and the S3 server
writes it — together about 18 ms of CPU per MiB on a 2-CPU benchmark machine, so a 256 MiB stdout took
4.6 s of host CPU for 0.9 s of the sandbox's own (``perf/README.md``, "Noisy neighbours"). Unbounded,
one sandbox flooding its stdout would keep the host busy several cores deep for each core it is allowed,
and every other sandbox's calls would wait. The budget lets the stores of all sandboxes together go at
``rate`` bytes per second after a ``burst``: an ordinary truncated output is stored at once, a flood is
stored at the budget's pace. A sandbox deleted before its turn takes its files with it, as it would if
it were deleted before any store; a router stopping does not wait for the queue (:meth:`ByteBudget.close`):
what had not had its turn stays in the sandbox's output directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from grove.core.errors import Invalid, Unavailable


class ByteBudget:
    """A token bucket of bytes that may go into debt: a large spend waits until the debt is paid off.

    Callers queue by the debt they find, so they are served roughly first come, first served. One event
    loop only (no lock: nothing awaits between reading and updating the balance).
    """

    def __init__(
        self, rate_bytes_per_s: float, burst_bytes: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if rate_bytes_per_s <= 0 or burst_bytes < 0:
            raise Invalid(f"a byte budget needs a rate > 0 and a burst >= 0, got {rate_bytes_per_s}, {burst_bytes}")
        self.rate = float(rate_bytes_per_s)
        self.burst = float(burst_bytes)
        self._clock = clock
        self._balance = self.burst
        self._at = clock()
        self._closed = asyncio.Event()

    def _refill(self) -> None:
        now = self._clock()
        self._balance = min(self.burst, self._balance + (now - self._at) * self.rate)
        self._at = now

    def reserve(self, nbytes: int) -> float:
        """Take ``nbytes`` now; the seconds the caller must wait before using them (0 within the burst)."""
        self._refill()
        self._balance -= max(0, nbytes)
        return 0.0 if self._balance >= 0 else -self._balance / self.rate

    async def spend(self, nbytes: int) -> float:
        """Take ``nbytes`` and wait until they are paid for; the seconds waited. Raises
        :class:`Unavailable` if the budget is (or gets) closed first."""
        wait = self.reserve(nbytes)
        if wait > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closed.wait(), wait)
        if self._closed.is_set():
            raise Unavailable("the router is stopping")
        return wait

    def close(self) -> None:
        """Release every waiting spender with :class:`Unavailable`, now and from now on."""
        self._closed.set()
