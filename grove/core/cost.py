"""What a sandbox cost, written once: the figures the router records when a sandbox ends (in its trajectory, its
index entry and the answer of its delete) and that rollouts add up per attempt, variant, project and run.

A figure the backend could not read is None (the Knative backend reads no counters of its pods); a sum leaves
out what is unknown, and is None only when every part is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

FIELDS = ("cpu_s", "memory_gb_s", "memory_peak_mb", "disk_bytes", "s3_bytes", "running_s")
"""The figures, in the order reports show them."""
_ROUND = {"cpu_s": 3, "memory_gb_s": 3, "memory_peak_mb": 1, "running_s": 3}
_WHOLE = ("disk_bytes", "s3_bytes")


@dataclass(frozen=True)
class Cost:
    """What one sandbox cost over its whole life — every run, a scale to zero and back included — or several
    sandboxes' costs added up."""

    cpu_s: float | None = None
    """CPU-seconds (user and system) its processes used, the executor's own work included."""
    memory_gb_s: float | None = None
    """Memory reserved: its memory limit in GiB times ``running_s`` (a sandbox scaled to zero reserves none)."""
    memory_peak_mb: float | None = None
    """The most memory (MiB) it held at once: its processes and the page cache of its files. A sum keeps the
    largest single peak, not the sum of peaks."""
    disk_bytes: int | None = None
    """What its writable layer (what it changed of its image) held when it ended."""
    s3_bytes: int | None = None
    """What it left in object storage: its trajectory record, its artifacts and commands' full outputs."""
    running_s: float | None = None
    """Seconds it ran: from ready (or claimed from a warm pool) to scaled to zero or deleted, over every run."""

    def to_dict(self) -> dict[str, float | int | None]:
        """The figures as JSON values, rounded (bytes whole)."""
        out: dict[str, float | int | None] = {}
        for name in FIELDS:
            value = getattr(self, name)
            out[name] = None if value is None else int(value) if name in _WHOLE else round(value, _ROUND[name])
        return out

    @classmethod
    def from_dict(cls, value: Any) -> Cost | None:
        """A cost read back (from a router's answer, a record, a results file); None if ``value`` is no cost at all.
        A figure that is not a finite, non-negative number counts as unknown: what reaches a report is never
        trusted to be well-formed."""
        if not isinstance(value, dict):
            return None
        found: dict[str, Any] = {}
        for name in FIELDS:
            figure = value.get(name)
            if isinstance(figure, int | float) and not isinstance(figure, bool) and math.isfinite(figure) \
                    and figure >= 0:
                found[name] = int(figure) if name in _WHOLE else float(figure)
        return cls(**found)

    def __add__(self, other: Cost) -> Cost:
        """Both costs together: figures summed, the peak the larger; unknown parts left out."""
        added: dict[str, Any] = {}
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if mine is None or theirs is None:
                added[f.name] = theirs if mine is None else mine
            else:
                added[f.name] = max(mine, theirs) if f.name == "memory_peak_mb" else mine + theirs
        return Cost(**added)


def total(costs: list[Cost]) -> Cost:
    """The sum of some costs (an empty list: every figure unknown)."""
    summed = Cost()
    for cost in costs:
        summed = summed + cost
    return summed
