"""Small files of ``/proc`` and ``/sys``, read and written with the fewest system calls.

``open(path).read()`` makes nine system calls (open, fstat, an ``isatty`` ioctl, two seeks, another
fstat, two reads, close), and each releases and retakes the GIL: on a busy router, whose threads and event
loop take turns at it, every release can cost a hand-off. A sandbox's start and end touch some thirty of
these files (its cgroups' limits and task lists, its PID 1's ``stat``); this reads one in four calls
(open, read, the read that finds the end, close) and writes one in three (a kernel attribute file takes
its value in one write, as ``write_text`` sent it too).
"""

from __future__ import annotations

import os

_CHUNK = 1 << 16
"""Larger than most files read here (``/proc/<pid>/stat`` ~300 bytes); a long task list takes more reads."""


def read(path: str | os.PathLike[str]) -> bytes:
    """The whole file; OSError as ``open`` raises it."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, _CHUNK):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def write(path: str | os.PathLike[str], value: str) -> None:
    """Write ``value`` to an existing file in one call; OSError as ``open`` and ``write`` raise it."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        data = value.encode()
        if os.write(fd, data) != len(data):  # kernel attribute files take a value whole or refuse it
            raise OSError(f"short write of {value!r} to {path}")
    finally:
        os.close(fd)
