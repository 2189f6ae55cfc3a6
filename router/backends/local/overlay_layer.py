"""One image layer as an overlayfs lower directory: whiteouts and opaque directories in overlayfs's form.

A layer of the layer store is unpacked on its own (not applied onto the layers below), so an OCI
whiteout cannot delete anything there. It is kept the way overlayfs reads it instead: ``.wh.NAME``
becomes a character device 0/0 named NAME, ``.wh..wh..opq`` the ``trusted.overlay.opaque=y`` attribute
of its directory. Both need root on the host, which the importer has; overlayfs reads them through the
idmapped view of each layer unchanged (a device number and a trusted attribute carry no owner).
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Callable, Sequence
from pathlib import Path

OPAQUE_XATTR = "trusted.overlay.opaque"
# The same flags as router.backends.local.rootfs_writer's (which imports this module): never through a symlink.
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
CHUNK = 1 << 20
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def make_whiteout(parent: int, name: str) -> None:
    """Make ``name`` in the directory ``parent`` an overlay whiteout (a 0/0 character device)."""
    os.mknod(name, stat.S_IFCHR | 0o600, os.makedev(0, 0), dir_fd=parent)


def make_opaque(parent: int, name: str) -> None:
    """Mark the directory ``name`` in ``parent`` opaque: overlayfs shows nothing of it from lower layers."""
    fd = os.open(name, DIR_FLAGS, dir_fd=parent)
    try:
        os.setxattr(fd, OPAQUE_XATTR, b"y")
    finally:
        os.close(fd)


def copy_from_lowers(
    lowers: Sequence[Path], target: tuple[str, ...], parent: int, leaf: str,
    own: Callable[[int, int, int, int], None], charge: Callable[[int], None],
) -> bool:
    """Copy the regular file ``target`` as the lower layers (topmost first) show it to ``leaf`` in ``parent``,
    its size ``charge``d first (to the image's unpack budget).

    For a hardlink whose target an earlier layer wrote: layers are shared between images, so one is
    never linked into another. Returns False when the layers show no such file.
    """
    for lower in lowers:
        found, stop = _lookup(lower, target)
        if found is not None:
            src, st = found
            try:
                charge(st.st_size)
            except BaseException:
                os.close(src)
                raise
            with os.fdopen(src, "rb") as inp, os.fdopen(os.open(leaf, _NEW_FILE, 0o600, dir_fd=parent), "wb") as out:
                shutil.copyfileobj(inp, out, CHUNK)
                out.flush()
                own(out.fileno(), st.st_uid, st.st_gid, st.st_mode)
            return True
        if stop:
            return False
    return False


def _lookup(lower: Path, target: tuple[str, ...]) -> tuple[tuple[int, os.stat_result] | None, bool]:
    """``(fd, stat)`` of the regular file ``target`` in one layer, or None; and whether the search must stop
    here (a whiteout or an opaque directory hides everything below)."""
    fd = os.open(lower, DIR_FLAGS)
    try:
        for part in target[:-1]:
            try:
                sub = os.open(part, DIR_FLAGS, dir_fd=fd)
            except OSError:
                st = _lstat(part, fd)
                return None, st is not None  # a whiteout, symlink or file here hides the path below
            os.close(fd)
            fd = sub
            if _opaque(fd):
                st = _lstat(target[-1], fd)
                if st is None:
                    return None, True
        st = _lstat(target[-1], fd)
        if st is None:
            return None, False
        if not stat.S_ISREG(st.st_mode):
            return None, True
        return (os.open(target[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd), st), True
    finally:
        os.close(fd)


def _opaque(fd: int) -> bool:
    try:
        return os.getxattr(fd, OPAQUE_XATTR) == b"y"
    except OSError:
        return False


def _lstat(name: str, dir_fd: int) -> os.stat_result | None:
    try:
        return os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
