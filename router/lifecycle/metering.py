"""The end of a sandbox's run: what the backend read of it goes into the sums on its record (router/records/cost.py).

A run begins when a sandbox is ready (started, woken, or claimed from a warm pool) and ends when it is scaled to
zero, found stopped, or deleted; its usage is read just before the backend stops or removes it, while its counters
(and, on the local backend, its writable layer, seen through its processes) are still there.
"""

from __future__ import annotations

import logging
import time

from router.backends.base import Backend
from router.records.registry import SandboxRecord

log = logging.getLogger("grove.router")


async def run_ended(backend: Backend, record: SandboxRecord) -> None:
    """Close the sandbox's current run, if one is open: add its time and what the backend can read of it (a
    reading that fails costs the figures of that run, never the stop or the delete)."""
    if record.spent.run_started is None:
        return
    try:
        usage = await backend.usage(record.id, record.handle)
    except Exception:
        log.exception("could not read what %s used; its cost lacks this run's figures", record.id)
        usage = None
    record.spent.ended(usage, time.time())
