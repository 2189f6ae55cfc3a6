"""A directory's manifest: every entry under it with its type, mode, size and, for regular files, sha256.

What changed between two moments of a workspace (an agent's attempt against the state after setup) is two
manifests compared: the caller fetches only the files that differ. The walk is on descriptors
(:func:`executor.treewalk.walk`: no recursion, never through a link), names listed in ``skip`` are pruned
wherever they appear (``.git``, ``__pycache__``), files are opened without following links or blocking on a
FIFO, and read no further than the size they had when opened. The work is the sandbox's: it runs in the
executor, inside the sandbox's own CPU quota.
"""

from __future__ import annotations

import hashlib
import os
import stat
from typing import Any

from executor.files import READ_FLAGS, kind_of
from executor.paths import PathResolver
from executor.treewalk import check_depth, walk
from grove.core.errors import NotFound, TooLarge

MAX_ENTRIES = 1_000_000
"""Most entries a manifest lists (a workspace beyond it is refused with a 413, not cut)."""
_CHUNK = 1 << 20


def manifest(paths: PathResolver, api: str, skip: frozenset[str]) -> list[dict[str, Any]]:
    """The entries under the directory ``api``, paths relative to it, in a stable order."""
    try:
        top = paths.open(api, os.O_PATH)
    except NotFound:
        raise NotFound(f"no such directory: {api}") from None
    try:
        if not stat.S_ISDIR(os.fstat(top).st_mode):
            raise NotFound(f"no such directory: {api}")
        check_depth(top, api)
        entries: list[dict[str, Any]] = []
        for rel_dir, dirfd, dirnames, others, _ in walk(top):
            dirnames[:] = [d for d in dirnames if d not in skip]  # pruned: not walked into
            for name in dirnames + [o for o in others if o not in skip]:
                entry = _entry(dirfd, name, name if rel_dir == "." else f"{rel_dir}/{name}")
                if entry is not None:
                    entries.append(entry)
                    if len(entries) > MAX_ENTRIES:
                        raise TooLarge(f"{api} holds more than {MAX_ENTRIES} entries; list a subdirectory of it")
        return entries
    finally:
        os.close(top)


def _entry(dirfd: int, name: str, rel: str) -> dict[str, Any] | None:
    try:
        st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
    except FileNotFoundError:
        return None  # removed while the walk went on
    entry: dict[str, Any] = {"path": rel, "type": kind_of(st.st_mode), "mode": stat.S_IMODE(st.st_mode),
                             "size": st.st_size if stat.S_ISREG(st.st_mode) else None, "sha256": None,
                             "target": None}
    if stat.S_ISLNK(st.st_mode):
        entry["target"] = os.readlink(name, dir_fd=dirfd)
    elif stat.S_ISREG(st.st_mode):
        entry["sha256"], entry["size"] = _hash(dirfd, name)
    return entry


def _hash(dirfd: int, name: str) -> tuple[str | None, int | None]:
    """sha256 and size of a regular file as it is when opened (None if it changed kind or went meanwhile)."""
    try:
        fd = os.open(name, READ_FLAGS | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dirfd)
    except OSError:
        return None, None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, None
        os.set_blocking(fd, True)
        digest, left = hashlib.sha256(), st.st_size
        while left > 0 and (block := os.read(fd, min(_CHUNK, left))):
            digest.update(block)
            left -= len(block)
        return digest.hexdigest(), st.st_size - left
    finally:
        os.close(fd)
