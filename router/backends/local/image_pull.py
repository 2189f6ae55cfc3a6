"""``grove image pull``: a registry image into the local store as a layered image.

:mod:`router.backends.local.registry_pull` copies the image (skopeo) into an OCI layout whose blobs land in the
store's shared blob directory; :meth:`ImageStore.add_layered` unpacks the layers the layer store does
not have yet and names the image. The image is named by the reference as given, or by an alias; its
digest is the registry's digest of its manifest, which every sandbox made from it records.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from router.backends.local import references
from router.backends.local.images import Image, ImageStore, LayerSource
from router.backends.local.registry_pull import PullOptions, pull

# What of the image config a sandbox may want later (and a person reads in image.json).
_CONFIG_KEYS = ("Env", "Cmd", "Entrypoint", "WorkingDir", "User", "Labels")


def pull_image(store: ImageStore, ref: str, *, name: str | None = None, options: PullOptions | None = None) -> Image:
    """Pull ``ref`` and store it as ``name`` (default: ``ref`` itself); a re-pull replaces the old version,
    which sandboxes made from it keep."""
    parsed = references.parse(ref)
    options = options or PullOptions()
    with store.layers.importing():  # no collection of blobs (or of this scratch dir) while skopeo writes them
        scratch = Path(tempfile.mkdtemp(prefix=".pull-", dir=store.root))
        try:
            pulled = pull(parsed, store.layers.blobs, scratch / "oci", options)
            config: dict[str, Any] = pulled.config.get("config") or {}
            platform = "/".join(str(pulled.config[k]) for k in ("os", "architecture", "variant")
                                if pulled.config.get(k))
            return store.add_layered(
                name or ref, pulled.digest,
                [LayerSource(blob, diff) for blob, diff in zip(pulled.layers, pulled.diff_ids, strict=True)],
                ref, platform=platform, index_digest=pulled.index_digest,
                config={k: config[k] for k in _CONFIG_KEYS if k in config},
                blobs=[d.removeprefix("sha256:") for d in (pulled.digest, pulled.manifest_blob, pulled.config_blob)],
            )
        finally:
            shutil.rmtree(scratch, ignore_errors=True)


def write_authfile(directory: Path, registry: str, username: str, password: str) -> Path:
    """A containers-auth.json (mode 0600) holding one login, so credentials never go on a command line."""
    path = directory / "auth.json"
    token = base64.b64encode(f"{username}:{password}".encode()).decode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump({"auths": {registry: {"auth": token}}}, fh)
    return path
