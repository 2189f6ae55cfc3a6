"""The live output of a background process started with pipes (:mod:`executor.processes`): each chunk is
appended to the process's log, as a child writing its own log would, and handed to whoever is attached at that
moment (E2B's streams), stdout and stderr apart. Output nobody is attached to is in the log only, as envd drops
it from its streams. The end (exit code, signal) is handed to every attached stream, and to one attaching later.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from collections.abc import Iterator
from typing import IO, Any

_READ = 16 * 1024  # base64 of a chunk stays one line under the router's line limit for the E2B stream

Event = tuple[str, Any]
"""``("stdout" | "stderr", bytes)`` or ``("end", {"exit_code": int, "signal": int | None})``."""


class Fanout:
    """The attached streams of one piped process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watchers: list[queue.SimpleQueue[Event | None]] = []
        self._ended: dict[str, Any] | None = None

    def attach(self) -> Iterator[Event]:
        """The process's events from now until its end; closing the iterator detaches (the process lives on).
        Attached at once, not at the first ``next``: nothing written after this call is missed."""
        watcher: queue.SimpleQueue[Event | None] = queue.SimpleQueue()
        with self._lock:
            if self._ended is not None:
                watcher.put(("end", self._ended))
                watcher.put(None)
            else:
                self._watchers.append(watcher)
        return self._events(watcher)

    def _events(self, watcher: queue.SimpleQueue[Event | None]) -> Iterator[Event]:
        try:
            while (event := watcher.get()) is not None:
                yield event
        finally:
            with self._lock:
                if watcher in self._watchers:
                    self._watchers.remove(watcher)

    def publish(self, event: Event) -> None:
        """Hand ``event`` to every attached stream."""
        with self._lock:
            for watcher in self._watchers:
                watcher.put(event)

    def end(self, ended: dict[str, Any]) -> None:
        """The process ended (its output all read): tell every stream, now and later, and let them go."""
        with self._lock:
            self._ended = ended
            for watcher in self._watchers:
                watcher.put(("end", ended))
                watcher.put(None)
            self._watchers.clear()


def pump(name: str, stream: IO[bytes], log_fd: int, fanout: Fanout) -> None:
    """Copy one pipe of a process to its log and its attached streams until the pipe's writers are all gone."""
    try:
        while chunk := os.read(stream.fileno(), _READ):
            with contextlib.suppress(OSError):  # a full disk costs the log, not the process or its streams
                os.write(log_fd, chunk)
            fanout.publish((name, chunk))
    finally:
        stream.close()


def pumps(stdout: IO[bytes], stderr: IO[bytes], log_fd: int, fanout: Fanout, pid: int) -> list[threading.Thread]:
    """Both pipes' pumps, started."""
    threads = [threading.Thread(target=pump, args=(name, stream, log_fd, fanout), daemon=True,
                                name=f"grove-proc-{pid}-{name}") for name, stream in (("stdout", stdout),
                                                                                        ("stderr", stderr))]
    for thread in threads:
        thread.start()
    return threads
