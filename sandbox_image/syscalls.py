"""System call numbers of the calls grove's seccomp filter names, for each architecture it runs on.

A seccomp program matches numbers, and the numbers differ by architecture: ``openat`` is 257 on x86-64
and 56 on aarch64, where 56 is x86-64's ``clone``. So the filter is built from the table of the
architecture it is installed on (:func:`current`), and checks that architecture first: a call made
through another ABI would be looked up in the wrong table.

aarch64 uses the kernel's generic table (``include/uapi/asm-generic/unistd.h``), which never had the
legacy calls x86-64 keeps (``create_module``, ``get_kernel_syms``, ``query_module``, ``uselib``,
``_sysctl``, ``iopl``, ``ioperm``, ``open``, ``fork`` ...): a call with no number there cannot be made,
so it needs no rule.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Arch:
    """One architecture's ABI as the filter sees it."""

    name: str
    """``uname -m``."""
    audit_arch: int
    """``AUDIT_ARCH_*``: what ``seccomp_data.arch`` holds for a call through this ABI."""
    numbers: Mapping[str, int]
    """System call numbers by name; a name missing here does not exist on this architecture."""
    x32_bit: int | None
    """A bit that marks a second ABI sharing ``audit_arch`` (x86-64's x32): calls with it are refused."""


X86_64 = Arch(
    name="x86_64",
    audit_arch=0xC000003E,  # AUDIT_ARCH_X86_64: EM_X86_64 | __AUDIT_ARCH_64BIT | __AUDIT_ARCH_LE
    x32_bit=0x40000000,  # __X32_SYSCALL_BIT
    numbers={  # asm/unistd_64.h
        "ptrace": 101, "syslog": 103, "personality": 135, "uselib": 134, "_sysctl": 156,
        "acct": 163, "swapon": 167, "swapoff": 168, "reboot": 169, "iopl": 172, "ioperm": 173,
        "create_module": 174, "init_module": 175, "delete_module": 176, "get_kernel_syms": 177,
        "query_module": 178, "quotactl": 179, "nfsservctl": 180, "lookup_dcookie": 212,
        "kexec_load": 246, "add_key": 248, "request_key": 249, "keyctl": 250, "unshare": 272,
        "perf_event_open": 298, "name_to_handle_at": 303, "open_by_handle_at": 304, "setns": 308,
        "process_vm_writev": 311, "finit_module": 313, "kexec_file_load": 320, "bpf": 321,
        "userfaultfd": 323, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
        "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432,
        "fspick": 433, "clone3": 435, "mount_setattr": 442, "quotactl_fd": 443,
        "mount": 165, "umount2": 166, "pivot_root": 155, "clone": 56, "socket": 41, "socketpair": 53,
        "io_setup": 206, "seccomp": 317, "openat2": 437,
    },
)

AARCH64 = Arch(
    name="aarch64",
    audit_arch=0xC00000B7,  # AUDIT_ARCH_AARCH64: EM_AARCH64 | __AUDIT_ARCH_64BIT | __AUDIT_ARCH_LE
    x32_bit=None,  # 32-bit ARM tasks report AUDIT_ARCH_ARM and fail the arch check instead
    numbers={  # asm-generic/unistd.h
        "io_setup": 0, "lookup_dcookie": 18, "umount2": 39, "mount": 40, "pivot_root": 41,
        "nfsservctl": 42, "quotactl": 60, "acct": 89, "personality": 92, "unshare": 97,
        "kexec_load": 104, "init_module": 105, "delete_module": 106, "syslog": 116, "ptrace": 117,
        "reboot": 142, "socket": 198, "socketpair": 199, "add_key": 217, "request_key": 218,
        "keyctl": 219, "clone": 220, "swapon": 224, "swapoff": 225, "perf_event_open": 241,
        "name_to_handle_at": 264, "open_by_handle_at": 265, "setns": 268, "process_vm_writev": 271,
        "finit_module": 273, "seccomp": 277, "bpf": 280, "userfaultfd": 282, "kexec_file_load": 294,
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428,
        "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "clone3": 435,
        "mount_setattr": 442, "quotactl_fd": 443, "openat2": 437,
    },
)

ARCHES: dict[str, Arch] = {arch.name: arch for arch in (X86_64, AARCH64)}
"""The architectures the filter is built for, by ``uname -m``."""


def current() -> Arch | None:
    """The running machine's architecture, or None when the filter has no table for it."""
    return ARCHES.get(os.uname().machine)
