"""Isolation through a real router: processes, host files, other sandboxes, the network, the API key.

Everything is checked from inside a sandbox, with commands an untrusted agent could run.
"""

from __future__ import annotations

import socket
import threading

from grove.client import Grove, Sandbox
from tests.support.router_fixtures import RouterProcess, layer_file

CONNECT = (
    "import socket, sys\n"
    "s = socket.socket()\n"
    "s.settimeout(1)\n"
    "try:\n"
    "    s.connect((sys.argv[1], int(sys.argv[2])))\n"
    "    print('connected')\n"
    "except OSError as e:\n"
    "    print('error', e.errno, e.strerror or e)\n"
)

SCAN_PROCS = (
    "import glob, sys\n"
    "key = sys.stdin.read().encode()\n"
    "hits = seen = 0\n"
    "for path in glob.glob('/proc/[0-9]*/environ') + glob.glob('/proc/[0-9]*/cmdline'):\n"
    "    try:\n"
    "        data = open(path, 'rb').read()\n"
    "    except OSError:\n"
    "        continue\n"
    "    seen += 1\n"
    "    hits += key in data\n"
    "print(hits, seen)\n"
)


def test_only_the_sandbox_processes_are_visible(pair: tuple[Sandbox, Sandbox]) -> None:
    a, _ = pair
    r = a.exec(["ps", "-eo", "pid,args"])
    lines = r.stdout.decode().strip().splitlines()[1:]
    pids = sorted(int(line.split()[0]) for line in lines)
    # PID 1 (the executor's arbiter), its worker, the shell-less ps: nothing of the host, nothing of b.
    assert pids[0] == 1 and len(pids) <= 4, lines
    assert not any("pytest" in line or "grove up" in line for line in lines), lines
    assert a.exec("hostname").stdout.strip().decode() == a.id
    assert a.exec("kill -0 1 && echo pid1-is-ours").stdout == b"pid1-is-ours\n"


def test_host_files_are_invisible(router: RouterProcess, pair: tuple[Sandbox, Sandbox]) -> None:
    a, _ = pair
    state = str(router.state_dir)
    for path in ("/work", "/work/main", state, "/root/.pyenv", "/tmp/pytest-of-root", "/sys/fs/cgroup"):
        r = a.exec(["test", "-e", path])
        assert r.exit_code == 1, f"{path} is visible inside the sandbox"
    r = a.exec("ls /")
    assert set(r.stdout.decode().split()) <= {
        "bin", "boot", "dev", "etc", "home", "lib", "lib32", "lib64", "libx32", "media", "mnt", "opt", "proc",
        "root", "run", "sbin", "srv", "sys", "tmp", "usr", "var", "workspace"}
    # The mount table names the overlay's host directories (as in any container); none is reachable.
    r = a.exec("grep -c ' /work\\| /tmp/gt-' /proc/self/mounts || true")
    assert r.stdout.strip() == b"0"


def test_other_sandboxes_files_are_invisible(router: RouterProcess, pair: tuple[Sandbox, Sandbox]) -> None:
    a, b = pair
    a.exec(f"echo secret-of-{a.id} > /tmp/marker; echo x > /etc/marker; echo y > /workspace/marker")
    for path in ("/tmp/marker", "/etc/marker", "/workspace/marker"):
        assert b.exec(["test", "-e", path]).exit_code == 1, path
        assert a.exec(["test", "-e", path]).exit_code == 0, path
    assert b.exec(f"grep -rs secret-of-{a.id} /tmp /etc /workspace /root || echo none").stdout == b"none\n"
    # The writes landed in a's own layer, never in the image.
    image = router.layout.images / "default" / "rootfs"
    a.exec("sync")
    for rel in ("tmp/marker", "etc/marker", "workspace/marker"):
        assert not (image / rel).exists()
        assert layer_file(router.state_dir, a.id, rel) is not None, rel
        assert layer_file(router.state_dir, b.id, rel) is None, rel


def test_writes_never_reach_the_image(router: RouterProcess, grove: Grove) -> None:
    image = router.layout.images / "default" / "rootfs"
    before = sorted(p.name for p in (image / "etc").iterdir())
    passwd = (image / "etc" / "passwd").read_bytes()
    sb = grove.create(heartbeat=False)
    r = sb.exec("echo 'evil:x:0:0::/:/bin/sh' >> /etc/passwd && rm /etc/hostname && mkdir /etc/new && echo ok")
    assert r.stdout == b"ok\n", r.stderr
    r = sb.exec("touch /usr/bin/grove-evil 2>&1; echo $?")  # the host's /usr is bound read-only
    assert r.stdout.strip().endswith(b"1") and b"Read-only" in r.stdout
    assert (image / "etc" / "passwd").read_bytes() == passwd
    assert sorted(p.name for p in (image / "etc").iterdir()) == before
    other = grove.create(heartbeat=False)
    assert b"evil" not in other.exec("cat /etc/passwd").stdout
    assert other.exec("test -e /etc/hostname && echo there").stdout == b"there\n"


class _Listener:
    """A TCP listener on the host's loopback that records whether anyone connected."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = int(self.sock.getsockname()[1])
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()


def test_egress_deny_reaches_nothing(router: RouterProcess, pair: tuple[Sandbox, Sandbox]) -> None:
    a, _ = pair
    listener = _Listener()
    try:
        # The host listener works from the host...
        with socket.create_connection(("127.0.0.1", listener.port), timeout=2):
            pass
        # ...but the sandbox's loopback is its own: nothing listens there.
        r = a.exec(["python3", "-c", CONNECT, "127.0.0.1", str(listener.port)])
        assert r.stdout.decode().startswith("error 111"), r.stdout  # ECONNREFUSED
        r = a.exec(["python3", "-c", CONNECT, "127.0.0.1", str(router.port)])  # nor the router
        assert r.stdout.decode().startswith("error 111"), r.stdout
        assert listener.accepted == 1
    finally:
        listener.close()
    # No route anywhere else: the connect fails at once, no packet leaves.
    for address in ("10.255.255.1", "8.8.8.8", "169.254.169.254"):
        r = a.exec(["python3", "-c", CONNECT, address, "80"])
        assert r.stdout.decode().strip() == "error 101 Network is unreachable", (address, r.stdout)
    r = a.exec("cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' '")
    assert r.stdout.split() == [b"lo"]  # the namespace has no other interface
    r = a.exec(["python3", "-c", "import socket; socket.getaddrinfo('example.com', 80)"])
    assert r.exit_code != 0  # no DNS either


def test_the_sandbox_can_serve_itself_on_loopback(pair: tuple[Sandbox, Sandbox]) -> None:
    a, _ = pair
    r = a.exec(
        "python3 -m http.server 8123 --bind 127.0.0.1 >/dev/null 2>&1 & "
        "for i in $(seq 50); do python3 -c \"import urllib.request as u; "
        "print(u.urlopen('http://127.0.0.1:8123/').status)\" 2>/dev/null && break; sleep 0.1; done; kill %1",
        timeout_s=20,
    )
    assert r.stdout.strip() == b"200", r.stderr


def test_the_code_interpreters_port_is_never_a_port_the_kernel_picks(pair: tuple[Sandbox, Sandbox]) -> None:
    """49999 (E2B's code interpreter) is in the range a bind to port 0 or a connect's own port comes from: in a
    sandbox it is kept out of it, so a server that starts a Jupyter kernel before it listens finds its port free."""
    a, _ = pair
    assert a.exec(["cat", "/proc/sys/net/ipv4/ip_local_reserved_ports"]).text.strip() == "49999"
    bound = a.exec(["python3", "-c", "import socket; s = socket.socket(); s.bind(('127.0.0.1', 49999)); "
                    "s.listen(); print(s.getsockname()[1])"])
    assert bound.text.strip() == "49999", bound  # asked for by number, it is the server's


def test_router_key_is_not_in_the_sandbox(router: RouterProcess, pair: tuple[Sandbox, Sandbox]) -> None:
    a, _ = pair
    key = router.key
    assert key.encode() not in a.exec("env").stdout
    r = a.exec(["grep", "-rsl", key, "/etc", "/root", "/workspace", "/tmp", "/.grove", "/dev/shm"])
    assert r.stdout == b"" and r.exit_code == 1
    # Not in any process's environment or command line either (PID 1 included).
    r = a.exec(["python3", "-c", SCAN_PROCS], stdin=key)  # via stdin: the key is in no argv of ours
    assert r.stdout.split()[0] == b"0" and int(r.stdout.split()[1]) >= 2, r.stdout
    # The variable that handed the key to the router is not passed down either.
    r = a.exec("cat /proc/1/environ | tr '\\0' '\\n' | grep -c GROVE_API_KEY || true")
    assert r.stdout.strip() == b"0"


def test_runtime_bundle_is_read_only(pair: tuple[Sandbox, Sandbox]) -> None:
    a, _ = pair
    r = a.exec("touch /.grove/x 2>&1; echo $?")
    assert b"Read-only" in r.stdout and r.stdout.strip().endswith(b"1")


def test_kernel_knobs_and_host_state_are_out_of_reach(pair: tuple[Sandbox, Sandbox]) -> None:
    a, _ = pair
    # core_pattern and sysrq-trigger would reach the host kernel: read-only inside.
    for path in ("/proc/sys/kernel/core_pattern", "/proc/sysrq-trigger", "/proc/sys/vm/drop_caches"):
        r = a.exec(["sh", "-c", f"echo x > {path}"])
        assert r.exit_code != 0, f"{path} is writable from inside a sandbox"
    assert a.exec(["sh", "-c", "head -c 16 /proc/kcore | wc -c"]).text.strip() == "0"
    assert a.exec(["sh", "-c", "cat /proc/keys | wc -c"]).text.strip() == "0"


def test_root_inside_has_only_a_small_capability_set(pair: tuple[Sandbox, Sandbox]) -> None:
    a, _ = pair
    status = a.exec(["cat", "/proc/self/status"]).text
    bounding = int(next(line for line in status.splitlines() if line.startswith("CapBnd:")).split()[1], 16)
    for cap, name in ((21, "SYS_ADMIN"), (16, "SYS_MODULE"), (17, "SYS_RAWIO"), (19, "SYS_PTRACE"),
                      (2, "DAC_READ_SEARCH"), (27, "MKNOD"), (12, "NET_ADMIN"), (25, "SYS_TIME")):
        assert not bounding & (1 << cap), f"CAP_{name} is still in the bounding set"
    assert bounding & (1 << 0), "CAP_CHOWN (kept for ordinary root work) is missing"
    # Consequences, not just bits: no mounts, no device nodes, no reading the executor's memory.
    assert a.exec(["sh", "-c", "mount -t tmpfs none /tmp"]).exit_code != 0
    assert a.exec(["sh", "-c", "mknod /tmp/disk b 8 0"]).exit_code != 0
    assert a.exec(["sh", "-c", "head -c 1 /proc/1/mem"]).exit_code != 0
    # Ordinary root work still works.
    assert a.exec(["sh", "-c", "touch /tmp/f && chown 1000:1000 /tmp/f && stat -c %u /tmp/f"]).text.strip() == "1000"
