"""The sandbox's seccomp filter: system calls a sandbox never needs fail with EPERM.

Installed by PID 1 (:mod:`sandbox_image.init`) after its own setup and before the executor serves,
so the executor and every command it starts inherit it; a filter can never be removed, only
stacked. The program is classic BPF built here in pure Python (no libseccomp):

* it is built for the running architecture (x86-64 or aarch64, :mod:`sandbox_image.syscalls`): a call
  through any other ABI (i386 ``int 0x80`` on x86-64, 32-bit ARM on aarch64) kills the process, and
  x86-64's x32 calls (numbers with bit 30 set) fail with EPERM — each is a second syscall table to audit;
* the calls in :data:`DENIED` fail with EPERM: kernel modules, kexec, reboot, swap, every mount
  call (old and new API), pivot_root, unshare, setns, the kernel keyring, bpf, perf, userfaultfd,
  file handles, acct, port I/O, quotas, io_uring, process_vm_writev;
* ``clone`` with any namespace flag fails with EPERM (``CLONE_NEWUSER`` is the one an unprivileged
  process could otherwise use, and a user namespace hands it every capability again inside it);
  ``clone3`` fails with ENOSYS (its flags sit behind a pointer BPF cannot read), so libc falls back
  to ``clone``;
* ``io_setup`` fails with ENOSYS, as on a kernel without native AIO: its contexts come from one
  host-wide pool (``fs.aio-max-nr``) that 16 calls of one sandbox emptied for every other sandbox and
  the host; libaio's users (InnoDB, fio) fall back to threads on ENOSYS, as they do for ``io_uring``;
* ``personality`` accepts only what programs really ask for (Linux default, ``PER_LINUX32``,
  ``UNAME26``, ``ADDR_NO_RANDOMIZE`` for gdb, and queries), never ``READ_IMPLIES_EXEC`` and friends;
* ``socket`` and ``socketpair`` take an allow-list of families (:data:`SOCKET_FAMILIES`): every other
  one fails with EAFNOSUPPORT, as on a kernel built without it. A block-list left ``AF_VSOCK`` open,
  whose port space is the host's and whose CIDs reach the hypervisor; every family the kernel adds
  later would be open too. Netlink is allowed only for :data:`NETLINK_PROTOCOLS`, the two that are
  scoped to the sandbox's own network namespace; the rest (device events, audit, process events,
  generic netlink, ...) fail with EPROTONOSUPPORT.

``ptrace`` stays allowed: gdb and strace on a task's own processes are ordinary agent work, and
the kernel already refuses everything else (no ``CAP_SYS_PTRACE``, PID 1 undumpable, no other
sandbox or host process in the PID namespace).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import os
import struct
from collections.abc import Iterable, Mapping

from sandbox_image.syscalls import X86_64, Arch, current

SYSCALLS: Mapping[str, int] = X86_64.numbers
"""x86-64's numbers (the local backend's hosts); :mod:`sandbox_image.syscalls` has every architecture's."""

DENIED: tuple[str, ...] = (
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "create_module",
    "get_kernel_syms", "query_module", "reboot", "swapon", "swapoff", "mount", "umount2", "pivot_root",
    "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
    "unshare", "setns", "keyctl", "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd",
    "open_by_handle_at", "name_to_handle_at", "acct", "iopl", "ioperm", "quotactl", "quotactl_fd",
    "lookup_dcookie", "uselib", "_sysctl", "nfsservctl", "io_uring_setup", "io_uring_enter",
    "io_uring_register", "process_vm_writev",
)
"""Always EPERM."""

AF_UNIX, AF_INET, AF_INET6, AF_NETLINK = 1, 2, 10, 16
SOCKET_FAMILIES = (AF_UNIX, AF_INET, AF_INET6)
"""What sandboxes need: local IPC, IPv4 and IPv6 (the network namespace decides what they reach)."""
NETLINK_ROUTE, NETLINK_SOCK_DIAG = 0, 4
NETLINK_PROTOCOLS = (NETLINK_ROUTE, NETLINK_SOCK_DIAG)
"""``NETLINK_ROUTE``: ``ip``, ``getifaddrs`` and glibc's ``getaddrinfo(AI_ADDRCONFIG)``;
``NETLINK_SOCK_DIAG``: ``ss``. Both answer only about the sandbox's own network namespace (and
changing it needs CAP_NET_ADMIN over a namespace root inside does not own)."""

CLONE_NAMESPACE_FLAGS = 0x7E020000
"""CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET."""

ALLOWED_PERSONALITIES = (0x0, 0x8, 0x20000, 0x20008, 0x40000, 0xFFFFFFFF)
"""PER_LINUX, PER_LINUX32, UNAME26, both, ADDR_NO_RANDOMIZE (gdb, ``setarch -R``) and the query value:
Docker's list plus ADDR_NO_RANDOMIZE, which only affects the caller's own address space."""

# Classic BPF (linux/filter.h, linux/seccomp.h).
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_JSET_K = 0x45
_RET_K = 0x06
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_RET_KILL_PROCESS = 0x80000000
# struct seccomp_data: the low 32 bits (little endian) of arg0 and arg2; the kernel reads these args as int.
_OFF_NR, _OFF_ARCH, _OFF_ARG0, _OFF_ARG2 = 0, 4, 16, 32

_SECCOMP_SET_MODE_FILTER = 1
_SECCOMP_FILTER_FLAG_TSYNC = 1
_PR_SET_NO_NEW_PRIVS = 38

_Insn = tuple[int, int | str, int | str, int]
"""(code, jt, jf, k); a jump target is a relative offset or a label resolved by :func:`_assemble`."""


def _assemble(code: Iterable[_Insn | str]) -> list[tuple[int, int, int, int]]:
    """Resolve labels (plain strings in the list) into forward jump offsets."""
    items = list(code)
    labels: dict[str, int] = {}
    insns: list[_Insn] = []
    for item in items:
        if isinstance(item, str):
            labels[item] = len(insns)
        else:
            insns.append(item)
    out: list[tuple[int, int, int, int]] = []
    def rel(pc: int, target: int | str) -> int:
        if isinstance(target, int):
            return target
        offset = labels[target] - pc - 1
        assert 0 <= offset <= 255, f"jump to {target} out of range"
        return offset

    for pc, (op, jt, jf, k) in enumerate(insns):
        out.append((op, rel(pc, jt), rel(pc, jf), k))
    return out


def program(arch: Arch | None = None, enosys: tuple[str, ...] = ()) -> list[tuple[int, int, int, int]]:
    """The filter for ``arch`` (default: this machine's) as (code, jt, jf, k) instructions. ``enosys``: calls
    that fail with ENOSYS besides, as on a kernel that lacks them (tests: ``openat2``, as under older gVisor)."""
    arch = arch or _this_arch()
    numbers = arch.numbers
    code: list[_Insn | str] = [
        (_LD_W_ABS, 0, 0, _OFF_ARCH),
        (_JEQ_K, 0, "kill", arch.audit_arch),
        (_LD_W_ABS, 0, 0, _OFF_NR),
    ]
    if arch.x32_bit is not None:
        code.append((_JGE_K, "deny", 0, arch.x32_bit))
    # A denied call the architecture never had (aarch64 has no create_module, iopl, ...) cannot be made.
    code += [(_JEQ_K, "deny", 0, numbers[name]) for name in DENIED if name in numbers]
    code += [(_JEQ_K, "enosys", 0, numbers[name]) for name in enosys]
    code += [
        (_JEQ_K, "clone", 0, numbers["clone"]),
        (_JEQ_K, "personality", 0, numbers["personality"]),
        (_JEQ_K, "enosys", 0, numbers["clone3"]),
        (_JEQ_K, "enosys", 0, numbers["io_setup"]),
        (_JEQ_K, "socket", 0, numbers["socket"]),
        (_JEQ_K, "socket", 0, numbers["socketpair"]),
        (_RET_K, 0, 0, _RET_ALLOW),
        "clone",
        (_LD_W_ABS, 0, 0, _OFF_ARG0),
        (_JSET_K, "deny", "allow", CLONE_NAMESPACE_FLAGS),
        "socket",
        (_LD_W_ABS, 0, 0, _OFF_ARG0),
    ]
    code += [(_JEQ_K, "allow", 0, family) for family in SOCKET_FAMILIES]
    code += [
        (_JEQ_K, 0, "eafnosupport", AF_NETLINK),
        (_LD_W_ABS, 0, 0, _OFF_ARG2),
    ]
    code += [(_JEQ_K, "allow", 0, protocol) for protocol in NETLINK_PROTOCOLS]
    code += [
        (_RET_K, 0, 0, _RET_ERRNO | errno.EPROTONOSUPPORT),
        "personality",
        (_LD_W_ABS, 0, 0, _OFF_ARG0),
    ]
    code += [(_JEQ_K, "allow", 0, value) for value in ALLOWED_PERSONALITIES]
    code += [  # jumps only go forward: the shared returns come last
        "deny",
        (_RET_K, 0, 0, _RET_ERRNO | errno.EPERM),
        "allow",
        (_RET_K, 0, 0, _RET_ALLOW),
        "enosys",
        (_RET_K, 0, 0, _RET_ERRNO | errno.ENOSYS),
        "eafnosupport",
        (_RET_K, 0, 0, _RET_ERRNO | errno.EAFNOSUPPORT),
        "kill",
        (_RET_K, 0, 0, _RET_KILL_PROCESS),
    ]
    return _assemble(code)


def _this_arch() -> Arch:
    arch = current()
    if arch is None:
        raise OSError(errno.ENOSYS, f"grove's seccomp filter has no system call table for {os.uname().machine}")
    return arch


# Loaded at import, which happens once in the zygote: find_library runs ``ldconfig``/``gcc`` in a
# subprocess, ~30 ms of CPU and two processes that every sandbox start would otherwise pay.
_LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_LIBC.syscall.restype = ctypes.c_long


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


_INSN_SIZE = struct.calcsize("HBBI")


@functools.cache
def packed(enosys: tuple[str, ...] = ()) -> bytes:
    """This machine's filter as the kernel takes it (``struct sock_filter`` after ``struct sock_filter``).

    Built once per process: the zygote builds it before it forks, so a sandbox start does not assemble it again.
    """
    return b"".join(struct.pack("HBBI", *insn) for insn in program(_this_arch(), enosys))


def install(enosys: tuple[str, ...] = ()) -> None:
    """Install the filter on this process (all its threads) and everything it starts from now on.

    Root with CAP_SYS_ADMIN may install a filter without ``no_new_privs``; that is what we want, so
    that setuid programs inside (``su``, ``sudo``) keep working. Without the capability we set
    ``no_new_privs`` first, as the kernel then requires. ``enosys``: see :func:`program`.
    """
    arch = _this_arch()
    raw = packed(enosys)
    buf = ctypes.create_string_buffer(raw, len(raw))
    prog = _SockFprog(len(raw) // _INSN_SIZE, ctypes.cast(buf, ctypes.c_void_p))
    libc = _LIBC

    def attempt() -> int:
        return int(libc.syscall(
            ctypes.c_long(arch.numbers["seccomp"]), ctypes.c_uint(_SECCOMP_SET_MODE_FILTER),
            ctypes.c_uint(_SECCOMP_FILTER_FLAG_TSYNC), ctypes.byref(prog),
        ))

    result = attempt()
    if result != 0 and ctypes.get_errno() == errno.EACCES:
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"prctl(PR_SET_NO_NEW_PRIVS): {errno.errorcode.get(err, err)}")
        result = attempt()
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"seccomp(SECCOMP_SET_MODE_FILTER): {errno.errorcode.get(err, err)}")
