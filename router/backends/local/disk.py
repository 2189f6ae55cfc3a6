"""Per-sandbox disk images: the router's side of :mod:`sandbox_image.disk`.

Each sandbox's writable layer lives in ``<state>/sandboxes/<id>/disk.img``, a sparse file holding an
ext4 filesystem of the sandbox's ``disk_mb``. Formatting one costs a ``mkfs`` run (tens of ms), so
each size is formatted once, as a template under ``<state>/disk-templates/``, and a sandbox gets a
sparse copy of it: only the metadata mkfs wrote is copied (0.2 MiB for 10 GiB), the rest stays holes.

The image grows as the sandbox writes, up to its size and no further; being sparse, the images of all
sandboxes together may promise more than the host's disk has (overcommit, as with thin volumes).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import subprocess
import time
from pathlib import Path

from grove.core.errors import Unavailable

IMAGE_NAME = "disk.img"
LOOP_CONTROL = Path("/dev/loop-control")
# No reserved blocks (root in the sandbox gets all of its quota), no journal (the layer lives as long
# as the sandbox, and a journal would cost writes on every change), no blocks reserved for growing the
# filesystem online (4 MiB of the 4.2 a 10 GiB template would hold; a quota never grows), and nothing
# zeroed: a sparse file reads as zeros already, so the inode tables are marked initialised and the
# kernel's lazy-init thread never writes them out (which would fill in the file's holes).
_MKFS = ["-q", "-F", "-m", "0", "-O", "^has_journal,^resize_inode",
         "-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard,assume_storage_prezeroed=1"]
_MKFS_TIMEOUT_S = 60.0
# Templates are named for the options they were made with, so a change of options makes new ones.
_FORMAT = hashlib.sha256(" ".join(_MKFS).encode()).hexdigest()[:8]
# Every size asked for gets a template (0.1 MiB for 64 MiB, 12 MiB for 1 TiB): keep the most recently used
# ones only, or clients asking for ever new sizes would fill the state dir with them.
KEPT_TEMPLATES = 16
_CHUNK = 1 << 30
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


class DiskTemplates:
    """Formatted, empty ext4 images, one per size, made on first use."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self._maps: dict[str, tuple[tuple[int, int, int], list[tuple[int, int]]]] = {}
        """Where each template holds data: path → ((device, inode, size), [(start, end), ...]). Found once
        (two seeks per extent, some forty system calls): a template never changes once renamed into place."""

    def template(self, size_mb: int) -> Path:
        """The template of ``size_mb`` MiB, formatting it if it is not there yet."""
        path = self._root / f"{size_mb}m-{_FORMAT}.img"
        with contextlib.suppress(FileNotFoundError):
            os.utime(path)  # recently used: kept
            return path
        self._root.mkdir(parents=True, exist_ok=True)
        # Formatted under a private name and renamed into place: a concurrent create of the same size
        # formats its own and one rename wins; no one ever copies a half-made template.
        tmp = self._root / f".{size_mb}m.{os.getpid()}.{time.monotonic_ns()}.tmp"
        try:
            with open(tmp, "wb") as fh:
                fh.truncate(size_mb * 1024 * 1024)
            done = subprocess.run([_mkfs(), *_MKFS, str(tmp)], capture_output=True, timeout=_MKFS_TIMEOUT_S,
                                  check=False)
            if done.returncode != 0:
                raise Unavailable(f"formatting a {size_mb} MiB sandbox disk failed: "
                                  f"{done.stderr.decode(errors='replace').strip()}")
            self._maps.pop(str(path), None)
            os.replace(tmp, path)
        except OSError as exc:
            if exc.errno in _NO_SPACE:  # the state disk is full: the router says so in its own words
                raise
            raise Unavailable(f"cannot make a {size_mb} MiB sandbox disk under {self._root}: {exc}") from exc
        finally:
            tmp.unlink(missing_ok=True)
        self._prune()
        return path

    def _prune(self) -> None:
        """Remove all but the most recently used templates (one being copied stays readable: its fd is open)."""
        found = []
        for entry in os.scandir(self._root):
            if entry.name.endswith(".img"):
                with contextlib.suppress(FileNotFoundError):
                    found.append((entry.stat().st_mtime_ns, entry.path))
        for _, stale in sorted(found, reverse=True)[KEPT_TEMPLATES:]:
            self._maps.pop(stale, None)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(stale)

    def _copy(self, template: Path, dest: Path) -> None:
        """A sparse copy of ``template`` at ``dest``, from the template's data map (found at its first copy)."""
        fin = os.open(template, os.O_RDONLY | os.O_CLOEXEC)
        try:
            st = os.fstat(fin)
            identity = (st.st_dev, st.st_ino, st.st_size)
            known = self._maps.get(str(template))
            if known is None or known[0] != identity:
                known = identity, data_ranges(fin, st.st_size)
                self._maps[str(template)] = known
            fout = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
            try:
                copy_ranges(fin, fout, known[1], st.st_size)
            finally:
                os.close(fout)
        finally:
            os.close(fin)

    def make_image(self, size_mb: int, dest: Path) -> None:
        """Give a sandbox its own empty disk image of ``size_mb`` MiB at ``dest``."""
        try:
            self._copy(self.template(size_mb), dest)
        except OSError as exc:
            dest.unlink(missing_ok=True)
            if exc.errno in _NO_SPACE:
                raise
            raise Unavailable(f"cannot make the sandbox disk {dest}: {exc}") from exc


def check_host() -> None:
    """Fail early and clearly when the host cannot give sandboxes disks: no loop devices, no mkfs.ext4."""
    if not LOOP_CONTROL.exists():
        # The loop driver may be a module nobody has loaded yet (a fresh VM): load it.
        modprobe = shutil.which("modprobe", path=sbin_path())
        if modprobe is not None:
            subprocess.run([modprobe, "loop"], capture_output=True, timeout=30, check=False)
    if not LOOP_CONTROL.exists():
        raise Unavailable(f"{LOOP_CONTROL} is missing: sandbox disks need the kernel's loop device driver "
                          "(modprobe loop; in a container, pass the host's loop devices in)")
    _mkfs()


def sbin_path() -> str:
    """PATH with the sbin directories, where mkfs and mount helpers live."""
    # Not every caller's PATH has the sbin directories (a non-login shell, a systemd unit's default).
    return os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])


def _mkfs() -> str:
    found = shutil.which("mkfs.ext4", path=sbin_path())
    if found is None:
        raise Unavailable("mkfs.ext4 is not installed (Debian package e2fsprogs); sandbox disks need it")
    return found


def data_ranges(fd: int, size: int) -> list[tuple[int, int]]:
    """The ``(start, end)`` byte ranges of an open file that hold data; the rest of its ``size`` is holes."""
    ranges = []
    offset = 0
    while offset < size:
        try:
            start = os.lseek(fd, offset, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # only a hole from here to the end
                break
            raise
        end = os.lseek(fd, start, os.SEEK_HOLE)
        ranges.append((start, end))
        offset = end
    return ranges


def copy_ranges(fin: int, fout: int, ranges: list[tuple[int, int]], size: int) -> None:
    """Copy those ranges of ``fin`` to the same offsets of ``fout`` (copy_file_range), and make it ``size`` long."""
    for start, end in ranges:
        pos = start
        while pos < end:
            try:
                copied = os.copy_file_range(fin, fout, min(end - pos, _CHUNK), pos, pos)
            except OSError as exc:
                if exc.errno != errno.EXDEV:
                    raise
                # Across file systems of different kinds (the state dir's ext4 to the sandboxes' XFS volume)
                # the kernel copies no range: through user space then, a megabyte at a time.
                copied = os.pwrite(fout, os.pread(fin, min(end - pos, 1 << 20), pos), pos)
            if copied == 0:
                raise OSError(errno.EIO, "the template shrank while being copied")
            pos += copied
    os.ftruncate(fout, size)


def attached_loops(image: Path, among: list[str] | None = None) -> list[str]:
    """The loop devices (``loopN``) whose backing file is ``image`` (also once it has been deleted).

    ``among``: look only at these devices (a wait for a detach polls the ones found holding the image,
    not every loop device of the host: there can be a thousand, read each time).
    """
    wanted = str(image)
    return [name for name, backing in _backings(among if among is not None else _bound_loops())
            if _holds(backing, wanted)]


def held_images(images: list[Path]) -> set[Path]:
    """Those of ``images`` some loop device still holds, from one scan of the loop devices for all of them (a
    batch of deletes: :mod:`router.backends.local.teardown`)."""
    backings = {backing for _, backing in _backings(_bound_loops())}
    return {image for image in images if not backings.isdisjoint(_names_of(str(image)))}


def _names_of(path: str) -> list[str]:
    """Every backing-file name under which a loop device holds the file ``path`` (see :func:`_holds`)."""
    parts = path.split("/")
    return [path, *("/" + "/".join(parts[i:]) for i in range(2, len(parts) - 1))]


def _backings(names: list[str]) -> list[tuple[str, str]]:
    """``(loopN, backing file)`` of those of the loop devices that are attached."""
    found = []
    for name in names:
        # os-level calls: three system calls where open().read() makes nine, each one a release of the GIL
        # (a scan reads a file for each sandbox running on the host, from a thread beside the event loop).
        try:
            fd = os.open(f"/sys/block/{name}/loop/backing_file", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:  # not attached (no loop/ directory) or detached meanwhile
            continue
        try:
            backing = os.read(fd, 8192).decode("utf-8", "replace").rstrip("\n")  # a path: < PATH_MAX + suffix
        except OSError:
            continue
        finally:
            os.close(fd)
        found.append((name, backing.removesuffix(" (deleted)")))
    return found


def _holds(backing: str, wanted: str) -> bool:
    """Whether a loop device whose backing file reads ``backing`` holds the file ``wanted``."""
    # On the checkpoint volume (router/backends/local/cow.py) the kernel names the file from that volume's
    # root: the sandbox's copy of the mount was detached with its old root at pivot_root, so
    # ``<state>/sandboxes/<id>/disk.img`` reads ``/<id>/disk.img``.
    return backing == wanted or (backing.startswith("/") and wanted.endswith(backing) and backing.count("/") >= 2)


def _bound_loops() -> list[str]:
    """The loop devices that may have a backing file: those ``/proc/partitions`` lists.

    The kernel leaves devices of zero capacity out of that file, and a bound loop device's capacity is its
    backing file's size (``LOOP_CONFIGURE`` sets it before the device counts as bound; a detach drops the
    backing file before the size): so every device holding a sandbox's image (a formatted, non-empty
    file) is listed, and the free ones, which on a host that ran a thousand sandboxes number a thousand
    (a loop device, once made, stays), are not. One read of it costs ~0.1 ms where trying every device's
    ``backing_file`` cost ~6 ms there. Without it (no ``/proc``), every loop device of ``/sys/block`` is tried.
    """
    try:
        with open("/proc/partitions", encoding="ascii", errors="replace") as fh:
            lines = fh.read().splitlines()[2:]  # a header and a blank line
    except OSError:
        try:
            return [name for name in os.listdir("/sys/block") if name.startswith("loop")]
        except OSError:
            return []
    names = (line.split()[-1] for line in lines if line.strip())
    return [name for name in names if name.startswith("loop")]
