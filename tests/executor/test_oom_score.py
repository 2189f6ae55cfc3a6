"""A command's OOM score reaches what it forked before the executor wrote it, however that write is done."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from executor.runner import _set_oom_score


def _score(pid: int) -> int:
    return int(Path(f"/proc/{pid}/oom_score_adj").read_text())


def test_a_child_forked_before_the_score_is_written_gets_it_too() -> None:
    # The shell forks its sleep before the score is written; a pid was handed out after the command's, so
    # the short cut (nothing forked since) does not apply and its descendants are found.
    proc = subprocess.Popen(["sh", "-c", "sleep 60 & echo $!; wait"], stdout=subprocess.PIPE,
                            start_new_session=True)
    try:
        assert proc.stdout is not None
        child = int(proc.stdout.readline())
        assert _score(proc.pid) == 0 and _score(child) == 0
        _set_oom_score(proc.pid, 1000)
        assert (_score(proc.pid), _score(child)) == (1000, 1000)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_a_command_that_forked_nothing_gets_its_score() -> None:
    proc = subprocess.Popen(["sleep", "60"])
    try:
        _set_oom_score(proc.pid, 1000)
        assert _score(proc.pid) == 1000
    finally:
        proc.kill()
        proc.wait()
