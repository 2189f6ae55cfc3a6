"""Copy-on-write file clones for checkpoints, and the volume that makes them possible.

A checkpoint of a local sandbox is a clone of its ``disk.img``: ``FICLONE`` (a reflink) shares every block
with the original, so it costs a metadata update whatever the image holds, and only the blocks either side
later writes are stored twice. That needs a file system that reflinks (XFS made with ``-m reflink=1``,
btrfs); the host's own is often ext4, which does not. So, when the state dir's ``sandboxes/`` cannot
reflink, the router makes a sparse XFS image file ``<state>/cow.img`` and loop-mounts it on ``sandboxes/``
(:class:`CowVolume`), keeps it mounted across restarts while sandboxes live, and unmounts it when the last
one is gone and the router stops. Device-mapper thin snapshots would do too, but are not available on these
hosts; an overlay layer cannot be stacked under a live mount.

Where there is no such volume (the state dir is too small to hold one, or ``mkfs.xfs`` is missing, or
``sandboxes/`` already held sandboxes on the plain file system), :func:`clone` falls back to a sparse full
copy: correct, but its time and storage grow with the data the sandbox holds, and the router says so once
in its log.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import shutil
import subprocess
import time
from pathlib import Path

from grove.core.errors import Unavailable
from router.backends.local import disk

log = logging.getLogger("grove.router")

FICLONE = 0x40049409
"""``_IOW(0x94, 9, int)``: make the destination file share all of the source's blocks."""
VOLUME_IMAGE = "cow.img"
MIN_VOLUME_BYTES = 4 << 30
"""A state dir's file system smaller than this gets no volume (an XFS log alone takes tens of MiB)."""
_NO_REFLINK = (errno.EOPNOTSUPP, errno.EXDEV, errno.EINVAL, errno.ENOTTY)
_TOOL_TIMEOUT_S = 60.0
_DETACH_S = 45.0


def clone(src: Path, dst: Path) -> bool:
    """Make ``dst`` a copy of ``src``: a reflink where the file system can (True), else a sparse copy (False)."""
    fin = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fout = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            try:
                fcntl.ioctl(fout, FICLONE, fin)
                return True
            except OSError as exc:
                if exc.errno not in _NO_REFLINK:
                    raise
            size = os.fstat(fin).st_size
            disk.copy_ranges(fin, fout, disk.data_ranges(fin, size), size)
            return False
        finally:
            os.close(fout)
    except BaseException:
        dst.unlink(missing_ok=True)
        raise
    finally:
        os.close(fin)


def reflinks(directory: Path) -> bool:
    """Whether files in ``directory`` can be reflinked (a probe: two small files, cloned, removed)."""
    src, dst = directory / ".reflink-probe", directory / ".reflink-probe.clone"
    try:
        src.write_bytes(b"grove")
        fin = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
        try:
            fout = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                fcntl.ioctl(fout, FICLONE, fin)
                return True
            except OSError:
                return False
            finally:
                os.close(fout)
        finally:
            os.close(fin)
    finally:
        src.unlink(missing_ok=True)
        dst.unlink(missing_ok=True)


def mounted_at(path: Path) -> bool:
    """Whether something is mounted exactly at ``path`` (in the router's mount namespace)."""
    wanted = str(path)
    with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as fh:
        return any(line.split()[4] == wanted for line in fh)


class CowVolume:
    """The reflink-capable file system under a state dir's ``sandboxes/`` (see the module docstring)."""

    def __init__(self, state_dir: Path, sandboxes: Path) -> None:
        self._image = state_dir / VOLUME_IMAGE
        self._mount = sandboxes
        self.reflinks = False
        """Whether checkpoints are reflinks here (known after :meth:`open`)."""

    def open(self) -> None:
        """Make sure ``sandboxes/`` reflinks: mount the volume (made on first use) unless it already does."""
        self._mount.mkdir(parents=True, exist_ok=True)
        if not mounted_at(self._mount) and not reflinks(self._mount):
            why = self._why_no_volume()
            if why is None:
                self._make_and_mount()
            else:
                log.warning("checkpoints of local sandboxes are full copies here (time and space grow with a "
                            "sandbox's data): %s", why)
        self.reflinks = reflinks(self._mount)

    def _why_no_volume(self) -> str | None:
        if shutil.which("mkfs.xfs", path=disk.sbin_path()) is None:
            return "mkfs.xfs is not installed (Debian package xfsprogs)"
        if any(self._mount.iterdir()):
            return f"{self._mount} already holds sandboxes on a file system that cannot reflink"
        st = os.statvfs(self._mount)
        if st.f_blocks * st.f_frsize < MIN_VOLUME_BYTES:
            return f"the state dir's file system is smaller than {MIN_VOLUME_BYTES >> 30} GiB"
        return None

    def _make_and_mount(self) -> None:
        if not self._image.exists():
            st = os.statvfs(self._mount)
            tmp = self._image.with_name(VOLUME_IMAGE + ".tmp")
            try:
                with open(tmp, "wb") as fh:  # sparse: it takes host space only as sandboxes write
                    fh.truncate(st.f_blocks * st.f_frsize)
                run_tool([shutil.which("mkfs.xfs", path=disk.sbin_path()) or "mkfs.xfs", "-q", "-f", "-m",
                          "reflink=1", str(tmp)], "format the checkpoint volume")
                os.replace(tmp, self._image)
            finally:
                tmp.unlink(missing_ok=True)
        # discard: blocks freed inside (a deleted sandbox or checkpoint) are punched out of the image file.
        run_tool(["mount", "-t", "xfs", "-o", "loop,discard,nosuid,nodev", str(self._image), str(self._mount)],
             "mount the checkpoint volume")
        os.chmod(self._mount, 0o700)

    def close(self) -> None:
        """Unmount the volume once no sandbox is left on it (its loop device detaches with the mount), and
        remove its image: nothing of it outlives the router's last sandbox."""
        if not mounted_at(self._mount) or any(self._mount.iterdir()):
            return
        done = subprocess.run(["umount", str(self._mount)], capture_output=True, timeout=_TOOL_TIMEOUT_S, check=False)
        if done.returncode != 0:
            log.warning("could not unmount the checkpoint volume %s: %s", self._mount, done.stderr.decode().strip())
            return
        with contextlib.suppress(FileNotFoundError):
            self._image.unlink()
        # The loop device lets go of the image once the file system is released everywhere: after the unmount
        # here, and after the last sandbox disk on it (a loop device of its own, detached by the kernel a moment
        # after its sandbox ended; slower on a loaded host) let go of its file.
        deadline = time.monotonic() + _DETACH_S
        while held := disk.attached_loops(self._image):
            if time.monotonic() > deadline:
                log.warning("the checkpoint volume's loop device %s still holds %s; the kernel detaches it once "
                            "its last user lets go", ", ".join(held), self._image)
                break
            time.sleep(0.02)


def run_tool(argv: list[str], what: str) -> None:
    """Run a mount or mkfs tool; ``Unavailable`` naming what failed and its error output if it fails."""
    done = subprocess.run(argv, capture_output=True, timeout=_TOOL_TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise Unavailable(f"could not {what} ({' '.join(argv)}): {done.stderr.decode(errors='replace').strip()}")
