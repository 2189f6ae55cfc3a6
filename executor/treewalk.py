"""Walking and removing directory trees on descriptors, without recursion and with few descriptors open.

A sandbox can nest directories as deep as its disk allows. ``os.fwalk`` and ``shutil.rmtree`` recurse in
Python (a ``RecursionError`` near 1,000 levels) and hold one descriptor per level (``EMFILE`` near the
descriptor limit): either failure turned the sandbox's own files into a 500 or a stream cut mid-way, which
the router must read as a fault of the environment. Here a walk keeps an explicit stack, refuses trees
deeper than :data:`MAX_DEPTH` up front (a 4xx before the first byte), and removal hoists deep subtrees up
to its top instead of descending further, so it finishes whatever the depth.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator

from grove.core.errors import TooLarge

MAX_DEPTH = 256
"""Deepest tree an archive is made of (a real workspace is far shallower; deeper is an attack)."""
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _entries(dirfd: int) -> tuple[list[str], list[str]]:
    """(subdirectories, other entries) of a directory, sorted; links are never directories here."""
    dirs: list[str] = []
    others: list[str] = []
    with os.scandir(dirfd) as it:
        for entry in it:
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                continue  # gone meanwhile
            (dirs if is_dir else others).append(entry.name)
    return sorted(dirs), sorted(others)


def check_depth(top: int, api: str, limit: int = MAX_DEPTH) -> None:
    """Raise ``TooLarge`` (413) if the tree under ``top`` is deeper than ``limit`` levels."""
    for _, _, _, _, depth in walk(top, limit + 1):
        if depth > limit:
            raise TooLarge(f"{api} is nested more than {limit} directories deep; archive a subdirectory of it")


def walk(top: int, limit: int = MAX_DEPTH) -> Iterator[tuple[str, int, list[str], list[str], int]]:
    """Top-down ``(relative dir, its descriptor, subdirs, other entries, depth)`` for every directory under
    ``top`` (``"."`` first), never below ``limit`` levels. The descriptor is valid until the next step."""
    stack: list[tuple[str, int, int]] = [(".", os.open(".", _OPEN_DIR, dir_fd=top), 0)]  # top may be O_PATH
    try:
        while stack:
            rel, fd, depth = stack.pop()
            try:
                dirs, others = _entries(fd)
                yield rel, fd, dirs, others, depth
                if depth < limit:
                    for name in reversed(dirs):  # popped in sorted order
                        try:
                            child = os.open(name, _OPEN_DIR, dir_fd=fd)
                        except OSError:
                            continue  # replaced by a link or removed meanwhile: not walked into
                        stack.append((name if rel == "." else f"{rel}/{name}", child, depth + 1))
            finally:
                os.close(fd)
    finally:
        for _, fd, _ in stack:
            os.close(fd)


_MAX_OPEN = 64


def remove_tree(parent: int, name: str) -> None:
    """Remove the directory ``name`` in ``parent`` and everything in it, never following a link.

    At most ``_MAX_OPEN`` descriptors are held: a subdirectory met deeper than that is first renamed up to
    the top of the tree being removed, where the loop finds it again.
    """
    top = os.open(name, _OPEN_DIR, dir_fd=parent)
    stack: list[int] = [top]
    names: list[str] = []
    try:
        while stack:
            fd = stack[-1]
            sub = None
            with os.scandir(fd) as it:
                for entry in it:
                    if entry.is_dir(follow_symlinks=False):
                        sub = entry.name
                        break
                    os.unlink(entry.name, dir_fd=fd)
            if sub is None:
                os.close(stack.pop())
                if names:
                    os.rmdir(names.pop(), dir_fd=stack[-1])
            elif len(stack) >= _MAX_OPEN:
                os.rename(sub, f".grove-rm-{secrets.token_hex(8)}", src_dir_fd=fd, dst_dir_fd=top)
            else:
                stack.append(os.open(sub, _OPEN_DIR, dir_fd=fd))
                names.append(sub)
    finally:
        for fd in stack:
            os.close(fd)
    os.rmdir(name, dir_fd=parent)
