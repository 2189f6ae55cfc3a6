"""Finding and killing every process a command started, including those that went to the background."""

from __future__ import annotations

import contextlib
import os
import signal
import time


def _stat(pid: int) -> tuple[int, int, int] | None:
    """(ppid, pgrp, session) of a process, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    # The command name may hold spaces and parentheses; fields resume after the last ')'.
    fields = raw[raw.rfind(b")") + 2 :].split()
    return int(fields[1]), int(fields[2]), int(fields[3])


def tree_of(root: int) -> set[int]:
    """Every live process that belongs to the command started as ``root``.

    A process belongs when it is a descendant of ``root``, or is in its process group or session:
    a background child whose parent exited is re-parented to PID 1 and only its group or session
    still ties it to the command.
    """
    table: dict[int, tuple[int, int, int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            info = _stat(int(name))
            if info is not None:
                table[int(name)] = info
    members = {pid for pid, (_, pgrp, sid) in table.items() if pgrp == root or sid == root}
    if root in table:
        members.add(root)
    grew = True
    while grew:
        grew = False
        for pid, (ppid, _, _) in table.items():
            if ppid in members and pid not in members:
                members.add(pid)
                grew = True
    members.discard(os.getpid())
    return members


def kill_tree(root: int, *, attempts: int = 20) -> None:
    """SIGKILL the command's whole tree, again until nothing of it is left (forks race the first pass).

    The tree is frozen with SIGSTOP before anything is killed: a member that escaped with setsid() is
    tied to the command only by its parent, and killing that parent first would re-parent it to PID 1,
    where no later scan could find it. A stopped process can neither exit nor fork, so the set is stable.
    """
    stopped: set[int] = set()
    for _ in range(attempts):
        fresh = tree_of(root) - stopped
        if not fresh:
            break
        for pid in fresh:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGSTOP)
        stopped |= fresh
    for pid in stopped:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    for _ in range(attempts):
        with contextlib.suppress(OSError):
            os.killpg(root, signal.SIGKILL)
        pids = tree_of(root)
        pids.discard(root)  # the root is our child: it is reaped by wait(), killpg already hit it
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.005)
