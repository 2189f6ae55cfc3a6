"""The records' files: each written whole and durably (temp file, fsync, rename), off the event loop.

An fsync on this machine's ext4 takes about 3 ms of waiting for the disk. Done on the event loop, a
sandbox's three to four record writes (created, ready, deleting; a claim's two) stopped every other
call that long: a burst of 1,000 claims spent seconds with the loop parked in fsync. Here the disk's
wait happens in worker threads, so the loop serves other calls meanwhile, and concurrent fsyncs share
the file system's journal commits. The caller still awaits its write: when it returns, the record is
on disk, and a full disk still raises there.

Writes of one record land in the order they were asked for (each waits for the one before it), and a
file removed while a write of it is in flight stays removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

_WORKERS = 8
"""Enough threads for concurrent fsyncs to share journal commits; each mostly waits for the disk."""


class RecordFiles:
    """One directory of ``<id>.json`` files, written atomically."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self._pool: ThreadPoolExecutor | None = None
        self._last: dict[str, asyncio.Task[None]] = {}
        """Per id, the newest write not yet done (the next write of that id waits for it)."""

    def write(self, sandbox_id: str, data: bytes) -> None:
        """Replace the file now, on the calling thread (start-up, tests, the rare paths)."""
        fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.dir / f"{sandbox_id}.json")
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise

    async def write_async(self, sandbox_id: str, data: bytes) -> None:
        """Replace the file in a worker thread, after any earlier write of the same id; raises what the
        write raised. A caller cancelled meanwhile does not cut the write short (the order holds)."""
        previous = self._last.get(sandbox_id)
        task = asyncio.create_task(self._after(previous, sandbox_id, data))
        self._last[sandbox_id] = task
        task.add_done_callback(lambda done: self._done(sandbox_id, done))
        await asyncio.shield(task)

    def discard(self, sandbox_id: str) -> None:
        """Remove the file in a worker thread, after any write of it in flight; nothing waits for it (the
        file of a deleted sandbox: a router restarted before it is gone deletes that sandbox again)."""
        previous = self._last.get(sandbox_id)
        task = asyncio.create_task(self._after(previous, sandbox_id, None))
        self._last[sandbox_id] = task
        task.add_done_callback(lambda done: self._done(sandbox_id, done))

    async def _after(self, previous: asyncio.Task[None] | None, sandbox_id: str, data: bytes | None) -> None:
        if previous is not None:
            with contextlib.suppress(BaseException):  # its caller saw its error; this write is newer
                await previous
        if self._pool is None:
            self._pool = ThreadPoolExecutor(_WORKERS, thread_name_prefix="grove-records")
        loop = asyncio.get_running_loop()
        if data is None:
            await loop.run_in_executor(self._pool, self._remove, sandbox_id)
        else:
            await loop.run_in_executor(self._pool, self.write, sandbox_id, data)

    def _remove(self, sandbox_id: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.dir / f"{sandbox_id}.json").unlink()

    def _done(self, sandbox_id: str, task: asyncio.Task[None]) -> None:
        if self._last.get(sandbox_id) is task:
            del self._last[sandbox_id]
        if not task.cancelled():
            # Marked as seen: a write's caller got it (if it still waited); a discard that failed leaves a
            # file a restarted router reads as a deleted sandbox's, and deletes again.
            task.exception()

    def unlink(self, sandbox_id: str) -> None:
        """Remove the file now, and again after a write of it still in flight (which would bring it back)."""
        with contextlib.suppress(FileNotFoundError):
            (self.dir / f"{sandbox_id}.json").unlink()
        if (pending := self._last.get(sandbox_id)) is not None:
            pending.add_done_callback(lambda _: self._unlink_quietly(sandbox_id))

    def _unlink_quietly(self, sandbox_id: str) -> None:
        if sandbox_id not in self._last:  # no newer write was asked for meanwhile
            with contextlib.suppress(FileNotFoundError):
                (self.dir / f"{sandbox_id}.json").unlink()

    async def drain(self) -> None:
        """Wait for every write in flight, then stop the threads."""
        for task in list(self._last.values()):
            with contextlib.suppress(BaseException):
                await task
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
