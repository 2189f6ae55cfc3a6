"""``grove image export NAME FILE``: a local image as a ``docker save`` tarball, which ``grove image import`` (on
this host or another) and ``docker load`` take back.

Each layer of the image becomes one ``<diff id>/layer.tar`` (a flat image is one layer), lowest first. The store
keeps a layer as an overlayfs lower directory, so its whiteouts go back to the OCI form on the way out: a 0/0
character device ``NAME`` becomes an empty ``.wh.NAME``, a directory marked opaque gets a ``.wh..wh..opq``.
Device nodes, fifos and sockets are left out (the importer skips them too). Owners are written as numbers only.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import os
import platform
import stat
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from grove.core.errors import Invalid
from router.backends.local.images import DEFAULT
from router.backends.local.overlay_layer import OPAQUE_XATTR
from sandbox_image.userns import RANGE

NOBODY = 65534
_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())


def export_image(store: Any, name: str, dest: str) -> Any:
    """Write the image ``name`` of ``store`` (an :class:`~router.backends.local.images.ImageStore`) to the file
    ``dest`` (``.gz``/``.tgz``: gzip-compressed; ``-``: stdout); the image."""
    image = None if name == DEFAULT else store.get(name)
    if image is None or image.bind_host_usr:
        raise Invalid(f"image {name!r} is this host's own /usr under a skeleton, not an image that stands alone: "
                      "it cannot be exported (export an imported, pulled or built image)")
    _export(image, dest, store.root)
    return image


def _export(image: Any, dest: str, spare_dir: Path) -> None:
    """Write ``image`` to ``dest``, the layer tars made in ``spare_dir`` when it goes to stdout."""
    if dest == "-":
        with _compressed(os.fdopen(os.dup(1), "wb"), gzip_it=False) as out:
            _write(image, out, spare_dir)
        return
    target = Path(dest)
    part = target.with_name(f".{target.name}.part")
    if not target.parent.is_dir():
        raise Invalid(f"cannot write {dest}: {target.parent} is not a directory")
    try:
        with open(part, "wb") as raw, _compressed(raw, gzip_it=target.name.endswith((".gz", ".tgz"))) as out:
            _write(image, out, target.parent)
        part.replace(target)  # whole or not at all: an interrupted export leaves no half tarball under the name
    finally:
        part.unlink(missing_ok=True)


@contextlib.contextmanager
def _compressed(raw: IO[bytes], *, gzip_it: bool) -> Iterator[IO[bytes]]:
    with raw:
        if not gzip_it:
            yield raw
            return
        with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as packed:
            yield packed  # type: ignore[misc]  # GzipFile is a binary file


def _write(image: Any, out: IO[bytes], scratch: Path) -> None:
    diff_ids = []
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as outer:
        for layer in image.lowers:
            # A member's size comes before its bytes: each layer tar is made beside, then copied in.
            with tempfile.TemporaryFile(dir=scratch) as tmp:
                with tarfile.open(fileobj=tmp, mode="w", format=tarfile.PAX_FORMAT) as inner:
                    add_layer_dir(inner, Path(layer))
                digest, size = _hash(tmp)
                diff_ids.append(f"sha256:{digest}")
                info = tarfile.TarInfo(f"{digest}/layer.tar")
                info.size, info.mode = size, 0o644
                outer.addfile(info, tmp)
        config = json.dumps({"architecture": _ARCH, "os": "linux", "config": {},
                             "rootfs": {"type": "layers", "diff_ids": diff_ids}}).encode()
        config_name = f"{hashlib.sha256(config).hexdigest()}.json"
        manifest = [{"Config": config_name, "RepoTags": _tags(image.name),
                     "Layers": [f"{d.removeprefix('sha256:')}/layer.tar" for d in diff_ids]}]
        _add_bytes(outer, config_name, config)
        _add_bytes(outer, "manifest.json", json.dumps(manifest).encode())


def add_layer_dir(tf: tarfile.TarFile, root: Path, *, id_base: int = 0) -> None:
    """Every entry under ``root`` (names relative to it), whiteouts in OCI form. ``id_base``: the host id
    the layer's root was (a sandbox's writable layer is owned by its user namespace's range); owners are
    written relative to it, and one outside the range as ``nobody``."""
    stack = [""]
    while stack:
        rel = stack.pop()
        with os.scandir(root / rel if rel else root) as listing:
            names = sorted(entry.name for entry in listing)
        for name in names:
            arc = f"{rel}/{name}" if rel else name
            path = root / arc
            st = os.lstat(path)
            if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:  # an overlay whiteout
                _add_bytes(tf, f"{rel}/.wh.{name}" if rel else f".wh.{name}", b"")
                continue
            info = tf.gettarinfo(str(path), arcname=arc)
            if info is None or not (info.isreg() or info.isdir() or info.issym() or info.islnk()):
                continue  # a socket, fifo or device: no image needs one, and the importer skips them
            info.uname = info.gname = ""  # numeric owners: names of this host mean nothing in an image
            if id_base:
                info.uid, info.gid = (_unshift(i, id_base) for i in (info.uid, info.gid))
            if info.isreg():
                with open(path, "rb") as fh:
                    tf.addfile(info, fh)
            else:
                tf.addfile(info)
            if info.isdir():
                if _opaque(path):
                    _add_bytes(tf, f"{arc}/.wh..wh..opq", b"")
                stack.append(arc)


def _unshift(host_id: int, base: int) -> int:
    return host_id - base if base <= host_id < base + RANGE else NOBODY


def _opaque(path: Path) -> bool:
    try:
        return os.getxattr(path, OPAQUE_XATTR, follow_symlinks=False) == b"y"
    except OSError:
        return False


def _add_bytes(tf: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), 0o644
    tf.addfile(info, io.BytesIO(data))


def _hash(tmp: IO[bytes]) -> tuple[str, int]:
    """The sha256 and size of a finished temporary file, which is left at its start for copying."""
    digest = hashlib.sha256()
    tmp.seek(0)
    size = 0
    while chunk := tmp.read(1 << 20):
        digest.update(chunk)
        size += len(chunk)
    tmp.seek(0)
    return digest.hexdigest(), size


def _tags(name: str) -> list[str]:
    """The ``RepoTags`` ``docker load`` names the image by: the name, with ``:latest`` if it has no tag."""
    if "@" in name:
        return []  # pinned by digest: docker cannot tag it so
    last = name.rsplit("/", 1)[-1]
    return [name if ":" in last else f"{name}:latest"]
