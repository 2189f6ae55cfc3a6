"""What a sandbox used so far, kept on its record: summed over its runs, so a sandbox scaled to zero and woken
again (or adopted by a restarted router) is charged for each run once, and for none of the time it slept."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from grove.core.cost import Cost
from router.backends.base import RunUsage


@dataclass
class Spent:
    """A sandbox's usage over the runs that ended, and when the current one began."""

    cpu_s: float | None = None
    """CPU-seconds of the runs that ended (None while no run's CPU time could be read)."""
    memory_peak_mb: float | None = None
    """The largest memory peak of any run."""
    disk_bytes: int | None = None
    """What its writable layer held at the last reading (the layer does not change while it sleeps)."""
    s3_bytes: int | None = None
    """What it left in object storage, once its trajectory was stored."""
    running_s: float = 0.0
    """Seconds its ended runs ran."""
    runs: int = 0
    """Runs that ended."""
    run_started: float | None = None
    """When the current run began (wall clock; for a pool member, its claim); None while it does not run."""

    def began(self, now: float) -> None:
        """A run began (a start, a wake-up, a claim: a pool member's wait before it is nobody's run)."""
        self.run_started = now

    def ended(self, usage: RunUsage | None, now: float) -> None:
        """The current run ends: add its time and what the backend read of it (nothing if no run is open)."""
        if self.run_started is None:
            return
        self.running_s += max(0.0, now - self.run_started)
        self.runs += 1
        self.run_started = None
        if usage is None:
            return
        if usage.cpu_s is not None:
            self.cpu_s = (self.cpu_s or 0.0) + usage.cpu_s
        if usage.memory_peak_mb is not None:
            self.memory_peak_mb = max(self.memory_peak_mb or 0.0, usage.memory_peak_mb)
        if usage.disk_bytes is not None:
            self.disk_bytes = usage.disk_bytes

    def cost(self, memory_mb: int) -> Cost:
        """The figures of the runs that ended (``memory_mb``: the sandbox's memory limit, reserved while it runs)."""
        return Cost(cpu_s=self.cpu_s, memory_gb_s=memory_mb / 1024 * self.running_s,
                    memory_peak_mb=self.memory_peak_mb, disk_bytes=self.disk_bytes, s3_bytes=self.s3_bytes,
                    running_s=self.running_s)

    def to_disk(self) -> dict[str, Any]:
        """What the record file keeps."""
        return dict(vars(self))

    @classmethod
    def from_disk(cls, data: Any) -> Spent:
        """Back from :meth:`to_disk`; a record written before costs were kept starts from nothing."""
        if not isinstance(data, dict):
            return cls()
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})
