"""Real executors for the tests: a gunicorn subprocess on a loopback port or a Unix socket, and a client.

Nothing here is a fake. ``start_executor`` runs ``python -m executor`` with ``GROVE_EXECUTOR_ROOT`` set
to a temporary directory, waits for ``/healthz``, and at exit kills the arbiter by PID, then checks
that its workers and every process the tests marked (see ``STRAY``) are gone.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import msgpack
import pytest

from tests.conftest import loopback_listener, short_tempdir

TOKEN = "test-token-7d1f"
MSGPACK = "application/msgpack"
# Long sleeps that tests start carry this duration, so a scan of /proc finds exactly them.
STRAY = f"7777.{os.getpid()}"

Body = bytes | Iterable[bytes] | None


def processes_with(needle: str) -> list[int]:
    """PIDs of live (non-zombie) processes whose command line contains ``needle``."""
    found = []
    raw_needle = needle.encode()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                cmdline = fh.read()  # empty for zombies and kernel threads
        except OSError:
            continue
        if raw_needle in cmdline.replace(b"\0", b" "):
            found.append(int(name))
    return found


def processes_running(*argv: str) -> list[int]:
    """PIDs of live processes whose argument vector is exactly ``argv``."""
    want = b"\0".join(a.encode() for a in argv) + b"\0"
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as fh:
                    if fh.read() == want:
                        found.append(int(name))
            except OSError:
                continue
    return found


def wait_gone(needle: str, timeout: float = 3.0) -> list[int]:
    """Wait until no process matches ``needle``; return the survivors (empty on success)."""
    deadline = time.monotonic() + timeout
    while (left := processes_with(needle)) and time.monotonic() < deadline:
        time.sleep(0.02)
    return left


def children_of(pid: int) -> list[int]:
    """Direct children of ``pid`` (from /proc/*/stat)."""
    kids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                raw = fh.read()
        except OSError:
            continue
        if int(raw[raw.rfind(b")") + 2 :].split()[1]) == pid:
            kids.append(int(name))
    return kids


def rss_kib(pid: int) -> int:
    """VmRSS of a process in KiB."""
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


class UnixHTTPConnection(http.client.HTTPConnection):
    """http.client over a Unix socket."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        """Connect to the socket file instead of host:port."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


@dataclass
class Reply:
    """One HTTP response, body read in full."""

    status: int
    headers: http.client.HTTPMessage
    body: bytes

    def json(self) -> Any:
        """The body decoded as JSON or msgpack, by its Content-Type."""
        if (self.headers.get("Content-Type") or "").startswith(MSGPACK):
            return msgpack.unpackb(self.body, raw=False)
        return json.loads(self.body)


@dataclass
class Client:
    """A keep-alive HTTP client for one executor (one connection; make one per thread)."""

    executor: RunningExecutor
    token: str | None = TOKEN
    timeout: float = 30.0
    _conn: http.client.HTTPConnection | None = field(default=None, repr=False)

    def connection(self) -> http.client.HTTPConnection:
        """The current connection, opened on first use."""
        if self._conn is None:
            self._conn = self.executor.connect(self.timeout)
        return self._conn

    def close(self) -> None:
        """Close the connection."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def send(
        self, method: str, path: str, body: Body = None, headers: dict[str, str] | None = None
    ) -> http.client.HTTPResponse:
        """Send a request and return the response unread (for streaming); an iterable body goes chunked."""
        hdrs = dict(headers or {})
        if self.token is not None:
            hdrs.setdefault("Authorization", f"Bearer {self.token}")
        conn = self.connection()
        try:
            conn.request(method, path, body=body, headers=hdrs)
            return conn.getresponse()
        except (ConnectionError, http.client.HTTPException):
            self.close()
            raise

    def request(self, method: str, path: str, body: Body = None, headers: dict[str, str] | None = None) -> Reply:
        """Send a request and read the whole response."""
        resp = self.send(method, path, body, headers)
        data = resp.read()
        if resp.will_close:
            self.close()
        return Reply(resp.status, resp.headers, data)

    def exec(self, *, msgpack_out: bool = False, msgpack_in: bool = False, **fields: Any) -> Reply:
        """POST /v1/exec with ``fields``; JSON both ways unless asked for msgpack."""
        headers = {"Content-Type": MSGPACK if msgpack_in else "application/json"}
        if msgpack_out:
            headers["Accept"] = MSGPACK
        body = msgpack.packb(fields, use_bin_type=True) if msgpack_in else json.dumps(fields).encode()
        return self.request("POST", "/v1/exec", body, headers)

    def run(self, **fields: Any) -> dict[str, Any]:
        """Exec and insist on a 200; return the result (msgpack both ways, so bytes stay bytes)."""
        reply = self.exec(msgpack_out=True, msgpack_in=True, **fields)
        assert reply.status == 200, (reply.status, reply.body[:500])
        result: dict[str, Any] = reply.json()
        return result


@dataclass
class RunningExecutor:
    """A live executor subprocess."""

    proc: subprocess.Popen[bytes]
    root: str
    bind: str
    log_path: str

    @property
    def arbiter_pid(self) -> int:
        """The gunicorn arbiter: the process we started."""
        return self.proc.pid

    def worker_pids(self) -> list[int]:
        """The arbiter's children: the gunicorn workers (one, by design)."""
        return children_of(self.arbiter_pid)

    def connect(self, timeout: float) -> http.client.HTTPConnection:
        """A new connection to this executor."""
        if self.bind.startswith("unix:"):
            return UnixHTTPConnection(self.bind.removeprefix("unix:"), timeout)
        host, port = self.bind.rsplit(":", 1)
        return http.client.HTTPConnection(host, int(port), timeout=timeout)

    def client(self, **kwargs: Any) -> Client:
        """A fresh client with its own connection."""
        return Client(self, **kwargs)

    def host_path(self, api_path: str) -> str:
        """Where an API path lives on this host."""
        return os.path.join(self.root, api_path.lstrip("/"))

    def log(self) -> str:
        """What the executor wrote to stderr so far."""
        with open(self.log_path, encoding="utf-8", errors="replace") as fh:
            return fh.read()


def _wait_healthy(ex: RunningExecutor, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ex.proc.poll() is not None:
            raise RuntimeError(f"executor exited with {ex.proc.returncode}:\n{ex.log()}")
        conn = ex.connect(1.0)
        try:
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        finally:
            conn.close()
        time.sleep(0.05)
    raise RuntimeError(f"executor not healthy after {timeout}s:\n{ex.log()}")


def _stop(ex: RunningExecutor) -> None:
    """Kill the arbiter by PID (TERM, then KILL), and any worker it left behind."""
    workers = ex.worker_pids()
    if ex.proc.poll() is None:
        ex.proc.send_signal(signal.SIGTERM)
        try:
            ex.proc.wait(timeout=8)
        except subprocess.TimeoutExpired:
            ex.proc.kill()
            ex.proc.wait(timeout=5)
    for pid in workers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def start_executor(*, unix: bool = False, env: dict[str, str] | None = None) -> Iterator[RunningExecutor]:
    """Run a real executor for the duration of the block; its root is a fresh temporary directory."""
    with short_tempdir() as tmp:
        root = os.path.join(tmp, "root")
        os.makedirs(os.path.join(root, "work"))
        # A TCP executor gets a socket already bound here (gunicorn's fd://): a port picked here and bound by the
        # child a moment later could be taken in between by another test's process.
        listener = None if unix else loopback_listener()
        bind = f"unix:{tmp}/executor.sock" if listener is None else f"127.0.0.1:{listener.getsockname()[1]}"
        child_env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "GROVE_EXECUTOR_TOKEN": TOKEN,
            "GROVE_EXECUTOR_ROOT": root,
            "GROVE_EXECUTOR_WORKDIR": "/work",
            "GROVE_EXECUTOR_OUTPUT_DIR": "/tmp/grove-output",
            **(env or {}),
        }
        log_path = os.path.join(tmp, "executor.log")
        argument = bind if listener is None else f"fd://{listener.fileno()}"
        with open(log_path, "wb") as log, listener or contextlib.nullcontext():  # the child keeps its own copies
            proc = subprocess.Popen(
                [sys.executable, "-m", "executor", "--bind", argument],
                env=child_env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
                pass_fds=() if listener is None else (listener.fileno(),),
            )
        ex = RunningExecutor(proc, root, bind, log_path)
        try:
            _wait_healthy(ex)
            yield ex
        finally:
            workers = ex.worker_pids()
            _stop(ex)
            deadline = time.monotonic() + 3
            while (alive := [pid for pid in workers if _is_live(pid)]) and time.monotonic() < deadline:
                time.sleep(0.02)
            strays = wait_gone(STRAY)
            for pid in strays:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            assert not alive, f"executor workers survived: {alive}"
            assert not strays, f"test processes outlived the executor: {strays}"


def _is_live(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read()
    except OSError:
        return False
    return raw[raw.rfind(b")") + 2 :].split()[0] != b"Z"


@pytest.fixture(scope="session")
def executor() -> Iterator[RunningExecutor]:
    """The shared executor on a loopback TCP port."""
    with start_executor() as ex:
        yield ex


@pytest.fixture(scope="session")
def unix_executor() -> Iterator[RunningExecutor]:
    """A second executor, listening on a Unix socket."""
    with start_executor(unix=True) as ex:
        yield ex


@pytest.fixture(scope="session")
def capped_executor() -> Iterator[RunningExecutor]:
    """An executor with a 4 KiB file-size cap, for the 413 paths."""
    with start_executor(env={"GROVE_EXECUTOR_MAX_FILE_BYTES": "4096"}) as ex:
        yield ex


@pytest.fixture(params=["tcp", "unix"])
def any_executor(request: pytest.FixtureRequest) -> RunningExecutor:
    """The TCP and the Unix-socket executor in turn."""
    name = "executor" if request.param == "tcp" else "unix_executor"
    ex: RunningExecutor = request.getfixturevalue(name)
    return ex


@pytest.fixture
def client(executor: RunningExecutor) -> Iterator[Client]:
    """A client of the shared TCP executor."""
    c = executor.client()
    yield c
    c.close()
