"""Extract a tar + zstd stream into a directory, refusing every member that could land outside it.

Refused, with :class:`grove.core.errors.BadRequest` naming the member: absolute names, ``..`` components,
symlinks whose target resolves outside the directory (unless allowed), hard links to anything but a
regular file inside it, device files, FIFOs and other special files, and any member whose parent
directory resolves outside (a symlink already on disk, or one the archive made earlier). Extraction
stops at the first refused member. Files are created with ``O_NOFOLLOW | O_EXCL`` after removing what
was there, so no member is ever written through a link.
"""

from __future__ import annotations

import contextlib
import os
import tarfile
from collections.abc import Iterable
from pathlib import Path
from typing import IO, cast

import zstandard

from artifacts.streams import CHUNK, Readable, as_reader
from grove.core.errors import BadRequest

# Permission bits a restored file may carry: setuid and setgid are dropped, a restore must never
# hand out privileges; the sticky bit is harmless and kept.
_MODE_MASK = 0o1777


def unpack_into(
    source: Readable | Iterable[bytes], path: str | os.PathLike[str], *, allow_outside_links: bool = False
) -> int:
    """Extract the tar + zstd ``source`` (a reader or byte chunks) into ``path``; return the member count.

    ``allow_outside_links`` keeps symlinks that point outside ``path`` (a virtualenv's absolute
    ``bin/python`` link, when the executor restores its own workspace): they are still never followed
    while extracting.
    """
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    real_root = os.path.realpath(root)
    compressed = cast(IO[bytes], as_reader(source))  # zstandard only calls read(n)
    reader = zstandard.ZstdDecompressor().stream_reader(compressed, read_size=CHUNK)
    directories: list[tuple[str, tarfile.TarInfo]] = []
    links: list[tuple[str, str]] = []
    count = 0
    try:
        with tarfile.open(fileobj=reader, mode="r|") as tar:
            for info in tar:
                _extract(tar, info, root, real_root, allow_outside_links, directories)
                if info.issym():
                    links.append((os.path.join(root, _relative_name(info.name, info.name)), info.name))
                count += 1
    except (tarfile.TarError, zstandard.ZstdError, EOFError) as exc:
        raise BadRequest(f"not a valid tar + zstd archive: {exc}") from exc
    if not allow_outside_links:
        # A link checked when made can leave later: "a" -> "b/.." is inside until a later member
        # makes "b" -> ".". Every link is checked again once all exist.
        for dest, member in links:
            if not _inside(real_root, os.path.realpath(dest)):
                os.unlink(dest)
                raise _refuse(member, "is a symlink that resolves outside the target directory")
    # Directory modes and times last, deepest first: a read-only directory must still receive its
    # children, and adding children would change its mtime.
    for dest, info in reversed(directories):
        os.chmod(dest, info.mode & _MODE_MASK)
        os.utime(dest, (info.mtime, info.mtime))
    return count


def _extract(
    tar: tarfile.TarFile,
    info: tarfile.TarInfo,
    root: Path,
    real_root: str,
    allow_outside_links: bool,
    directories: list[tuple[str, tarfile.TarInfo]],
) -> None:
    rel = _relative_name(info.name, info.name)
    if not rel:
        if info.isdir():
            return  # the archive's own "./"
        raise _refuse(info.name, "has an empty name")
    dest = os.path.join(root, rel)
    parent = os.path.dirname(dest)
    if not _inside(real_root, os.path.realpath(parent)):
        raise _refuse(info.name, "would be written through a link that leaves the target directory")
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as exc:
        raise _refuse(info.name, f"has a parent that is not a directory ({exc.strerror})") from exc

    if info.isdir():
        if os.path.islink(dest) or (os.path.lexists(dest) and not os.path.isdir(dest)):
            os.unlink(dest)
        os.makedirs(dest, exist_ok=True)
        directories.append((dest, info))
    elif info.isreg():
        _clear(dest, info.name)
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as out:
            data = tar.extractfile(info)
            if data is not None:
                while chunk := data.read(CHUNK):
                    out.write(chunk)
            os.fchmod(out.fileno(), info.mode & _MODE_MASK)
        os.utime(dest, (info.mtime, info.mtime))
    elif info.issym():
        target = os.path.realpath(os.path.join(os.path.realpath(parent), info.linkname))
        if not allow_outside_links and not _inside(real_root, target):
            raise _refuse(info.name, f"is a symlink to {info.linkname!r}, outside the target directory")
        _clear(dest, info.name)
        os.symlink(info.linkname, dest)
        os.utime(dest, (info.mtime, info.mtime), follow_symlinks=False)
    elif info.islnk():
        source = os.path.realpath(os.path.join(root, _relative_name(info.linkname, info.name)))
        if not _inside(real_root, source) or not os.path.isfile(source):
            raise _refuse(info.name, f"is a hard link to {info.linkname!r}, not a file inside the target")
        _clear(dest, info.name)
        os.link(source, dest)
    else:
        kind = "a device file" if info.ischr() or info.isblk() else "a FIFO" if info.isfifo() else "special"
        raise _refuse(info.name, f"is {kind} (type {info.type!r}); only files, directories and links")


def _relative_name(name: str, member: str) -> str:
    if name.startswith("/"):
        raise _refuse(member, f"has an absolute path {name!r}")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise _refuse(member, f"has a '..' component in {name!r}")
    return "/".join(parts)


def _clear(dest: str, member: str) -> None:
    """Remove what is at ``dest`` (a file or link, never followed) so the new member can be created."""
    if os.path.isdir(dest) and not os.path.islink(dest):
        raise _refuse(member, "would replace a directory")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(dest)


def _inside(real_root: str, real_path: str) -> bool:
    return real_path == real_root or real_path.startswith(real_root.rstrip("/") + "/")


def _refuse(member: str, why: str) -> BadRequest:
    return BadRequest(f"archive member {member!r} {why}")
