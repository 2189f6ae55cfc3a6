"""Tar archives of directories: streamed out, and extracted in without ever writing outside the target."""

from __future__ import annotations

import os
import stat
import tarfile
from collections.abc import Iterator
from typing import IO

from executor.files import NO_SPACE
from grove.errors import BadRequest, NotFound, TooLarge

_CHUNK = 256 * 1024
_BLOCK = tarfile.BLOCKSIZE


def stream_tar(root: str, api: str) -> Iterator[bytes]:
    """Yield a tar (PAX) of the directory ``root`` chunk by chunk, never holding a whole file in memory."""
    if not os.path.isdir(root):
        raise NotFound(f"no such directory: {api}")

    def members() -> Iterator[bytes]:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            rel_dir = os.path.relpath(dirpath, root)
            for name in sorted(dirnames) + sorted(filenames):
                full = os.path.join(dirpath, name)
                arcname = name if rel_dir == "." else f"{rel_dir}/{name}"
                yield from _member(full, arcname)
        yield b"\0" * (2 * _BLOCK)

    return members()


def _member(full: str, arcname: str) -> Iterator[bytes]:
    try:
        st = os.lstat(full)
    except FileNotFoundError:
        return
    info = tarfile.TarInfo(arcname)
    info.mode = stat.S_IMODE(st.st_mode)
    info.mtime = int(st.st_mtime)
    info.uid, info.gid = st.st_uid, st.st_gid
    if stat.S_ISDIR(st.st_mode):
        info.type = tarfile.DIRTYPE
    elif stat.S_ISLNK(st.st_mode):
        info.type = tarfile.SYMTYPE
        info.linkname = os.readlink(full)
    elif stat.S_ISREG(st.st_mode):
        info.size = st.st_size
    else:
        return  # sockets, fifos and devices have no place in a workspace archive
    if not info.isreg():
        yield info.tobuf(tarfile.PAX_FORMAT)
        return
    try:
        fh = open(full, "rb")  # noqa: SIM115
    except OSError:
        return
    with fh:
        yield info.tobuf(tarfile.PAX_FORMAT)
        left = info.size
        while left > 0:
            block = fh.read(min(_CHUNK, left))
            if not block:  # the file shrank while we read it: pad to the size the header promised
                block = b"\0" * min(_CHUNK, left)
            left -= len(block)
            yield block
    pad = -info.size % _BLOCK
    if pad:
        yield b"\0" * pad


def _inside(base: str, path: str) -> bool:
    return path == base or path.startswith(base + os.sep)


def _check_name(name: str) -> list[str]:
    if name.startswith("/"):
        raise BadRequest(f"archive member {name!r}: absolute names are refused")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise BadRequest(f"archive member {name!r}: '..' in a name is refused")
    if "\x00" in name:
        raise BadRequest(f"archive member {name!r}: NUL in a name is refused")
    return parts


def extract_tar(body: IO[bytes], target: str, api: str, *, max_bytes: int, max_members: int) -> int:
    """Extract a (possibly compressed) tar stream into ``target``; return the number of members.

    Every member is checked before it is written: absolute names, '..', links pointing outside the
    target and device files are refused with a 400 naming the member. Parent directories are resolved
    with symlinks followed and must stay inside the target, and files are opened with O_NOFOLLOW, so a
    link planted by an earlier member cannot redirect a later write outside.
    """
    os.makedirs(target, exist_ok=True)
    base = os.path.realpath(target)
    total = count = 0
    try:
        tar = tarfile.open(fileobj=body, mode="r|*")  # noqa: SIM115 - closed by the with below
    except tarfile.TarError as exc:
        raise BadRequest(f"body is not a tar archive (plain, gzip, bz2 or xz): {exc}") from exc
    with tar:
        try:
            for member in tar:
                count += 1
                total += max(member.size, 0)
                if count > max_members:
                    raise TooLarge(f"archive has more than {max_members} members")
                if total > max_bytes:
                    raise TooLarge(f"archive expands beyond {max_bytes} bytes")
                _extract_one(tar, member, base)
        except tarfile.TarError as exc:
            raise BadRequest(f"archive is corrupt after {count} members: {exc}") from exc
        except OSError as exc:
            if exc.errno in NO_SPACE:
                raise TooLarge(f"no space left in the sandbox to extract member {count} into {api}") from exc
            raise
    return count


def _extract_one(tar: tarfile.TarFile, member: tarfile.TarInfo, base: str) -> None:
    parts = _check_name(member.name)
    if not parts:
        return  # "./" itself
    dest = os.path.join(base, *parts)
    parent = os.path.realpath(os.path.dirname(dest))
    if not _inside(base, parent):
        raise BadRequest(f"archive member {member.name!r}: its directory resolves outside the target")
    os.makedirs(parent, exist_ok=True)
    dest = os.path.join(parent, parts[-1])
    if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
        raise BadRequest(f"archive member {member.name!r}: device files, fifos and special files are refused")
    if member.isdir():
        if os.path.islink(dest):
            os.unlink(dest)
        os.makedirs(dest, exist_ok=True)
        os.chmod(dest, member.mode & 0o7777 or 0o755)
        return
    if member.issym():
        link_target = os.path.normpath(os.path.join(os.path.dirname(dest), member.linkname))
        if member.linkname.startswith("/") or not _inside(base, link_target):
            raise BadRequest(f"archive member {member.name!r}: symlink to {member.linkname!r} leads outside the target")
        _remove_existing(dest)
        os.symlink(member.linkname, dest)
        return
    if member.islnk():
        try:
            src_parts = _check_name(member.linkname)
        except BadRequest as exc:  # name the member itself, not only the path it links to
            raise BadRequest(
                f"archive member {member.name!r}: hard link to {member.linkname!r} leads outside the target"
            ) from exc
        src = os.path.realpath(os.path.join(base, *src_parts))
        if not _inside(base, src) or not os.path.isfile(src):
            raise BadRequest(
                f"archive member {member.name!r}: hard link to {member.linkname!r} is not a file inside the target"
            )
        _remove_existing(dest)
        os.link(src, dest)
        return
    _remove_existing(dest)
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    src_fh = tar.extractfile(member)
    with os.fdopen(fd, "wb") as out:
        if src_fh is not None:
            while block := src_fh.read(_CHUNK):
                out.write(block)
    os.chmod(dest, member.mode & 0o7777)
    os.utime(dest, (member.mtime, member.mtime))


def _remove_existing(path: str) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        raise BadRequest(f"cannot replace directory {path!r} with a file")
    os.unlink(path)
