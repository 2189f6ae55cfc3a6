"""The embedded S3 server: loopback only, private credentials, its files in its data dir, restarts."""

from __future__ import annotations

import json
import os
import socket
import stat
import sys
import urllib.request
from pathlib import Path

import pytest

from artifacts import s3proc
from artifacts.s3server import EmbeddedS3
from artifacts.store import ObjectStore
from grove.core.errors import Conflict
from tests.support.s3_fixtures import config_for


def listening_addresses(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket ``pid`` listens on, from /proc."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        with open(table) as fh:
            for line in fh.readlines()[1:]:
                fields = line.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state == "0A" and inode in inodes:  # 0A: LISTEN
                    addr_hex, port_hex = local.split(":")
                    raw = bytes.fromhex(addr_hex)
                    # /proc prints each 32-bit word in host (little-endian) order.
                    raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
                    found.append((socket.inet_ntop(family, raw), int(port_hex, 16)))
    return found


def test_listens_on_loopback_only_with_private_credentials(s3_server: EmbeddedS3) -> None:
    assert s3_server.pid is not None
    addresses = listening_addresses(s3_server.pid)
    assert len(addresses) >= 8  # master, volume, filer, s3, admin, each with HTTP and gRPC
    assert {addr for addr, _ in addresses} == {"127.0.0.1"}, addresses
    assert s3_server.endpoint == f"http://127.0.0.1:{s3_server.endpoint.rsplit(':', 1)[1]}"
    data = s3_server.data_dir
    for name in (s3proc.STATE_FILE, s3proc.IDENTITIES_FILE):
        assert stat.S_IMODE((data / name).stat().st_mode) == 0o600
    assert s3_server.secret_key in (data / s3proc.STATE_FILE).read_text()
    assert "-master.telemetry=false" in s3_server.argv
    assert s3_server.log_path.parent == data and s3_server.log_path.stat().st_size > 0


def test_a_second_server_on_the_same_directory_is_refused(s3_server: EmbeddedS3) -> None:
    with pytest.raises(Conflict, match=str(s3_server.pid)):
        EmbeddedS3(s3_server.data_dir).start()


def test_weed_is_found_without_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    weed = s3proc.find_weed()
    assert os.access(weed, os.X_OK)
    # An unactivated venv: the binary sits next to the interpreter that runs grove.
    assert Path(weed).parent == Path(sys.executable).parent


def test_restart_keeps_data_credentials_and_port(tmp_path: Path) -> None:
    data = tmp_path / "s3"
    with EmbeddedS3(data) as first:
        endpoint, keys = first.endpoint, (first.access_key, first.secret_key)
        config = config_for(first, "keep")
        with ObjectStore(config) as store:
            store.put_bytes("survives/restart", b"still here")
        ports = json.loads((data / s3proc.STATE_FILE).read_text())["ports"]
        grpc_ports = [port for name, port in ports.items() if "grpc" in name]
    assert first.pid is None
    assert not (data / s3proc.PID_FILE).exists()
    # weed's gRPC sockets went to the data dir's tmp/, not to /tmp.
    leftovers = [n for n in os.listdir("/tmp") if n.startswith("seaweedfs-") and any(str(p) in n for p in grpc_ports)]
    assert leftovers == []
    with EmbeddedS3(data) as second:
        # start() returned only once the master knew the volume server (reads before that answer 500).
        master = f"http://127.0.0.1:{ports['master.port']}/dir/status"
        with urllib.request.urlopen(master) as response:
            assert '"DataNodes":[{' in response.read().decode()
        assert (second.endpoint, second.access_key, second.secret_key) == (endpoint, *keys)
        with ObjectStore(config_for(second, "keep")) as store:
            assert store.get_bytes("survives/restart") == b"still here"
