"""``openat2``'s resolve rules kept in user space, for kernels without it (gVisor before its 2026-09 releases).

The walk holds a descriptor of every directory it has entered and opens one name at a time below the last
one with ``O_NOFOLLOW``, so no component is ever looked up by the kernel through a link, and a name swapped
for a link between two steps is met as a link, not followed. A link is read (``readlinkat``) and its text
walked by the same rules:

* ``..`` pops the walk's own stack of descriptors, never asks the kernel for a parent: above the starting
  directory it is refused (``RESOLVE_BENEATH``: EXDEV) or stays put (``RESOLVE_IN_ROOT``: the start is "/"),
  and a directory moved elsewhere meanwhile cannot lead the walk out;
* an absolute link (or path) restarts at the starting directory under ``RESOLVE_IN_ROOT`` and is refused
  (EXDEV) under ``RESOLVE_BENEATH``;
* ``RESOLVE_NO_SYMLINKS`` refuses any link (ELOOP); ``RESOLVE_NO_MAGICLINKS`` refuses every link on procfs
  (ELOOP) — the magic ones (``/proc/<pid>/fd/N``, ``/root``) and, stricter than the kernel, ``/proc/self``;
* at most 40 links per walk (the kernel's ``MAXSYMLINKS``), else ELOOP.

The last name is opened with the caller's flags plus ``O_NOFOLLOW``; with ``O_PATH`` that opens a link itself,
which is then seen (``fstat``) and followed by the same rules.
"""

from __future__ import annotations

import collections
import ctypes
import errno
import os
import stat

RESOLVE_NO_MAGICLINKS = 0x02
"""Refuse ``/proc/<pid>/fd/N``, ``/proc/<pid>/root`` and their kind (jumps the walk could not check)."""
RESOLVE_NO_SYMLINKS = 0x04
"""Refuse every symbolic link on the way, the last component included."""
RESOLVE_BENEATH = 0x08
"""Refuse a walk that leaves the starting directory (``..`` above it, an absolute link)."""
RESOLVE_IN_ROOT = 0x10
"""Walk as if the starting directory were ``/`` (absolute links and ``..`` stay inside it)."""
MAX_LINKS = 40
"""Links followed in one walk before it is refused (ELOOP), as the kernel's ``MAXSYMLINKS``."""
_PROC_SUPER_MAGIC = 0x9FA0
_libc = ctypes.CDLL(None, use_errno=True)


def walk_open(dirfd: int, path: str, flags: int, resolve: int, mode: int = 0) -> int:
    """What ``openat2(dirfd, path, {flags, mode, resolve})`` opens, or the OSError it would raise."""
    if not path:
        raise OSError(errno.ENOENT, os.strerror(errno.ENOENT), path)
    in_root = bool(resolve & RESOLVE_IN_ROOT)
    if path.startswith("/") and not in_root:
        raise OSError(errno.EXDEV, "an absolute path leaves the starting directory", path)
    todo = collections.deque(_names(path))
    stack = [dirfd]  # the walk's directories; stack[0] is the caller's and never closed here
    links = 0
    try:
        while todo:
            name = todo.popleft()
            if name == "..":
                if len(stack) > 1:
                    os.close(stack.pop())
                elif not in_root:
                    raise OSError(errno.EXDEV, "'..' leaves the starting directory", path)
                continue
            here = stack[-1]
            opened = _step(here, name, flags, mode, last=not todo)
            if isinstance(opened, int):
                if todo:
                    stack.append(opened)
                    continue
                return opened
            # A link, with its text.
            if resolve & RESOLVE_NO_SYMLINKS:
                raise OSError(errno.ELOOP, "a symbolic link is on the way", path)
            if resolve & RESOLVE_NO_MAGICLINKS and _on_procfs(here):
                raise OSError(errno.ELOOP, "a link on procfs is on the way", path)
            links += 1
            if links > MAX_LINKS:
                raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
            if opened.startswith("/"):
                if not in_root:
                    raise OSError(errno.EXDEV, "an absolute link leaves the starting directory", path)
                while len(stack) > 1:
                    os.close(stack.pop())
            todo.extendleft(reversed(_names(opened)))
        # The path (or a link's text) ended in '..', '.' or "/": the directory the walk stands in.
        return os.open(".", flags | os.O_CLOEXEC, mode, dir_fd=stack[-1])
    finally:
        for fd in stack[1:]:
            os.close(fd)


def _step(here: int, name: str, flags: int, mode: int, *, last: bool) -> int | str:
    """Open ``name`` in ``here`` without following it: a descriptor (a directory on the way, or the last name
    opened with ``flags``), or the text of the link it is."""
    if not last:
        fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=here)
        kind = os.fstat(fd).st_mode
        if stat.S_ISDIR(kind):
            return fd
        os.close(fd)
        if not stat.S_ISLNK(kind):
            raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), name)
        return os.readlink(name, dir_fd=here)
    try:
        fd = os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=here)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):  # O_NOFOLLOW met a link (ENOTDIR with O_DIRECTORY)
            raise
        try:
            return os.readlink(name, dir_fd=here)
        except OSError:
            raise exc from None  # not a link after all: the open's own error
    if flags & os.O_PATH and stat.S_ISLNK(os.fstat(fd).st_mode):
        os.close(fd)
        return os.readlink(name, dir_fd=here)
    return fd


def _names(path: str) -> list[str]:
    return [part for part in path.split("/") if part not in ("", ".")]


def _on_procfs(fd: int) -> bool:
    """Whether the directory ``fd`` is on procfs (``fstatfs``; its first field is ``f_type``)."""
    buf = ctypes.create_string_buffer(256)
    if _libc.fstatfs(fd, buf) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return ctypes.c_long.from_buffer(buf).value == _PROC_SUPER_MAGIC
