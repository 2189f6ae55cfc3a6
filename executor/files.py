"""File operations: read, atomic write, delete, list."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from typing import IO, Any

from grove.errors import BadRequest, Conflict, Forbidden, Invalid, NotFound, TooLarge

_CHUNK = 256 * 1024
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def _kind(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "other"


def _stat(path: str, api: str) -> os.stat_result:
    try:
        return os.stat(path)
    except FileNotFoundError as exc:
        raise NotFound(f"no such file or directory: {api}") from exc
    except NotADirectoryError as exc:
        raise NotFound(f"a parent of {api} is not a directory") from exc
    except PermissionError as exc:
        raise Forbidden(f"permission denied: {api}") from exc


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


def open_for_read(path: str, api: str) -> tuple[int, Iterator[bytes]]:
    """Size and a chunk iterator of a regular file."""
    st = _stat(path, api)
    if stat.S_ISDIR(st.st_mode):
        raise BadRequest(f"{api} is a directory: use /v1/files/list or /v1/archive")
    if not stat.S_ISREG(st.st_mode):
        raise BadRequest(f"{api} is not a regular file")
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed by the generator below
    except PermissionError as exc:
        raise Forbidden(f"permission denied: {api}") from exc

    def chunks() -> Iterator[bytes]:
        with fh:
            while block := fh.read(_CHUNK):
                yield block

    return st.st_size, chunks()


def write_atomic(path: str, api: str, body: IO[bytes], *, mode: int | None, limit: int, length: int | None) -> int:
    """Stream ``body`` into a temp file beside ``path`` and rename it into place; return the size."""
    if length is not None and length > limit:
        raise TooLarge(f"file of {length} bytes exceeds the limit of {limit} bytes")
    if os.path.isdir(path):
        raise Conflict(f"{api} is a directory")
    parent = os.path.dirname(path)
    try:
        os.makedirs(parent, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as exc:
        raise Conflict(f"a parent of {api} exists and is not a directory") from exc
    fd, tmp = tempfile.mkstemp(prefix=".grove-put-", dir=parent)
    size = 0
    try:
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
            os.fsync(out.fileno())
        # gunicorn ends the body stream quietly when the client hangs up early: never rename a torn upload.
        if length is not None and size < length:
            raise BadRequest(f"upload of {api} ended after {size} of {length} bytes; the file was not changed")
        if mode is not None:
            os.chmod(tmp, mode)
        elif os.path.exists(path):
            os.chmod(tmp, stat.S_IMODE(os.stat(path).st_mode))
        else:
            os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and exc.errno in NO_SPACE:
            # A full filesystem is the sandbox's limit, not a bug of grove: say so with a 413.
            raise TooLarge(f"no space left in the sandbox to write {api} ({size} bytes written)") from exc
        raise
    return size


def delete(path: str, api: str, *, recursive: bool) -> None:
    """Remove a file, a symlink, or (with ``recursive``) a directory tree."""
    try:
        st = os.lstat(path)
    except FileNotFoundError as exc:
        raise NotFound(f"no such file or directory: {api}") from exc
    if stat.S_ISDIR(st.st_mode):
        if not recursive:
            raise Conflict(f"{api} is a directory: pass recursive=1 to delete it and everything in it")
        shutil.rmtree(path)
    else:
        os.unlink(path)


def listing(path: str, api: str) -> list[dict[str, Any]]:
    """The entries of a directory with name, type, size, mode and mtime."""
    st = _stat(path, api)
    if not stat.S_ISDIR(st.st_mode):
        raise BadRequest(f"{api} is not a directory")
    entries: list[dict[str, Any]] = []
    with os.scandir(path) as it:
        for entry in it:
            try:
                est = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # removed while we listed
            entries.append(
                {
                    "name": entry.name,
                    "type": _kind(est.st_mode),
                    "size": est.st_size,
                    "mode": f"{stat.S_IMODE(est.st_mode):04o}",
                    "mtime": est.st_mtime,
                }
            )
    entries.sort(key=lambda e: str(e["name"]))
    return entries
