"""The boundaries around a sandbox: its executor socket and token, archives, the network, other sandboxes.

Attacks from inside a sandbox (an agent's commands) and from outside it (a client holding one
sandbox's credentials), against a real router.
"""

from __future__ import annotations

import io
import json
import secrets
import socket
import tarfile
from http.client import HTTPConnection
from pathlib import Path

import pytest

from grove.client import Sandbox
from tests.security.probes import CONNECT
from tests.support.router_fixtures import RouterProcess, error_of, layer_file

# Reads its router's embedded S3 port: that server too must be out of a sandbox's reach.
pytestmark = pytest.mark.embedded_s3

ECONNREFUSED, ENETUNREACH = 111, 101
SCAN = (
    "import glob, sys\n"
    "key = sys.stdin.read().encode()\n"
    "hits = 0\n"
    "for path in glob.glob('/proc/[0-9]*/environ') + glob.glob('/proc/[0-9]*/cmdline') \\\n"
    "        + glob.glob('/proc/[0-9]*/mem'):\n"
    "    try:\n"
    "        hits += key in open(path, 'rb').read(1 << 20)\n"
    "    except OSError:\n"
    "        pass\n"
    "print(hits)\n"
)


def _record(router: RouterProcess, sandbox_id: str) -> dict[str, object]:
    data: dict[str, object] = json.loads((router.layout.record(sandbox_id)).read_text())
    return data


class _UnixHTTP(HTTPConnection):
    def __init__(self, path: Path) -> None:
        super().__init__("executor", timeout=10)
        self._path = str(path)

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(self._path)


def _executor_get(socket_path: Path, token: str, path: str = "/v1/files/list?path=/") -> int:
    conn = _UnixHTTP(socket_path)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}"})
        return conn.getresponse().status
    finally:
        conn.close()


# -- executor sockets and tokens ---------------------------------------------------------------------------


def test_each_executor_takes_only_its_own_token(router: RouterProcess, pair: tuple[Sandbox, Sandbox]) -> None:
    a, b = pair
    tokens = {sb.id: str(_record(router, sb.id)["token"]) for sb in pair}
    assert tokens[a.id] != tokens[b.id]
    sock_a = router.layout.sandbox(a.id) / "executor.sock"
    assert sock_a.stat().st_mode & 0o077 == 0, "the executor socket is open to other host users"
    assert _executor_get(sock_a, tokens[a.id]) == 200
    assert _executor_get(sock_a, tokens[b.id]) == 401  # b's token opens b's executor only
    assert _executor_get(sock_a, "") == 401
    assert _executor_get(sock_a, tokens[a.id][:-1]) == 401
    # A sandbox token is no API key, not even for its own sandbox.
    for token in tokens.values():
        reply = router.http("GET", f"/v1/sandboxes/{a.id}", key=token)
        assert reply.status == 401 and error_of(reply)["code"] == "unauthorized"


def test_no_executor_socket_or_token_inside(router: RouterProcess, pair: tuple[Sandbox, Sandbox]) -> None:
    a, b = pair
    for sb, other in ((a, b), (b, a)):
        host_sockets = router.layout.sandboxes
        for path in (host_sockets / sb.id / "executor.sock", host_sockets / other.id / "executor.sock"):
            assert sb.exec(["test", "-e", str(path)]).exit_code == 1
        # No socket file anywhere in its tree, and its commands inherit no descriptor of the executor.
        r = sb.exec(["sh", "-c", "find / -xdev -type s 2>/dev/null | grep -v '^/proc' | wc -l"])
        assert r.stdout.strip() == b"0", r
        r = sb.exec(["sh", "-c", "ls /proc/self/fd"])
        assert sorted(r.stdout.split()) == [b"0", b"1", b"2", b"3"], r.stdout  # 3: ls's own directory
        token = str(_record(router, other.id)["token"])
        r = sb.exec(["python3", "-c", SCAN], stdin=token)
        assert r.stdout.strip() == b"0", r


def test_abstract_and_host_unix_sockets_are_unreachable(router: RouterProcess, pair: tuple[Sandbox, Sandbox]) -> None:
    a, _ = pair
    name = f"grove-test-{secrets.token_hex(4)}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\0" + name)
    listener.listen(1)
    try:
        r = a.exec(["python3", "-c", CONNECT, "@" + name])
        assert r.stdout.split() == [b"error", str(ECONNREFUSED).encode()], r.stdout  # another network namespace
        r = a.exec(["python3", "-c", CONNECT, "/run/systemd/private"])
        assert r.stdout.startswith(b"error"), r.stdout
    finally:
        listener.close()


# -- archives ------------------------------------------------------------------------------------------------


def _tar(*members: tuple[str, str, bytes | str]) -> bytes:
    """A tar of (kind, name, data-or-link-target) members; kinds: file, symlink, hardlink, dir."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for kind, name, payload in members:
            info = tarfile.TarInfo(name)
            if kind == "file":
                assert isinstance(payload, bytes)
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
                continue
            info.type = {"symlink": tarfile.SYMTYPE, "hardlink": tarfile.LNKTYPE, "dir": tarfile.DIRTYPE}[kind]
            info.linkname = str(payload)
            tar.addfile(info)
    return out.getvalue()


@pytest.mark.parametrize("members", [
    [("symlink", "root", "/"), ("file", "root/etc/grove-evil", b"x")],
    [("symlink", "up", "../../.."), ("file", "up/etc/grove-evil", b"x")],
    [("symlink", "d", "/etc"), ("file", "d/grove-evil", b"x")],
    [("hardlink", "shadow", "/etc/shadow")],
    [("hardlink", "h", "../../etc/passwd")],
    [("file", "../../etc/grove-evil", b"x")],
    [("file", "/etc/grove-evil", b"x")],
    [("dir", "ok", ""), ("symlink", "ok/x", "/"), ("file", "ok/x/etc/grove-evil", b"x")],
], ids=["symlink-root", "symlink-up", "symlink-etc", "hardlink-abs", "hardlink-up", "dotdot", "absolute", "nested"])
def test_archive_links_cannot_write_outside_the_target(
        router: RouterProcess, pair: tuple[Sandbox, Sandbox], members: list[tuple[str, str, bytes | str]]) -> None:
    a, _ = pair
    a.exec("mkdir -p /workspace/t")
    reply = router.http("PUT", f"/v1/sandboxes/{a.id}/archive?path=/workspace/t", _tar(*members),
                        headers={"Content-Type": "application/x-tar"})
    assert reply.status == 400, reply.body
    assert "archive member" in error_of(reply)["message"]
    assert a.exec(["test", "-e", "/etc/grove-evil"]).exit_code == 1
    assert not list(router.state_dir.glob("**/grove-evil"))  # nor anywhere on the host under the state dir
    a.exec("rm -rf /workspace/t")


def test_archive_through_a_planted_symlink(router: RouterProcess, pair: tuple[Sandbox, Sandbox]) -> None:
    a, _ = pair
    # The agent plants a link first; a later upload of the harness must not follow it.
    a.exec("mkdir -p /workspace/p && ln -sfn /etc /workspace/p/conf")
    reply = router.http("PUT", f"/v1/sandboxes/{a.id}/archive?path=/workspace/p",
                        _tar(("file", "conf/grove-evil", b"x")), headers={"Content-Type": "application/x-tar"})
    assert reply.status == 400 and "outside the target" in error_of(reply)["message"], reply.body
    assert a.exec(["test", "-e", "/etc/grove-evil"]).exit_code == 1
    # The target itself being a link is the caller's own choice of directory, resolved inside the sandbox.
    a.exec("ln -sfn / /workspace/rootlink")
    reply = router.http("PUT", f"/v1/sandboxes/{a.id}/archive?path=/workspace/rootlink/tmp/in",
                        _tar(("file", "f", b"y")), headers={"Content-Type": "application/x-tar"})
    assert reply.status == 201, reply.body
    assert a.exec("cat /tmp/in/f").stdout == b"y"
    a.exec("sync")
    assert layer_file(router.state_dir, a.id, "tmp/in/f") == b"y"  # a's layer


def test_file_api_paths_stay_in_the_sandbox(router: RouterProcess, pair: tuple[Sandbox, Sandbox]) -> None:
    a, b = pair
    b.exec("echo secret-of-b > /workspace/b-secret")
    for path in (f"/proc/1/root/../../{router.state_dir}/records", f"{router.state_dir}/api_keys",
                 f"/../../{router.state_dir}/sandboxes/{b.id}/upper/workspace/b-secret", "/etc/../../etc/shadow/.."):
        reply = router.http("GET", f"/v1/sandboxes/{a.id}/files?path={path}")
        assert reply.status in (400, 403, 404), (path, reply.status)
        assert b"secret-of-b" not in reply.body and router.key.encode() not in reply.body
    # The executor reads its own /proc (it is the sandbox's PID 1): nothing of the host's is in it.
    for path in ("/proc/1/environ", "/proc/1/cmdline", "/proc/self/mountinfo"):
        reply = router.http("GET", f"/v1/sandboxes/{a.id}/files?path={path}")
        assert router.key.encode() not in reply.body and b"GROVE_API_KEY" not in reply.body, path


# -- the network ---------------------------------------------------------------------------------------------


def _host_addresses() -> list[str]:
    """This host's non-loopback IPv4 addresses."""
    found: set[str] = set()
    try:
        for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET):
            found.add(str(info[4][0]))
    except OSError:
        pass
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.255.255.1", 9))  # no packet is sent: this only picks the route's source
            found.add(probe.getsockname()[0])
        except OSError:
            pass
    return sorted(a for a in found if not a.startswith("127."))


def test_egress_deny_reaches_no_host_service(router: RouterProcess, pair: tuple[Sandbox, Sandbox]) -> None:
    a, b = pair
    s3 = json.loads((router.layout.s3 / "grove-s3.json").read_text())["ports"]["s3.port"]
    targets = [("127.0.0.1", router.port), ("127.0.0.1", s3), ("::1", router.port), ("localhost", router.port)]
    targets += [(address, router.port) for address in _host_addresses()]
    targets += [("169.254.169.254", 80), ("169.254.169.254", 443), ("fd00:ec2::254", 80), ("10.0.0.1", 53),
                ("172.17.0.1", 2375), ("192.168.0.1", 80), ("224.0.0.1", 80), ("255.255.255.255", 67)]
    for host, port in targets:
        r = a.exec(["python3", "-c", CONNECT, host, str(port)])
        out = r.stdout.decode().split()
        assert out[:1] == ["error"], (host, port, r.stdout, r.stderr)
        if host in ("127.0.0.1", "::1", "localhost"):
            assert out[1] == str(ECONNREFUSED), (host, port, out)  # its own loopback: nothing listens there
        else:
            assert out[1] in (str(ENETUNREACH), "-2", "-3", "99"), (host, port, out)  # no route, no packet
    # Another sandbox's service on its own loopback is in another namespace: a sees nothing of it.
    b.exec("python3 -m http.server 8765 --bind 127.0.0.1 >/dev/null 2>&1 & sleep 0.5; echo started", timeout_s=10)
    assert b.exec(["python3", "-c", CONNECT, "127.0.0.1", "8765"]).stdout == b"connected\n"
    assert a.exec(["python3", "-c", CONNECT, "127.0.0.1", "8765"]).stdout.split()[1] == str(ECONNREFUSED).encode()
    # Neither UDP nor raw packets leave: sendto fails with no route.
    r = a.exec(["python3", "-c", "import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
                "s.sendto(b'x', ('169.254.169.254', 53))"])
    assert r.exit_code != 0 and b"unreachable" in r.stderr
