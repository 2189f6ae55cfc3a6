"""The few Linux system calls the sandbox init needs that Python 3.11's ``os`` module lacks."""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import os
import socket
import struct

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MNT_DETACH = 2

_SYS_PIVOT_ROOT = 155  # x86_64
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def unshare(flags: int) -> None:
    """unshare(2)."""
    _check(_libc.unshare(flags), "unshare")


def mount(source: str | None, target: str, fstype: str | None, flags: int = 0, data: str | None = None) -> None:
    """mount(2)."""
    enc = [s.encode() if s is not None else None for s in (source, target, fstype, data)]
    _check(_libc.mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3]), f"mount {target}")


def bind(source: str, target: str, *, readonly: bool) -> None:
    """Bind-mount ``source`` on ``target``; read-only needs a second, remounting call."""
    mount(source, target, None, MS_BIND | MS_REC)
    if readonly:
        mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def umount2(target: str, flags: int) -> None:
    """umount2(2)."""
    _check(_libc.umount2(target.encode(), flags), f"umount {target}")


def pivot_root(new_root: str, put_old: str) -> None:
    """pivot_root(2) (no libc wrapper)."""
    _check(_libc.syscall(_SYS_PIVOT_ROOT, new_root.encode(), put_old.encode()), "pivot_root")


def sethostname(name: str) -> None:
    """sethostname(2)."""
    raw = name.encode()
    _check(_libc.sethostname(raw, len(raw)), "sethostname")


def loopback_up() -> None:
    """Bring ``lo`` up in the current network namespace (an empty namespace starts with it down)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        req = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock.fileno(), _SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(sock.fileno(), _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | _IFF_UP))


_PR_CAPBSET_DROP = 24
_PR_SET_DUMPABLE = 4
# What root in a sandbox keeps (Docker's default set, without MKNOD: there is no devices cgroup here,
# so mknod would hand out the host's disks). Everything else — SYS_ADMIN, SYS_MODULE, SYS_RAWIO,
# SYS_PTRACE, DAC_READ_SEARCH (open_by_handle_at), NET_ADMIN, SYS_TIME, BPF, ... — is gone for good.
KEPT_CAPABILITIES = frozenset({0, 1, 3, 4, 5, 6, 7, 8, 10, 13, 18, 29, 31})


def drop_capabilities_for_children() -> None:
    """Shrink the bounding set, so every program executed from now on has at most the kept capabilities."""
    with open("/proc/sys/kernel/cap_last_cap", encoding="ascii") as fh:
        last = int(fh.read())
    for cap in range(last + 1):
        if cap not in KEPT_CAPABILITIES:
            _check(_libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0), f"drop capability {cap}")


def set_undumpable() -> None:
    """No core dumps and no ptrace or /proc/<pid>/mem access to this process from its sandbox."""
    _check(_libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(PR_SET_DUMPABLE)")
