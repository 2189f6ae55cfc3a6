"""The records' files written off the event loop: one record's writes land in the order they were asked
for, a removal is not undone by a write still in flight, and a write's error reaches its caller."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from router.recordfiles import RecordFiles

pytestmark = pytest.mark.fast  # real files in a temp dir, no router: `make test-fast`
ID = "sb-00000000000000aa"


def test_writes_of_one_record_land_in_order(tmp_path: Path) -> None:
    files = RecordFiles(tmp_path)

    async def run() -> None:
        # Many writes at once, across the worker threads: the last one asked for is what stays.
        await asyncio.gather(*(files.write_async(ID, json.dumps({"n": n}).encode()) for n in range(60)))
        await files.drain()

    asyncio.run(run())
    assert json.loads((tmp_path / f"{ID}.json").read_text()) == {"n": 59}
    assert [p.name for p in tmp_path.iterdir()] == [f"{ID}.json"]  # no temp file left


def test_a_removal_stays_removed(tmp_path: Path) -> None:
    files = RecordFiles(tmp_path)

    async def run() -> None:
        writes = [asyncio.create_task(files.write_async(ID, b'{"n": %d}' % n)) for n in range(20)]
        await asyncio.sleep(0)  # the writes are queued, some already in a thread
        files.unlink(ID)
        await asyncio.gather(*writes)
        other = "sb-00000000000000bb"
        await files.write_async(other, b"{}")
        files.discard(other)
        await files.drain()

    asyncio.run(run())
    assert list(tmp_path.iterdir()) == []


def test_a_failed_write_raises_in_its_caller(tmp_path: Path) -> None:
    files = RecordFiles(tmp_path / "gone")  # no such directory: the temp file cannot be made

    async def run() -> None:
        with pytest.raises(FileNotFoundError):
            await files.write_async(ID, b"{}")
        await files.drain()

    asyncio.run(run())
