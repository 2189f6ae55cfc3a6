"""The file API's and archives' tests again, against executors whose own seccomp filter (the one a Knative pod's
executor installs, ``GROVE_EXECUTOR_SECCOMP=1``) answers ``openat2`` with ENOSYS, as gVisor before its 2026-09
releases does: every path then goes through the user-space walk (:mod:`executor.walkopen`), and the same tests
(symlinks out of the root refused, ``..`` kept inside, archives that try to escape refused) must pass."""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Iterator

import pytest

from tests.executor.test_archive import *  # noqa: F403 - the same tests, on these executors
from tests.executor.test_files import *  # noqa: F403
from tests.support.executor_fixtures import RunningExecutor, start_executor

WITHOUT_OPENAT2 = {"GROVE_EXECUTOR_SECCOMP": "1", "GROVE_EXECUTOR_SECCOMP_ENOSYS": "openat2"}
_PROBE = ("import ctypes, errno; libc = ctypes.CDLL(None, use_errno=True); "
          "r = libc.syscall(437, -100, b'.', ctypes.create_string_buffer(24), 24); "
          "print(errno.errorcode.get(ctypes.get_errno()) if r < 0 else 'opened')")


@pytest.fixture(scope="module")
def executor() -> Iterator[RunningExecutor]:
    """This module's TCP executor, without openat2."""
    with start_executor(env=WITHOUT_OPENAT2) as ex:
        yield ex


@pytest.fixture(scope="module")
def unix_executor() -> Iterator[RunningExecutor]:
    """This module's Unix-socket executor, without openat2."""
    with start_executor(unix=True, env=WITHOUT_OPENAT2) as ex:
        yield ex


@pytest.fixture(scope="module")
def capped_executor() -> Iterator[RunningExecutor]:
    """This module's executor with a 4 KiB file cap, without openat2."""
    with start_executor(env={**WITHOUT_OPENAT2, "GROVE_EXECUTOR_MAX_FILE_BYTES": "4096"}) as ex:
        yield ex


def test_openat2_really_is_missing_in_there(executor: RunningExecutor) -> None:
    """The filter is the executor's own and its commands inherit it: openat2 answers ENOSYS there, here not."""
    client = executor.client()
    try:
        result = client.run(command=[sys.executable, "-c", _PROBE])
    finally:
        client.close()
    assert result["stdout"] == b"ENOSYS\n", result
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.syscall(437, -100, b".", ctypes.create_string_buffer(24), 24)
    assert fd >= 0  # the test's own process has it
    os.close(fd)
