"""grove's code interpreter server keeps its port from its own kernels.

The server starts its default kernel before it listens, and a kernel's five ports are free ports the system picks
from the range a client's own ports come from (32768-60999 by default; E2B's 49999 is in it). Were the server's
port still free then, a kernel could take it: the server failed to bind, while a kernel's ZeroMQ socket answered
on 49999 (seen once in CI: the SDK's ``run_code`` got ZeroMQ's greeting as the answer's status line).

Here the collision is made likely: each server runs in a network namespace of its own where a kernel's ports come
from six, 49999 one of them. A kernel takes five, so a server that left its port free loses it 5 times in 6; three
servers, each in its own namespace, catch that order with probability 1 - (1/6)^3 (> 99.5 %). It cannot be made
certain: with fewer than five other ports to take, ``jupyter_client`` looks for a free port forever. Needs root
(``unshare --net``), as the suite does.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.router_fixtures import wait_for

PORT = 49999
_RANGE = (49980, 49999)
_HELD = range(49981, 49989, 2)
"""Odd ports of the range held before the server starts: a port the system picks for a bind is of the range's other
parity first (odd here; a connect's, even), so a kernel's five ports are five of the six odd ports left, 49989-49999."""
SERVERS = 3

_LAUNCH = f"""
import os, socket, subprocess, sys
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
with open("/proc/sys/net/ipv4/ip_local_port_range", "w") as f:
    f.write("{_RANGE[0]} {_RANGE[1]}")
held = [socket.socket() for _ in {list(_HELD)}]
for sock, port in zip(held, {list(_HELD)}):
    sock.bind(("127.0.0.1", port))
    sock.set_inheritable(True)
os.execv(sys.executable, [sys.executable, "-m", "grove.integrations.e2b_interpreter", "--cwd", sys.argv[1],
                          "{PORT}"])
"""


@pytest.fixture
def crowded_servers(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    """:data:`SERVERS` servers on :data:`PORT`, each in a network namespace of its own where a kernel's ports
    come from six, :data:`PORT` one of them; server N's log is ``server-N.log`` under ``tmp_path``. Each one's
    whole process group (server and kernels) is killed at the end."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for n in range(SERVERS):
            (tmp_path / str(n)).mkdir()
            with open(tmp_path / f"server-{n}.log", "wb") as log:
                procs.append(subprocess.Popen(["unshare", "--net", "--", sys.executable, "-c", _LAUNCH,
                                               str(tmp_path / str(n))], stdout=log, stderr=subprocess.STDOUT,
                                              start_new_session=True))
        yield procs
    finally:
        for proc in procs:
            # The kernels run in sessions of their own: every process of the server's network namespace goes.
            members = _in_network_namespace_of(proc.pid)
            for pid in members:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            proc.wait()
            wait_for(lambda gone=members: not any(os.path.exists(f"/proc/{pid}") for pid in gone), 10, 0.05,
                     f"the processes of server {proc.pid}'s network namespace gone")


def _in_network_namespace_of(pid: int) -> list[int]:
    """The processes in ``pid``'s network namespace (none if ``pid`` has ended)."""
    try:
        namespace = os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return []
    members = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{name}/ns/net") == namespace:
                    members.append(int(name))
    return members


def _in_namespace(pid: int, code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["nsenter", f"--net=/proc/{pid}/ns/net", "--", sys.executable, "-c", code],
                          capture_output=True, text=True, timeout=90)


_CALL = f"""
import json, sys, urllib.request
request = urllib.request.Request("http://127.0.0.1:{PORT}/execute", data=json.dumps({{"code": "6 * 7"}}).encode(),
                                 headers={{"Content-Type": "application/json"}})
print(urllib.request.urlopen(request, timeout=60).read().decode())
"""

_LISTENING = f"""
import socket, sys
s = socket.socket(); s.settimeout(1)
sys.exit(s.connect_ex(("127.0.0.1", {PORT})))
"""


def test_the_servers_port_is_its_own_when_a_kernel_could_take_it(crowded_servers: list[subprocess.Popen[bytes]],
                                                                   tmp_path: Path) -> None:
    deadline = time.monotonic() + 90
    for n, server in enumerate(crowded_servers):
        while _in_namespace(server.pid, _LISTENING).returncode != 0:
            log = (tmp_path / f"server-{n}.log").read_text()
            assert server.poll() is None, f"server {n} ended ({server.returncode}):\n{log}"
            assert time.monotonic() < deadline, f"server {n} did not listen on {PORT} within 90 s:\n{log}"
            time.sleep(0.3)
        answered = _in_namespace(server.pid, _CALL)
        log = (tmp_path / f"server-{n}.log").read_text()
        assert answered.returncode == 0, f"server {n} did not answer:\n{answered.stderr}\nits log:\n{log}"
        lines = [json.loads(line) for line in answered.stdout.splitlines() if line.strip()]
        assert {"type": "end_of_execution"} in lines
        assert [line["text"] for line in lines if line["type"] == "result"] == ["42"]


def test_a_port_it_cannot_have_is_a_clear_error(tmp_path: Path) -> None:
    taken = ("import socket, subprocess, sys\n"
             f"held = socket.socket(); held.bind(('127.0.0.1', {PORT})); held.listen()\n"
             f"sys.exit(subprocess.run([sys.executable, '-m', 'grove.integrations.e2b_interpreter', '--cwd', "
             f"{str(tmp_path)!r}, '{PORT}']).returncode)")
    ended = subprocess.run(["unshare", "--net", "--", "sh", "-c", f"ip link set lo up && exec {sys.executable} -c "
                            f"\"{taken}\""], capture_output=True, text=True, timeout=60)
    assert ended.returncode == 1, ended.stderr
    assert f"grove's code interpreter cannot listen on 127.0.0.1:{PORT}: Address already in use" in ended.stderr
    assert "stop what holds the port, or give another (--port N)" in ended.stderr

    elsewhere = subprocess.run([sys.executable, "-m", "grove.integrations.e2b_interpreter", "--host", "192.0.2.1",
                                "--cwd", str(tmp_path), str(PORT)], capture_output=True, text=True, timeout=60)
    assert elsewhere.returncode == 1, elsewhere.stderr  # an address of no interface here (TEST-NET-1)
    assert (f"grove's code interpreter cannot listen on 192.0.2.1:{PORT}: Cannot assign requested address"
            in elsewhere.stderr)
