"""Unpacking image archives into a rootfs without ever writing outside it.

Formats: a directory, a rootfs tarball (plain, gzip, bzip2, xz, zstd), a ``docker save`` tarball and an
OCI image-layout tarball, whose layers are applied in order with whiteouts honoured (``.wh.NAME``
deletes, ``.wh..wh..opq`` makes a directory opaque). Every write goes through :class:`RootfsWriter`, which
walks each path one component at a time from a directory file descriptor with ``O_NOFOLLOW``: a
symlink inside an image is never followed while writing, and any ``..`` is refused. Device nodes,
fifos and sockets are skipped.
"""

from __future__ import annotations

import builtins
import bz2
import gzip
import json
import lzma
import os
import platform
import posixpath
import re
import tarfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, cast

import zstandard

from grove.core.errors import Invalid
from router.backends.local.rootfs_writer import CHUNK, RootfsWriter
from router.backends.local.unpack_limits import GIB, Budget, UnpackLimits

_COMPRESSED = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz", b"\x28\xb5\x2f\xfd": "zstd"}


def fill(rootfs: Path, source: Path, scratch: Path, budget: Budget) -> tuple[str, int]:
    """Unpack ``source`` into the new directory ``rootfs`` within ``budget``; return its format and how many
    entries (device nodes, fifos, sockets) were skipped."""
    rootfs.mkdir(mode=0o755)
    os.chmod(rootfs, 0o755)
    try:
        if source.is_dir():
            with RootfsWriter(rootfs, budget) as writer:
                writer.copy_dir(source)
            return "directory", writer.skipped
        if not source.is_file():
            raise Invalid(f"cannot import {str(source)!r}: it is neither a directory nor a regular file")
        plain = _plain_tar(source, scratch, budget.limits)
        try:
            return _fill_from_tar(rootfs, plain, budget)
        finally:
            if plain != source:
                plain.unlink()
    except (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError, zstandard.ZstdError, OSError) as exc:
        # Decompressors report bad data as OSError without an errno; real I/O errors carry one.
        if isinstance(exc, OSError) and exc.errno is not None:
            raise
        raise Invalid(f"cannot import {str(source)!r}: the archive is truncated or corrupt ({exc})") from exc


def _fill_from_tar(rootfs: Path, plain: Path, budget: Budget) -> tuple[str, int]:
    with tarfile.open(plain, "r:") as tf:
        in_order = tf.getmembers()
        members = {_lookup_name(m.name): m for m in in_order}  # a later duplicate wins, as in tar
        docker = _docker_layers(tf, members)
        layers = docker if docker is not None else _oci_layers(tf, members)
        with RootfsWriter(rootfs, budget) as writer:
            if layers is None:
                for member in in_order:
                    writer.add(tf, member, layer=False)
                return "rootfs-tar", writer.skipped
            for layer in layers:
                writer.start_layer()
                budget.start_layer(f"layer {layer.name!r}")
                for ltf, member in _layer_members(tf, layer):
                    writer.add(ltf, member, layer=True)
            return "docker-save" if docker is not None else "oci-layout", writer.skipped


def _plain_tar(source: Path, scratch: Path, limits: UnpackLimits) -> Path:
    """``source`` itself if it is an uncompressed tar, else its decompressed copy in ``scratch`` (zeros left as
    holes, and refused past what the image may unpack to, with room for the archive's headers)."""
    with open(source, "rb") as f:
        head = f.read(512)
    kind = next((k for magic, k in _COMPRESSED.items() if head.startswith(magic)), None)
    plain = source
    if kind is not None:
        plain = scratch / "source.tar"
        cap = limits.image_bytes + limits.image_bytes // 4 + (64 << 20)  # with room for the tar's headers
        with open(source, "rb") as raw, _decompress(kind, raw) as src, open(plain, "wb") as dst:
            size = 0
            while chunk := src.read(CHUNK):
                size += len(chunk)
                if size > cap:
                    raise Invalid(f"cannot import {str(source)!r}: it decompresses to more than {cap / GIB:.2f} GiB, "
                                  "past what an image may unpack to; raise it with --max-image-gb if it is meant "
                                  "to be that large")
                if chunk.count(0) != len(chunk):
                    dst.seek(size - len(chunk))
                    dst.write(chunk)
            dst.truncate(size)
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
