"""Raw exec calls for latency benchmarks: one keep-alive ``http.client`` connection each, no SDK in the way.

Each call checks its answer (a failed call must not pass for a fast one) and the connection notices
when the server dropped keep-alive, since a reconnect per call would be a different benchmark.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
from typing import Any

import msgpack

JSON = "application/json"
MSGPACK = "application/msgpack"
TRUE = ["true"]


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over a Unix socket (a local sandbox's executor listens on one)."""

    def __init__(self, path: str, timeout: float = 60.0) -> None:
        super().__init__("executor", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


class KeepAlive:
    """POSTs on one persistent connection; counts reconnects."""

    def __init__(self, conn: http.client.HTTPConnection, token: str) -> None:
        self.conn = conn
        self.token = token
        self.conn.connect()
        self._sock = conn.sock
        self.reconnects = 0

    def post(self, path: str, body: bytes, content_type: str, accept: str) -> bytes:
        """One request; the body of a 200 answer (anything else raises)."""
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": content_type, "Accept": accept}
        self.conn.request("POST", path, body=body, headers=headers)
        resp = self.conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"POST {path}: {resp.status} {data[:300]!r}")
        if self.conn.sock is not self._sock:
            self.reconnects += 1
            self._sock = self.conn.sock
        return data

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()


def check_result(result: dict[str, Any]) -> dict[str, Any]:
    """The exec result, if the command ran and exited 0."""
    if result.get("exit_code") != 0 or result.get("timed_out"):
        raise RuntimeError(f"exec did not succeed: {result}")
    return result


class ExecCalls:
    """``["true"]`` through one endpoint in the wire formats grove speaks."""

    def __init__(self, link: KeepAlive, path: str) -> None:
        self.link = link
        self.path = path
        self.durations_s: list[float] = []
        """The executor's own ``duration_s`` (spawn to exit of the command) of each JSON call."""
        self._json = json.dumps({"command": TRUE}).encode()
        self._msgpack: bytes = msgpack.packb({"command": TRUE}, use_bin_type=True)

    def json(self) -> dict[str, Any]:
        """JSON in, JSON out."""
        result = check_result(json.loads(self.link.post(self.path, self._json, JSON, JSON)))
        self.durations_s.append(float(result["duration_s"]))
        return result

    def msgpack(self) -> dict[str, Any]:
        """msgpack in, msgpack out."""
        return check_result(msgpack.unpackb(self.link.post(self.path, self._msgpack, MSGPACK, MSGPACK), raw=False))

    def stream(self) -> dict[str, Any]:
        """``?stream=1`` with JSON: ndjson frames, the result last."""
        last = json.loads(self.link.post(self.path + "?stream=1", self._json, JSON, JSON).splitlines()[-1])
        if last.get("type") != "result":
            raise RuntimeError(f"stream did not end with a result: {last}")
        return check_result(last["result"])


def floor() -> None:
    """The floor every exec figure is compared with: start and wait for ``true`` from this process."""
    subprocess.run(TRUE, check=True)


def cpu_ticks(pid: int, *, children: bool = True) -> int:
    """utime + stime (and, with ``children``, of its waited-for children) of a process, in clock ticks."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read()
    except OSError:
        return 0
    fields = raw[raw.rfind(b")") + 2 :].split()
    # fields[0] is field 3 (state) of proc(5): utime, stime, cutime, cstime are fields 14-17.
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks


TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def system_busy_ticks() -> int:
    """CPU ticks all CPUs spent busy since boot (``/proc/stat``; includes whatever else runs on the machine)."""
    with open("/proc/stat", encoding="ascii") as fh:
        fields = [int(x) for x in fh.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields[:8]) - idle  # user nice system idle iowait irq softirq steal (guest is inside user)


def child_pids(pid: int) -> list[int]:
    """Direct children of a process (every thread's ``children`` file)."""
    found: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", encoding="ascii") as fh:
                found.extend(int(p) for p in fh.read().split())
        except OSError:
            continue
    return found
