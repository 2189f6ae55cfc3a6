"""gunicorn's gthread worker, with the thread that answered a request waiting a moment for the next one.

gthread hands every request over twice. Its main thread waits for a kept-alive connection to become
readable and hands it to a pool thread; the pool thread answers and hands it back (a pipe write that
wakes the main thread, which puts the socket back in its poller). For the router's keep-alive connection
that is two thread wake-ups and five system calls per exec around the request's own work, and on a
machine whose idle CPUs halt, waking a sleeping one is paid in latency as well.

Here the thread that answered waits on the same connection, in ``poll`` (no CPU while it waits), for up
to :attr:`LingeringWorker.linger_s`: calls sent back to back (a rollout's commands, a file written then
run, a burst) are answered by the thread already there. Past that, when half the pool is already waiting
so (connections opened meanwhile always find a thread), or when the worker stops, the connection goes
back to the main thread exactly as gthread does it.
"""

from __future__ import annotations

import os
import select
import threading
from typing import Any

from gunicorn.workers.gthread import ThreadWorker


class LingeringWorker(ThreadWorker):  # type: ignore[misc]
    """gthread, with a connection's thread kept for its next request (see the module)."""

    linger_s = 2.0
    """How long the thread that answered waits for the connection's next request before handing it back."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._waiting_lock = threading.Lock()
        self._waiting = 0
        self._max_waiting = int(self.cfg.threads) // 2
        self._stopping: tuple[int, int] | None = None

    def init_process(self) -> None:
        """After the fork: the pipe a stop writes to, which ends every wait at once."""
        self._stopping = os.pipe()
        super().init_process()

    def handle_exit(self, sig: int, frame: Any) -> None:
        """SIGTERM: gthread's graceful stop, and no thread goes on waiting for a next request."""
        self._stop_waiting()
        super().handle_exit(sig, frame)

    def handle_quit(self, sig: int, frame: Any) -> None:
        """SIGQUIT/SIGINT: gthread's quick stop, the waits ended first (the pool's threads are joined at exit)."""
        self._stop_waiting()
        super().handle_quit(sig, frame)

    def handle(self, conn: Any) -> Any:
        """Answer requests on ``conn`` while they come back to back; then what gthread's ``handle`` returns."""
        keep = super().handle(conn)
        while keep is True and self.alive and not conn.is_http2:
            if not _buffered(conn) and not self._next_request_within(conn, self.linger_s):
                break
            keep = super().handle(conn)
        return keep

    def _next_request_within(self, conn: Any, seconds: float) -> bool:
        """Whether ``conn`` became readable (a request, or the caller closing it) within ``seconds``; False at
        once when half the pool already waits or the worker is stopping."""
        with self._waiting_lock:
            if self._waiting >= self._max_waiting or self._stopping is None:
                return False
            self._waiting += 1
        try:
            poller = select.poll()
            poller.register(conn.sock.fileno(), select.POLLIN)
            poller.register(self._stopping[0], select.POLLIN)
            ready = {fd for fd, _ in poller.poll(seconds * 1000)}
            return conn.sock.fileno() in ready
        finally:
            with self._waiting_lock:
                self._waiting -= 1

    def _stop_waiting(self) -> None:
        if self._stopping is not None:
            os.write(self._stopping[1], b"x")  # never read: the pipe stays readable, every wait ends


def _buffered(conn: Any) -> bool:
    """Whether the parser already read (part of) the next request off the socket."""
    unreader = getattr(conn.parser, "unreader", None)
    return unreader is not None and bool(unreader.buf.getvalue())
