"""Images made from other images: a layer on top (a sandbox's commit, a build step) or only new metadata.

The new image names its parent's layers in the shared layer store plus its own, so every image built on one
base shares that base's layers on disk. A parent that is one imported directory (not layered) is put into the
layer store once, as one layer, the first time an image is made from it (``<images>/.flat/<digest>`` remembers
which); ``default`` cannot be a parent (it is this host's ``/usr`` under a skeleton, not an image of its own).
"""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from grove.core.errors import Invalid
from router.backends.local.image_export import add_layer_dir
from router.backends.local.images import MAX_LAYERS, Image, ImageStore, check_name
from router.backends.local.layer_store import chain_ids
from router.backends.local.unpack_limits import Budget

_FLAT = ".flat"


def file_digest(path: Path) -> str:
    """``sha256:`` of a file's bytes (a layer tar's diff id)."""
    sha = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            sha.update(chunk)
    return "sha256:" + sha.hexdigest()


def derive(store: ImageStore, name: str, parent: Image, layer: Path | None, **meta: Any) -> Image:
    """Store ``name`` as ``parent``'s layers plus ``layer`` (a plain layer tar, or None: the same layers) with
    ``meta`` recorded in its ``image.json``. Its digest covers its layers and its metadata."""
    check_name(name)
    with store.layers.importing():
        chain = chain_of(store, parent)
        if layer is not None:
            if len(chain) >= MAX_LAYERS:
                raise Invalid(f"image {name!r} would have {len(chain) + 1} layers, more than a sandbox stacks "
                              f"({MAX_LAYERS}); join some of its RUN steps with &&")
            diff_id = file_digest(layer)
            new = chain_ids([diff_id]) if not chain else [_chain_id(chain[-1], diff_id)]
            lowers = [store.layers.path(c) for c in reversed(chain)]
            store.layers.add(new[0], diff_id, layer, lowers, Budget(store.limits, f"image {name!r}"))
            chain = [*chain, new[0]]
        body = json.dumps({"layers": chain, **meta}, sort_keys=True, default=str)
        digest = "sha256:" + hashlib.sha256(body.encode()).hexdigest()
        return store.name_layers(name, digest, chain, f"from {parent.name}", parent=parent.name,
                                 parent_digest=parent.digest, **meta)


def _chain_id(parent: str, diff_id: str) -> str:
    return "sha256:" + hashlib.sha256(f"{parent} {diff_id}".encode()).hexdigest()


def chain_of(store: ImageStore, image: Image) -> list[str]:
    """The layer store's chain ids of ``image``, lowest first (an imported image put in as one layer first)."""
    if image.bind_host_usr:
        raise Invalid(f"image {image.name!r} is this host's /usr under a skeleton, not an image of its own: nothing "
                      "can be built on it; use an imported, pulled or built image (e.g. `grove image pull debian:12`)")
    if image.layers:
        return [f"sha256:{p.name}" for p in image.layers]
    record = store.root / _FLAT / image.digest.removeprefix("sha256:")
    try:
        chain_id = record.read_text(encoding="ascii").strip()
        if store.layers.has(chain_id):
            return [chain_id]
    except FileNotFoundError:
        pass
    record.parent.mkdir(exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=".tmp-flat-", dir=record.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tf:
            add_layer_dir(tf, image.rootfs)
        diff_id = file_digest(tmp)
        store.layers.add(diff_id, diff_id, tmp, [], Budget(store.limits, f"image {image.name!r}"))
    finally:
        tmp.unlink(missing_ok=True)
    record.write_text(diff_id + "\n", encoding="ascii")
    return [diff_id]
