"""The local backend's image store: directories that sandboxes use as their read-only root layers.

An imported image is ``<root>/<name>/rootfs`` (one overlay lower layer) beside ``<root>/<name>/image.json``
(its digest and origin). Images are imported from a directory, a rootfs tarball, a ``docker save``
tarball or an OCI image-layout tarball; the image ``default`` is built from the host instead and is
completed at run time by a read-only bind mount of the host's ``/usr``. A *layered* image (pulled from a
registry) has only its ``image.json``, listing layers of the shared layer store
(:mod:`router.backends.local.layer_store`); a name that is a registry reference (``host/repo:tag``) lives in a
directory named ``=<hash of the name>``.

The importer runs as root on the host and unpacks archives nobody reviewed, so every write goes
through :mod:`router.backends.local.layers`, which walks each path one component at a time from a directory file
descriptor with ``O_NOFOLLOW``: a symlink inside an image is never followed while writing, a member
that would be written through one is refused, and so is any ``..``. Device nodes, fifos and sockets
are skipped: a sandbox gets its own ``/dev``, and a device node from an image is a way to the host's
hardware.

Every method blocks (an import can take minutes); async callers run them in a thread.
"""

from __future__ import annotations

import builtins
import fcntl
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grove.core.errors import Conflict, Invalid, NotFound
from router.backends.local import references
from router.backends.local.layer_store import LayerStore, chain_ids, disk_usage
from router.backends.local.layers import fill
from router.backends.local.rootfs_writer import CHUNK, DIR_FLAGS, MAX_DEPTH
from router.backends.local.unpack_limits import Budget, UnpackLimits
from sandbox_image.newroot import MOUNT_POINTS, describe, not_a_directory

DEFAULT = "default"
_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
META_FILE = "image.json"
RETIRED_DIR = ".retired"
_REF_PREFIX = "="
MAX_LAYERS = 24
"""The most layers a sandbox's overlay stacks. A deeper image keeps its lowest ``MAX_LAYERS - 1`` layers
(where a shared base is) and has the rest merged into one layer on top. overlayfs itself stacks up to
500, but every lookup of a name no layer has walks all of them: at 50 layers a sandbox took 1.25x as
long to start as on one layer (perf/README.md), at 24 it is within 1.1x."""
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
# Bumping this rebuilds every host's default image (its layout is code, not data), and so replaces every pool
# member made from it: an upgrade of grove alone should not.
_DEFAULT_LAYOUT = 1
# The dynamic loader's cache of where the host's libraries are. The default image runs the host's /usr, so the host's
# cache is right for it; without one, every dynamically linked command searched a dozen directories per library. A
# default image built before it was copied gets it at its next rebuild (the host's packages change), not at the
# upgrade: until then its commands search as they did. A cache older than the host's libraries is no worse than
# none: a library it does not list, or lists where it no longer is, is looked for in the library directories.
_LD_CACHE = Path("/etc/ld.so.cache")
_HOST_USR_LINKS = ("bin", "sbin", "lib", "lib64")


@dataclass(frozen=True)
class Image:
    """One image in the store, ready to be a sandbox's lower layer."""

    name: str
    """The image's name, unique in its store."""
    rootfs: Path
    """The directory to use as the overlay lower layer."""
    digest: str
    """``sha256:<hex>`` over the rootfs tree (for ``default``, also over the host's packages)."""
    bind_host_usr: bool
    """Whether the sandbox must bind-mount the host's ``/usr`` read-only over ``rootfs/usr``."""
    created_at: float
    """When the image was imported or built (Unix seconds)."""
    source: str
    """What the image was made from: a path, a registry reference, or ``host`` for ``default``."""
    layers: tuple[Path, ...] = ()
    """For a layered image, its layers' directories, lowest first (``rootfs`` is then the topmost)."""
    unusable: str | None = None
    """Why no sandbox may start on it (a mount point that is not a directory: an image stored before grove
    checked), or None. The image store refuses such images; one already stored stays listed, and is refused
    by every create."""

    @property
    def lowers(self) -> tuple[Path, ...]:
        """The overlay lower directories, lowest first: the layers, or the one ``rootfs``."""
        return self.layers or (self.rootfs,)


@dataclass(frozen=True)
class LayerSource:
    """One layer to add to a layered image: its blob and the digest of its uncompressed content."""

    blob: Path
    """The layer tar, plain or gzip/zstd-compressed."""
    diff_id: str
    """``sha256:`` of the uncompressed tar (from the image config); checked while unpacking."""


@dataclass(frozen=True)
class Usage:
    """What an image costs on disk."""

    size: int
    """Bytes of all its layers."""
    shared: int
    """Bytes of the layers it shares with at least one other image."""


class ImageStore:
    """The images under one state directory; safe to share between threads and processes."""

    def __init__(self, root: Path, limits: UnpackLimits | None = None) -> None:
        """Use ``root`` (``<state-dir>/images``), creating it if missing; an image may unpack to ``limits``."""
        self.limits = limits or UnpackLimits()
        self._root = root.absolute()
        self._root.mkdir(parents=True, exist_ok=True)
        self.layers = LayerStore(self._root / "layers", self._root / "blobs")
        self._images: dict[str, tuple[str, tuple[int, int, int, int], Image]] = {}
        """By name: its ``image.json`` path, that file's stat when it was read, and the image (:meth:`get`)."""

    @property
    def root(self) -> Path:
        """The store's directory."""
        return self._root

    def ensure_default(self) -> Image:
        """Return the ``default`` image, (re)building it if missing or if the host's packages changed."""
        fingerprint = _host_fingerprint()
        current = self._current_default(fingerprint)
        if current is not None:
            return current
        with self._locked():
            # Another process may have built it while this one waited for the lock.
            current = self._current_default(fingerprint)
            if current is not None:
                return current
            tmp = self._new_tmp(DEFAULT)
            try:
                _build_default(tmp / "rootfs")
                tree = _tree_digest(tmp / "rootfs")
                digest = "sha256:" + hashlib.sha256(f"{tree}\0{fingerprint}".encode()).hexdigest()
                image = Image(DEFAULT, self._root / DEFAULT / "rootfs", digest, True, time.time(), "host")
                _write_meta(tmp, image, format="host", host_fingerprint=fingerprint)
                replaced = self._swap_in(DEFAULT, tmp, replace=True)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        if replaced is not None:
            self._retire(replaced / DEFAULT)
        return image

    def import_image(
        self, name: str, source: Path, *, force: bool = False, extra: dict[str, Any] | None = None,
        label: str | None = None,
    ) -> Image:
        """Import ``source`` (directory, rootfs tarball, ``docker save`` or OCI layout) as ``name``.

        The import is built beside the store's images and renamed into place at the end, so a failed
        import leaves nothing behind. ``force`` replaces an existing image of that name. ``extra`` is
        recorded in the image's ``image.json``; ``label`` is its ``source`` (default: the path imported from).
        """
        check_name(name)
        if name == DEFAULT:
            raise Invalid("the image name 'default' is reserved for the host image; choose another name")
        if not force and self._dir(name).exists():
            raise Conflict(f"image {name!r} already exists; remove it first or import with force")
        if not source.exists():
            raise NotFound(f"cannot import {str(source)!r}: no such file or directory")
        tmp = self._new_tmp(name)
        try:
            fmt, skipped = fill(tmp / "rootfs", source, tmp, Budget(self.limits, f"image {name!r}"))
            image = Image(
                name, self._dir(name) / "rootfs", _tree_digest(tmp / "rootfs"), False, time.time(),
                label or str(source.absolute()),
            )
            _write_meta(tmp, image, format=fmt, skipped_special_files=skipped, size=disk_usage(tmp / "rootfs"),
                        **(extra or {}))
            with self._locked():
                replaced = self._swap_in(name, tmp, replace=force)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if replaced is not None:
            self._retire(replaced / self._dir(name).name)
        return image

    def add_layered(
        self, name: str, digest: str, layers: builtins.list[LayerSource], source: str, **meta: object
    ) -> Image:
        """Add (or replace) ``name`` as the layers ``layers`` (lowest first) of the shared layer store,
        unpacking those not there yet; ``digest`` is the image's (its manifest's) digest."""
        check_name(name)
        if name == DEFAULT:
            raise Invalid("the image name 'default' is reserved for the host image; choose another name")
        if not _DIGEST.fullmatch(digest):
            raise Invalid(f"not an image digest: {digest!r}")
        chain = chain_ids([layer.diff_id for layer in layers])
        budget = Budget(self.limits, f"image {name!r}")
        with self.layers.importing():
            skipped = 0
            keep = layers if len(layers) <= MAX_LAYERS else layers[: MAX_LAYERS - 1]
            for i, layer in enumerate(keep):
                lowers = [self.layers.path(c) for c in reversed(chain[:i])]
                skipped += self.layers.add(chain[i], layer.diff_id, layer.blob, lowers, budget)
            if len(keep) < len(layers):
                # Deeper than a sandbox's overlay should stack: the top layers merged into one over the
                # shared lower ones (a common base, at the bottom, stays shared).
                merged = "sha256:" + hashlib.sha256(f"merged {chain[-1]}".encode()).hexdigest()
                top = [(layer.diff_id, layer.blob) for layer in layers[len(keep):]]
                below = [self.layers.path(c) for c in reversed(chain[: len(keep)])]
                skipped += self.layers.add_merged(merged, top, below, budget)
                chain = [*chain[: len(keep)], merged]
            return self.name_layers(name, digest, chain, source, skipped_special_files=skipped, **meta)

    def name_layers(self, name: str, digest: str, chain: builtins.list[str], source: str, **meta: object) -> Image:
        """Add (or replace) ``name`` as the layers ``chain`` (chain ids, lowest first) already in the layer
        store; the caller holds :meth:`LayerStore.importing` from the layers' making until this returns."""
        check_name(name)
        if name == DEFAULT:
            raise Invalid("the image name 'default' is reserved for the host image; choose another name")
        tmp = self._new_tmp(name)
        try:
            image = Image(name, self.layers.path(chain[-1]) if chain else self._dir(name) / "rootfs", digest,
                          False, time.time(), source, tuple(self.layers.path(c) for c in chain))
            if not chain:  # an image without layers is an empty root
                (tmp / "rootfs").mkdir(mode=0o755)
            _write_meta(tmp, image, format="layered", layers=chain, **meta)
            with self._locked():
                replaced = self._swap_in(name, tmp, replace=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if replaced is not None:
            self._retire(replaced / self._dir(name).name)
        return image

    def meta(self, name: str) -> dict[str, Any]:
        """What the image's ``image.json`` records (its config, its build); NotFound if there is no such image."""
        self.get(name)
        try:
            return self._meta(name)
        except FileNotFoundError:
            raise NotFound(f"image {name!r} was removed just now") from None

    def usage(self) -> dict[str, Usage]:
        """Each image's bytes on disk and how many of them it shares with other images (``default`` has none)."""
        chains: dict[str, builtins.list[str]] = {}
        for name in self._names():
            with suppress(FileNotFoundError):  # removed since _names() looked
                chains[name] = self._meta(name).get("layers") or []
        users: dict[str, int] = {}
        for chain in chains.values():
            for layer in set(chain):
                users[layer] = users.get(layer, 0) + 1
        return {
            name: Usage(sum(self.layers.size(c) for c in set(chain)) or int(self._meta(name).get("size") or 0),
                        sum(self.layers.size(c) for c in set(chain) if users[c] > 1))
            for name, chain in chains.items()
        }

    def collect_layers(self) -> builtins.list[str]:
        """Delete the layers no image uses, current or retired (kept for its sandboxes)."""
        keep: set[str] = set()
        keep_blobs: set[str] = set()
        # Images in place, retired, and half-way through a replace or remove (``.old-*/``, ``.rm-*/``);
        # never a file of an image's own tree (``<name>/rootfs/image.json`` is the image's content).
        metas = [*self._root.glob(f"*/{META_FILE}"), *(
            p for p in self._root.glob(f".*/*/{META_FILE}") if p.parent.name != "rootfs"
        )]
        for path in metas:
            with suppress(OSError, ValueError):
                meta = json.loads(path.read_text())
                keep.update(meta.get("layers") or [])
                keep_blobs.update(meta.get("blobs") or [])
        # A pull's scratch directory exists only while it holds the import lock: any seen here is a killed pull's.
        return self.layers.remove_unused(keep, keep_blobs, scratch=list(self._root.glob(".pull-*")))

    def get(self, name: str) -> Image:
        """The image called ``name``; NotFound (listing the known names) if there is none.

        Built once per version of its ``image.json``: every create and claim looks its image up (a burst's
        thousand claims, the same one), and a stat costs a fraction of the read, the parse and the paths.
        An image is only ever replaced by renaming a whole new directory into place: a new inode."""
        check_name(name)
        cached = self._images.get(name)
        path = cached[0] if cached is not None else str(self._dir(name) / META_FILE)
        try:
            info = os.stat(path)
            version = (info.st_dev, info.st_ino, info.st_mtime_ns, info.st_size)
            if cached is not None and cached[1] == version:
                return cached[2]
            meta = self._meta(name)
        except FileNotFoundError:
            known = ", ".join(self._names()) or "none"
            hint = " (the local backend builds it when it starts)" if name == DEFAULT else ""
            pull = " (pull it first: grove image pull REF)" if references.is_reference(name) else ""
            raise NotFound(f"no image {name!r}{hint}{pull}; known images: {known}") from None
        image = self._image(name, self._dir(name), meta)
        self._images[name] = (path, version, image)
        return image

    def _image(self, name: str, directory: Path, meta: dict[str, Any]) -> Image:
        layers = tuple(self.layers.path(str(c)) for c in meta.get("layers") or [])
        rootfs = layers[-1] if layers else directory / "rootfs"
        return Image(
            name, rootfs, meta["digest"], meta["bind_host_usr"], meta["created_at"], meta["source"], layers,
            unusable=_mount_point_problem(layers or (rootfs,)),
        )

    def _meta(self, name: str) -> dict[str, Any]:
        """The image's ``image.json``; FileNotFoundError if there is no such image."""
        meta = json.loads((self._dir(name) / META_FILE).read_text())
        assert isinstance(meta, dict)
        return meta

    def list(self) -> builtins.list[Image]:
        """Every image in the store, sorted by name."""
        images = []
        for name in self._names():
            with suppress(NotFound):  # removed since _names() looked
                images.append(self.get(name))
        return images

    def remove(self, name: str) -> None:
        """Delete the image ``name``; ``default`` belongs to the host and cannot be removed."""
        check_name(name)
        if name == DEFAULT:
            raise Invalid("the 'default' image is built from the host and cannot be removed")
        key = self._dir(name).name
        with self._locked():
            if not (self._root / key / META_FILE).exists():
                raise NotFound(f"no image {name!r}; known images: {', '.join(self._names()) or 'none'}")
            # Renamed first so that no reader ever sees a half-deleted image.
            doomed = Path(tempfile.mkdtemp(prefix=f".rm-{key}-", dir=self._root))
            os.rename(self._root / key, doomed / key)
        self._retire(doomed / key)

    def version(self, name: str, digest: str) -> Image:
        """The image ``name`` as it was at ``digest``: the current one, or the retired copy a sandbox
        made from it keeps (an image replaced or removed while sandboxes use it stays until they are
        gone). A sandbox must resume over the very layer it was made on."""
        with suppress(NotFound):
            current = self.get(name)
            if current.digest == digest:
                return current
        retired = self._retired_dir(digest)
        try:
            meta = json.loads((retired / META_FILE).read_text())
        except FileNotFoundError:
            raise Conflict(
                f"image {name!r} was replaced or removed after this sandbox was made from it, and its "
                f"original ({digest}) is gone; the sandbox cannot be resumed, delete it"
            ) from None
        return self._image(name, retired, meta)

    def collect_retired(self, keep: set[str]) -> builtins.list[str]:
        """Delete retired images whose digest is not in ``keep`` (the digests sandboxes still use)."""
        deleted = []
        retired_root = self._root / RETIRED_DIR
        for path in retired_root.iterdir() if retired_root.is_dir() else ():
            digest = f"sha256:{path.name}"
            if digest not in keep:
                shutil.rmtree(path, ignore_errors=True)
                deleted.append(digest)
        if deleted:
            self.collect_layers()
        return deleted

    def _retire(self, old: Path) -> None:
        """Keep a replaced or removed image (``old``: its directory, already out of the store's names)
        under ``.retired/<digest>`` for the sandboxes made from it; its parent temp dir goes."""
        try:
            digest = json.loads((old / META_FILE).read_text())["digest"]
            target = self._retired_dir(digest)
            target.parent.mkdir(exist_ok=True)
            if not target.exists():
                os.rename(old, target)
        except (OSError, ValueError, KeyError):
            pass  # no readable digest: nothing could ask for it by digest
        shutil.rmtree(old.parent, ignore_errors=True)

    def has_retired(self) -> bool:
        """Whether any retired image waits for its sandboxes to go (a cheap check before a collection)."""
        retired_root = self._root / RETIRED_DIR
        return retired_root.is_dir() and any(retired_root.iterdir())

    def _retired_dir(self, digest: str) -> Path:
        if not _DIGEST.fullmatch(digest):
            raise Invalid(f"not an image digest: {digest!r}")
        return self._root / RETIRED_DIR / digest.removeprefix("sha256:")

    def _names(self) -> builtins.list[str]:
        names = []
        for p in self._root.iterdir():
            if _NAME.fullmatch(p.name) and (p / META_FILE).exists():
                names.append(p.name)
            elif p.name.startswith(_REF_PREFIX):
                with suppress(OSError, ValueError, KeyError):
                    names.append(str(json.loads((p / META_FILE).read_text())["name"]))
        return sorted(names)

    def _dir(self, name: str) -> Path:
        """Where the image ``name`` lives: ``<root>/<name>``, or for a registry reference (which may hold
        ``/`` and ``:``) ``<root>/=<hash>``."""
        if _NAME.fullmatch(name):
            return self._root / name
        return self._root / (_REF_PREFIX + hashlib.sha256(name.encode()).hexdigest()[:40])

    def _current_default(self, fingerprint: str) -> Image | None:
        try:
            meta = json.loads((self._root / DEFAULT / META_FILE).read_text())
        except FileNotFoundError:
            return None
        if meta.get("host_fingerprint") != fingerprint:
            return None
        return self.get(DEFAULT)

    def _new_tmp(self, name: str) -> Path:
        # Beside the final directory (same filesystem), so that the last step is one rename.
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{self._dir(name).name}-", dir=self._root))
        tmp.chmod(0o755)
        return tmp

    def _swap_in(self, name: str, tmp: Path, *, replace: bool) -> Path | None:
        """Move a finished ``tmp`` into place as ``name``; return what it replaced, for deleting.

        The caller holds the store lock, and deletes the old tree after releasing it.
        """
        final = self._dir(name)
        if not final.exists():
            os.rename(tmp, final)
            return None
        if not replace:
            raise Conflict(f"image {name!r} already exists; remove it first or import with force")
        old = Path(tempfile.mkdtemp(prefix=f".old-{final.name}-", dir=self._root))
        os.rename(final, old / final.name)
        os.rename(tmp, final)
        return old

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with open(self._root / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield


def _mount_point_problem(lowers: tuple[Path, ...]) -> str | None:
    """What is wrong with the image's mount points as its overlay shows them (``lowers``: lowest first), or None.

    The topmost layer that has the name decides, as in overlayfs: a whiteout (a 0/0 character device) hides
    it, a directory is fine, anything else is refused. Sandbox init checks the merged root again at start.
    """
    for name in MOUNT_POINTS:
        for layer in reversed(lowers):
            try:
                st = os.lstat(layer / name)
            except (FileNotFoundError, NotADirectoryError):
                continue
            if stat.S_ISDIR(st.st_mode) or (stat.S_ISCHR(st.st_mode) and st.st_rdev == 0):
                break
            target = os.readlink(layer / name) if stat.S_ISLNK(st.st_mode) else None
            return not_a_directory(name, describe(st, target))
    return None


def check_name(name: str) -> None:
    """Invalid, saying what a name looks like, unless ``name`` is a valid image name or registry reference."""
    if references.is_reference(name):
        references.parse(name)  # Invalid, saying what a reference looks like
        return
    if not _NAME.fullmatch(name):
        raise Invalid(
            f"invalid image name {name!r}: use 1-63 characters of a-z, 0-9, '.', '_' and '-', "
            "starting with a letter or digit"
        )


def _write_meta(directory: Path, image: Image, **extra: object) -> None:
    meta = {
        "name": image.name, "digest": image.digest, "bind_host_usr": image.bind_host_usr,
        "created_at": image.created_at, "source": image.source, **extra,
    }
    (directory / META_FILE).write_text(json.dumps(meta, indent=1) + "\n")


# --- the default image ------------------------------------------------------------------------------

_ETC = {
    "passwd": "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
    "group": "root:x:0:\nnogroup:x:65534:\n",
    "hosts": "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n",
    "hostname": "sandbox\n",
    "nsswitch.conf": "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\nnetworks: files\n"
    "protocols: files\nservices: files\n",
    # Empty: egress is denied by default, and a sandbox that may reach the network gets its own.
    "resolv.conf": "",
}


def _host_fingerprint() -> str:
    """What the default image depends on besides its own tree: the host's packages and python3."""
    h = hashlib.sha256(f"layout {_DEFAULT_LAYOUT}\0".encode())
    for path in ("/var/lib/dpkg/status", "/etc/os-release"):
        with suppress(FileNotFoundError):
            h.update(Path(path).read_bytes())
        h.update(b"\0")
    try:
        done = subprocess.run(["/usr/bin/python3", "--version"], capture_output=True, timeout=30, check=False)
        h.update(done.stdout + done.stderr)
    except FileNotFoundError:
        pass
    h.update(" ".join(_host_usr_links()).encode())
    return "sha256:" + h.hexdigest()


def _host_usr_links() -> builtins.list[str]:
    return [name for name in _HOST_USR_LINKS if os.path.isdir(f"/usr/{name}")]


def _build_default(rootfs: Path) -> None:
    rootfs.mkdir(mode=0o755)
    for rel, mode in (
        ("usr", 0o755), ("etc", 0o755), ("root", 0o700), ("tmp", 0o1777), ("proc", 0o555), ("dev", 0o755),
        ("sys", 0o555), ("run", 0o755), ("workspace", 0o755), ("var", 0o755), ("var/tmp", 0o1777),
    ):
        (rootfs / rel).mkdir()
        os.chmod(rootfs / rel, mode)  # explicit: mkdir's mode is cut by the umask
    for name in _host_usr_links():
        os.symlink(f"usr/{name}", rootfs / name)
    try:
        os_release = Path("/etc/os-release").read_text()
    except FileNotFoundError:
        os_release = 'NAME="grove sandbox"\nID=grove\n'
    for name, text in {**_ETC, "os-release": os_release}.items():
        (rootfs / "etc" / name).write_text(text)
        os.chmod(rootfs / "etc" / name, 0o644)
    os.symlink("../proc/self/mounts", rootfs / "etc" / "mtab")
    with suppress(FileNotFoundError):  # a host without one: commands search the library directories, as before
        shutil.copyfile(_LD_CACHE, rootfs / "etc" / "ld.so.cache")
        os.chmod(rootfs / "etc" / "ld.so.cache", 0o644)


# --- digests ----------------------------------------------------------------------------------------


def _tree_digest(rootfs: Path) -> str:
    """``sha256:`` over every entry: path, type, mode, owner, and content or link target.

    Entries are visited depth first in sorted byte order, so the digest depends only on the tree.
    Times are left out: two imports of the same content have the same digest.
    """
    h = hashlib.sha256()

    def walk(dir_fd: int, prefix: bytes, depth: int) -> None:
        for name in sorted(os.listdir(dir_fd), key=os.fsencode):
            st = os.lstat(name, dir_fd=dir_fd)
            rel = prefix + os.fsencode(name)
            head = b"%s\0%o\0%d\0%d\0" % (rel, st.st_mode, st.st_uid, st.st_gid)
            if stat.S_ISREG(st.st_mode):
                content = hashlib.sha256()
                with os.fdopen(os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dir_fd), "rb") as f:
                    while chunk := f.read(CHUNK):
                        content.update(chunk)
                h.update(head + b"%d\0%s\n" % (st.st_size, content.hexdigest().encode()))
            elif stat.S_ISLNK(st.st_mode):
                h.update(head + os.fsencode(os.readlink(name, dir_fd=dir_fd)) + b"\n")
            else:
                h.update(head + b"\n")
            if stat.S_ISDIR(st.st_mode) and depth < MAX_DEPTH:
                sub = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
                try:
                    walk(sub, rel + b"/", depth + 1)
                finally:
                    os.close(sub)

    top = os.open(rootfs, DIR_FLAGS)
    try:
        walk(top, b"", 0)
    finally:
        os.close(top)
    return "sha256:" + h.hexdigest()


# --- import -----------------------------------------------------------------------------------------
