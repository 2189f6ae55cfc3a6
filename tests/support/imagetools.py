"""Build test images from real files: a busybox rootfs, layer tars, ``docker save`` and OCI archives.

Layers are given as ``{path: content}`` in archive order: ``bytes`` is a regular file (mode 0644, or
0755 under ``bin/``), ``str`` a symlink to that target, ``None`` a directory. Whiteouts are ordinary
entries (``"etc/.wh.motd": b""``, ``"opt/.wh..wh..opq": b""``). No parent directory is added
implicitly, so a test can write through a symlink on purpose. A layer may also be a finished tar
(``bytes``), e.g. from :func:`tar_directory`.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import platform
import shutil
import tarfile
from collections.abc import Mapping, Sequence
from pathlib import Path

BUSYBOX = Path("/bin/busybox")
APPLETS = (
    "sh", "ash", "ls", "cat", "echo", "sleep", "head", "tail", "env", "id", "mkdir", "rm", "rmdir", "true",
    "false", "printf", "wc", "grep", "sed", "hostname", "ps", "mount", "umount", "cp", "mv", "ln", "touch",
    "chmod", "stat", "pwd", "test", "[", "uname", "whoami", "date", "kill", "du", "df", "find", "tr", "cut",
    "sort", "uniq", "tee", "xargs", "seq", "basename", "dirname", "readlink", "which", "nproc", "yes",
)

# What an image built on this host says it runs on (the importer picks the manifest for the host).
ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())

Layer = Mapping[str, bytes | str | None] | bytes


def make_busybox_rootfs(dest: Path) -> Path:
    """A minimal rootfs in ``dest``: Debian's static busybox with its common applets, etc/, tmp/, root/."""
    if not BUSYBOX.exists():
        raise FileNotFoundError(f"{BUSYBOX} is missing: install it with `apt-get install -y busybox-static`")
    (dest / "bin").mkdir(parents=True)
    shutil.copy2(BUSYBOX, dest / "bin" / "busybox")
    for applet in APPLETS:
        os.symlink("busybox", dest / "bin" / applet)
    (dest / "usr" / "bin").mkdir(parents=True)
    os.symlink("../../bin/busybox", dest / "usr" / "bin" / "env")  # for `#!/usr/bin/env` scripts
    (dest / "etc").mkdir()
    (dest / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534::/:/bin/false\n")
    (dest / "etc" / "group").write_text("root:x:0:\nnogroup:x:65534:\n")
    for rel, mode in (("tmp", 0o1777), ("root", 0o700), ("proc", 0o555), ("dev", 0o755)):
        (dest / rel).mkdir()
        os.chmod(dest / rel, mode)
    return dest


def tar_directory(src: Path, *, gzip_it: bool = False) -> bytes:
    """A tar of the tree under ``src`` (names relative to it, symlinks kept), optionally gzipped."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for entry in sorted(src.iterdir()):
            tf.add(entry, arcname=entry.name)
    return gzip.compress(buf.getvalue(), mtime=0) if gzip_it else buf.getvalue()


def layer_tar(layer: Layer) -> bytes:
    """One layer as an uncompressed tar (a ``bytes`` layer is returned unchanged)."""
    if isinstance(layer, bytes):
        return layer
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for path, content in layer.items():
            info = tarfile.TarInfo(path)
            info.mtime = 1_700_000_000
            if content is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tf.addfile(info)
            elif isinstance(content, str):
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, content, 0o777
                tf.addfile(info)
            else:
                info.size, info.mode = len(content), 0o755 if path.startswith("bin/") else 0o644
                tf.addfile(info, io.BytesIO(content))
    return buf.getvalue()


def _write_tar(dest: Path, files: dict[str, bytes]) -> Path:
    with tarfile.open(dest, "w") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 1_700_000_000
            tf.addfile(info, io.BytesIO(data))
    return dest


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def make_docker_save_tar(dest: Path, layers: Sequence[Layer], *, tag: str = "grove-test:latest") -> Path:
    """A ``docker save`` archive (legacy layout: manifest.json, ``<id>/layer.tar``) of ``layers``."""
    tars = [layer_tar(layer) for layer in layers]
    config = json.dumps({
        "architecture": ARCH, "os": "linux", "config": {},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{_sha(t)}" for t in tars]},
    }).encode()
    files: dict[str, bytes] = {}
    for t in tars:
        files[f"{_sha(t)}/VERSION"] = b"1.0"
        files[f"{_sha(t)}/layer.tar"] = t
    files[f"{_sha(config)}.json"] = config
    files["manifest.json"] = json.dumps(
        [{"Config": f"{_sha(config)}.json", "RepoTags": [tag], "Layers": [f"{_sha(t)}/layer.tar" for t in tars]}]
    ).encode()
    return _write_tar(dest, files)


def make_oci_layout_tar(dest: Path, layers: Sequence[Layer], *, gzip_layers: bool = True, nested: bool = False) -> Path:
    """An OCI image-layout archive of ``layers``; ``nested`` puts an image index (with an
    attestation manifest beside the image, as BuildKit writes) between index.json and the manifest."""
    blobs: dict[str, bytes] = {}

    def blob(data: bytes, media_type: str, **extra: object) -> dict[str, object]:
        blobs[_sha(data)] = data
        return {"mediaType": media_type, "digest": f"sha256:{_sha(data)}", "size": len(data), **extra}

    tars = [layer_tar(layer) for layer in layers]
    config = json.dumps({
        "architecture": ARCH, "os": "linux", "config": {},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{_sha(t)}" for t in tars]},
    }).encode()
    layer_type = "application/vnd.oci.image.layer.v1.tar" + ("+gzip" if gzip_layers else "")
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": blob(config, "application/vnd.oci.image.config.v1+json"),
        "layers": [blob(gzip.compress(t, mtime=0) if gzip_layers else t, layer_type) for t in tars],
    }).encode()
    top = blob(manifest, "application/vnd.oci.image.manifest.v1+json",
               platform={"architecture": ARCH, "os": "linux"})
    if nested:
        attestation = json.dumps({"schemaVersion": 2, "layers": []}).encode()
        inner = json.dumps({"schemaVersion": 2, "manifests": [
            top,
            blob(attestation, "application/vnd.oci.image.manifest.v1+json",
                 platform={"architecture": "unknown", "os": "unknown"},
                 annotations={"vnd.docker.reference.type": "attestation-manifest"}),
        ]}).encode()
        top = blob(inner, "application/vnd.oci.image.index.v1+json")
    files = {f"blobs/sha256/{digest}": data for digest, data in blobs.items()}
    files["oci-layout"] = b'{"imageLayoutVersion": "1.0.0"}'
    files["index.json"] = json.dumps({"schemaVersion": 2, "manifests": [top]}).encode()
    return _write_tar(dest, files)
