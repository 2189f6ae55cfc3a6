"""Opening paths a sandbox can change under us: ``openat2(2)`` and ``*at`` calls on directory descriptors.

A check of a path followed by a use of the same path can be raced: between the two, code in the sandbox
swaps a directory for a symlink (``renameat2(RENAME_EXCHANGE)``) and the use lands elsewhere. Here every
lookup is one ``openat2`` call, whose ``resolve`` flags the kernel enforces on every component as it walks
them, and everything after it works on the descriptor it returned. ``openat2`` needs Linux 5.6, and gVisor
has it only since its 2026-09 releases: where it answers ENOSYS, the same rules are kept by a walk of one
``O_NOFOLLOW`` open per component from directory descriptors (:mod:`executor.walkopen`).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os

from executor.walkopen import RESOLVE_BENEATH, RESOLVE_IN_ROOT, RESOLVE_NO_MAGICLINKS, RESOLVE_NO_SYMLINKS, walk_open

__all__ = ["MEMBER", "RESOLVE_BENEATH", "RESOLVE_IN_ROOT", "RESOLVE_NO_MAGICLINKS", "RESOLVE_NO_SYMLINKS",
           "open_dirs", "openat2"]

MEMBER = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS
"""How names inside an archive's target resolve: never through a link, never above the target."""

_SYS_OPENAT2 = 437  # one number on every architecture: system calls added since 5.1 share a table
_EAGAIN_RETRIES = 64  # the kernel answers EAGAIN when a rename or mount raced a '..' in a scoped walk


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def openat2(dirfd: int, path: str, flags: int, resolve: int, mode: int = 0) -> int:
    """``openat2(dirfd, path, {flags | O_CLOEXEC, mode, resolve})``; OSError naming ``path`` on failure."""
    how = _OpenHow(flags | os.O_CLOEXEC, mode, resolve)
    raw = os.fsencode(path)
    err = errno.EAGAIN
    for _ in range(_EAGAIN_RETRIES):
        fd = _libc.syscall(
            ctypes.c_long(_SYS_OPENAT2), ctypes.c_int(dirfd), raw, ctypes.byref(how), ctypes.c_size_t(24)
        )
        if fd >= 0:
            return int(fd)
        err = ctypes.get_errno()
        if err != errno.EAGAIN:
            break
    if err == errno.ENOSYS:  # an older kernel, or gVisor before 2026-09
        return walk_open(dirfd, path, flags, resolve, mode)
    raise OSError(err, os.strerror(err), path)


def open_dirs(base: int, parts: list[str], resolve: int, *, create: bool) -> int:
    """An ``O_PATH`` descriptor of the directory ``parts`` below ``base``, made (mode 755) if ``create``.

    The part that exists is resolved with ``resolve``; directories made here are entered without following
    links, so one swapped in meanwhile is refused (ELOOP) rather than followed.
    """
    flags = os.O_PATH | os.O_DIRECTORY
    try:
        return openat2(base, "/".join(parts) or ".", flags, resolve)
    except FileNotFoundError:
        if not create:
            raise
    # Find the longest prefix that exists (usually all but the last part or two), then make the rest.
    have = len(parts) - 1
    while True:
        try:
            fd = openat2(base, "/".join(parts[:have]) or ".", flags, resolve)
            break
        except FileNotFoundError:
            if have == 0:
                raise
            have -= 1
    try:
        for name in parts[have:]:
            # Made meanwhile, or a dangling link in the way: the open below tells them apart.
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o755, dir_fd=fd)
            inner = openat2(fd, name, flags, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd

