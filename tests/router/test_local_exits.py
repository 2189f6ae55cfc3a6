"""router.backends.local.exits: a tree's liveness from its pidfd, exactly the recorded process, no descriptor kept
for a process that is gone."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from router.backends.local import procs
from router.backends.local.exits import Exits


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "60"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_an_exit_is_seen_from_the_kernel_and_its_pidfd_closed(sleeper: subprocess.Popen[bytes]) -> None:
    started = procs.start_time(sleeper.pid)
    assert started is not None

    async def run() -> None:
        exits = Exits()
        before = _fds()
        assert exits.running("sb-a", sleeper.pid, started)
        assert exits.watched() == 1 and _fds() == before + 1
        assert exits.running("sb-a", sleeper.pid, started)  # asked again: the same watch, no new descriptor
        assert _fds() == before + 1
        exits.kill("sb-a", sleeper.pid, started)
        assert await exits.wait("sb-a", sleeper.pid, started, 10.0)
        # Seen by the event loop (no /proc read): the process is a zombie until this test reaps it below.
        assert not exits.running("sb-a", sleeper.pid, started)
        assert exits.watched() == 0 and _fds() == before
        exits.forget("sb-a")
        assert _fds() == before

    asyncio.run(run())
    assert sleeper.wait(5) == -9


def test_a_pid_with_another_start_time_is_not_the_tree(sleeper: subprocess.Popen[bytes]) -> None:
    # A pid recycled by another process: neither running nor killable through the old record.
    started = procs.start_time(sleeper.pid)
    assert started is not None

    async def run() -> None:
        exits = Exits()
        before = _fds()
        assert not exits.running("sb-b", sleeper.pid, started - 1)
        exits.kill("sb-b", sleeper.pid, started - 1)
        assert await exits.wait("sb-b", sleeper.pid, started - 1, 0.1)
        assert exits.watched() == 0 and _fds() == before

    asyncio.run(run())
    assert sleeper.poll() is None  # the other process was never signalled


def test_a_gone_pid_keeps_nothing_and_forget_closes_a_live_watch(sleeper: subprocess.Popen[bytes]) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    started = procs.start_time(sleeper.pid)
    assert started is not None

    async def run() -> None:
        exits = Exits()
        before = _fds()
        assert not exits.running("sb-gone", gone.pid, 1)
        assert exits.watched() == 0 and _fds() == before
        assert exits.running("sb-c", sleeper.pid, started)
        assert _fds() == before + 1
        exits.forget("sb-c")  # deleted or stopped: the descriptor goes, the process is not touched
        assert exits.watched() == 0 and _fds() == before
        assert exits.running("sb-c", sleeper.pid, started)  # asked again: watched again
        exits.close()
        assert _fds() == before

    asyncio.run(run())
    assert sleeper.poll() is None


def test_a_resumed_tree_replaces_the_old_watch(sleeper: subprocess.Popen[bytes]) -> None:
    other = subprocess.Popen(["sleep", "60"])
    try:
        first, second = procs.start_time(sleeper.pid), procs.start_time(other.pid)
        assert first is not None and second is not None

        async def run() -> None:
            exits = Exits()
            before = _fds()
            assert exits.running("sb-d", sleeper.pid, first)
            assert exits.running("sb-d", other.pid, second)  # the sandbox's new PID 1
            assert exits.watched() == 1 and _fds() == before + 1
            exits.close()

        asyncio.run(run())
    finally:
        other.kill()
        other.wait()


def test_a_wait_ends_once_the_main_thread_has_exited_while_another_thread_holds_on() -> None:
    # A PID 1 whose main thread exited while another of its threads waits for the namespace to empty (held
    # by a process that cannot die yet): the pidfd stays unreadable, but the delete must go on to the
    # cgroups, which say what is stuck, instead of waiting its whole timeout.
    script = ("import ctypes, sys, threading, time\n"
              "threading.Thread(target=time.sleep, args=(60,)).start()\n"
              "sys.stdin.readline()\n"
              "ctypes.CDLL(None).pthread_exit(None)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE)
    assert proc.stdin is not None
    try:
        started = procs.start_time(proc.pid)
        assert started is not None

        async def run() -> None:
            assert proc.stdin is not None
            exits = Exits()
            assert exits.running("sb-e", proc.pid, started)  # watched while whole
            proc.stdin.write(b"go\n")
            proc.stdin.flush()
            t0 = time.monotonic()
            assert await exits.wait("sb-e", proc.pid, started, 10.0)
            assert time.monotonic() - t0 < 2.0
            raw = Path(f"/proc/{proc.pid}/stat").read_bytes()
            assert raw[raw.rfind(b")") + 2:].split()[0] == b"Z"  # the main thread is a zombie...
            assert len(os.listdir(f"/proc/{proc.pid}/task")) == 2  # ...and the other thread lives on
            assert exits.running("sb-e", proc.pid, started)  # the thread group has not exited
            exits.close()

        asyncio.run(run())
    finally:
        proc.kill()
        proc.wait()
