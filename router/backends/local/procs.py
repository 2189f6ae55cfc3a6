"""Host processes by pid *and* start time, so a recycled pid is never mistaken for a sandbox."""

from __future__ import annotations

import contextlib
import os
import signal

from router.backends.local import kernfiles


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot, or None if it is gone or a zombie."""
    try:
        raw = kernfiles.read(f"/proc/{pid}/stat")
    except OSError:
        return None
    fields = raw[raw.rfind(b")") + 2 :].split()
    if fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])


def alive(pid: int, started: int) -> bool:
    """Whether exactly this process (same pid, same start time) still runs."""
    return start_time(pid) == started


def kill(pid: int, started: int) -> None:
    """SIGKILL the process if it is still the same one."""
    if alive(pid, started):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
