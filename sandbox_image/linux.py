"""The few Linux system calls the sandbox init needs that Python 3.11's ``os`` module lacks."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import fcntl
import os
import signal
import socket
import struct

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
CLONE_VM = 0x00000100

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
_SYS_PAUSE = 34
_CLONE_STACK_BYTES = 16 * 1024
_SYS_OPEN_TREE = 428
_SYS_MOVE_MOUNT = 429
_SYS_MOUNT_SETATTR = 442
_OPEN_TREE_CLONE = 1
_OPEN_TREE_CLOEXEC = os.O_CLOEXEC
_AT_FDCWD = -100
_AT_EMPTY_PATH = 0x1000
_AT_RECURSIVE = 0x8000
_MOVE_MOUNT_F_EMPTY_PATH = 0x4
_MOVE_MOUNT_T_EMPTY_PATH = 0x40
_MOUNT_ATTR_RDONLY = 0x1
_MOUNT_ATTR_NOSUID = 0x2
_MOUNT_ATTR_NODEV = 0x4
_MOUNT_ATTR_IDMAP = 0x100000
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


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def idmapped_bind(source: str, target: str, userns_fd: int, *, readonly: bool) -> None:
    """Bind ``source`` (recursively) on ``target`` with its owners shifted by the user namespace's id map.

    ``open_tree(OPEN_TREE_CLONE)`` copies the tree as a detached mount, ``mount_setattr(MOUNT_ATTR_IDMAP)``
    gives it the mapping (file owner 0 on disk reads as the namespace's root, and writes through it go
    back to disk as 0), ``move_mount`` attaches it. The files on disk are untouched.
    """
    _attach(source, _AT_FDCWD, target, userns_fd=userns_fd, readonly=readonly)


def bind_at(source: str, target_fd: int, *, readonly: bool) -> None:
    """Bind ``source`` (recursively; read-only, nosuid and nodev throughout if ``readonly``) on the directory
    ``target_fd`` is open on (an ``O_PATH`` descriptor is enough): no path of the target is looked up."""
    _attach(source, target_fd, "", userns_fd=None, readonly=readonly)


def _attach(source: str, to_fd: int, to_path: str, *, userns_fd: int | None, readonly: bool) -> None:
    """``open_tree`` a detached copy of ``source``, set its attributes, ``move_mount`` it to ``to_fd``/``to_path``
    (``to_path`` empty: onto ``to_fd`` itself)."""
    flags = _OPEN_TREE_CLONE | _OPEN_TREE_CLOEXEC | _AT_RECURSIVE
    tree = _libc.syscall(_SYS_OPEN_TREE, _AT_FDCWD, source.encode(), flags)
    if tree < 0:
        _check(-1, f"open_tree {source}")
    try:
        attr_set = (_MOUNT_ATTR_IDMAP if userns_fd is not None else 0) | (
            _MOUNT_ATTR_RDONLY | _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV if readonly else 0)
        if attr_set:
            attr = _MountAttr(attr_set, 0, 0, userns_fd or 0)
            _check(
                _libc.syscall(
                    _SYS_MOUNT_SETATTR, tree, b"", _AT_EMPTY_PATH | _AT_RECURSIVE, ctypes.byref(attr),
                    ctypes.sizeof(attr),
                ),
                f"idmap {source} (does its filesystem support idmapped mounts?)" if userns_fd is not None
                else f"mount_setattr {source}",
            )
        move = _MOVE_MOUNT_F_EMPTY_PATH | (0 if to_path else _MOVE_MOUNT_T_EMPTY_PATH)
        _check(
            _libc.syscall(_SYS_MOVE_MOUNT, tree, b"", to_fd, to_path.encode(), move),
            f"move_mount {to_path or source}",
        )
    finally:
        os.close(tree)


def clone_paused(flags: int) -> int:
    """clone(2) a child that shares this process's memory (``CLONE_VM``: no copy of its page tables, none of
    the copy-on-write faults a fork of a big Python process costs both sides) and only sleeps in ``pause``
    until killed; returns its pid. The caller must block every signal around the call (the child inherits
    the mask and must run no handler in the shared memory), then end the child with :func:`reap_paused`.

    The child runs nothing but libc's ``syscall(SYS_pause)``, on a stack of its own (one at a time: there
    is one stack); ``SIGCHLD`` is its exit signal, so ``waitpid`` collects it as any child.
    """
    if _paused:
        raise RuntimeError("a paused clone is alive already: reap it first")
    top = (ctypes.addressof(_CLONE_STACK) + len(_CLONE_STACK) - 64) & ~0xF  # 16-byte aligned, as x86-64 wants
    pid = int(_libc.clone(_PAUSE_ENTRY, ctypes.c_void_p(top), flags | CLONE_VM | signal.SIGCHLD, _SYS_PAUSE))
    if pid < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"clone: {os.strerror(err)}")
    _paused.add(pid)  # its stack is in use until it is reaped
    return pid


def reap_paused(pid: int) -> None:
    """Kill and collect a child of :func:`clone_paused`; its stack is free again once it is gone."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    _paused.discard(pid)


# Made at import, so a zygote makes them once for every process it forks: resolving a libc function and
# zeroing a stack in each sandbox cost ~0.8 ms of CPU and ~150 page faults.
_CLONE_STACK = ctypes.create_string_buffer(_CLONE_STACK_BYTES)
_PAUSE_ENTRY = ctypes.cast(_libc.syscall, ctypes.c_void_p)
_libc.clone.restype = ctypes.c_int
_libc.clone.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_long)
_paused: set[int] = set()


def setns(fd: int, nstype: int) -> None:
    """setns(2)."""
    _check(_libc.setns(fd, nstype), "setns")


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


def reserve_ports(ports: tuple[int, ...]) -> None:
    """Keep ``ports`` out of the ports the kernel picks by itself (a bind to port 0, a connect's own port) in the
    current network namespace; a server that binds one of them by number still can."""
    with open("/proc/sys/net/ipv4/ip_local_reserved_ports", "w", encoding="ascii") as fh:
        fh.write(",".join(map(str, ports)))


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


def set_cmdline(title: str) -> None:
    """Make ``/proc/<pid>/cmdline`` of this process read ``title``: overwrite the argv area in place.

    The kernel reads cmdline from the process's own memory (``arg_start``..``arg_end`` in
    ``/proc/self/stat``), so writing there is enough; a title longer than the area is cut. Python
    keeps its own copy of argv, so nothing in the interpreter changes.
    """
    with open("/proc/self/stat", "rb") as fh:
        # Fields after the command name (which may hold spaces and parentheses): state is field 3.
        fields = fh.read().rsplit(b")", 1)[1].split()
    arg_start, arg_end = int(fields[48 - 3]), int(fields[49 - 3])  # proc(5): fields 48 and 49
    size = arg_end - arg_start
    if size <= 0:
        return
    data = title.encode()[: size - 1]
    ctypes.memmove(arg_start, data + b"\0" * (size - len(data)), size)
