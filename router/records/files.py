"""The records' files, made durable in groups: one log append and one fsync for every write asked for
meanwhile, off the event loop.

An fsync on this machine's ext4 takes about 3 ms of waiting for the disk. A sandbox writes its record three
to four times (created, ready, deleting; a claim twice), and a burst of 1,000 creates or claims asks for
thousands of writes at once: one fsync each queued them behind each other on the disk. Here one writer
thread takes every write waiting, appends them all to the write-ahead log (:mod:`router.records.log`) with one
``fdatasync``, then overwrites the record files in place without an fsync of their own, and only then
answers the writes' callers: when a write returns, the record is durable (in the log) and its file shows it
(a patch of many records, a batch of claims, is answered once it is in the log:
:meth:`RecordFiles.queue_patch`). A full disk still raises in the caller when the append fails (which is cut
back off the log); a file that cannot be replaced after its append lags the log until it can be (the log,
not the file, is what a restart trusts).

The log is rotated past :data:`ROTATE_BYTES`. A checkpoint thread then fsyncs the files the old log
touched that still exist (in a burst most are deleted by then: nothing to sync) and removes the old log;
writes go on meanwhile into the new one. A router starting replays whatever logs are left, so a record
file a crash left stale, empty or missing is brought back to its newest write.

Writes of one record land in the order they were asked for (one thread, one queue), and a file removed
while a write of it is in flight stays removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import threading
from collections import deque
from concurrent.futures import Future
from pathlib import Path

from router.records import log as recordlog
from router.records.log import PATCH, REMOVE, WRITE

ROTATE_BYTES = 8 << 20
"""A log this long is handed to the checkpoint (at about 1.5 KiB a record, some 5,000 writes)."""

_Entry = tuple[bytes, str, bytes, "Future[None] | None", tuple[str, ...]]
"""(op, id, data, the caller's future, the ids a patch names)."""


class RecordFiles:
    """One directory of ``<id>.json`` files, each written whole, durable through the directory's log."""

    def __init__(self, directory: Path, *, rotate_bytes: int = ROTATE_BYTES) -> None:
        self.dir = directory
        self._rotate_bytes = rotate_bytes
        self.commits = 0
        """Log appends made (each one fsync), for the benchmarks and tests."""
        self._next_seq, behind, held = recordlog.replay(directory) if directory.is_dir() else (0, {}, [])
        self._queue: deque[_Entry] = deque()
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._writer: threading.Thread | None = None
        self._log_fd: int | None = None
        self._log_seq = 0
        self._log_size = 0
        self._stale: dict[str, tuple[bytes, bytes]] = behind
        """Logged writes whose file does not show them yet (the writer thread's own)."""
        self._patched: set[str] = set()
        """Records patched in the log (:meth:`queue_patch`) whose files wait for their next whole write (the
        writer thread's own): no log is checkpointed away meanwhile."""
        self._held = [(seq, set(behind)) for seq in held]
        """Logs an earlier router left that the files do not all show yet: checkpointed once they do."""
        self._touched: set[str] = set()
        """Ids the current log has entries for (what its checkpoint must make durable)."""
        self._checkpoints: deque[tuple[int, set[str]]] = deque()
        self._checkpointer: threading.Thread | None = None
        self._closing = False
        self._at_log: set[Future[None]] = set()
        """Writes answered once they are in the log, before their files are brought up to it (under ``_lock``)."""
        self._log_lock = threading.RLock()
        """Around the log's fd: the writer appends and rotates, and :meth:`close` rotates."""

    # -- asking for writes ---------------------------------------------------------------------------

    def write(self, sandbox_id: str, data: bytes) -> None:
        """Replace the file durably, waiting on the calling thread (start-up, tests, the rare paths)."""
        self._submit(WRITE, sandbox_id, data, Future()).result()

    async def write_async(self, sandbox_id: str, data: bytes) -> None:
        """Replace the file durably, the wait off the event loop; raises what the write raised. A caller
        cancelled meanwhile does not cut the write short (the order holds)."""
        done = self._submit(WRITE, sandbox_id, data, Future())
        await asyncio.shield(asyncio.wrap_future(done))

    def queue_patch(self, ids: list[str], payload: bytes) -> Future[None]:
        """A patch of the records ``ids`` (``payload``: :func:`router.records.log.patch_of`), queued for the
        log; the future is settled once it is durable there (a streamed batch claims its next part
        meanwhile). A batch of claims is logged so, in a tenth of its whole records' bytes. Their files
        show it at each record's next whole write (the claim's hand-over writes one); until then the log
        is kept, and a restart applies the patch to them."""
        done: Future[None] = Future()
        with self._lock:
            self._queue.append((PATCH, "", payload, done, tuple(ids)))
            self._at_log.add(done)
            self._start_writer()
            self._wake.notify()
        return done

    def discard(self, sandbox_id: str) -> None:
        """Remove the file after any write of it in flight; nothing waits for it (the file of a deleted
        sandbox: a router restarted before it is gone deletes that sandbox again)."""
        self._submit(REMOVE, sandbox_id, b"", None)

    def unlink(self, sandbox_id: str) -> None:
        """Remove the file now, and again after a write of it still in flight (which would bring it back).
        Needs no free space: if the removal cannot be logged, the logs are checkpointed away instead, so no
        replay brings the file back."""
        recordlog.remove_file(self.dir, sandbox_id)
        self._submit(REMOVE, sandbox_id, b"", None)

    def _submit(self, op: bytes, sandbox_id: str, data: bytes, done: Future[None] | None) -> Future[None]:
        with self._lock:
            self._queue_entry(op, sandbox_id, data, done)
        return done if done is not None else Future()

    def _queue_entry(self, op: bytes, sandbox_id: str, data: bytes, done: Future[None] | None) -> None:
        """Queue one write or removal for the writer thread (started if it is not running, and woken); under
        the lock."""
        if len(sandbox_id.encode()) > 255:
            raise ValueError(f"record id too long: {sandbox_id[:40]}...")
        self._queue.append((op, sandbox_id, data, done, ()))
        self._start_writer()
        self._wake.notify()

    def _start_writer(self) -> None:
        """The writer thread started if it is not running; under the lock."""
        if self._writer is None:
            self._closing = False
            self._writer = threading.Thread(target=self._write_loop, name="grove-records", daemon=True)
            self._writer.start()

    # -- the writer thread -------------------------------------------------------------------------

    def _write_loop(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._closing:
                    self._wake.wait()
                if not self._queue:
                    self._writer = None
                    return
                batch = list(self._queue)
                self._queue.clear()
            try:
                self._commit(batch)
            except BaseException as exc:  # a bug here must reach the callers, never leave them waiting
                for _, _, _, done, _ in batch:
                    if done is not None and not done.done():
                        done.set_exception(exc)

    def _commit(self, batch: list[_Entry]) -> None:
        """Log the batch with one fsync, then apply it to the files and answer its callers."""
        try:
            self._append(b"".join(recordlog.frame(op, sid, data) for op, sid, data, _, _ in batch),
                         {touched for _, sid, _, _, ids in batch for touched in (ids or (sid,))})
        except OSError as exc:
            removals = [sid for op, sid, _, _, _ in batch if op == REMOVE]
            if removals and exc.errno == errno.ENOSPC:
                self._settle_without_space(removals)
            with self._lock:
                self._at_log.difference_update(done for _, _, _, done, _ in batch)
            for _, _, _, done, _ in batch:
                if done is not None:
                    done.set_exception(exc)
            return
        if self._at_log:
            with self._lock:
                early = [done for _, _, _, done, _ in batch if done in self._at_log]
                self._at_log.difference_update(early)
            for done in early:
                done.set_result(None)
        for op, sid, data, _, ids in batch:  # in order: a record written twice in the batch, its newest
            if op == PATCH:
                self._patched.update(ids)
            else:
                self._stale[sid] = (op, data)
                self._patched.discard(sid)
        # Files behind the log from earlier commits may wait while appends are queued; a batch with a caller
        # still to answer has its files brought up first.
        waiting = any(done is not None and not done.done() for _, _, _, done, _ in batch)
        self._apply_stale({sid for _, sid, _, _, _ in batch} if waiting else set())
        for _, _, _, done, _ in batch:
            if done is not None and not done.done():
                done.set_result(None)

    def _apply_stale(self, first: set[str] | None = None) -> None:
        """Bring the files up to the log: those of ``first`` in any case, the others until an append is queued
        (a later commit goes on with them; ``first=None``: all of them). One that cannot be written now (a full
        disk) stays behind the log and is retried at every commit: the write is durable all the same (the log
        has it, and the log is not checkpointed away while a file lags it; a restart replays it)."""
        order = list(self._stale)
        if first is not None:
            order.sort(key=lambda sid: sid not in first)
        for sid in order:
            if first is not None and sid not in first and self._queue:  # unlocked: a hint
                break
            op, data = self._stale[sid]
            try:
                if op == WRITE:
                    recordlog.write_file(self.dir, sid, data, durable=False)
                else:
                    recordlog.remove_file(self.dir, sid)
            except OSError:
                continue
            del self._stale[sid]
        if not self._stale and not self._patched and self._held:
            with self._lock:
                self._checkpoints.extend(self._held)
            self._held = []
            self._start_checkpointer()

    def current(self) -> dict[str, bytes]:
        """Every record as last written, by id: the files, and the writes they lag behind (before any new
        write is asked for; what a starting router loads)."""
        found = {path.stem: path.read_bytes() for path in self.dir.glob("sb-*.json") if path.stem not in self._stale}
        for sid, (op, data) in self._stale.items():
            if op == WRITE:
                found[sid] = data
            elif op == REMOVE:
                found.pop(sid, None)
        return found

    def _append(self, frames: bytes, ids: set[str]) -> None:
        with self._log_lock:
            self._append_locked(frames, ids)

    def _append_locked(self, frames: bytes, ids: set[str]) -> None:
        if self._log_fd is None:
            self._log_seq, self._next_seq = self._next_seq, self._next_seq + 1
            path = recordlog.log_path(self.dir, self._log_seq)
            self._log_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
            self._log_size = 0
            recordlog.fsync_dir(self.dir)
        try:
            view = memoryview(frames)
            while view:
                view = view[os.write(self._log_fd, view):]
            os.fdatasync(self._log_fd)
        except OSError:
            # Nothing of this batch was acknowledged: cut it off, or a torn frame would hide every later one.
            with contextlib.suppress(OSError):
                os.ftruncate(self._log_fd, self._log_size)
            raise
        self._log_size += len(frames)
        self.commits += 1
        self._touched |= ids
        if self._log_size >= self._rotate_bytes and not self._stale and not self._patched:
            self._rotate()

    def _rotate(self) -> None:
        """Close the current log and hand it to the checkpoint thread; the next append opens a new one."""
        with self._log_lock:
            self._rotate_locked()

    def _rotate_locked(self) -> None:
        if self._log_fd is None:
            return
        os.close(self._log_fd)
        self._log_fd = None
        with self._lock:
            self._checkpoints.append((self._log_seq, self._touched))
        self._touched = set()
        self._start_checkpointer()

    def _start_checkpointer(self) -> None:
        with self._lock:
            if self._checkpoints and self._checkpointer is None:
                self._checkpointer = threading.Thread(target=self._checkpoint_loop, name="grove-records-ckpt",
                                                      daemon=True)
                self._checkpointer.start()

    def _checkpoint_loop(self) -> None:
        while True:
            with self._lock:
                if not self._checkpoints:
                    self._checkpointer = None
                    return
                seq, touched = self._checkpoints.popleft()
            self._checkpoint(seq, touched)

    def _checkpoint(self, seq: int, touched: set[str]) -> None:
        """The files one log touched are made durable as they are now, so the log is no longer needed."""
        with contextlib.suppress(OSError):  # left in place, it is replayed at the next start: nothing lost
            recordlog.fsync_files(self.dir, touched)
            recordlog.log_path(self.dir, seq).unlink()

    def _settle_without_space(self, removals: list[str]) -> None:
        """A removal that could not be logged on a full disk: every file as it is now is made durable and
        every log removed (which frees space, and leaves no entry that would bring the files back). A write of
        a removed record still waiting for room (logged, its file not written) is dropped too: once space is
        back it would bring the file back, as a record of a sandbox no one made (a create refused as its
        journal could not be written, on a disk whose log page still had room for its record)."""
        for sid in removals:
            self._stale.pop(sid, None)
            self._patched.discard(sid)
        with contextlib.suppress(OSError):
            self._rotate()
            self._finish_checkpoints()
            for sid in removals:
                recordlog.remove_file(self.dir, sid)
            recordlog.fsync_dir(self.dir)

    def _finish_checkpoints(self) -> None:
        """Wait until every log handed to the checkpoint thread is checkpointed (only the writer thread and
        :meth:`close` hand logs over, so none arrives while this waits)."""
        with self._lock:
            checkpointer = self._checkpointer
        if checkpointer is not None:
            checkpointer.join()

    async def drain(self) -> None:
        """Wait for every write asked for, then checkpoint the logs away and stop the threads (a clean stop
        leaves only record files)."""
        await asyncio.get_running_loop().run_in_executor(None, self.close)

    def close(self) -> None:
        """:meth:`drain`, on the calling thread."""
        with self._lock:
            writer = self._writer
            self._closing = True
            self._wake.notify()
        if writer is not None:
            writer.join()
        self._apply_stale()
        if self._stale or self._patched:  # files still behind their log: it stays, the next start replays it
            return
        self._rotate()
        self._finish_checkpoints()
