"""Tar archives of directories: streamed out, and extracted in without ever writing outside the target."""

from __future__ import annotations

import errno
import os
import stat
import tarfile
from collections.abc import Iterator
from typing import IO

from executor.files import NO_SPACE
from executor.paths import PathResolver
from executor.safeopen import MEMBER, open_dirs, openat2
from executor.treewalk import check_depth, walk
from grove.core.errors import BadRequest, NotFound, TooLarge

_CHUNK = 256 * 1024
_BLOCK = tarfile.BLOCKSIZE


def stream_tar(paths: PathResolver, api: str) -> Iterator[bytes]:
    """Yield a tar (PAX) of the directory at ``api`` chunk by chunk, never holding a whole file in memory.

    The walk is on descriptors (:func:`executor.treewalk.walk`, no recursion) and every entry is opened
    without following links, so a directory swapped for a link while it runs is archived as the link, never
    as what it points to. A tree deeper than :data:`executor.treewalk.MAX_DEPTH` is refused up front (413).
    """
    try:
        found = paths.open(api, os.O_PATH)
    except NotFound:
        raise NotFound(f"no such directory: {api}") from None
    if not stat.S_ISDIR(os.fstat(found).st_mode):
        os.close(found)
        raise NotFound(f"no such directory: {api}")

    try:
        check_depth(found, api)  # before the first byte: a refusal is a 413, not a stream cut short
    except BaseException:
        os.close(found)
        raise

    def members() -> Iterator[bytes]:
        try:
            for rel_dir, dirfd, dirnames, others, _ in walk(found):
                for name in dirnames + others:
                    arcname = name if rel_dir == "." else f"{rel_dir}/{name}"
                    yield from _member(dirfd, name, arcname)
            yield b"\0" * (2 * _BLOCK)
        finally:
            os.close(found)

    return members()


def _member(dirfd: int, name: str, arcname: str) -> Iterator[bytes]:
    try:
        st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
    except FileNotFoundError:
        return
    info = tarfile.TarInfo(arcname)
    if stat.S_ISDIR(st.st_mode):
        info.type = tarfile.DIRTYPE
    elif stat.S_ISLNK(st.st_mode):
        info.type = tarfile.SYMTYPE
        try:
            info.linkname = os.readlink(name, dir_fd=dirfd)
        except OSError:
            return  # replaced by something else meanwhile
    elif not stat.S_ISREG(st.st_mode):
        return  # sockets, fifos and devices have no place in a workspace archive
    if not stat.S_ISREG(st.st_mode):
        _stamp(info, st)
        yield info.tobuf(tarfile.PAX_FORMAT)
        return
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC, dir_fd=dirfd)
    except OSError:
        return
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)  # what was opened, not what the name held a moment before
        if not stat.S_ISREG(st.st_mode):
            return
        _stamp(info, st)
        info.size = st.st_size
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


def _stamp(info: tarfile.TarInfo, st: os.stat_result) -> None:
    info.mode = stat.S_IMODE(st.st_mode)
    info.mtime = int(st.st_mtime)
    info.uid, info.gid = st.st_uid, st.st_gid


NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
"""How a member's file is made once its name is clear: never through a link, never into an existing file."""


def check_name(name: str) -> list[str]:
    """The components of a member name; 400 for absolute names, '..' and NUL."""
    if name.startswith("/"):
        raise BadRequest(f"archive member {name!r}: absolute names are refused")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise BadRequest(f"archive member {name!r}: '..' in a name is refused")
    if "\x00" in name:
        raise BadRequest(f"archive member {name!r}: NUL in a name is refused")
    return parts


def extract_tar(body: IO[bytes], paths: PathResolver, api: str, *, max_bytes: int, max_members: int) -> int:
    """Extract a (possibly compressed) tar stream into the directory ``api``; return the number of members.

    Every member is checked before it is written: absolute names, '..', links pointing outside the
    target and device files are refused with a 400 naming the member. Names inside the target resolve on
    the target's descriptor without following any link (``RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS``): a
    member under a link, planted beforehand or swapped in while we extract, is refused, never followed.
    """
    target = paths.open_dir(api, create=True)
    total = count = 0
    try:
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
                    _extract_one(tar, member, target)
            except tarfile.TarError as exc:
                raise BadRequest(f"archive is corrupt after {count} members: {exc}") from exc
            except OSError as exc:
                if exc.errno in NO_SPACE:
                    raise TooLarge(f"no space left in the sandbox to extract member {count} into {api}") from exc
                raise
    finally:
        os.close(target)
    return count


def member_parent(target: int, parts: list[str], name: str) -> int:
    """The directory a member goes in (made if missing), reached from ``target`` without following links."""
    try:
        return open_dirs(target, parts[:-1], MEMBER, create=True)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EXDEV):
            raise BadRequest(
                f"archive member {name!r}: a directory on its way is a symbolic link; members are never "
                "written through links, so that nothing lands outside the target"
            ) from exc
        if exc.errno in (errno.ENOTDIR, errno.EEXIST):
            raise BadRequest(f"archive member {name!r}: a parent of it exists and is not a directory") from exc
        raise


def _extract_one(tar: tarfile.TarFile, member: tarfile.TarInfo, target: int) -> None:
    parts = check_name(member.name)
    if not parts:
        return  # "./" itself
    if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
        raise BadRequest(f"archive member {member.name!r}: device files, fifos and special files are refused")
    if member.issym():
        link_target = os.path.normpath(os.path.join(*parts[:-1], member.linkname) if parts[:-1] else member.linkname)
        if member.linkname.startswith("/") or link_target == ".." or link_target.startswith("../"):
            raise BadRequest(f"archive member {member.name!r}: symlink to {member.linkname!r} leads outside the target")
    source = _link_source(target, member) if member.islnk() else None
    parent = member_parent(target, parts, member.name)
    name = parts[-1]
    try:
        if member.isdir():
            make_dir(parent, name, member.mode & 0o7777 or 0o755)
        elif member.issym():
            replace_entry(parent, name)
            os.symlink(member.linkname, name, dir_fd=parent)
        elif source is not None:
            replace_entry(parent, name)
            # The descriptor pins the file checked above; linking its /proc name links exactly that file.
            os.link(f"/proc/self/fd/{source}", name, dst_dir_fd=parent, follow_symlinks=True)
        else:
            replace_entry(parent, name)
            fd = os.open(name, NEW_FILE, 0o600, dir_fd=parent)
            src_fh = tar.extractfile(member)
            with os.fdopen(fd, "wb") as out:
                if src_fh is not None:
                    while block := src_fh.read(_CHUNK):
                        out.write(block)
                os.fchmod(fd, member.mode & 0o7777)
                os.utime(fd, (member.mtime, member.mtime))
    finally:
        os.close(parent)
        if source is not None:
            os.close(source)


def _link_source(target: int, member: tarfile.TarInfo) -> int:
    refused = BadRequest(
        f"archive member {member.name!r}: hard link to {member.linkname!r} is not a file inside the target"
    )
    try:
        src_parts = check_name(member.linkname)
    except BadRequest as exc:  # name the member itself, not only the path it links to
        raise BadRequest(
            f"archive member {member.name!r}: hard link to {member.linkname!r} leads outside the target"
        ) from exc
    try:
        fd = openat2(target, "/".join(src_parts) or ".", os.O_PATH, MEMBER)
    except OSError as exc:
        raise refused from exc
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise refused
    return fd


def make_dir(parent: int, name: str, mode: int) -> None:
    """Make (or keep) the directory ``name`` in ``parent`` with ``mode``; a link in its place is replaced."""
    try:
        st: os.stat_result | None = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        st = None
    if st is not None and stat.S_ISLNK(st.st_mode):
        os.unlink(name, dir_fd=parent)
        st = None
    if st is None:
        os.mkdir(name, 0o700, dir_fd=parent)
    elif not stat.S_ISDIR(st.st_mode):
        raise BadRequest(f"cannot replace {name!r}, which is not a directory, with a directory")
    fd = openat2(parent, name, os.O_RDONLY | os.O_DIRECTORY, MEMBER)
    try:
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def replace_entry(parent: int, name: str) -> None:
    """Clear the way for a new file or link ``name`` in ``parent``: unlink what is there, refuse a directory."""
    try:
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        raise BadRequest(f"cannot replace directory {name!r} with a file")
    os.unlink(name, dir_fd=parent)
