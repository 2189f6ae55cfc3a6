"""The sandbox's disk: its writable layer on an ext4 image of fixed size, behind a loop device.

The router gives each sandbox a sparse file ``disk.img`` holding an ext4 filesystem as large as its
quota. PID 1 attaches it to a free loop device and mounts it in the sandbox's own mount namespace,
before the overlay whose upper and work directories live inside it. A full layer is then ENOSPC inside
the sandbox, never a full host.

Nothing of this shows in the host's mount table, and nothing needs undoing: the loop device is
configured with ``LO_FLAGS_AUTOCLEAR``, so when the sandbox's last process exits, its mount namespace
goes, the filesystem is unmounted, and the kernel detaches the loop device itself. Standard library
only: this runs in the runtime bundle's Python.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import struct
import time

from sandbox_image import linux
from sandbox_image.userns import RANGE

LOOP_CONTROL = "/dev/loop-control"
_LOOP_CTL_GET_FREE = 0x4C82
_LOOP_CONFIGURE = 0x4C0A
_LO_FLAGS_AUTOCLEAR = 4
# struct loop_config: __u32 fd, __u32 block_size, struct loop_info64 (232 bytes), __u64 __reserved[8].
# loop_info64: five __u64 (device, inode, rdevice, offset, sizelimit), four __u32 (number,
# encrypt_type, encrypt_key_size, flags), file_name[64], crypt_name[64], encrypt_key[32], __u64 init[2].
_LOOP_CONFIG = struct.Struct("=II QQQQQ IIII 64s64s32s QQ 64x")
_ATTEMPTS = 50
MOUNT_FLAGS = linux.MS_NOSUID | linux.MS_NODEV


def _loop_config(backing_fd: int, name: str) -> bytes:
    return _LOOP_CONFIG.pack(
        backing_fd, 0, 0, 0, 0, 0, 0, 0, 0, 0, _LO_FLAGS_AUTOCLEAR, name.encode()[-63:], b"", b"", 0, 0
    )


def attach(image: str) -> tuple[int, str]:
    """Attach ``image`` to a free loop device; returns an open fd of the device and its path.

    The device stays attached while the fd is open or a filesystem on it is mounted, then detaches
    itself. Another process may take the device ``LOOP_CTL_GET_FREE`` named before we configure it
    (EBUSY): then ask for the next free one.
    """
    backing = os.open(image, os.O_RDWR | os.O_CLOEXEC)
    try:
        control = os.open(LOOP_CONTROL, os.O_RDWR | os.O_CLOEXEC)
        try:
            for _ in range(_ATTEMPTS):
                number = fcntl.ioctl(control, _LOOP_CTL_GET_FREE)
                path = f"/dev/loop{number}"
                try:
                    device = os.open(path, os.O_RDWR | os.O_CLOEXEC)
                except FileNotFoundError:  # a new device whose node devtmpfs has not made yet
                    time.sleep(0.01)
                    continue
                try:
                    fcntl.ioctl(device, _LOOP_CONFIGURE, _loop_config(backing, image))
                except OSError as exc:
                    os.close(device)
                    if exc.errno == errno.EBUSY:
                        continue
                    raise OSError(exc.errno, f"attach {image} to {path}: {exc.strerror}") from exc
                return device, path
        finally:
            os.close(control)
    finally:
        os.close(backing)
    raise OSError(errno.EBUSY, f"no free loop device for {image} after {_ATTEMPTS} attempts")


def mount(image: str, target: str) -> None:
    """Mount the ext4 ``image`` on ``target`` (nosuid, nodev) in the current mount namespace."""
    device, path = attach(image)
    try:
        linux.mount(path, target, "ext4", MOUNT_FLAGS)
    finally:
        # The mount holds the device from here on and AUTOCLEAR detaches it when that mount goes; if
        # the mount failed, closing our fd (its last user) detaches it now.
        os.close(device)


def prepare_layer(image: str, mountpoint: str, upper: str, work: str, *, owner: int | None = None,
                  rebase_from: int | None = None) -> None:
    """PID 1, before the overlay: mount the sandbox's disk and make its layer directories inside.

    ``owner``: the host uid (and gid) the layer directories belong to, for a sandbox whose root is
    mapped to an unprivileged host id; they live inside the image, so only PID 1 can reach them.
    """
    mount(image, mountpoint)
    for path in (upper, work):
        os.makedirs(path, mode=0o755, exist_ok=True)
        if owner is not None and rebase_from is not None:
            rebase_tree(path, rebase_from, owner)
        if owner is not None:
            os.chown(path, owner, owner)


def rebase_tree(top: str, old_base: int, new_base: int) -> None:
    """Every entry under ``top`` (``top`` too; symlinks never followed) owned by an id of ``old_base``'s range
    gets the same offset in ``new_base``'s; modes, setuid bits included, are kept.

    A layer made from another sandbox's checkpoint holds the files that sandbox's processes wrote, owned by
    its own host id range, in which this sandbox's root is nobody: they become this sandbox's root's.
    """

    def move(path: str) -> None:
        st = os.lstat(path)
        uid, gid = _moved(st.st_uid, old_base, new_base), _moved(st.st_gid, old_base, new_base)
        if (uid, gid) == (st.st_uid, st.st_gid):
            return
        os.lchown(path, uid, gid)
        if not stat.S_ISLNK(st.st_mode):
            os.chmod(path, st.st_mode & 0o7777)  # a chown clears setuid and setgid: put them back

    move(top)
    for parent, dirs, files in os.walk(top, followlinks=False):
        for name in (*dirs, *files):
            move(os.path.join(parent, name))


def _moved(value: int, old_base: int, new_base: int) -> int:
    return new_base + (value - old_base) if old_base <= value < old_base + RANGE else value
