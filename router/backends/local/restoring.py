"""A checkpoint's layer handed to a new sandbox: its files re-owned to the new sandbox's host ids.

Each local sandbox's root is its own unprivileged host id range (:mod:`router.backends.local.uids`), and the
files its processes wrote carry that range's ids inside its disk image. A sandbox started from another's
checkpoint has a range of its own, in which those ids mean nothing (its root would see its files as
``nobody``'s): before it starts, its copy of the image is mounted on the host for a moment and every entry
owned by the parent's range is given the same id in the child's. Ownership only; a copy-on-write image
stores just the changed inodes again.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from grove.core.errors import Unavailable
from router.backends.local import disk
from router.backends.local.cow import run_tool
from sandbox_image.userns import RANGE

_DETACH_S = 10.0


def rebase_layer(image: Path, mountpoint: Path, old_base: int, new_base: int) -> None:
    """Re-own the layer in the ext4 ``image`` (mounted at ``mountpoint`` meanwhile) from ``old_base``'s range
    to ``new_base``'s."""
    if old_base == new_base:
        return
    mountpoint.mkdir(exist_ok=True)
    run_tool(["mount", "-t", "ext4", "-o", "loop,nosuid,nodev,noexec", str(image), str(mountpoint)],
             "mount a restored sandbox disk")
    try:
        for top in ("upper", "work"):
            if (mountpoint / top).is_dir():
                rebase_tree(mountpoint / top, old_base, new_base)
    finally:
        run_tool(["umount", str(mountpoint)], "unmount a restored sandbox disk")
    # The loop device detaches itself once unmounted (autoclear); the sandbox's own start attaches the image
    # again, and two attachments of one ext4 image must never overlap.
    deadline = time.monotonic() + _DETACH_S
    while disk.attached_loops(image):
        if time.monotonic() > deadline:
            raise Unavailable(f"{image} stayed attached to a loop device after re-owning its files; try again")
        time.sleep(0.01)


def rebase_tree(top: Path, old_base: int, new_base: int) -> None:
    """Every entry under ``top`` (``top`` too; symlinks never followed) owned by an id of ``old_base``'s range
    gets the same offset in ``new_base``'s; modes, setuid bits included, are kept."""

    def move(path: str) -> None:
        st = os.lstat(path)
        uid = _moved(st.st_uid, old_base, new_base)
        gid = _moved(st.st_gid, old_base, new_base)
        if (uid, gid) == (st.st_uid, st.st_gid):
            return
        os.lchown(path, uid, gid)
        if not os.path.islink(path):
            os.chmod(path, st.st_mode & 0o7777)  # a chown clears setuid and setgid: put them back

    move(str(top))
    for parent, dirs, files in os.walk(top, followlinks=False):
        for name in (*dirs, *files):
            move(os.path.join(parent, name))


def _moved(value: int, old_base: int, new_base: int) -> int:
    return new_base + (value - old_base) if old_base <= value < old_base + RANGE else value
