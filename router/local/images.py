"""The local backend's image store: directories that sandboxes use as their read-only root layer.

Each image is ``<root>/<name>/rootfs`` (the overlay lower layer) beside ``<root>/<name>/image.json``
(its digest and origin). Images are imported from a directory, a rootfs tarball, a ``docker save``
tarball or an OCI image-layout tarball; the image ``default`` is built from the host instead and is
completed at run time by a read-only bind mount of the host's ``/usr``.

The importer runs as root on the host and unpacks archives nobody reviewed, so every write goes
through :class:`_Writer`, which walks each path one component at a time from a directory file
descriptor with ``O_NOFOLLOW``: a symlink inside an image is never followed while writing, a member
that would be written through one is refused, and so is any ``..``. Device nodes, fifos and sockets
are skipped: a sandbox gets its own ``/dev``, and a device node from an image is a way to the host's
hardware.

Every method blocks (an import can take minutes); async callers run them in a thread.
"""

from __future__ import annotations

import builtins
import bz2
import errno
import fcntl
import gzip
import hashlib
import json
import lzma
import os
import platform
import posixpath
import re
import shutil
import stat
import subprocess
import tarfile
import tempfile
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

import zstandard

from grove.errors import Conflict, Invalid, NotFound

DEFAULT = "default"
_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
_META = "image.json"
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
# Deeper trees would exhaust file descriptors and the recursion limit; no real image comes close.
_MAX_DEPTH = 256
_CHUNK = 1 << 20
_WH = ".wh."
_OPAQUE = ".wh..wh..opq"
_COMPRESSED = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz", b"\x28\xb5\x2f\xfd": "zstd"}
# Bumping this rebuilds every host's default image (its layout is code, not data).
_DEFAULT_LAYOUT = 1
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
    """What the image was made from: a path, or ``host`` for ``default``."""


class ImageStore:
    """The images under one state directory; safe to share between threads and processes."""

    def __init__(self, root: Path) -> None:
        """Use ``root`` (``<state-dir>/images``), creating it if missing."""
        self._root = root.absolute()
        self._root.mkdir(parents=True, exist_ok=True)

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
            shutil.rmtree(replaced)
        return image

    def import_image(self, name: str, source: Path, *, force: bool = False) -> Image:
        """Import ``source`` (directory, rootfs tarball, ``docker save`` or OCI layout) as ``name``.

        The import is built beside the store's images and renamed into place at the end, so a failed
        import leaves nothing behind. ``force`` replaces an existing image of that name.
        """
        _check_name(name)
        if name == DEFAULT:
            raise Invalid("the image name 'default' is reserved for the host image; choose another name")
        if not force and (self._root / name).exists():
            raise Conflict(f"image {name!r} already exists; remove it first or import with force")
        if not source.exists():
            raise NotFound(f"cannot import {str(source)!r}: no such file or directory")
        tmp = self._new_tmp(name)
        try:
            fmt, skipped = _fill(tmp / "rootfs", source, tmp)
            image = Image(
                name, self._root / name / "rootfs", _tree_digest(tmp / "rootfs"), False, time.time(),
                str(source.absolute()),
            )
            _write_meta(tmp, image, format=fmt, skipped_special_files=skipped)
            with self._locked():
                replaced = self._swap_in(name, tmp, replace=force)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if replaced is not None:
            shutil.rmtree(replaced)
        return image

    def get(self, name: str) -> Image:
        """The image called ``name``; NotFound (listing the known names) if there is none."""
        _check_name(name)
        try:
            meta = json.loads((self._root / name / _META).read_text())
        except FileNotFoundError:
            known = ", ".join(self._names()) or "none"
            hint = " (the local backend builds it when it starts)" if name == DEFAULT else ""
            raise NotFound(f"no image {name!r}{hint}; known images: {known}") from None
        return Image(
            name, self._root / name / "rootfs", meta["digest"], meta["bind_host_usr"],
            meta["created_at"], meta["source"],
        )

    def list(self) -> builtins.list[Image]:
        """Every image in the store, sorted by name."""
        images = []
        for name in self._names():
            with suppress(NotFound):  # removed since _names() looked
                images.append(self.get(name))
        return images

    def remove(self, name: str) -> None:
        """Delete the image ``name``; ``default`` belongs to the host and cannot be removed."""
        _check_name(name)
        if name == DEFAULT:
            raise Invalid("the 'default' image is built from the host and cannot be removed")
        with self._locked():
            if not (self._root / name / _META).exists():
                raise NotFound(f"no image {name!r}; known images: {', '.join(self._names()) or 'none'}")
            # Renamed first so that no reader ever sees a half-deleted image.
            doomed = Path(tempfile.mkdtemp(prefix=f".rm-{name}-", dir=self._root))
            os.rename(self._root / name, doomed / name)
        shutil.rmtree(doomed)

    def _names(self) -> builtins.list[str]:
        return sorted(p.name for p in self._root.iterdir() if _NAME.fullmatch(p.name) and (p / _META).exists())

    def _current_default(self, fingerprint: str) -> Image | None:
        try:
            meta = json.loads((self._root / DEFAULT / _META).read_text())
        except FileNotFoundError:
            return None
        if meta.get("host_fingerprint") != fingerprint:
            return None
        return self.get(DEFAULT)

    def _new_tmp(self, name: str) -> Path:
        # Beside the final directory (same filesystem), so that the last step is one rename.
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{name}-", dir=self._root))
        tmp.chmod(0o755)
        return tmp

    def _swap_in(self, name: str, tmp: Path, *, replace: bool) -> Path | None:
        """Move a finished ``tmp`` into place as ``name``; return what it replaced, for deleting.

        The caller holds the store lock, and deletes the old tree after releasing it.
        """
        final = self._root / name
        if not final.exists():
            os.rename(tmp, final)
            return None
        if not replace:
            raise Conflict(f"image {name!r} already exists; remove it first or import with force")
        old = Path(tempfile.mkdtemp(prefix=f".old-{name}-", dir=self._root))
        os.rename(final, old / name)
        os.rename(tmp, final)
        return old

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with open(self._root / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield


def _check_name(name: str) -> None:
    if not _NAME.fullmatch(name):
        raise Invalid(
            f"invalid image name {name!r}: use 1-63 characters of a-z, 0-9, '.', '_' and '-', "
            "starting with a letter or digit"
        )


def _write_meta(directory: Path, image: Image, **extra: str | int) -> None:
    meta = {
        "name": image.name, "digest": image.digest, "bind_host_usr": image.bind_host_usr,
        "created_at": image.created_at, "source": image.source, **extra,
    }
    (directory / _META).write_text(json.dumps(meta, indent=1) + "\n")


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
                    while chunk := f.read(_CHUNK):
                        content.update(chunk)
                h.update(head + b"%d\0%s\n" % (st.st_size, content.hexdigest().encode()))
            elif stat.S_ISLNK(st.st_mode):
                h.update(head + os.fsencode(os.readlink(name, dir_fd=dir_fd)) + b"\n")
            else:
                h.update(head + b"\n")
            if stat.S_ISDIR(st.st_mode) and depth < _MAX_DEPTH:
                sub = os.open(name, _DIR, dir_fd=dir_fd)
                try:
                    walk(sub, rel + b"/", depth + 1)
                finally:
                    os.close(sub)

    top = os.open(rootfs, _DIR)
    try:
        walk(top, b"", 0)
    finally:
        os.close(top)
    return "sha256:" + h.hexdigest()


# --- import -----------------------------------------------------------------------------------------


def _fill(rootfs: Path, source: Path, scratch: Path) -> tuple[str, int]:
    """Unpack ``source`` into the new directory ``rootfs``; return its format and how many entries
    (device nodes, fifos, sockets) were skipped."""
    rootfs.mkdir(mode=0o755)
    os.chmod(rootfs, 0o755)
    try:
        if source.is_dir():
            with _Writer(rootfs) as writer:
                writer.copy_dir(source)
            return "directory", writer.skipped
        if not source.is_file():
            raise Invalid(f"cannot import {str(source)!r}: it is neither a directory nor a regular file")
        plain = _plain_tar(source, scratch)
        try:
            return _fill_from_tar(rootfs, plain)
        finally:
            if plain != source:
                plain.unlink()
    except (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError, zstandard.ZstdError, OSError) as exc:
        # Decompressors report bad data as OSError without an errno; real I/O errors carry one.
        if isinstance(exc, OSError) and exc.errno is not None:
            raise
        raise Invalid(f"cannot import {str(source)!r}: the archive is truncated or corrupt ({exc})") from exc


def _fill_from_tar(rootfs: Path, plain: Path) -> tuple[str, int]:
    with tarfile.open(plain, "r:") as tf:
        in_order = tf.getmembers()
        members = {_lookup_name(m.name): m for m in in_order}  # a later duplicate wins, as in tar
        docker = _docker_layers(tf, members)
        layers = docker if docker is not None else _oci_layers(tf, members)
        with _Writer(rootfs) as writer:
            if layers is None:
                for member in in_order:
                    writer.add(tf, member, layer=False)
                return "rootfs-tar", writer.skipped
            for layer in layers:
                writer.start_layer()
                for ltf, member in _layer_members(tf, layer):
                    writer.add(ltf, member, layer=True)
            return "docker-save" if docker is not None else "oci-layout", writer.skipped


def _plain_tar(source: Path, scratch: Path) -> Path:
    """``source`` itself if it is an uncompressed tar, else its decompressed copy in ``scratch``."""
    with open(source, "rb") as f:
        head = f.read(512)
    kind = next((k for magic, k in _COMPRESSED.items() if head.startswith(magic)), None)
    plain = source
    if kind is not None:
        plain = scratch / "source.tar"
        with open(source, "rb") as raw, _decompress(kind, raw) as src, open(plain, "wb") as dst:
            shutil.copyfileobj(src, dst, _CHUNK)
        with open(plain, "rb") as f:
            head = f.read(512)
    if len(head) == 512 and head.count(0) == 512:
        raise Invalid(f"cannot import {str(source)!r}: it is an empty tar archive; an image needs files")
    try:
        tarfile.TarInfo.frombuf(head, tarfile.ENCODING, "surrogateescape")
    except tarfile.HeaderError:
        what = f"{kind}-compressed, but what it holds is not" if kind else "not a directory or"
        raise Invalid(
            f"cannot import {str(source)!r}: it is {what} a tar archive (it starts with {head[:8]!r}); "
            "give a rootfs directory, a rootfs tarball (.tar, .tar.gz, .tar.zst), a `docker save` "
            "tarball or an OCI image-layout tarball"
        ) from None
    return plain


def _decompress(kind: str, raw: IO[bytes]) -> IO[bytes]:
    if kind == "gzip":
        return cast(IO[bytes], gzip.GzipFile(fileobj=raw))
    if kind == "bzip2":
        return cast(IO[bytes], bz2.BZ2File(raw))
    if kind == "xz":
        return cast(IO[bytes], lzma.LZMAFile(raw))
    return zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)


def _lookup_name(name: str) -> str:
    return posixpath.normpath("/" + name).lstrip("/")


def _read_json(tf: tarfile.TarFile, member: tarfile.TarInfo) -> Any:
    f = tf.extractfile(member)
    if f is None:
        raise Invalid(f"archive member {member.name!r} should be a JSON file but is not a regular file")
    try:
        return json.load(f)
    except ValueError as exc:
        raise Invalid(f"archive member {member.name!r} is not valid JSON: {exc}") from None


def _docker_layers(tf: tarfile.TarFile, members: dict[str, tarfile.TarInfo]) -> list[tarfile.TarInfo] | None:
    """The layers of a ``docker save`` archive in order, or None if this is not one."""
    if "manifest.json" not in members:
        return None
    manifest = _read_json(tf, members["manifest.json"])
    if not isinstance(manifest, list) or not all(isinstance(m, dict) and "Layers" in m for m in manifest):
        return None
    if len(manifest) != 1:
        tags = [t for m in manifest for t in m.get("RepoTags") or []]
        raise Invalid(f"the docker save archive holds {len(manifest)} images ({tags}); save exactly one")
    layers = manifest[0]["Layers"]
    if not isinstance(layers, list) or not all(isinstance(p, str) for p in layers):
        raise Invalid("manifest.json: 'Layers' must be a list of paths inside the archive")
    return [_member(members, p, "manifest.json") for p in layers]


def _oci_layers(tf: tarfile.TarFile, members: dict[str, tarfile.TarInfo]) -> list[tarfile.TarInfo] | None:
    """The layers of an OCI image layout (index → manifest → layers), or None if this is not one."""
    if "oci-layout" not in members or "index.json" not in members:
        return None
    doc = _read_json(tf, members["index.json"])
    where = "index.json"
    for _ in range(4):  # an index may point to further indexes; real ones nest at most once
        if isinstance(doc, dict) and isinstance(doc.get("layers"), list):
            return [_member(members, _blob_path(d, where), where) for d in doc["layers"]]
        if not isinstance(doc, dict) or not isinstance(doc.get("manifests"), list):
            raise Invalid(f"OCI layout: {where} has neither 'manifests' nor 'layers'")
        where = _blob_path(_pick_manifest(doc["manifests"], where), where)
        doc = _read_json(tf, _member(members, where, "index.json"))
    raise Invalid("OCI layout: image indexes nest too deeply")


def _pick_manifest(descriptors: builtins.list[Any], where: str) -> Any:
    """The one image manifest for this host among an index's descriptors (attestations ignored)."""
    images = [
        d for d in descriptors
        if isinstance(d, dict)
        and (d.get("annotations") or {}).get("vnd.docker.reference.type") != "attestation-manifest"
    ]
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    if len(images) > 1:
        images = [
            d for d in images
            if (d.get("platform") or {}).get("os", "linux") == "linux"
            and (d.get("platform") or {}).get("architecture") == arch
        ][:1]
    if len(images) != 1:
        platforms = [d.get("platform") for d in descriptors if isinstance(d, dict)]
        raise Invalid(f"OCI layout: {where} has no single image for linux/{arch} (it has {platforms})")
    return images[0]


def _blob_path(descriptor: Any, where: str) -> str:
    digest = descriptor.get("digest") if isinstance(descriptor, dict) else None
    match = re.fullmatch(r"([a-z0-9]+):([a-f0-9]{32,128})", digest) if isinstance(digest, str) else None
    if match is None:
        raise Invalid(f"OCI layout: {where} has a descriptor without a valid digest: {descriptor!r}")
    return f"blobs/{match[1]}/{match[2]}"


def _member(members: dict[str, tarfile.TarInfo], path: str, where: str) -> tarfile.TarInfo:
    member = members.get(_lookup_name(path))
    if member is None:
        raise Invalid(f"{where} refers to {path!r}, which is not in the archive")
    return member


def _layer_members(
    tf: tarfile.TarFile, member: tarfile.TarInfo
) -> Iterator[tuple[tarfile.TarFile, tarfile.TarInfo]]:
    """The members of one layer (a tar, optionally gzip/bzip2/xz/zstd-compressed), streamed in order."""
    raw = tf.extractfile(member)
    if raw is None:
        raise Invalid(f"layer {member.name!r} is not a regular file in the archive")
    head = raw.read(4)
    if not head:  # an empty blob is a valid layer that adds nothing
        return
    raw.seek(0)
    stream: IO[bytes] = raw
    if head == b"\x28\xb5\x2f\xfd":
        stream = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
    with tarfile.open(fileobj=stream, mode="r|*") as ltf:
        for m in ltf:
            yield ltf, m


class _Writer:
    """Writes entries under one rootfs, resolving every path inside it and never following symlinks.

    Device nodes, fifos and sockets are skipped (counted in ``skipped``). Ownership and setuid bits
    are kept when running as root: the sandbox is isolated, and images rely on them.
    """

    def __init__(self, rootfs: Path) -> None:
        self._root_fd = os.open(rootfs, _DIR)
        self._as_root = os.geteuid() == 0
        # Paths this layer wrote: whiteouts apply only to lower layers (OCI image spec, "Whiteouts").
        self._written: set[tuple[str, ...]] = set()
        self.skipped = 0

    def __enter__(self) -> _Writer:
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
            self._whiteout(member.name, parts)
            return
        if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
            self.skipped += 1
            return
        parent = self._open_parent(member.name, parts[:-1], create=True)
        assert parent is not None
        try:
            self._add_entry(tf, member, parent, parts[-1])
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
            fd = os.open(leaf, _DIR, dir_fd=parent)
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
            src = tf.extractfile(member)
            assert src is not None  # a regular member always has a file object
            with os.fdopen(os.open(leaf, _NEW_FILE, 0o600, dir_fd=parent), "wb") as out:
                shutil.copyfileobj(src, out, _CHUNK)
                out.flush()
                self._own(out.fileno(), member.uid, member.gid, member.mode)
                os.utime(out.fileno(), (_mtime(member),) * 2)

    def _hardlink(self, member: tarfile.TarInfo, parent: int, leaf: str, old: os.stat_result | None) -> None:
        target = _parts(member.linkname, member.name)
        if not target:
            raise Invalid(f"hardlink {member.name!r} points to the image root; a hardlink must name a file")
        target_parent = self._open_parent(member.name, target[:-1], create=False)
        try:
            found = None if target_parent is None else _lstat(target[-1], target_parent)
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

    def _prune(self, dir_fd: int, prefix: tuple[str, ...]) -> None:
        """Make a directory opaque: drop everything lower layers put in it."""
        for name in os.listdir(dir_fd):
            st = _lstat(name, dir_fd)
            if (*prefix, name) not in self._written:
                _remove(dir_fd, name, st)
            elif st is not None and stat.S_ISDIR(st.st_mode):
                sub = os.open(name, _DIR, dir_fd=dir_fd)
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
                    sub = os.open(part, _DIR, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        os.close(fd)
                        return None
                    os.mkdir(part, 0o755, dir_fd=fd)
                    sub = os.open(part, _DIR, dir_fd=fd)
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
        if len(prefix) >= _MAX_DEPTH:
            raise Invalid(f"the directory {'/'.join(prefix)!r} is nested more than {_MAX_DEPTH} deep")
        for entry in sorted(os.scandir(src), key=lambda e: e.name):
            st, name = entry.stat(follow_symlinks=False), entry.name
            if stat.S_ISDIR(st.st_mode):
                os.mkdir(name, 0o700, dir_fd=dst)
                sub_src, sub_dst = os.open(name, _DIR, dir_fd=src), os.open(name, _DIR, dir_fd=dst)
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
                with (
                    os.fdopen(os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=src), "rb") as i,
                    os.fdopen(os.open(name, _NEW_FILE, 0o600, dir_fd=dst), "wb") as o,
                ):
                    shutil.copyfileobj(i, o, _CHUNK)
                    o.flush()
                    self._own(o.fileno(), st.st_uid, st.st_gid, st.st_mode)
                    os.utime(o.fileno(), ns=(st.st_atime_ns, st.st_mtime_ns))
                if st.st_nlink > 1:
                    links[(st.st_dev, st.st_ino)] = "/".join((*prefix, name))
            else:
                self.skipped += 1


def _parts(name: str, member: str) -> tuple[str, ...]:
    """The components of an archive path, relative to the rootfs; ``..`` anywhere is refused."""
    parts = tuple(p for p in name.split("/") if p not in ("", "."))
    if ".." in parts:
        raise Invalid(f"archive member {member!r} contains '..' ({name!r}); grove refuses paths that climb out")
    if len(parts) > _MAX_DEPTH:
        raise Invalid(f"archive member {member!r} is nested more than {_MAX_DEPTH} directories deep")
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
