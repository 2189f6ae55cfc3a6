"""Escapes from a sandbox to its host: /proc, mounts, devices, ptrace, chroot, forbidden system calls.

Each test is an attack an untrusted agent could run as root inside a real sandbox of a real router;
``test_router_isolation`` covers the basics (capability bits, /proc/sys read-only, kcore masked).
"""

from __future__ import annotations

import contextlib
import json
import os

import pytest

from grove.client import Sandbox
from sandbox_image.seccomp import DENIED, SYSCALLS
from tests.security.probes import SYSCALL, syscall_results
from tests.support.router_fixtures import RouterProcess

EPERM, EACCES, ENOSYS = 1, 13, 38


@pytest.fixture(scope="module")
def sb(sandbox: Sandbox) -> Sandbox:
    """One sandbox for the module's attacks (each attack leaves it usable, which is checked too)."""
    return sandbox


def _sh(sb: Sandbox, script: str) -> tuple[int, str]:
    r = sb.exec(["sh", "-c", "exec 2>&1; " + script], timeout_s=60)
    return r.exit_code, r.stdout.decode(errors="replace")


# -- /proc -----------------------------------------------------------------------------------------------


def test_proc_knobs_that_reach_the_host_are_not_writable(sb: Sandbox) -> None:
    for path in ("/proc/sys/kernel/core_pattern", "/proc/sysrq-trigger", "/proc/sys/kernel/modprobe",
                 "/proc/sys/vm/panic_on_oom", "/proc/sys/kernel/hostname", "/proc/sys/fs/binfmt_misc/register"):
        code, out = _sh(sb, f"echo x > {path}")
        assert code != 0, f"{path} is writable: {out}"
    # The core_pattern is still the host's own (nothing wrote through some other path).
    with open("/proc/sys/kernel/core_pattern", encoding="ascii") as fh:
        assert fh.read().strip() != "x"
    # A command cannot shield itself from the OOM killer (CAP_SYS_RESOURCE is gone).
    code, out = _sh(sb, "echo -1000 > /proc/self/oom_score_adj")
    assert code != 0, out


def test_pid1_memory_environment_and_root_are_closed(sb: Sandbox) -> None:
    for path in ("/proc/1/mem", "/proc/1/environ", "/proc/1/maps"):
        code, out = _sh(sb, f"head -c 1 {path}")
        assert code != 0, f"{path} is readable: {out}"
    for path in ("/proc/1/root/", "/proc/1/cwd/", "/proc/1/map_files/"):
        code, out = _sh(sb, f"ls {path}")
        assert code != 0, f"{path} is listable: {out}"
    # The fd numbers can be listed (root owns the directory), but none can be followed or opened.
    code, out = _sh(sb, "for fd in /proc/1/fd/*; do readlink $fd || cat $fd; done")
    assert "socket:" not in out and "/" not in out.replace("/proc/1/fd/", ""), out
    r = sb.exec(["python3", "-c", "import os; os.readlink('/proc/1/exe')"])
    assert r.exit_code != 0 and b"Permission denied" in r.stderr


def test_pid1_holds_no_descriptor_of_the_hosts_root(router: RouterProcess, sb: Sandbox) -> None:
    # PID 1 is forked from the zygote, which runs in the host's root: a descriptor of it inherited across
    # the fork (the zygote's warm-up app and server template each held one) leads back out of pivot_root.
    pid1 = json.loads((router.state_dir / "records" / f"{sb.id}.json").read_text())["handle"]["pid"]
    host_root = os.stat("/")
    held = []
    for fd in os.listdir(f"/proc/{pid1}/fd"):
        with contextlib.suppress(FileNotFoundError):  # a descriptor closed meanwhile
            st = os.stat(f"/proc/{pid1}/fd/{fd}")  # the very file the descriptor holds
            if (st.st_dev, st.st_ino) == (host_root.st_dev, host_root.st_ino):
                held.append(fd)
    assert not held, f"the sandbox's PID 1 holds the host's root as fd {held}"
    assert sb.exec("true").exit_code == 0


def test_host_processes_are_not_in_the_sandbox_proc(router: RouterProcess, sb: Sandbox) -> None:
    host_pids = (router.pid, os.getpid(), os.getppid())
    for pid in host_pids:
        assert pid > 64, pid  # a sandbox's own PIDs are small: a hit below could only be its own process
        code, _ = _sh(sb, f"test -e /proc/{pid}")
        assert code == 1, f"host pid {pid} is visible"
    code, out = _sh(sb, "cat /proc/[0-9]*/cmdline | tr '\\0' ' '")
    assert "grove up" not in out and "pytest" not in out, out


# -- mounts and chroot -----------------------------------------------------------------------------------


@pytest.mark.parametrize("script", [
    "mount -t tmpfs none /tmp/m",
    "mount --bind / /tmp/m",
    "mount -o remount,rw /.grove",
    "mount -o remount,rw /proc/sys",
    "mount -t proc proc /tmp/m",
    "mount -t sysfs sys /tmp/m",
    "mount -t cgroup -o memory none /tmp/m",
])
def test_mounts_are_refused(sb: Sandbox, script: str) -> None:
    code, out = _sh(sb, f"mkdir -p /tmp/m && {script}")
    assert code != 0, f"{script!r} worked: {out}"
    assert "ermission denied" in out or "not permitted" in out, out


def test_unmounts_are_refused(sb: Sandbox) -> None:
    # umount(8) refuses by itself without CAP_SYS_ADMIN: call umount2(2) directly, lazily and forced.
    umount = ("import ctypes, sys; l = ctypes.CDLL(None, use_errno=True); "
              "print(l.umount2(sys.argv[1].encode(), {}), ctypes.get_errno())")
    for target in ("/.grove", "/proc/sys", "/proc", "/proc/kcore", "/dev", "/"):
        for flags in (0, 2, 1):  # plain, MNT_DETACH, MNT_FORCE
            r = sb.exec(["python3", "-c", umount.format(flags), target])
            assert r.stdout.split() == [b"-1", b"1"], (target, flags, r.stdout, r.stderr)


def test_mount_table_unchanged_after_the_attempts(sb: Sandbox) -> None:
    _, out = _sh(sb, "touch /.grove/x; touch /proc/sys/x; echo > /proc/sys/kernel/domainname")
    assert out.count("Read-only") >= 2, out
    _code, out = _sh(sb, "test -e /proc/sys/kernel/ostype && mkdir -p /tmp/m && ls /tmp/m | wc -l")
    assert out.strip() == "0", out


def test_chroot_breakout_finds_only_the_sandbox(sb: Sandbox) -> None:
    # The classic breakout (chroot into a subdir, climb past the new root, chroot there) works against
    # chroot jails; after pivot_root with the old root detached there is nothing above / to climb to.
    breakout = (
        "import os\n"
        "os.makedirs('/tmp/jail', exist_ok=True)\n"
        "fd = os.open('/', os.O_RDONLY)\n"
        "os.chroot('/tmp/jail')\n"
        "os.fchdir(fd)\n"
        "for _ in range(64):\n"
        "    os.chdir('..')\n"
        "os.chroot('.')\n"
        "print(sorted(os.listdir('/')))\n"
        "print(os.path.exists('/work'), os.path.exists('/sys/fs/cgroup/memory'))\n"
    )
    r = sb.exec(["python3", "-c", breakout])
    assert r.exit_code == 0, r.stderr
    listing, leaks = r.stdout.decode().splitlines()
    assert "'workspace'" in listing and "'work'" not in listing
    assert leaks == "False False"


# -- devices -----------------------------------------------------------------------------------------------


def test_only_harmless_devices_exist_and_none_can_be_made(sb: Sandbox) -> None:
    code, out = _sh(sb, "ls /dev")
    assert set(out.split()) == {"null", "zero", "full", "random", "urandom", "tty", "pts", "ptmx", "shm",
                                "stdin", "stdout", "stderr", "fd"}, out
    for major_minor in ("b 8 0", "b 259 0", "c 1 1", "c 1 2", "c 10 200", "b 7 0"):  # sda, nvme, mem, kmem, tun, loop
        code, out = _sh(sb, f"mknod /tmp/dev-{major_minor.replace(' ', '-')} {major_minor}")
        assert code != 0 and "not permitted" in out, (major_minor, out)
    for path in ("/dev/sda", "/dev/vda", "/dev/nvme0n1", "/dev/mem", "/dev/kmsg", "/dev/loop0", "/dev/net/tun"):
        code, _ = _sh(sb, f"test -e {path}")
        assert code == 1, f"{path} exists"
    code, out = _sh(sb, "ls -A /sys | wc -l")
    assert out.strip() == "0", "sysfs (block devices, cgroups, uevent_helper) is reachable"


# -- ptrace -------------------------------------------------------------------------------------------------


def test_ptrace_of_pid1_is_refused_but_gdb_and_strace_work(sb: Sandbox) -> None:
    r = sb.exec(["python3", "-c", SYSCALL, "attach:101:16:1", "seize:101:0x4206:1"])  # PTRACE_ATTACH/SEIZE pid 1
    assert syscall_results(r.stdout) == {"attach": (-1, EPERM), "seize": (-1, EPERM)}, r.stdout
    # A task's own processes stay debuggable: strace and gdb are ordinary agent tools.
    code, out = _sh(sb, "strace -f -o /dev/null -- sh -c 'echo traced' && echo ok")
    assert out.strip().endswith("ok"), out
    code, out = _sh(sb, "gdb -q -batch -ex run --args /bin/true </dev/null")
    assert code == 0 and "exited normally" in out, out


# -- seccomp -----------------------------------------------------------------------------------------------

# Arguments chosen so that, without the filter, most calls would *succeed* or fail with something other
# than EPERM: an EPERM below is the filter's doing, not a missing capability.
_ARGS = {
    "unshare": "0x10000000",  # CLONE_NEWUSER: allowed to anyone without the filter
    "keyctl": "0:-3",  # KEYCTL_GET_KEYRING_ID of the session keyring
    "userfaultfd": "1",  # UFFD_USER_MODE_ONLY
    "io_uring_setup": "1:0",
    "setns": "-1:0",
    "finit_module": "-1:0:0",
    "iopl": "0",
    "personality": "0x0400000",  # READ_IMPLIES_EXEC
}


def test_seccomp_denies_what_a_sandbox_never_needs(sb: Sandbox) -> None:
    calls = [f"{name}:{SYSCALLS[name]}" + (f":{_ARGS[name]}" if name in _ARGS else "") for name in DENIED]
    calls += [
        f"personality:{SYSCALLS['personality']}:{_ARGS['personality']}",
        f"clone_newuser:{SYSCALLS['clone']}:0x10000011",  # CLONE_NEWUSER | SIGCHLD
        "x32_getpid:0x40000027",
        f"clone3:{SYSCALLS['clone3']}",
        "personality_query:135:0xffffffff",
        "aslr_off:135:0x20000",
    ]
    r = sb.exec(["python3", "-c", SYSCALL, *calls])
    got = syscall_results(r.stdout)
    for name in [*DENIED, "personality", "clone_newuser", "x32_getpid"]:
        assert got[name] == (-1, EPERM), (name, got[name])
    assert got["clone3"] == (-1, ENOSYS)  # libc falls back to clone, whose flags the filter can read
    assert got["personality_query"][0] >= 0 and got["aslr_off"][0] >= 0
    # Every process has it, PID 1 (the executor) included, and none can take it off.
    code, out = _sh(sb, "grep -h '^Seccomp:' /proc/1/status /proc/self/status")
    assert out.split() == ["Seccomp:", "2", "Seccomp:", "2"], out
    code, out = _sh(sb, "unshare -U -r true")
    assert code != 0 and "not permitted" in out, out


def test_ordinary_work_still_works_under_the_filter(sb: Sandbox) -> None:
    script = (
        "set -e; cd /tmp && rm -rf w && mkdir w && cd w\n"
        "git init -q . && git -c user.email=a@b -c user.name=a commit -q --allow-empty -m x\n"
        "git log --oneline | wc -l\n"
        "python3 -c 'import threading, multiprocessing as m; t = threading.Thread(target=print, args=(\"thread\",)); "
        "t.start(); t.join(); print(m.Pool(2).map(abs, [-1, -2]))'\n"
        "python3 -m pip --version | cut -c1-4\n"
        "if command -v gcc >/dev/null; then "
        "printf '#include <stdio.h>\\nint main(void){puts(\"compiled\");return 0;}' > h.c "
        "&& gcc -o h h.c && ./h; else echo compiled; fi\n"
        "setarch -R true && echo setarch\n"
        "sleep 0.1 & wait && echo background\n"
        "python3 -c 'import socket; s = socket.socket(); s.bind((\"127.0.0.1\", 0)); s.listen(); print(\"listen\")'\n"
    )
    r = sb.exec(["bash", "-c", script], timeout_s=60)
    assert r.exit_code == 0, r.stdout + r.stderr
    assert r.stdout.decode().split("\n")[:-1] == [
        "1", "thread", "[1, 2]", "pip ", "compiled", "setarch", "background", "listen"], r.stdout
