"""The content-addressed layer store: each image layer unpacked once, shared by every image that uses it.

``<images>/layers/<hex>/`` is one layer, unpacked as an overlayfs lower directory (whiteouts in
overlayfs's form, see :mod:`router.backends.local.overlay_layer`); ``<hex>.json`` beside it (written last, so
its presence means the layer is complete) records its diff id and its size on disk. ``<hex>`` is the
layer's OCI *chain id* — the digest of this layer's content together with every layer below it — not
its diff id: a layer's unpacked form can depend on what is below (a hardlink to a lower file is
copied), so two images share a layer exactly when they share everything up to it, which is what a
common base is.

Pulls leave the layers' compressed blobs in ``<images>/blobs/sha256/`` (skopeo's shared blob directory):
a later pull of an image with the same base fetches nothing it has, and a killed pull resumes from the
blobs it finished. A blob goes when no layer or image records it.

A layer is unpacked into a temporary directory and renamed into place; two imports unpacking the same
layer at once both succeed and one copy is dropped. Imports hold :meth:`LayerStore.importing` (a shared
lock) from their first layer until their image is in place; :meth:`LayerStore.remove_unused` runs only
when it can take that lock exclusively, so it never deletes a layer an import is about to name.
"""

from __future__ import annotations

import fcntl
import gzip
import hashlib
import json
import os
import shutil
import tarfile
import tempfile
import time
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, cast

import zstandard

from grove.core.errors import Invalid
from router.backends.local.rootfs_writer import CHUNK, RootfsWriter
from router.backends.local.unpack_limits import Budget


def chain_ids(diff_ids: Sequence[str]) -> list[str]:
    """The OCI chain id of each layer (``ChainID(L0) = DiffID(L0)``, then ``sha256(parent + " " + diff)``)."""
    chain: list[str] = []
    for diff in diff_ids:
        chain.append(diff if not chain else "sha256:" + hashlib.sha256(f"{chain[-1]} {diff}".encode()).hexdigest())
    return chain


class LayerStore:
    """The unpacked layers under ``<images>/layers``."""

    def __init__(self, root: Path, blobs: Path) -> None:
        """Use ``root`` for layers and ``blobs`` for compressed blobs, creating them if missing."""
        self._root = root
        self._root.mkdir(parents=True, exist_ok=True)
        self.blobs = blobs
        """The shared blob directory (``sha256/<hex>`` files) pulls copy into."""

    def path(self, chain_id: str) -> Path:
        """The directory of the layer ``chain_id`` (the overlay lower dir)."""
        return self._root / _hex(chain_id)

    def has(self, chain_id: str) -> bool:
        """Whether the layer is complete in the store."""
        return (self._root / f"{_hex(chain_id)}.json").exists()

    def size(self, chain_id: str) -> int:
        """Bytes on disk of the layer (0 if it is gone)."""
        try:
            return int(json.loads((self._root / f"{_hex(chain_id)}.json").read_text())["size"])
        except (OSError, ValueError, KeyError):
            return 0

    def add(self, chain_id: str, diff_id: str, blob: Path, lowers: Sequence[Path], budget: Budget) -> int:
        """Unpack ``blob`` (a tar, plain or gzip/zstd-compressed, whose content must hash to ``diff_id``)
        as the layer ``chain_id`` over ``lowers`` (topmost first), within ``budget`` (a layer already here is
        charged its size); return entries skipped (devices, ...)."""
        return self._add(chain_id, [(diff_id, blob)], lowers=lowers, budget=budget)

    def add_merged(
        self, key: str, layers: Sequence[tuple[str, Path]], lowers: Sequence[Path], budget: Budget
    ) -> int:
        """Apply ``layers`` (``(diff_id, blob)``, lowest first) one over the other into the one layer ``key``
        over ``lowers`` (topmost first): the top of an image deeper than a sandbox's overlay should stack."""
        return self._add(key, layers, lowers=lowers, budget=budget)

    def _add(self, key: str, layers: Sequence[tuple[str, Path]], *, lowers: Sequence[Path], budget: Budget) -> int:
        if self.has(key):
            budget.start_layer(f"layer {key}")
            budget.charge(self.size(key))
            return 0
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=self._root))
        try:
            tmp.chmod(0o755)
            with RootfsWriter(tmp, budget, overlay=True, lowers=lowers) as writer:
                for diff_id, blob in layers:
                    writer.start_layer()
                    budget.start_layer(f"layer {diff_id}")
                    got = _unpack(blob, writer)
                    if got != diff_id:
                        raise Invalid(
                            f"layer {blob.name}: its content hashes to {got}, but the image config says {diff_id}"
                        )
            # A merged layer records no blob: its many blobs are not kept for it.
            only = layers[0][1] if len(layers) == 1 else None
            meta = {"chain_id": key, "diff_id": layers[0][0] if only else None, "size": disk_usage(tmp),
                    "created_at": time.time(), "merged": len(layers) if not only else None,
                    "blob": only.name if only is not None and only.parent.parent == self.blobs else None}
            final = self.path(key)
            try:
                os.rename(tmp, final)
            except OSError:  # another import put the same layer in place first
                if not final.is_dir():
                    raise
                shutil.rmtree(tmp, ignore_errors=True)
            _write_atomic(self._root / f"{_hex(key)}.json", json.dumps(meta) + "\n")
            return writer.skipped
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    def ids(self) -> set[str]:
        """The chain ids of every complete layer."""
        return {f"sha256:{p.stem}" for p in self._root.glob("*.json")}

    @contextmanager
    def importing(self) -> Iterator[None]:
        """Held by an import from its first layer until its image names them: no collection meanwhile."""
        with open(self._root / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_SH)
            yield

    def remove_unused(self, keep: set[str], keep_blobs: set[str], scratch: Sequence[Path] = ()) -> list[str]:
        """Delete the layers not in ``keep`` (and leftovers of killed imports), then the blobs neither a
        kept layer nor ``keep_blobs`` (hex digests) records, and the ``scratch`` directories of killed
        pulls — unless an import runs now."""
        with open(self._root / ".lock", "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return []  # an import is under way; the next collection gets them
            removed = []
            for path in self._root.iterdir():
                if path.name.startswith(".tmp-"):
                    if path.is_dir():
                        shutil.rmtree(path, ignore_errors=True)
                    else:
                        path.unlink(missing_ok=True)
                elif path.suffix == ".json" and f"sha256:{path.stem}" not in keep:
                    path.unlink()  # first: a layer without its record is incomplete to every reader
                    shutil.rmtree(self._root / path.stem, ignore_errors=True)
                    removed.append(f"sha256:{path.stem}")
                elif path.is_dir() and not (self._root / f"{path.name}.json").exists():
                    shutil.rmtree(path, ignore_errors=True)  # renamed in, record never written
            self._remove_blobs(keep_blobs)
            for path in scratch:
                shutil.rmtree(path, ignore_errors=True)
            return removed

    def _remove_blobs(self, keep: set[str]) -> None:
        for path in self._root.glob("*.json"):
            try:
                keep.add(str(json.loads(path.read_text()).get("blob")))
            except (OSError, ValueError):
                continue
        blob_dir = self.blobs / "sha256"
        for blob in blob_dir.iterdir() if blob_dir.is_dir() else ():
            if blob.name not in keep:
                blob.unlink(missing_ok=True)


def _hex(digest: str) -> str:
    algo, _, hexa = digest.partition(":")
    if algo != "sha256" or len(hexa) != 64 or not all(c in "0123456789abcdef" for c in hexa):
        raise Invalid(f"not a sha256 layer digest: {digest!r}")
    return hexa


class _Hashing:
    """A read-only stream that hashes what passes through (the layer's diff id)."""

    def __init__(self, raw: IO[bytes]) -> None:
        self._raw = raw
        self.sha = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self._raw.read(size)
        self.sha.update(data)
        return data


def _unpack(blob: Path, writer: RootfsWriter) -> str:
    """Write the layer's entries; return ``sha256:`` of its uncompressed tar."""
    with open(blob, "rb") as raw:
        head = raw.read(4)
        raw.seek(0)
        stream: IO[bytes] = raw
        if head[:2] == b"\x1f\x8b":
            stream = cast(IO[bytes], gzip.GzipFile(fileobj=raw))
        elif head == b"\x28\xb5\x2f\xfd":
            stream = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
        hashing = _Hashing(stream)
        try:
            if head:  # an empty blob is a valid layer that adds nothing
                with tarfile.open(fileobj=cast(IO[bytes], hashing), mode="r|") as ltf:
                    for member in ltf:
                        writer.add(ltf, member, layer=True)
            while hashing.read(CHUNK):  # the tar's end padding belongs to the diff id too
                pass
        except (tarfile.TarError, EOFError, zlib.error, zstandard.ZstdError) as exc:
            raise Invalid(f"layer {blob.name} is truncated or corrupt ({exc})") from exc
    return "sha256:" + hashing.sha.hexdigest()


def disk_usage(top: Path) -> int:
    """Bytes the tree takes on disk (allocated blocks, a hardlinked file once)."""
    seen: set[int] = set()
    total = os.lstat(top).st_blocks * 512
    for _, dirs, files, fd in os.fwalk(top, follow_symlinks=False):
        for name in dirs + files:
            st = os.lstat(name, dir_fd=fd)
            if st.st_ino not in seen:
                seen.add(st.st_ino)
                total += st.st_blocks * 512
    return total


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".tmp-{path.name}")
    tmp.write_text(text)
    os.rename(tmp, path)
