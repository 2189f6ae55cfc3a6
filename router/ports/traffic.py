"""What went through a sandbox's ports, summarized into its trajectory.

A page load is dozens of requests: one step each would bury the agent's own steps. So requests are counted
per port, and a ``port_traffic`` step with the counts since the last one is written at most every
``interval_s`` (and at the router's end); a WebSocket or terminal session is a step of its own when it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from router.records.registry import SandboxRecord
from router.trajectory.recorder import Recorder

FLUSH_S = 5.0


@dataclass
class Counts:
    """One port's traffic since its last step."""

    since: float = field(default_factory=time.time)
    requests: int = 0
    websockets: int = 0
    bytes_in: int = 0
    """Bytes from the client to the sandbox's server (request bodies, messages sent)."""
    bytes_out: int = 0
    """Bytes from the sandbox's server to the client."""
    statuses: dict[str, int] = field(default_factory=dict)

    def step(self, port: int) -> dict[str, Any]:
        return {"type": "port_traffic", "t": self.since, "until": time.time(), "port": port,
                "requests": self.requests, "websockets": self.websockets, "bytes_in": self.bytes_in,
                "bytes_out": self.bytes_out, "statuses": dict(self.statuses)}


class Traffic:
    """Counters per (sandbox, port), written to the sandbox's trajectory by :meth:`flush`."""

    def __init__(self, recorder: Recorder, interval_s: float = FLUSH_S) -> None:
        self.recorder = recorder
        self.interval_s = interval_s
        self._counts: dict[tuple[str, int], tuple[SandboxRecord, Counts]] = {}

    def counts(self, record: SandboxRecord, port: int) -> Counts:
        """The port's open counters (made on its first request since the last step)."""
        entry = self._counts.get((record.id, port))
        if entry is None:
            entry = self._counts[(record.id, port)] = (record, Counts())
        return entry[1]

    def request(self, record: SandboxRecord, port: int, status: int, bytes_in: int, bytes_out: int) -> None:
        """One HTTP request answered (or refused) through the port."""
        counts = self.counts(record, port)
        counts.requests += 1
        counts.bytes_in += bytes_in
        counts.bytes_out += bytes_out
        counts.statuses[str(status)] = counts.statuses.get(str(status), 0) + 1

    def session(self, record: SandboxRecord, kind: str, step: dict[str, Any]) -> None:
        """A WebSocket or terminal session that ended: a step of its own, with what moved."""
        self.recorder.step(record, {"type": kind, **step})

    def flush(self) -> None:
        """Write one step per port with traffic since its last, and start counting anew."""
        entries, self._counts = self._counts, {}
        for (_, port), (record, counts) in entries.items():
            self.recorder.step(record, counts.step(port))

    @contextlib.asynccontextmanager
    async def flushing(self) -> AsyncIterator[Traffic]:
        """Flush every ``interval_s`` for the block, and once more at its end."""

        async def loop() -> None:
            while True:
                await asyncio.sleep(self.interval_s)
                self.flush()

        task = asyncio.create_task(loop())
        try:
            yield self
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            self.flush()
