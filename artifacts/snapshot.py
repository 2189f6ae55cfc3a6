"""Workspace snapshots: a directory as a streamed tar + zstd, and back, refusing anything that escapes.

The executor packs its workspace to a presigned PUT URL when it is about to stop and unpacks it from a
presigned GET URL when it starts (the Knative backend's scale-to-zero). Neither side holds the whole
archive in memory. This module and :mod:`artifacts.presigned` use only the standard library,
``zstandard`` and ``grove.core.errors``, so they run inside a sandbox's runtime bundle (no ``minio``).

Packed: directories, regular files, symlinks (as links) with their permission bits and mtimes; owners
are not recorded (a restore runs as whoever restores), hard links become separate files, and sockets,
FIFOs and devices are skipped.
"""

from __future__ import annotations

import os
import stat
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path

import zstandard

from artifacts.presigned import download_via_presigned, upload_via_presigned
from artifacts.streams import CHUNK
from artifacts.unpack import unpack_into
from grove.core.errors import NotFound

__all__ = ["download_via_presigned", "pack_directory", "unpack_into", "upload_via_presigned"]

BLOCK = tarfile.BLOCKSIZE


def pack_directory(path: str | os.PathLike[str], *, level: int = 3, chunk_size: int = CHUNK) -> Iterator[bytes]:
    """The directory's tree as tar + zstd, in pieces of about ``chunk_size`` bytes (NotFound at once if missing)."""
    root = Path(path)
    if not root.is_dir():
        raise NotFound(f"no such directory: {root}")
    return _pack(root, level, chunk_size)


def _pack(root: Path, level: int, chunk_size: int) -> Iterator[bytes]:
    compressor = zstandard.ZstdCompressor(level=level).compressobj()
    pending: list[bytes] = []
    pending_size = 0

    def emit(data: bytes) -> Iterator[bytes]:
        nonlocal pending_size
        out = compressor.compress(data)
        if out:
            pending.append(out)
            pending_size += len(out)
        if pending_size >= chunk_size:
            yield b"".join(pending)
            pending.clear()
            pending_size = 0

    # tarfile cannot hand back control while it copies a file; writing each header with TarInfo.tobuf
    # and the data ourselves lets a large file stream through in chunks.
    for info, source in _members(root):
        yield from emit(info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape"))
        if source is not None:
            yield from _file_data(source, info.size, chunk_size, emit)
    yield from emit(b"\0" * (2 * BLOCK))  # end-of-archive marker
    pending.append(compressor.flush())
    yield b"".join(pending)


def _file_data(source: Path, size: int, chunk_size: int, emit: Callable[[bytes], Iterator[bytes]]) -> Iterator[bytes]:
    left = size
    # The tree is the sandbox's: what was a file when measured may be a FIFO, a device or a link by now.
    # Never block on it or follow it; whatever it is, the header already promised ``size`` bytes.
    try:
        fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as fh:
        regular = stat.S_ISREG(os.fstat(fd).st_mode)
        while left > 0:
            data = fh.read(min(chunk_size, left)) if regular else b""
            if not data:
                # The file shrank after it was measured (or is no file now): pad, so the archive stays
                # well-formed (the header already promised ``size`` bytes).
                data = b"\0" * min(chunk_size, left)
            left -= len(data)
            yield from emit(data)
    if size % BLOCK:
        yield from emit(b"\0" * (BLOCK - size % BLOCK))


def _members(root: Path) -> Iterator[tuple[tarfile.TarInfo, Path | None]]:
    """(header, file to copy or None) for every entry below ``root``, parents before children, sorted."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        here = Path(dirpath)
        for name in sorted(dirnames) + sorted(filenames):
            full = here / name
            try:
                st = full.lstat()
            except FileNotFoundError:  # removed while we walk
                continue
            info = tarfile.TarInfo(full.relative_to(root).as_posix())
            info.mode = stat.S_IMODE(st.st_mode)
            info.mtime = int(st.st_mtime)
            if stat.S_ISDIR(st.st_mode):
                info.type = tarfile.DIRTYPE
                yield info, None
            elif stat.S_ISLNK(st.st_mode):
                info.type = tarfile.SYMTYPE
                info.linkname = os.readlink(full)
                yield info, None
            elif stat.S_ISREG(st.st_mode):
                info.size = st.st_size
                yield info, full
            # sockets, FIFOs and devices: not workspace content
