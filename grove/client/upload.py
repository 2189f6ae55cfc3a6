"""Files going into a sandbox as one tar: spooled to a temporary file and streamed, never held in memory whole.

A directory is tarred into a temporary file (symlinks kept as links, never followed), refused once the
tar passes ``max_bytes``; a tarball is streamed from its file after its size is checked. Either way the
request body is read from disk as it is sent: uploading a large tree costs the client no more memory
than a small one.
"""

from __future__ import annotations

import os
import posixpath
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from grove.core.errors import Invalid

UPLOAD_MAX_BYTES = 8 << 30
"""The largest upload by default (8 GiB): a task's files or a project, not a host's disk."""


class _Capped:
    """A writable file that refuses to grow past ``limit`` bytes (``Invalid`` naming ``what``)."""

    def __init__(self, raw: IO[bytes], limit: int, what: str) -> None:
        self._raw, self._limit, self._what, self.size = raw, limit, what, 0

    def write(self, data: bytes) -> int:
        self.size += len(data)
        if self.size > self._limit:
            raise Invalid(f"{self._what} is more than {self._limit} bytes as a tar; upload less, or raise max_bytes")
        return self._raw.write(data)

    def tell(self) -> int:
        return self.size

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)


def spool_tar(local_dir: str | Path, max_bytes: int = UPLOAD_MAX_BYTES,
              keep: Callable[[str, bool], bool] | None = None) -> IO[bytes]:
    """A tar of ``local_dir`` (its contents at ``.``) in an anonymous temporary file, rewound; the caller closes it.
    ``keep``: given each path (relative, ``.`` the directory itself) and whether it is a directory, whether it
    goes in (a directory left out is left out whole)."""
    if not Path(local_dir).is_dir():
        raise Invalid(f"cannot upload {str(local_dir)!r}: not a directory")

    def chosen(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        return info if keep is None or keep(posixpath.normpath(info.name), info.isdir()) else None

    spool = tempfile.TemporaryFile()  # noqa: SIM115  (handed to the caller, who closes it)
    try:
        capped = _Capped(spool, max_bytes, repr(str(local_dir)))
        with tarfile.open(fileobj=capped, mode="w") as tar:
            tar.add(str(local_dir), arcname=".", filter=chosen)
        spool.seek(0)
        return spool
    except BaseException:
        spool.close()
        raise


def open_tarball(path: str | Path, max_bytes: int = UPLOAD_MAX_BYTES) -> IO[bytes]:
    """A tarball opened for streaming, after checking it is at most ``max_bytes``; the caller closes it."""
    size = os.stat(path).st_size
    if size > max_bytes:
        raise Invalid(f"{str(path)!r} is {size} bytes, more than the {max_bytes} an upload may be")
    return open(path, "rb")
