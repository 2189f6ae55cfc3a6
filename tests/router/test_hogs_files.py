"""router.backends.local.hogs on real cpu cgroups: each ``cpu.stat`` kept open and read afresh at every tick, its
descriptor closed once its group is gone, a group made again under its name read anew, none left open."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from router.backends.local.hogs import HOG_SHARES, HogWatch
from tests.support.router_fixtures import CGROUP_ROOT


@pytest.fixture
def parent() -> Iterator[Path]:
    instance = f"test-hogs-{secrets.token_hex(4)}"
    path = CGROUP_ROOT / "cpu" / f"grove-{instance}"
    path.mkdir()
    try:
        yield path
    finally:
        for group in path.iterdir():
            if group.is_dir():
                group.rmdir()
        path.rmdir()


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_stats_stay_open_and_are_read_as_they_are_now(parent: Path) -> None:
    watch = HogWatch(parent.name.removeprefix("grove-"))
    before = _fds()
    for name in ("sb-a", "sb-b"):
        (parent / name).mkdir()
    watch.tick(now=0.0)
    assert _fds() == before + 2
    watch.tick(now=1.0)  # read again through the same descriptors
    assert _fds() == before + 2

    (parent / "sb-a").rmdir()
    watch.tick(now=2.0)
    assert _fds() == before + 1

    # A group removed and made again between two ticks: its old descriptor reads ENODEV, the new one is read.
    (parent / "sb-b").rmdir()
    (parent / "sb-b").mkdir()
    watch.tick(now=3.0)
    assert _fds() == before + 1
    (parent / "sb-c").mkdir()
    (parent / "sb-c" / "cpu.shares").write_text(str(HOG_SHARES))
    watch.tick(now=4.0)  # first sight of a demoted group (a restarted router's): it stays demoted a while
    assert watch.demoted() == {"sb-c"} and _fds() == before + 2

    watch.close()
    assert _fds() == before
