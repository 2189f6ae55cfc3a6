"""A token bucket for Kubernetes writes: a burst of 1,000 creates must not flatten the API server."""

from __future__ import annotations

import asyncio
import time


class TokenBucket:
    """``rate`` tokens per second, at most ``burst`` saved up; ``acquire`` waits for one, first come first served."""

    def __init__(self, rate: float, burst: int) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("a token bucket needs a positive rate and a burst of at least 1")
        self.rate = rate
        """Tokens added per second."""
        self.burst = burst
        """Most tokens held at once."""
        self._tokens = float(burst)
        self._stamp = time.monotonic()
        self._lock = asyncio.Lock()  # waiters queue here, so they are served in arrival order
        self.waited_s = 0.0
        """Total time callers spent waiting (for metrics and the scaling notes)."""

    def _refill(self) -> None:
        now = time.monotonic()
        self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now

    async def acquire(self) -> None:
        """Take one token, waiting until there is one."""
        async with self._lock:
            self._refill()
            if self._tokens < 1:
                delay = (1 - self._tokens) / self.rate
                self.waited_s += delay
                await asyncio.sleep(delay)
                self._refill()
            self._tokens -= 1
