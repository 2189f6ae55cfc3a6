"""File operations on descriptors: read, atomic write, delete, list."""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator
from typing import IO, Any

from executor.paths import PathResolver
from executor.treewalk import remove_tree
from grove.core.errors import BadRequest, Conflict, Invalid, NotFound, TooLarge

_CHUNK = 256 * 1024
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def kind_of(mode: int) -> str:
    """The type an API listing names: file, dir, symlink or other."""
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "other"


def parse_mode(raw: str | None) -> int | None:
    """Parse a ``mode`` query value given in octal ("644", "0o755")."""
    if raw is None or raw == "":
        return None
    try:
        mode = int(raw.removeprefix("0o"), 8)
    except ValueError as exc:
        raise BadRequest(f"'mode' must be octal permissions like 644, got {raw!r}") from exc
    if not 0 <= mode <= 0o7777:
        raise Invalid(f"'mode' must be between 0 and 7777, got {raw!r}")
    return mode


READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY
"""How a file the sandbox controls is opened for reading: a FIFO put in its place cannot block the open."""


def open_regular(paths: PathResolver, api: str, *, what: str = "") -> tuple[int, os.stat_result]:
    """A descriptor and stat of the regular file at ``api`` (400 for a directory, FIFO, device, socket)."""
    fd = paths.open(api, READ_FLAGS)
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise BadRequest(f"{what or api} is a directory" + ("" if what else ": use /v1/files/list or /v1/archive"))
        if not stat.S_ISREG(st.st_mode):
            raise BadRequest(f"{what or api} is not a regular file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def open_for_read(paths: PathResolver, api: str) -> tuple[int, Iterator[bytes]]:
    """Size and a chunk iterator of a regular file (the size it had when opened, never more bytes)."""
    fd, st = open_regular(paths, api)

    def chunks() -> Iterator[bytes]:
        # Content-Length is the size at open: a file that grows meanwhile must not overrun it, and one that
        # shrinks ends the body early (the client sees a short read, not other bytes).
        with os.fdopen(fd, "rb") as fh:
            left = st.st_size
            while left > 0 and (block := fh.read(min(_CHUNK, left))):
                left -= len(block)
                yield block

    return st.st_size, chunks()


def write_atomic(
    paths: PathResolver, api: str, body: IO[bytes], *, mode: int | None, limit: int, length: int | None
) -> int:
    """Stream ``body`` into a temp file beside ``api`` and rename it into place; return the size.

    The parent is opened once (made if missing) and the temp file, the rename and the mode all work on that
    descriptor, so a link swapped into the path meanwhile cannot send the bytes elsewhere.
    """
    if length is not None and length > limit:
        raise TooLarge(f"file of {length} bytes exceeds the limit of {limit} bytes")
    dirfd, name = paths.open_parent(api, create=True)
    try:
        return _write_in(dirfd, name, api, body, mode=mode, limit=limit, length=length)
    finally:
        os.close(dirfd)


def _write_in(dirfd: int, name: str, api: str, body: IO[bytes], *, mode: int | None, limit: int,
              length: int | None) -> int:
    try:
        old: os.stat_result | None = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
    except FileNotFoundError:
        old = None
    if old is not None and stat.S_ISDIR(old.st_mode):
        raise Conflict(f"{api} is a directory")
    if mode is None:
        mode = stat.S_IMODE(old.st_mode) if old is not None and stat.S_ISREG(old.st_mode) else 0o644
    tmp = f".grove-put-{secrets.token_hex(6)}"
    size = 0
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dirfd)
        with os.fdopen(fd, "wb") as out:
            while block := body.read(_CHUNK):
                size += len(block)
                if size > limit:
                    raise TooLarge(f"file exceeds the limit of {limit} bytes")
                out.write(block)
            # Stored before it is renamed into place. On a local sandbox the layer is a sparse disk image:
            # a write fits into the sandbox's own filesystem even when the host's is full, and only the
            # write-back to the image fails; fsync is where that shows (ENOSPC, a 413 below) instead of
            # the file quietly going missing later. About 0.4 ms per file there.
            out.flush()
            os.fchmod(out.fileno(), mode)
            os.fsync(out.fileno())
        # gunicorn ends the body stream quietly when the client hangs up early: never rename a torn upload.
        if length is not None and size < length:
            raise BadRequest(f"upload of {api} ended after {size} of {length} bytes; the file was not changed")
        os.replace(tmp, name, src_dir_fd=dirfd, dst_dir_fd=dirfd)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dirfd)
        if isinstance(exc, OSError) and exc.errno in NO_SPACE:
            # A full filesystem is the sandbox's limit, not a bug of grove: say so with a 413.
            raise TooLarge(f"no space left in the sandbox to write {api} ({size} bytes written)") from exc
        if isinstance(exc, IsADirectoryError):  # a directory put there since the check above
            raise Conflict(f"{api} is a directory") from exc
        raise
    return size


def delete(paths: PathResolver, api: str, *, recursive: bool) -> None:
    """Remove a file, a symlink (never what it points to), or (with ``recursive``) a directory tree."""
    dirfd, name = paths.open_parent(api, create=False)
    try:
        try:
            st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
        except FileNotFoundError as exc:
            raise NotFound(f"no such file or directory: {api}") from exc
        if stat.S_ISDIR(st.st_mode):
            if not recursive:
                raise Conflict(f"{api} is a directory: pass recursive=1 to delete it and everything in it")
            remove_tree(dirfd, name)  # on descriptors, any depth: it never follows a link it meets
        else:
            os.unlink(name, dir_fd=dirfd)
    finally:
        os.close(dirfd)


def listing(paths: PathResolver, api: str) -> list[dict[str, Any]]:
    """The entries of a directory with name, type, size, mode and mtime."""
    found = paths.open(api, os.O_PATH)
    try:
        if not stat.S_ISDIR(os.fstat(found).st_mode):
            raise BadRequest(f"{api} is not a directory")
        fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=found)
    finally:
        os.close(found)
    entries: list[dict[str, Any]] = []
    try:
        with os.scandir(fd) as it:
            for entry in it:
                try:
                    est = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue  # removed while we listed
                entries.append(
                    {
                        "name": entry.name,
                        "type": kind_of(est.st_mode),
                        "size": est.st_size,
                        "mode": f"{stat.S_IMODE(est.st_mode):04o}",
                        "mtime": est.st_mtime,
                    }
                )
    finally:
        os.close(fd)
    entries.sort(key=lambda e: str(e["name"]))
    return entries
