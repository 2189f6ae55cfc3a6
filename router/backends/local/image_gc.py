"""The local backend's images as the router's housekeeping sees them: what they take on this host, how much of
that no image and no sandbox uses, and collecting it — by the image store's own collection
(:meth:`ImageStore.collect_retired`, :meth:`ImageStore.collect_layers`), never a second one.

What is on disk is a set of *pieces*: each layer of the shared layer store, each flat image's own root (an
imported image, ``default``), and each retired image (one replaced or removed while sandboxes were made from
it). A current image uses its pieces; a retired image is used while a sandbox made from it exists, as each
local sandbox records in its own directory (the digest :class:`~router.backends.local.backend.LocalBackend`
writes at create and resumes from). A piece nothing uses is what a collection frees.

The backend collects retired images itself whenever a sandbox stops or goes; what is left for a pass is what
no such moment came for: an image replaced with ``grove image import --force`` (or rebuilt) while no sandbox
ran, layers a killed pull left, a collection skipped because an import held the layer store.
"""

from __future__ import annotations

import json
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grove.statedir import StateDir
from router.backends.local.backend import IMAGE_FILE
from router.backends.local.images import META_FILE, RETIRED_DIR, ImageStore
from router.backends.local.layer_store import disk_usage


@dataclass(frozen=True)
class Piece:
    """One thing of the image store on disk."""

    id: str
    """A layer's chain id (``sha256:…``), ``image <name>`` (a flat image's root) or ``retired <digest>``."""
    bytes: int
    """What it takes on disk."""
    used: bool
    """Whether an image or a sandbox uses it."""


class HostImages:
    """The image store of a local backend, with the sandboxes made from its images."""

    def __init__(self, store: ImageStore, sandboxes: Path) -> None:
        self._store = store
        self._sandboxes = sandboxes

    def survey(self) -> list[Piece]:
        """Every piece on disk, and whether anything uses it (blocks: run it in a thread)."""
        in_use = self._digests_in_use()
        used_layers: set[str] = set()
        pieces: list[Piece] = []
        usage = self._store.usage()
        for image in self._store.list():
            used_layers.update(f"sha256:{path.name}" for path in image.layers)
            if not image.layers:
                size = usage[image.name].size if image.name in usage else 0
                pieces.append(Piece(f"image {image.name}", size or disk_usage(image.rootfs), True))
        for directory, meta in self._retired():
            digest = str(meta.get("digest"))
            used = digest in in_use
            layers = [str(c) for c in meta.get("layers") or []]
            if used:
                used_layers.update(layers)
            size = 0 if layers else int(meta.get("size") or 0) or disk_usage(directory / "rootfs")
            pieces.append(Piece(f"retired {digest}", size, used))
        for chain_id in sorted(self._store.layers.ids()):
            pieces.append(Piece(chain_id, self._store.layers.size(chain_id), chain_id in used_layers))
        return pieces

    def collect(self) -> list[Piece]:
        """Delete the retired images no sandbox uses and the layers no image uses; what went (blocks)."""
        before = self.survey()
        self._store.collect_retired(self._digests_in_use())
        self._store.collect_layers()  # also when no retired image went: leftovers of killed pulls
        after = {piece.id for piece in self.survey()}
        return [piece for piece in before if piece.id not in after]

    def _digests_in_use(self) -> set[str]:
        """The image digests the sandboxes on this host were made from (each records its own)."""
        found = set()
        for directory in self._sandboxes.iterdir() if self._sandboxes.is_dir() else ():
            with suppress(OSError):
                found.add((directory / IMAGE_FILE).read_text(encoding="ascii").strip())
        return found

    def _retired(self) -> list[tuple[Path, dict[str, Any]]]:
        found = []
        root = self._store.root / RETIRED_DIR
        for directory in sorted(root.iterdir()) if root.is_dir() else ():
            with suppress(OSError, ValueError):
                meta = json.loads((directory / META_FILE).read_text())
                if isinstance(meta, dict):
                    found.append((directory, meta))
        return found


def host_images(backend: object, layout: StateDir) -> HostImages | None:
    """The images of a backend that keeps them on this host (the local one), else None (a cluster's nodes keep
    theirs). Asked of the backend's ``images`` (its :class:`ImageStore`), so the router names no backend."""
    store = getattr(backend, "images", None)
    return HostImages(store, layout.sandboxes) if isinstance(store, ImageStore) else None
