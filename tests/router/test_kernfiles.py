"""router.backends.local.kernfiles: whole files in few system calls, and open's errors unchanged."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from router.backends.local import kernfiles


def test_a_file_longer_than_one_read_comes_whole(tmp_path: Path) -> None:
    # A cgroup's task list after a fork bomb can pass one read's 64 KiB: every pid must reach the killer.
    data = b"".join(b"%d\n" % pid for pid in range(40_000))
    (tmp_path / "cgroup.procs").write_bytes(data)
    assert len(data) > 1 << 16 and kernfiles.read(tmp_path / "cgroup.procs") == data
    assert kernfiles.read(f"/proc/{os.getpid()}/stat").startswith(b"%d (" % os.getpid())


def test_write_replaces_the_value_and_errors_are_open_s(tmp_path: Path) -> None:
    target = tmp_path / "pids.max"
    target.write_text("")
    kernfiles.write(target, "1048")
    assert target.read_text() == "1048"
    with pytest.raises(FileNotFoundError):
        kernfiles.write(tmp_path / "absent", "1")  # never creates a file: a missing cgroup stays an error
    with pytest.raises(FileNotFoundError):
        kernfiles.read(tmp_path / "absent")
