"""Kernel state every sandbox shares with the host: socket families, per-user counters, TCP buffer memory,
the OOM killer's choice, signals to PID 1 and what /proc tells about the host.

Each test is an attack from inside a real sandbox of a real router (issue 18, findings 2, 3, 4, 6, 11, 12).
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import signal
import time
from pathlib import Path

from grove.client import Sandbox
from router.backends.local.cgroups import CgroupSet, tcp_memory_bytes
from router.backends.local.uids import REGISTRY, SLOTS
from sandbox_image.init import PTYS_MAX
from tests.support.router_fixtures import RouterProcess, instance_of, router_state, wait_for, wait_removed

_ALLOWED_FAMILIES = {1, 2, 10}  # AF_UNIX, AF_INET, AF_INET6
_AF_NETLINK = 16
_ALLOWED_NETLINK = {0, 4}  # NETLINK_ROUTE, NETLINK_SOCK_DIAG

SOCKETS = (
    "import ctypes\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "sv = (ctypes.c_int * 2)()\n"
    "for fam in range(64):\n"
    "    for call in ('socket', 'socketpair'):\n"
    "        ctypes.set_errno(0)\n"
    "        r = libc.socket(fam, 1, 0) if call == 'socket' else libc.socketpair(fam, 1, 0, sv)\n"
    "        print(call, fam, 0, r >= 0, ctypes.get_errno())\n"
    "for proto in range(32):\n"
    "    ctypes.set_errno(0)\n"
    "    r = libc.socket(16, 3, proto)\n"
    "    print('netlink', 16, proto, r >= 0, ctypes.get_errno())\n"
)


def test_only_unix_inet_and_own_netns_netlink_sockets_can_be_made(pair: tuple[Sandbox, Sandbox]) -> None:
    a, _ = pair
    r = a.exec(["python3", "-c", SOCKETS])
    assert r.exit_code == 0, r.stderr
    for line in r.stdout.decode().splitlines():
        call, fam, proto, ok, err = line.split()
        family, protocol = int(fam), int(proto)
        if call == "netlink":
            if protocol in _ALLOWED_NETLINK:
                assert ok == "True", line
            else:  # device events (15), audit (9), process events (11), generic (16), ...
                assert (ok, int(err)) == ("False", errno.EPROTONOSUPPORT), line
        elif family in _ALLOWED_FAMILIES or family == _AF_NETLINK:
            assert int(err) != errno.EAFNOSUPPORT, line  # AF_INET socketpair is EOPNOTSUPP: the kernel's answer
        else:  # AF_VSOCK (40), AF_PACKET (17), AF_BLUETOOTH (31), AF_ALG (38), AF_XDP (44), ...
            assert (ok, int(err)) == ("False", errno.EAFNOSUPPORT), line
    # The tools that use netlink still work: ip (NETLINK_ROUTE), ss (NETLINK_SOCK_DIAG), name lookups.
    script = ("set -e; python3 -c 'import socket; print(socket.if_nameindex()[0][1])'; "
              "if command -v ss >/dev/null; then ss -tln | head -1 | cut -c1-5; else echo State; fi; "
              "if command -v ip >/dev/null; then ip -o link show lo | cut -d: -f2; else echo ' lo'; fi; "
              "python3 -c 'import socket; print(socket.getaddrinfo(\"localhost\", 80)[0][4][1])'")
    r = a.exec(["sh", "-c", script])
    assert r.exit_code == 0 and r.stdout.decode().split() == ["lo", "State", "lo", "80"], (r.stdout, r.stderr)


HOLD_INOTIFY = (
    "import ctypes, os, sys, time\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "held = 0\n"
    "while held < 4096:\n"
    "    if libc.inotify_init1(0) < 0:\n"
    "        break\n"
    "    held += 1\n"
    "err = ctypes.get_errno()\n"
    "with open('/tmp/held.tmp', 'w') as fh:\n"
    "    fh.write(f'{held} {err}')\n"
    "os.rename('/tmp/held.tmp', '/tmp/held')\n"
    "deadline = time.monotonic() + 60\n"
    "while not os.path.exists('/tmp/release') and time.monotonic() < deadline:\n"
    "    time.sleep(0.05)\n"
)
INOTIFY_ONCE = ("import ctypes; l = ctypes.CDLL(None, use_errno=True); "
                "print(l.inotify_init1(0) >= 0, ctypes.get_errno())")


def test_inotify_instances_are_counted_per_sandbox(pair: tuple[Sandbox, Sandbox]) -> None:
    a, b = pair
    a.write_file("/tmp/hold.py", HOLD_INOTIFY)
    a.exec(["sh", "-c", "rm -f /tmp/held /tmp/release; python3 /tmp/hold.py >/dev/null 2>&1 &"])
    try:
        wait_for(lambda: a.exec(["test", "-e", "/tmp/held"]).exit_code == 0, 20, 0.2, "the instances to be held")
        held, err = (int(x) for x in a.read_file("/tmp/held").split())
        # Its own limit ends it (the host's max_user_instances, counted for its own namespace owner)...
        limit = int(Path("/proc/sys/user/max_inotify_instances").read_text())
        assert err == errno.EMFILE and 0 < held <= limit, held
        # ...and no one else's: another sandbox and host root can still watch files.
        r = b.exec(["python3", "-c", INOTIFY_ONCE])
        assert r.stdout.split() == [b"True", b"0"], (r.stdout, r.stderr)
        libc = ctypes.CDLL(None, use_errno=True)
        fd = libc.inotify_init1(0)
        assert fd >= 0, f"host root is at {os.strerror(ctypes.get_errno())} while a sandbox holds {held}"
        os.close(fd)
    finally:
        a.exec(["touch", "/tmp/release"])


HOLD_SIGNALS = (
    "import ctypes, os, signal, time\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "sig = signal.SIGRTMIN + 1\n"
    "signal.pthread_sigmask(signal.SIG_BLOCK, [sig])\n"
    "queued = 0\n"
    "while queued < 1 << 20 and libc.sigqueue(os.getpid(), sig, ctypes.c_long(0)) == 0:\n"
    "    queued += 1\n"
    "err = ctypes.get_errno()\n"
    "with open('/tmp/sigs.tmp', 'w') as fh:\n"
    "    fh.write(f'{queued} {err}')\n"
    "os.rename('/tmp/sigs.tmp', '/tmp/sigs')\n"
    "deadline = time.monotonic() + 60\n"
    "while not os.path.exists('/tmp/release-sigs') and time.monotonic() < deadline:\n"
    "    time.sleep(0.05)\n"
)


def test_queued_signals_are_counted_per_sandbox(pair: tuple[Sandbox, Sandbox]) -> None:
    """RLIMIT_SIGPENDING counts against the namespace owner too: held by host root, one sandbox's queued
    real-time signals left host root without timers and queued signals."""
    a, _ = pair
    a.write_file("/tmp/sigs.py", HOLD_SIGNALS)
    a.exec(["sh", "-c", "rm -f /tmp/sigs /tmp/release-sigs; python3 /tmp/sigs.py >/dev/null 2>&1 &"])
    try:
        wait_for(lambda: a.exec(["test", "-e", "/tmp/sigs"]).exit_code == 0, 30, 0.2, "the signals to be queued")
        queued, err = (int(x) for x in a.read_file("/tmp/sigs").split())
        assert err == errno.EAGAIN and queued > 1000, (queued, err)
        sig = signal.SIGRTMIN + 2
        # A handler, not a blocked mask: this process has other threads, and an ignored signal is
        # dropped before it is queued (and so counted).
        got: list[int] = []
        old = signal.signal(sig, lambda signum, frame: got.append(signum))
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            # EAGAIN if the sandbox's signals counted against host root (kill() would drop it silently).
            assert libc.sigqueue(os.getpid(), sig, ctypes.c_long(0)) == 0, os.strerror(ctypes.get_errno())
            wait_for(lambda: got, 2, 0.01, "the signal")
        finally:
            signal.signal(sig, old)
    finally:
        a.exec(["touch", "/tmp/release-sigs"])


def test_one_sandbox_cannot_take_every_pty(pair: tuple[Sandbox, Sandbox]) -> None:
    a, b = pair
    grab = ("import os, resource\n"
            "resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)\n"
            "masters = []\n"
            "try:\n"
            "    while len(masters) < 5000:\n"
            "        master, child = os.openpty()\n"  # the master alone holds the pty
            "        os.close(child)\n"
            "        masters.append(master)\n"
            "except OSError as e:\n"
            "    print(len(masters), e.errno)\n")
    r = a.exec(["python3", "-c", grab])
    held, err = (int(x) for x in r.stdout.split())
    assert held <= PTYS_MAX and err == errno.ENOSPC, (held, err)
    # Held at once in the background, they leave the other sandbox its own.
    a.write_file("/tmp/grab.py", grab + "import time\ntime.sleep(5)\n")
    a.exec(["sh", "-c", "python3 /tmp/grab.py >/dev/null 2>&1 &"])
    time.sleep(0.5)
    assert b.exec(["python3", "-c", "import os; os.openpty(); print('pty')"]).stdout == b"pty\n"


TCP_FILL = (
    "import socket, sys\n"
    "pairs, queued = [], 0\n"
    "for _ in range(int(sys.argv[1])):\n"
    "    listener = socket.socket(); listener.bind(('127.0.0.1', 0)); listener.listen(1)\n"
    "    c = socket.create_connection(listener.getsockname()); s, _ = listener.accept(); listener.close()\n"
    "    c.setblocking(False)\n"
    "    try:\n"
    "        while True:\n"
    "            queued += c.send(b'x' * 65536)\n"
    "    except BlockingIOError:\n"
    "        pass\n"
    "    pairs.append((c, s))\n"
    "print(queued)\n"
)


def test_tcp_buffers_are_charged_to_the_sandbox(router: RouterProcess) -> None:
    bound = tcp_memory_bytes(128)
    with router.client() as grove:
        sb = grove.create(heartbeat=False, memory_mb=128)
        try:
            # 40 unread loopback pairs queued ~400 MiB of host memory before (the cgroup saw 14 MiB).
            r = sb.exec(["python3", "-c", TCP_FILL, "40"], timeout_s=60)
            assert r.exit_code == 0, r.stderr
            queued = int(r.stdout)
            peak = int((_memory_cgroup(router, sb.id) / "memory.kmem.tcp.max_usage_in_bytes").read_text())
            # Queued payload is at most the bound (plus one 64 KiB send that fit under it).
            assert queued <= bound + (1 << 20), f"{queued >> 20} MiB queued past the {bound >> 20} MiB bound"
            # The kernel charges a packet it must accept (an ACK, a receive it already committed to) past the
            # limit: measured 35 MiB at a 32 MiB limit; a quarter over is the bound stated in SECURITY.md.
            assert 0 < peak <= bound * 5 // 4, f"{peak >> 20} MiB of TCP buffers at the {bound >> 20} MiB limit"
            assert sb.exec("echo still-here").stdout == b"still-here\n"
        finally:
            sb.close()


def _memory_cgroup(router: RouterProcess, sandbox_id: str) -> Path:
    return CgroupSet(instance_of(router.state_dir), sandbox_id).path("memory")


def test_a_memory_hungry_command_is_killed_never_the_executor(router: RouterProcess) -> None:
    with router.client() as grove:
        sb = grove.create(heartbeat=False, memory_mb=128)
        try:
            hog = "import sys; b = bytearray(1 << 30); sys.stdout.write('x' * (1 << 20))"
            r = sb.exec(["python3", "-c", hog], timeout_s=60)
            assert r.oom_killed and r.exit_code == 137, (r.exit_code, r.stderr[-300:])
            # A shell that starts the hog at once: the child it forked right after its exec gets the
            # command's score too (written before the executor knew of it), so the hog goes, not PID 1.
            r = sb.exec(["sh", "-c", f"python3 -c \"{hog}\"; echo after"], timeout_s=60)
            assert r.stdout == b"after\n" and b"Killed" in r.stderr, (r.stdout, r.stderr[-300:])
            r = sb.exec(["sh", "-c", "cat /proc/1/oom_score_adj; sh -c 'cat /proc/self/oom_score_adj'"])
            assert r.stdout == b"0\n1000\n", r.stdout
            assert router.http("GET", f"/v1/sandboxes/{sb.id}").json()["status"] == "ready"
        finally:
            sb.close()


def test_signals_from_inside_do_not_stop_pid1(router: RouterProcess) -> None:
    with router.client() as grove:
        sb = grove.create(heartbeat=False, idle_timeout_s=1, heartbeat_timeout_s=60)
        try:
            before = router.http("GET", f"/v1/sandboxes/{sb.id}").json()
            r = sb.exec(["sh", "-c", "for s in QUIT TERM INT ABRT USR1 WINCH HUP USR2 SEGV STOP; do kill -$s 1; done; "
                                     "sleep 2; echo alive"], timeout_s=30)
            assert r.exit_code == 0 and r.stdout == b"alive\n", (r.exit_code, r.stdout, r.stderr)
            assert sb.exec("echo again").stdout == b"again\n"
            after = router.http("GET", f"/v1/sandboxes/{sb.id}").json()
            assert after["status"] == before["status"] == "ready", after
            # The router still stops it: scale to zero, wake, delete.
            wait_for(lambda: router.http("GET", f"/v1/sandboxes/{sb.id}").json()["status"] == "idle", 8, 0.1,
                     "the sandbox to scale to zero")
            assert sb.exec("echo woken").stdout == b"woken\n"
        finally:
            sb.close()
    wait_removed(router.state_dir, sb.id)  # its remains go in the teardown's passes, just after the delete


def test_proc_shows_no_host_paths_or_boot_arguments(router: RouterProcess, pair: tuple[Sandbox, Sandbox]) -> None:
    a, _ = pair
    state = str(router.state_dir.resolve())
    script = "tr '\\0' ' ' < /proc/1/cmdline; echo; cat /proc/cmdline | wc -c; cat /proc/self/mountinfo"
    r = a.exec(["sh", "-c", script])
    cmdline, boot_args, *mountinfo = r.stdout.decode().splitlines()
    assert cmdline.split() == ["grove-executor"], cmdline
    assert boot_args == "0"
    overlay = next(line for line in mountinfo if " / / " in line)
    assert state not in overlay and re.search(r"lowerdir=lower[/,:]", overlay), overlay  # relative to the sandbox dir
    # What remains: a bind mount's root is its source's path inside that filesystem (/.grove's is
    # the bundle's); see SECURITY.md.
    assert [line for line in mountinfo if state in line and " /.grove " not in line] == []


def test_host_root_only_files_under_the_default_usr_stay_closed(pair: tuple[Sandbox, Sandbox]) -> None:
    a, _ = pair
    secret = "/usr/local/share/grove-t-secret"
    os.makedirs(secret, mode=0o700, exist_ok=True)
    os.chmod(secret, 0o700)
    try:
        with open(f"{secret}/key", "w", encoding="ascii") as fh:
            fh.write("host-only\n")
        r = a.exec(["sh", "-c", f"ls {secret}; cat {secret}/key; stat -c '%u' /usr/bin"])
        assert b"host-only" not in r.stdout and b"key" not in r.stdout, r.stdout
        assert b"Permission denied" in r.stderr, r.stderr
        assert r.stdout.split()[-1] == b"65534"  # host root's files are nobody's inside
        # Ordinary programs from it still run.
        assert a.exec(["python3", "-c", "print('ok')"]).stdout == b"ok\n"
    finally:
        for name in (f"{secret}/key",):
            os.unlink(name)
        os.rmdir(secret)


def _host_base(sb: Sandbox) -> int:
    _inside, base, _count = (int(x) for x in sb.exec("cat /proc/self/uid_map").stdout.split())
    return base


def test_two_routers_on_one_host_never_share_an_id_range(router: RouterProcess, pair: tuple[Sandbox, Sandbox]) -> None:
    ours = {_host_base(sb) for sb in pair}
    # A claim left by a router whose state dir is gone (a crash, a wiped /tmp) is taken back at start.
    stale = REGISTRY / str(SLOTS - 1)
    stale.write_text("/nonexistent/gt-gone/sandboxes/x/userns")
    with router_state() as other, other.client() as grove:
        assert not stale.exists()
        theirs = [grove.create(heartbeat=False) for _ in range(2)]
        try:
            bases = {_host_base(sb) for sb in theirs}
            assert len(bases) == 2 and not bases & ours, (ours, bases)
        finally:
            for sb in theirs:
                sb.close()

