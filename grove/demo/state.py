"""Where the demo keeps its state — ``.state/demo`` of the checkout it runs from, so that two checkouts on one
machine never share a router's state dir — and what it tells its user about that state afterwards."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from grove.core.errors import Invalid
from grove.statedir import StateDir

STATE = Path(".state") / "demo"
"""The demo's state dir, relative to the directory it runs from (``make demo``: the checkout)."""


def demo_state_dir(given: str | None) -> Path:
    """``given`` (``--state-dir``, else ``$GROVE_DEMO_STATE_DIR``), else ``.state/demo`` here; refused with a
    message if too long for the sockets of the sandboxes under it."""
    state = Path(given or os.environ.get("GROVE_DEMO_STATE_DIR") or STATE).resolve()
    try:
        StateDir(state).check_socket_room()
    except Invalid as exc:
        sys.exit(f"grove demo: {exc.message} (or GROVE_DEMO_STATE_DIR)")
    return state


def shown(path: Path) -> str:
    """``path`` as the user would type it from here: relative if it is under the current directory."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def afterwards(state_dir: Path, key: str, *, filters: str) -> str:
    """How to look at what the demo left (the CLI and the viewer, on a router started for it) and how to clean
    up; ``filters``: the ``trajectories ls`` options that pick this run's trajectories."""
    grove = shown(Path(sys.executable).with_name("grove"))
    state = shown(state_dir)
    return (
        f"  the demo's state stays in {state} (images, trajectories, its S3 data; a later run reuses it). To look:\n"
        f"    {grove} --state-dir {state} up --port 8471            # a router on it, in another terminal\n"
        f"    {grove} --state-dir {state} trajectories ls {filters}\n"
        f"    viewer: http://127.0.0.1:8471/ui/, log in with the demo's API key {key}\n"
        f"  to clean up: {grove} --state-dir {state} down   (stops that router and anything left running), "
        f"then rm -rf {state}"
    )
