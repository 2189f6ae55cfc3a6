"""The sandbox's new root as init builds it: every mount point resolved inside it, never on the host.

Init runs as host root with the host's root directory until ``pivot_root``. A path such as
``<root>/proc`` given to ``mount(2)`` by name is resolved on the host: an image whose ``proc`` is a symlink
to ``/`` had procfs mounted over the host's own root, and the old root then stayed above the sandbox's
(``/..`` inside was the host's ``/``). So init never names a path under the new root. It opens the root
once, opens each mount point *from* it with ``O_NOFOLLOW`` (one component: no symlink can be on the way),
refuses one that is anything but a directory, and mounts on the descriptor (``move_mount`` for binds,
``/proc/self/fd/N`` for new filesystems). After ``pivot_root`` it checks that nothing is stacked on ``/``.

Standard library only: this runs in the runtime bundle's Python.
"""

from __future__ import annotations

import os
import stat

from sandbox_image import linux

MOUNT_POINTS = ("proc", "dev", ".grove", "usr")
"""The top-level directories of a sandbox's root that init mounts on (``usr`` only for the host image). In an
image each must be a directory or absent: the image store refuses anything else, and init again."""

_PATH_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class BadImage(Exception):
    """The image cannot be a sandbox's root (the create's fault, not grove's: a 422, never retried)."""


def not_a_directory(name: str, what: str) -> str:
    """Why an image whose mount point ``name`` is ``what`` (a symlink to X, a regular file) is refused."""
    return (f"/{name} is {what}; grove mounts the sandbox's own /{name} there, so in an image it must be a "
            "directory or absent")


def describe(st: os.stat_result, readlink: str | None) -> str:
    """What a non-directory entry is, for :func:`not_a_directory`."""
    if stat.S_ISLNK(st.st_mode):
        return f"a symlink (to {(readlink or '')[:200]!r})"
    if stat.S_ISREG(st.st_mode):
        return "a regular file"
    return "not a directory"


def fd_path(fd: int) -> str:
    """A path naming exactly what ``fd`` is open on, for system calls that take a path (``mount``)."""
    return f"/proc/self/fd/{fd}"


class NewRoot:
    """The directory that becomes the sandbox's ``/``, held by a descriptor; mount points are opened from it."""

    def __init__(self, path: str) -> None:
        """Open ``path`` (a host path of the router's own making: the overlay's mount point)."""
        self.fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self._open: list[int] = [self.fd]

    def __enter__(self) -> NewRoot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close every descriptor this root handed out."""
        while self._open:
            os.close(self._open.pop())

    def mount_point(self, name: str) -> int:
        """An ``O_PATH`` descriptor of the directory ``name`` right under the root, made if missing.

        ``BadImage`` if it is anything but a directory; and it must be on the root's own filesystem, so
        that nothing is mounted there already.
        """
        assert name in MOUNT_POINTS and "/" not in name, name
        try:
            st = os.lstat(name, dir_fd=self.fd)
        except FileNotFoundError:
            os.mkdir(name, 0o755, dir_fd=self.fd)
        else:
            if not stat.S_ISDIR(st.st_mode):
                target = os.readlink(name, dir_fd=self.fd) if stat.S_ISLNK(st.st_mode) else None
                raise BadImage(not_a_directory(name, describe(st, target)))
        fd = self._keep(os.open(name, _PATH_FLAGS, dir_fd=self.fd))
        if os.fstat(fd).st_dev != os.fstat(self.fd).st_dev:
            raise BadImage(f"/{name} is already a mount point before the sandbox's own is made there")
        return fd

    def mounted(self, name: str) -> int:
        """A descriptor of what is mounted on ``name`` now (opening it anew crosses into the mount)."""
        return self._keep(os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.fd))

    def _keep(self, fd: int) -> int:
        self._open.append(fd)
        return fd

    def pivot(self) -> None:
        """Make this the process's root: ``pivot_root`` from inside it, detach the old root, then check that
        nothing is stacked on ``/`` (``/..`` would lead up into it: the host's root)."""
        os.fchdir(self.fd)
        # pivot_root(".", ".") stacks the old root on the new one; detaching the top of "." takes it off.
        linux.pivot_root(".", ".")
        linux.umount2(".", linux.MNT_DETACH)
        os.chdir("/")
        check_alone()


def check_alone() -> None:
    """Refuse to go on if ``/..`` is not ``/`` in this process: a mount above its root, reachable from inside."""
    here, up = os.stat("/"), os.stat("/..")
    if (here.st_dev, here.st_ino) != (up.st_dev, up.st_ino):
        raise RuntimeError("a mount is still stacked on the sandbox's root after pivot_root; refusing to start")
