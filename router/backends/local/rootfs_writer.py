"""Writing into an image's rootfs as root without ever leaving it: :class:`RootfsWriter`.

Each path is walked one component at a time from a directory file descriptor with ``O_NOFOLLOW``, so
a symlink inside the image is never followed while writing, a member that would be written through
one is refused, and so is any ``..``. Device nodes, fifos and sockets are skipped: a sandbox gets its
own ``/dev``, and a device node from an image is a way to the host's hardware.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tarfile
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from grove.core.errors import Invalid
from router.backends.local import overlay_layer
from router.backends.local.unpack_limits import Budget
from sandbox_image.newroot import MOUNT_POINTS, describe, not_a_directory

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
"""Open a directory, never through a symlink."""
# Deeper trees would exhaust file descriptors and the recursion limit; no real image comes close.
MAX_DEPTH = 256
CHUNK = 1 << 20
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_WH = ".wh."
_OPAQUE = ".wh..wh..opq"

_ZEROS = bytes(CHUNK)


class RootfsWriter:
    """Writes entries under one rootfs, resolving every path inside it and never following symlinks.

    Device nodes, fifos and sockets are skipped (counted in ``skipped``). Ownership and setuid bits
    are kept when running as root: the sandbox is isolated, and images rely on them.
    """

    def __init__(
        self, rootfs: Path, budget: Budget, *, overlay: bool = False, lowers: Sequence[Path] = ()
    ) -> None:
        """Write under ``rootfs``, every regular file's size charged to ``budget``. With ``overlay``, ``rootfs``
        is one layer of an overlay stack: whiteouts are kept in overlayfs's own form (a 0/0 character device;
        a ``trusted.overlay.opaque`` directory) instead of deleting from what is below, and a hardlink to a
        file of a lower layer (``lowers``, topmost first) copies that file into this one."""
        self._budget = budget
        self._root_fd = os.open(rootfs, DIR_FLAGS)
        self._as_root = os.geteuid() == 0
        self._overlay = overlay
        self._lowers = tuple(lowers)
        # Paths this layer wrote: whiteouts apply only to lower layers (OCI image spec, "Whiteouts").
        self._written: set[tuple[str, ...]] = set()
        # Overlay whiteouts this layer made: an entry written over one must still hide what is below.
        self._whited: set[tuple[str, ...]] = set()
        self.skipped = 0

    def __enter__(self) -> RootfsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self._root_fd)

    def start_layer(self) -> None:
        """Start applying the next layer on top of what is there."""
        self._written.clear()

    def add(self, tf: tarfile.TarFile, member: tarfile.TarInfo, *, layer: bool) -> None:
        """Write one tar member; with ``layer``, ``.wh.`` files are whiteouts rather than files."""
        parts = _parts(member.name, member.name)
        _check_header(member)
        if not parts:  # the archive's own root: the rootfs already exists
            return
        if layer and parts[-1].startswith(_WH):
            if self._overlay:
                self._overlay_whiteout(member.name, parts)
            else:
                self._whiteout(member.name, parts)
            return
        if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
            self.skipped += 1
            return
        if len(parts) == 1 and parts[0] in MOUNT_POINTS and not member.isdir():
            what = f"a symlink (to {member.linkname[:200]!r})" if member.issym() else (
                f"a hard link (to {member.linkname[:200]!r})" if member.islnk() else "a regular file")
            raise Invalid(f"archive member {member.name!r}: {not_a_directory(parts[0], what)}")
        parent = self._open_parent(member.name, parts[:-1], create=True)
        assert parent is not None
        try:
            self._add_entry(tf, member, parent, parts[-1])
            if self._overlay and member.isdir() and parts in self._whited:
                overlay_layer.make_opaque(parent, parts[-1])  # a directory over a whiteout replaces, never merges
        finally:
            os.close(parent)
        self._mark(parts)

    def _add_entry(self, tf: tarfile.TarFile, member: tarfile.TarInfo, parent: int, leaf: str) -> None:
        old = _lstat(leaf, parent)
        if member.islnk():
            self._hardlink(member, parent, leaf, old)
            return
        if not (member.isdir() and old is not None and stat.S_ISDIR(old.st_mode)):
            _remove(parent, leaf, old)
        if member.isdir():
            if old is None or not stat.S_ISDIR(old.st_mode):
                os.mkdir(leaf, 0o700, dir_fd=parent)
            fd = os.open(leaf, DIR_FLAGS, dir_fd=parent)
            try:
                self._own(fd, member.uid, member.gid, member.mode)
            finally:
                os.close(fd)
        elif member.issym():
            os.symlink(member.linkname, leaf, dir_fd=parent)
            if self._as_root:
                os.chown(leaf, member.uid, member.gid, dir_fd=parent, follow_symlinks=False)
            os.utime(leaf, (_mtime(member),) * 2, dir_fd=parent, follow_symlinks=False)
        else:
            self._budget.charge(member.size)
            src = tf.extractfile(member)
            assert src is not None  # a regular member always has a file object
            out = os.open(leaf, _NEW_FILE, 0o600, dir_fd=parent)
            try:
                _write_sparse(src, member, out)
                self._own(out, member.uid, member.gid, member.mode)
                os.utime(out, (_mtime(member),) * 2)
            finally:
                os.close(out)

    def _hardlink(self, member: tarfile.TarInfo, parent: int, leaf: str, old: os.stat_result | None) -> None:
        target = _parts(member.linkname, member.name)
        if not target:
            raise Invalid(f"hardlink {member.name!r} points to the image root; a hardlink must name a file")
        target_parent = self._open_parent(member.name, target[:-1], create=False)
        try:
            found = None if target_parent is None else _lstat(target[-1], target_parent)
            if target in self._whited:
                found = None  # this layer deleted it: there is nothing to link to
            elif found is None and self._overlay and target not in self._whited:
                _remove(parent, leaf, old)
                if overlay_layer.copy_from_lowers(self._lowers, target, parent, leaf, self._own, self._budget.charge):
                    return
            if found is None or stat.S_ISDIR(found.st_mode):
                raise Invalid(
                    f"hardlink {member.name!r} points to {member.linkname!r}, which is not a file in the image"
                )
            if old is not None and (old.st_dev, old.st_ino) == (found.st_dev, found.st_ino):
                return
            _remove(parent, leaf, old)
            os.link(target[-1], leaf, src_dir_fd=target_parent, dst_dir_fd=parent, follow_symlinks=False)
        finally:
            if target_parent is not None:
                os.close(target_parent)

    def _whiteout(self, name: str, parts: tuple[str, ...]) -> None:
        parent = self._open_parent(name, parts[:-1], create=False)
        if parent is None:  # nothing below to hide
            return
        try:
            if parts[-1] == _OPAQUE:
                self._prune(parent, parts[:-1])
            elif not parts[-1].startswith(_WH + _WH):  # other .wh..wh. names are aufs bookkeeping
                hidden = parts[-1][len(_WH):]
                if hidden in ("", ".", ".."):
                    raise Invalid(f"archive member {name!r} is a whiteout for no valid name")
                if (*parts[:-1], hidden) not in self._written:
                    _remove(parent, hidden, _lstat(hidden, parent))
        finally:
            os.close(parent)

    def _overlay_whiteout(self, name: str, parts: tuple[str, ...]) -> None:
        """Record a whiteout in overlayfs's form; what it hides lies in lower layers, untouched."""
        parent = self._open_parent(name, parts[:-1], create=True)
        assert parent is not None
        try:
            if parts[-1] == _OPAQUE:
                # What layers merged into this one before wrote here goes (see LayerStore.add_merged).
                self._prune(parent, parts[:-1])
                if parts[:-1]:
                    dirname = parts[-2]
                    up = self._open_parent(name, parts[:-2], create=False)
                    assert up is not None
                    try:
                        overlay_layer.make_opaque(up, dirname)
                    finally:
                        os.close(up)
                # An opaque marker on the image root itself hides nothing any image relies on.
            elif not parts[-1].startswith(_WH + _WH):
                hidden = parts[-1][len(_WH):]
                if hidden in ("", ".", ".."):
                    raise Invalid(f"archive member {name!r} is a whiteout for no valid name")
                target = (*parts[:-1], hidden)
                old = _lstat(hidden, parent)
                if target not in self._written:
                    _remove(parent, hidden, old)
                    overlay_layer.make_whiteout(parent, hidden)
                    self._whited.add(target)
                elif old is not None and stat.S_ISDIR(old.st_mode):
                    overlay_layer.make_opaque(parent, hidden)  # this layer's dir stays; the lower one goes
        finally:
            os.close(parent)

    def _prune(self, dir_fd: int, prefix: tuple[str, ...]) -> None:
        """Make a directory opaque: drop everything lower layers put in it."""
        for name in os.listdir(dir_fd):
            st = _lstat(name, dir_fd)
            if (*prefix, name) not in self._written:
                _remove(dir_fd, name, st)
            elif st is not None and stat.S_ISDIR(st.st_mode):
                sub = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
                try:
                    self._prune(sub, (*prefix, name))
                finally:
                    os.close(sub)

    def _open_parent(self, member: str, parts: tuple[str, ...], *, create: bool) -> int | None:
        """An fd for the directory ``parts`` inside the rootfs; None if missing and not ``create``."""
        fd = os.dup(self._root_fd)
        try:
            for i, part in enumerate(parts):
                try:
                    sub = os.open(part, DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        os.close(fd)
                        return None
                    os.mkdir(part, 0o755, dir_fd=fd)
                    sub = os.open(part, DIR_FLAGS, dir_fd=fd)
                    os.fchmod(sub, 0o755)
                    self._mark(parts[: i + 1])
                except OSError as exc:
                    if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                        raise
                    where = "/".join(parts[: i + 1])
                    if stat.S_ISLNK(os.lstat(part, dir_fd=fd).st_mode):
                        what = f"the symlink {where!r} -> {os.readlink(part, dir_fd=fd)!r}"
                        advice = "grove never follows symlinks inside an image; store files at their real paths"
                    else:
                        what, advice = f"{where!r}, which is not a directory", "fix the archive"
                    raise Invalid(f"archive member {member!r} would be written through {what}; {advice}") from None
                os.close(fd)
                fd = sub
            return fd
        except BaseException:
            os.close(fd)
            raise

    def _mark(self, parts: tuple[str, ...]) -> None:
        # Every ancestor counts as written, so an opaque marker never drops this layer's own files.
        for i in range(1, len(parts) + 1):
            self._written.add(parts[:i])

    def _own(self, fd: int, uid: int, gid: int, mode: int) -> None:
        if self._as_root:
            os.fchown(fd, uid, gid)  # before chmod: chown clears setuid bits
        os.fchmod(fd, stat.S_IMODE(mode))

    def copy_dir(self, source: Path) -> None:
        """Copy a directory tree into the rootfs; symlinks are copied as symlinks, never followed."""
        src = os.open(source, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            self._copy(src, self._root_fd, (), {})
        finally:
            os.close(src)

    def _copy(self, src: int, dst: int, prefix: tuple[str, ...], links: dict[tuple[int, int], str]) -> None:
        if len(prefix) >= MAX_DEPTH:
            raise Invalid(f"the directory {'/'.join(prefix)!r} is nested more than {MAX_DEPTH} deep")
        for entry in sorted(os.scandir(src), key=lambda e: e.name):
            st, name = entry.stat(follow_symlinks=False), entry.name
            if not prefix and name in MOUNT_POINTS and not stat.S_ISDIR(st.st_mode):
                target = os.readlink(name, dir_fd=src) if stat.S_ISLNK(st.st_mode) else None
                raise Invalid(f"{name!r} in the directory imported: {not_a_directory(name, describe(st, target))}")
            if stat.S_ISDIR(st.st_mode):
                os.mkdir(name, 0o700, dir_fd=dst)
                sub_src, sub_dst = os.open(name, DIR_FLAGS, dir_fd=src), os.open(name, DIR_FLAGS, dir_fd=dst)
                try:
                    self._copy(sub_src, sub_dst, (*prefix, name), links)
                    self._own(sub_dst, st.st_uid, st.st_gid, st.st_mode)
                    os.utime(sub_dst, ns=(st.st_atime_ns, st.st_mtime_ns))
                finally:
                    os.close(sub_src)
                    os.close(sub_dst)
            elif stat.S_ISLNK(st.st_mode):
                os.symlink(os.readlink(name, dir_fd=src), name, dir_fd=dst)
                if self._as_root:
                    os.chown(name, st.st_uid, st.st_gid, dir_fd=dst, follow_symlinks=False)
                os.utime(name, ns=(st.st_atime_ns, st.st_mtime_ns), dir_fd=dst, follow_symlinks=False)
            elif stat.S_ISREG(st.st_mode):
                first = links.get((st.st_dev, st.st_ino))
                if first is not None:  # keep hardlinks shared, as the source has them
                    os.link(first, name, src_dir_fd=self._root_fd, dst_dir_fd=dst, follow_symlinks=False)
                    continue
                self._budget.charge(st.st_size)
                with (
                    os.fdopen(os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=src), "rb") as i,
                    os.fdopen(os.open(name, _NEW_FILE, 0o600, dir_fd=dst), "wb") as o,
                ):
                    shutil.copyfileobj(i, o, CHUNK)
                    o.flush()
                    self._own(o.fileno(), st.st_uid, st.st_gid, st.st_mode)
                    os.utime(o.fileno(), ns=(st.st_atime_ns, st.st_mtime_ns))
                if st.st_nlink > 1:
                    links[(st.st_dev, st.st_ino)] = "/".join((*prefix, name))
            else:
                self.skipped += 1


def _write_sparse(src: IO[bytes], member: tarfile.TarInfo, out: int) -> None:
    """Write a regular member's content to ``out`` with every all-zero chunk left a hole: a sparse member's holes
    (which tarfile reads back as zeros) and runs of zeros in plain data take no space on disk.

    Read in order, never seeking: a streamed archive cannot go back. Its size is capped by the image's budget.
    """
    position = 0
    while position < member.size:
        chunk = src.read(min(CHUNK, member.size - position))
        if not chunk:
            raise Invalid(f"archive member {member.name!r} ends before its {member.size} bytes")
        if chunk != (_ZEROS if len(chunk) == CHUNK else bytes(len(chunk))):
            os.pwrite(out, chunk, position)
        position += len(chunk)
    os.ftruncate(out, member.size)


def _parts(name: str, member: str) -> tuple[str, ...]:
    """The components of an archive path, relative to the rootfs; ``..`` anywhere is refused."""
    parts = tuple(p for p in name.split("/") if p not in ("", "."))
    if ".." in parts:
        raise Invalid(f"archive member {member!r} contains '..' ({name!r}); grove refuses paths that climb out")
    if len(parts) > MAX_DEPTH:
        raise Invalid(f"archive member {member!r} is nested more than {MAX_DEPTH} directories deep")
    if any(len(os.fsencode(p)) > 255 for p in parts):
        raise Invalid(f"archive member {member!r} has a path component longer than 255 bytes")
    return parts


def _check_header(member: tarfile.TarInfo) -> None:
    if "\0" in member.name or "\0" in member.linkname:
        raise Invalid(f"archive member {member.name!r} has a NUL byte in its name or link target")
    if len(os.fsencode(member.linkname)) >= 4096:
        raise Invalid(f"archive member {member.name!r} has a link target longer than 4095 bytes")
    if not (0 <= member.uid < 2**32 - 1 and 0 <= member.gid < 2**32 - 1):
        raise Invalid(f"archive member {member.name!r} has an owner out of range ({member.uid}:{member.gid})")


def _mtime(member: tarfile.TarInfo) -> float:
    # A hostile or broken header may carry any number; times are not part of the digest anyway.
    return member.mtime if 0 <= member.mtime < 2**40 else 0.0


def _lstat(name: str, dir_fd: int) -> os.stat_result | None:
    try:
        return os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return None


def _remove(dir_fd: int, name: str, st: os.stat_result | None) -> None:
    if st is None:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(name, dir_fd=dir_fd)  # fd-based: never follows a symlink out of the tree
    else:
        os.unlink(name, dir_fd=dir_fd)
