"""``<state dir>/router.json``: which router serves a state dir, so ``grove`` commands find and stop it.

The router writes it once it listens and removes it when it stops; a router that was SIGKILLed leaves
it behind, so a reader checks that the PID is still a live ``grove`` process before trusting it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from grove.statedir import StateDir


@dataclass(frozen=True)
class RunningRouter:
    """A router serving a state dir."""

    pid: int
    url: str


def write_run_file(state_dir: Path, url: str) -> Path:
    """Say that this process serves ``state_dir`` at ``url`` (atomically)."""
    path = StateDir(state_dir).run_file
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(), "url": url}))
    tmp.replace(path)
    return path


def remove_run_file(state_dir: Path) -> None:
    """Forget the run file, if it is still this process's."""
    path = StateDir(state_dir).run_file
    running = _read(path)
    if running is not None and running.pid == os.getpid():
        path.unlink(missing_ok=True)


def running_router(state_dir: Path) -> RunningRouter | None:
    """The live router serving ``state_dir``, or None (none started, or it died without cleaning up)."""
    running = _read(StateDir(state_dir).run_file)
    if running is None or not _is_grove(running.pid):
        return None
    return running


def _read(path: Path) -> RunningRouter | None:
    try:
        data = json.loads(path.read_text())
        return RunningRouter(pid=int(data["pid"]), url=str(data["url"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _is_grove(pid: int) -> bool:
    """Whether ``pid`` is alive and runs grove (a recycled PID belongs to something else)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = fh.read().split(b"\0")
    except OSError:
        return False
    return any(b"grove" in part or b"router" in part for part in argv[:3])
