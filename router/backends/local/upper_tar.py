"""A sandbox's writable layer as an OCI layer tar, read by a short-lived process of its own.

``python -m router.backends.local.upper_tar DEVICE ID_BASE OUT`` runs as root on the host while the sandbox's
processes are frozen (:mod:`router.backends.local.layer_commit`). The layer lives on the sandbox's ext4 disk,
mounted only inside the sandbox's own mount namespace; this process unshares a private mount namespace and
mounts the same loop device there. The kernel hands it the very superblock the sandbox has mounted (same
device, same flags), so it reads the layer as the sandbox wrote it, page cache included; the mount goes
away with the process, also when it is killed, and the host's mount table never sees it.

Whiteouts go back to OCI form and owners relative to the sandbox's id range (``ID_BASE``), as an export of an
image's layer writes them (:func:`router.backends.local.image_export.add_layer_dir`). Nothing is followed:
the walk lists directories and stats entries, symlinks are stored as links, and the sandbox cannot change
the tree meanwhile (frozen).
"""

from __future__ import annotations

import os
import sys
import tarfile
import tempfile
from pathlib import Path

from router.backends.local.image_export import add_layer_dir
from sandbox_image import linux

_CLONE_NEWNS = 0x00020000


def write_upper(device: str, id_base: int, out: Path) -> None:
    """Mount ``device`` privately and write its ``upper`` directory to ``out`` as a plain layer tar."""
    linux.unshare(_CLONE_NEWNS)
    linux.mount(None, "/", None, linux.MS_REC | linux.MS_PRIVATE)
    mount_point = tempfile.mkdtemp(prefix=".commit-mnt-", dir=out.parent)
    try:
        linux.mount(device, mount_point, "ext4", linux.MS_NOSUID | linux.MS_NODEV | linux.MS_NOEXEC)
        with open(out, "xb") as raw, tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tf:
            add_layer_dir(tf, Path(mount_point) / "upper", id_base=id_base)
            os.fsync(raw.fileno())
        linux.umount2(mount_point, linux.MNT_DETACH)
    finally:
        os.rmdir(mount_point)


def main(argv: list[str]) -> int:
    """The command line: ``DEVICE ID_BASE OUT``; errors go to stderr for the router to quote."""
    if len(argv) != 3:
        print("usage: python -m router.backends.local.upper_tar DEVICE ID_BASE OUT", file=sys.stderr)
        return 2
    try:
        write_upper(argv[0], int(argv[1]), Path(argv[2]))
    except OSError as exc:
        print(f"reading the sandbox's layer failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
