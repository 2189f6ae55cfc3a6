"""Paths the sandbox controls, raced and booby-trapped, against the executor (issue 18, findings 8 and 11).

A loop swaps a directory with a symlink (``renameat2(RENAME_EXCHANGE)``) while archives and files are
written through it; FIFOs, devices and huge sparse files sit where the executor reads. Nothing may land
outside the target (or the root), and nothing may hang.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from artifacts.snapshot import pack_directory
from grove.client import Sandbox
from tests.support.executor_fixtures import Client, RunningExecutor
from tests.support.router_fixtures import RouterProcess, error_of, wait_for

# Swaps two names as fast as it can until a deadline or a stop file: the directory and the link trade
# places atomically, so at any instant the name holds one of them.
SWAPPER = (
    "import ctypes, os, sys, time\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "a, b, stop = (p.encode() for p in sys.argv[1:4])\n"
    "end = time.monotonic() + float(sys.argv[4])\n"
    "while time.monotonic() < end and not os.path.exists(stop):\n"
    "    for _ in range(500):\n"
    "        libc.renameat2(-100, a, -100, b, 2)\n"  # AT_FDCWD, RENAME_EXCHANGE
)
ATTEMPTS = 150


@contextlib.contextmanager
def _swapping(a: Path, b: Path) -> Iterator[None]:
    """Run the swapper on the host for the block (stopped by its stop file, then waited for)."""
    stop = a.parent / f".stop-{os.urandom(4).hex()}"
    before = a.lstat().st_ino
    racer = subprocess.Popen([sys.executable, "-c", SWAPPER, str(a), str(b), str(stop), "120"])
    try:
        wait_for(lambda: a.lstat().st_ino != before, timeout=10, interval=0.001, what="the swapper to start")
        yield
    finally:
        stop.touch()
        racer.wait(timeout=10)
        stop.unlink()


def _tar(name: str, data: bytes) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


# -- inside a real sandbox -----------------------------------------------------------------------------------


def test_archive_put_raced_by_a_link_swap_never_writes_outside(router: RouterProcess, sandbox: Sandbox) -> None:
    """Finding 8: before the fix, 54 of 150 PUTs wrote /outside/pwned."""
    sandbox.exec("rm -rf /workspace/t /outside /workspace/stop && mkdir -p /workspace/t/d /outside "
                 "&& ln -s /outside /workspace/t/l")
    sandbox.exec(["sh", "-c", 'python3 -c "$0" /workspace/t/d /workspace/t/l /workspace/stop 120 '
                  "</dev/null >/dev/null 2>&1 &", SWAPPER])
    statuses: dict[int, int] = {}
    refusals: set[str] = set()
    try:
        body = _tar("d/pwned", b"x")
        for _ in range(ATTEMPTS):
            reply = router.http("PUT", f"/v1/sandboxes/{sandbox.id}/archive?path=/workspace/t", body,
                                headers={"Content-Type": "application/x-tar"})
            statuses[reply.status] = statuses.get(reply.status, 0) + 1
            if reply.status == 400:
                refusals.add(error_of(reply)["message"])
    finally:
        sandbox.exec("touch /workspace/stop; sleep 0.2")
    assert sandbox.exec(["test", "-e", "/outside/pwned"]).exit_code == 1, statuses
    assert set(statuses) <= {201, 400}, statuses
    assert all("'d/pwned'" in m and "symbolic link" in m for m in refusals), refusals
    assert statuses.get(400) and statuses.get(201), f"the swap never raced the extraction: {statuses}"
    sandbox.exec("rm -rf /workspace/t /outside /workspace/stop")


@pytest.fixture
def booby_trapped(sandbox: Sandbox) -> Iterator[Sandbox]:
    """The sandbox with its /etc/passwd and /etc/group kept aside, put back afterwards."""
    sandbox.exec("cp -a /etc/passwd /tmp/passwd.keep && cp -a /etc/group /tmp/group.keep")
    try:
        yield sandbox
    finally:
        sandbox.exec("rm -f /etc/passwd /etc/group /tmp/pw; mv /tmp/passwd.keep /etc/passwd; "
                     "mv /tmp/group.keep /etc/group")


@pytest.mark.parametrize(("trap", "needle"), [
    ("mkfifo /tmp/pw && ln -sf /tmp/pw /etc/passwd", "/etc/passwd is not a regular file but a FIFO"),
    ("ln -sf /dev/zero /etc/passwd", "/etc/passwd is not a regular file but a device"),
    ("truncate -s 2G /tmp/pw && ln -sf /tmp/pw /etc/group", "/etc/group is larger than"),
], ids=["fifo", "device", "sparse"])
def test_a_booby_trapped_passwd_is_a_prompt_422(
        router: RouterProcess, booby_trapped: Sandbox, trap: str, needle: str) -> None:
    """Finding 11: ``user: nobody`` with /etc/passwd a link to a FIFO never returned."""
    booby_trapped.exec(["sh", "-c", trap])
    started = time.monotonic()
    reply = router.http("POST", f"/v1/sandboxes/{booby_trapped.id}/exec", timeout=20,
                        json_body={"command": ["true"], "user": "nobody", "timeout_s": 5})
    assert reply.status == 422, reply.body
    assert needle in error_of(reply)["message"], reply.body
    assert time.monotonic() - started < 5
    # Root needs no lookup and is unaffected; so is a numeric id.
    assert booby_trapped.exec("true").exit_code == 0


# -- an executor serving a directory (the root is not "/") ---------------------------------------------------


@pytest.fixture
def swapping(executor: RunningExecutor) -> Iterator[tuple[str, Path]]:
    """``/work/race-*/d`` swapping with a link to a host directory outside the executor's root."""
    api = f"/work/race-{os.urandom(4).hex()}"
    outside = Path(os.path.dirname(executor.root)) / f"outside-{os.urandom(4).hex()}"
    outside.mkdir()
    (outside / "secret").write_text("host secret")
    here = Path(executor.host_path(api))
    (here / "d").mkdir(parents=True)
    (here / "d" / "secret").write_text("inside")
    (here / "l").symlink_to(outside)
    with _swapping(here / "d", here / "l"):
        yield api, outside


def test_file_api_raced_by_a_link_swap_stays_in_the_root(client: Client, swapping: tuple[str, Path]) -> None:
    """Files and archives by path, while the path's directory swaps with a link out of the executor's root."""
    api, outside = swapping
    seen: dict[str, set[int]] = {}
    for i in range(ATTEMPTS):
        calls = [
            ("PUT", f"/v1/files?path={api}/d/pwned-{i}", b"x"),
            ("GET", f"/v1/files?path={api}/d/secret", None),
            ("GET", f"/v1/files/list?path={api}/d", None),
            ("PUT", f"/v1/archive?path={api}/d", _tar(f"a-{i}", b"x")),
            ("GET", f"/v1/archive?path={api}/d", None),
            ("DELETE", f"/v1/files?path={api}/d/pwned-{i}", None),
        ]
        for method, path, body in calls:
            reply = client.request(method, path, body)
            seen.setdefault(f"{method} {path.split('?')[0]}", set()).add(reply.status)
            assert b"host secret" not in reply.body, (method, path)
            assert reply.status < 500, (method, path, reply.body)
    assert sorted(p.name for p in outside.iterdir()) == ["secret"], "something was written outside the root"
    assert (outside / "secret").read_text() == "host secret"
    assert 403 in seen["PUT /v1/files"] and 201 in seen["PUT /v1/files"], f"the swap never raced: {seen}"


def test_swerex_read_of_a_fifo_answers_at_once(executor: RunningExecutor, client: Client) -> None:
    """SWE-ReX's read_file opened a FIFO (size 0, under the cap) and blocked the worker for good."""
    fifo = executor.host_path("/work/fifo-read")
    os.mkfifo(fifo)
    try:
        reply = client.request("POST", "/swerex/read_file", json.dumps({"path": "/work/fifo-read"}).encode(),
                               {"Content-Type": "application/json"})
        assert reply.status == 511, reply.body
        assert "not a regular file" in reply.json()["swerexception"]["message"]
        for path in ("/v1/files?path=/work/fifo-read",):
            assert client.request("GET", path).status == 400
    finally:  # the executor is the session's: a FIFO left in its /work blocks a later test that reads it all
        os.unlink(fifo)


class _Sink(BaseHTTPRequestHandler):
    """A presigned-PUT stand-in: takes the body it was promised and answers 200."""

    def do_PUT(self) -> None:
        """Read the promised body, answer 200."""
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_: object) -> None:
        """Quiet."""


@pytest.fixture
def sink() -> Iterator[str]:
    """The URL of a loopback HTTP server that accepts PUTs."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/bucket/key?X-Amz-Signature=x"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def file_or_fifo(executor: RunningExecutor) -> Iterator[str]:
    """The API path of a file that swaps with a FIFO (and back) as fast as it can."""
    api = f"/work/fifo-{os.urandom(4).hex()}"
    here = Path(executor.host_path(api))
    here.mkdir()
    (here / "f").write_bytes(b"z" * 100_000)
    os.mkfifo(here / "p")
    with _swapping(here / "f", here / "p"):
        yield api


def test_artifact_push_of_a_file_raced_with_a_fifo_never_hangs(client: Client, sink: str, file_or_fifo: str) -> None:
    """The push checked the path was a regular file, then opened it by name: a FIFO swapped in blocked."""
    client.timeout = 10
    statuses: set[int] = set()
    for _ in range(ATTEMPTS):
        reply = client.request("POST", "/v1/artifacts/push",
                               json.dumps({"items": [{"path": f"{file_or_fifo}/f", "url": sink}]}).encode(),
                               {"Content-Type": "application/json"})
        statuses.add(reply.status)
        if reply.status == 200:
            item = reply.json()["items"][0]
            assert item["uploaded"] and item["size"] == 100_000, item
        else:
            assert "not a regular file" in reply.json()["error"]["message"], reply.body
    assert statuses <= {200, 400}, statuses


def test_snapshot_of_a_file_raced_with_a_fifo_never_hangs(executor: RunningExecutor, file_or_fifo: str) -> None:
    """A snapshot measured a file, then opened it by name: a FIFO swapped in blocked the SIGTERM snapshot."""
    tree = executor.host_path(file_or_fifo)
    packed: list[int] = []

    def pack() -> None:
        packed.append(sum(map(len, pack_directory(tree))))

    for attempt in range(ATTEMPTS // 3):
        worker = threading.Thread(target=pack, daemon=True)
        worker.start()
        worker.join(timeout=10)
        assert len(packed) == attempt + 1, "packing blocked on a FIFO"


def test_a_fifo_planted_as_the_next_session_script_does_not_block_it(executor: RunningExecutor,
                                                                      client: Client) -> None:
    """A session writes each command to ``<dir>/<seq>.sh``, a name the sandbox can guess and take first."""
    client.timeout = 15
    name = f"s-{os.urandom(4).hex()}"
    swerex = {"Content-Type": "application/json"}
    created = client.request("POST", "/swerex/create_session",
                             json.dumps({"session": name, "startup_timeout": 5}).encode(), swerex)
    assert created.status == 200, created.body
    try:
        planted = 0
        for script_dir in Path(executor.host_path("/tmp/.grove-swerex")).iterdir():
            if not (script_dir / "1.sh").exists():
                os.mkfifo(script_dir / "1.sh")
                planted += 1
        assert planted
        reply = client.request("POST", "/swerex/run_in_session", json.dumps(
            {"session": name, "command": "echo ran", "check": "silent", "timeout": 10}).encode(), swerex)
        assert reply.status == 200 and reply.json()["output"].strip() == "ran", reply.body
    finally:
        client.request("POST", "/swerex/close_session", json.dumps({"session": name}).encode(), swerex)
