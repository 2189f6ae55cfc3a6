"""The executor's gunicorn worker (``executor.worker.LingeringWorker``) under real gunicorn, on a Unix socket.

Each test serves :func:`app` (it answers with the id of the thread that ran it) with a subclass of the worker
whose wait for a connection's next request is long (30 s) or short, so that a thread stuck waiting shows
as a call that is not answered in time rather than as a slightly slower one.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from executor.worker import LingeringWorker
from tests.support.executor_fixtures import UnixHTTPConnection

REPO = Path(__file__).resolve().parents[2]


class LongLinger(LingeringWorker):
    """Waits 30 s for a connection's next request: longer than any test waits for an answer."""

    linger_s = 30.0


class ShortLinger(LingeringWorker):
    """Waits 0.2 s, then hands the connection back to gthread's main thread."""

    linger_s = 0.2


def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    """The id of the thread that answers, and the path asked for."""
    body = f"{threading.get_ident()} {environ['PATH_INFO']}".encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]


@contextmanager
def serving(
    tmp_path: Path, worker: str, threads: int, graceful_s: int = 5
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """gunicorn (its arbiter and one worker) serving :func:`app` with ``worker``; stopped by its PID at the end."""
    sock = str(tmp_path / "w.sock")
    log = open(tmp_path / "gunicorn.log", "wb")  # noqa: SIM115 - closed below, after the server
    proc = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "--worker-class", f"tests.executor.test_worker.{worker}",
         "--threads", str(threads), "--bind", f"unix:{sock}", "--graceful-timeout", str(graceful_s),
         "--keep-alive", "75", "tests.executor.test_worker:app"],
        cwd=REPO, stdout=log, stderr=log, start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(sock):
            assert proc.poll() is None, (tmp_path / "gunicorn.log").read_text()
            assert time.monotonic() < deadline, "gunicorn did not bind its socket in 30 s"
            time.sleep(0.05)
        yield sock, proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        log.close()


def call(conn: UnixHTTPConnection, path: str = "/") -> str:
    """One GET on a kept-alive connection: the id of the thread that answered."""
    conn.request("GET", path)
    resp = conn.getresponse()
    body = resp.read().decode()
    assert resp.status == 200, body
    thread, answered = body.split()
    assert answered == path
    return thread


def test_calls_back_to_back_are_answered_by_the_thread_already_there(tmp_path: Path) -> None:
    # Two connections, called in turn. gthread alone hands each call to whichever pool thread is idle (the same
    # one every time, calls being one at a time); here each connection keeps the thread that answered it.
    with serving(tmp_path, "LongLinger", threads=4) as (sock, _):
        a, b = UnixHTTPConnection(sock, timeout=10), UnixHTTPConnection(sock, timeout=10)
        threads_a, threads_b = set(), set()
        for i in range(10):
            threads_a.add(call(a, f"/a{i}"))
            threads_b.add(call(b, f"/b{i}"))
        assert len(threads_a) == 1 and len(threads_b) == 1 and threads_a != threads_b


def test_at_most_half_the_pool_waits_so_new_connections_find_a_thread(tmp_path: Path) -> None:
    # Two threads: one may wait on a connection, never both. If both waited (30 s each), the third
    # connection's call would find no thread and time out after 10 s.
    with serving(tmp_path, "LongLinger", threads=2) as (sock, _):
        first, second, third = (UnixHTTPConnection(sock, timeout=10) for _ in range(3))
        waiting = call(first)
        call(second)
        call(third)
        # The second and third connections went back to gthread's poller and are served from there; the
        # first still has its own thread.
        call(second, "/again")
        call(third, "/again")
        assert call(first, "/again") == waiting


def test_a_connection_handed_back_after_the_wait_is_served(tmp_path: Path) -> None:
    with serving(tmp_path, "ShortLinger", threads=2) as (sock, _):
        conn = UnixHTTPConnection(sock, timeout=10)
        call(conn)
        time.sleep(0.6)  # past the 0.2 s wait: the connection is in gthread's poller again
        call(conn, "/after")
        other = UnixHTTPConnection(sock, timeout=10)
        call(other)


def test_requests_sent_together_are_all_answered_in_order(tmp_path: Path) -> None:
    with serving(tmp_path, "LongLinger", threads=2) as (sock, _):
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(10)
            s.connect(sock)
            s.sendall(b"".join(f"GET /{i} HTTP/1.1\r\nHost: x\r\n\r\n".encode() for i in range(3)))
            received = b""
            while received.count(b"HTTP/1.1 200") < 3 or not received.rstrip().endswith(b"/2"):
                chunk = s.recv(65536)
                assert chunk, f"the connection closed after {received!r}"
                received += chunk
        bodies = [part.rsplit(b"\r\n\r\n", 1)[-1].split()[-1] for part in received.split(b"HTTP/1.1 200")[1:]]
        assert bodies == [b"/0", b"/1", b"/2"]


def test_a_stop_ends_the_waits(tmp_path: Path) -> None:
    # A thread waiting 30 s for a next request would hold up the worker's exit (the pool's threads are
    # joined then) until the arbiter's 20 s of graceful stop run out and it kills the worker.
    with serving(tmp_path, "LongLinger", threads=4, graceful_s=20) as (sock, proc):
        conn = UnixHTTPConnection(sock, timeout=10)
        call(conn)
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        assert time.monotonic() - started < 10
        assert proc.returncode == 0


def test_a_caller_closing_its_connection_frees_the_waiting_thread(tmp_path: Path) -> None:
    # One thread of two may wait. Once the first caller hangs up, its thread stops waiting; the next
    # connection's thread may then wait in its turn, and a third connection is still served.
    with serving(tmp_path, "LongLinger", threads=2) as (sock, _):
        first = UnixHTTPConnection(sock, timeout=10)
        call(first)
        first.close()
        second, third = UnixHTTPConnection(sock, timeout=10), UnixHTTPConnection(sock, timeout=10)
        waiting = call(second)
        assert call(third) != waiting  # the second's thread waits on it: the first's wait no longer counts
        assert call(second, "/again") == waiting
