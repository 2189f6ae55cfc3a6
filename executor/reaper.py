"""Reaping orphans when the executor is PID 1 of its sandbox, without stealing its own children's exits.

A command's background children outlive it and are re-parented to PID 1 — in a local sandbox, the
executor itself. Unreaped they stay zombies and eat the sandbox's ``pids_max``. A plain ``wait()``
would also collect the exit status of commands the executor is still waiting for (subprocess then
reports exit code 0), so every child the executor starts goes through :func:`spawn`, which records it
under a lock, and the reaper only collects processes it does not know.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time
from typing import Any

_lock = threading.Lock()
_ours: set[int] = set()
_started = False
# Set by spawn(): with no child at all the reaper sleeps on this instead of polling, so an idle sandbox's
# PID 1 stays asleep (hundreds of idle sandboxes polling twice a second cost real CPU). Orphans are
# only ever descendants of a spawned child, so none can appear while it sleeps; the timeout is a backstop.
_wake = threading.Event()
_IDLE_BACKSTOP_S = 60.0


def spawn(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen`` whose child the reaper will leave to its owner."""
    with _lock:
        proc: subprocess.Popen[bytes] = subprocess.Popen(*args, **kwargs)
        _ours.add(proc.pid)
    _wake.set()
    return proc


def release(proc: subprocess.Popen[bytes]) -> None:
    """The owner has waited for ``proc``: forget it."""
    with _lock:
        _ours.discard(proc.pid)


def start() -> None:
    """Start the reaper thread (only when this process is PID 1 of a namespace)."""
    global _started
    if _started:
        return
    _started = True
    threading.Thread(target=_reap_forever, name="grove-reaper", daemon=True).start()


def _reap_forever() -> None:
    while True:
        _wake.clear()  # before waitid: a spawn from here on either is seen by it or sets the event
        try:
            # WNOWAIT: look without collecting, so a child of ours stays for its owner's wait().
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOWAIT)
        except ChildProcessError:
            _wake.wait(_IDLE_BACKSTOP_S)  # no children at all right now
            continue
        if info is None:
            continue
        with _lock:
            if info.si_pid not in _ours:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(info.si_pid, os.WNOHANG)
                continue
        time.sleep(0.01)  # ours: its owner collects it in a moment
