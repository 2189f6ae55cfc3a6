"""The layer store without a registry: deep images have their top merged, layers are keyed by chain."""

from __future__ import annotations

import gzip
import hashlib
import os
import stat
from pathlib import Path

import pytest

from grove.core.errors import Invalid
from router.backends.local.images import MAX_LAYERS, ImageStore, LayerSource
from router.backends.local.layer_store import chain_ids
from router.backends.local.overlay_layer import OPAQUE_XATTR
from tests.support.imagetools import layer_tar

pytestmark = pytest.mark.fast


def _layers(tmp_path: Path, layers: list[dict[str, bytes | str | None]]) -> list[LayerSource]:
    out = []
    for i, layer in enumerate(layers):
        tar = layer_tar(layer)
        blob = tmp_path / f"l{i}.tar.gz"
        blob.write_bytes(gzip.compress(tar, mtime=0))
        out.append(LayerSource(blob, "sha256:" + hashlib.sha256(tar).hexdigest()))
    return out


def _digest(n: int) -> str:
    return "sha256:" + hashlib.sha256(str(n).encode()).hexdigest()


def test_the_top_of_an_image_deeper_than_the_limit_is_merged_into_one_layer(tmp_path: Path) -> None:
    store = ImageStore(tmp_path / "images")
    deep: list[dict[str, bytes | str | None]] = [{"etc": None, "etc/keep": b"0\n", "etc/drop": b"x\n"}]
    deep += [{f"f{i}": f"{i}\n".encode()} for i in range(1, MAX_LAYERS + 3)]
    deep.append({"opt": None, "opt/old": b"old\n", "f30": b"gone soon\n"})
    deep.append({"etc/.wh.drop": b"", "f7": b"changed\n", "opt/.wh..wh..opq": b"", "opt/new": b"new\n",
                 ".wh.f30": b""})
    image = store.add_layered("deep", _digest(1), _layers(tmp_path, deep), "test")
    assert len(image.layers) == MAX_LAYERS
    shared = store.add_layered("shallow", _digest(2), _layers(tmp_path, deep[:MAX_LAYERS]), "test")
    assert len(shared.layers) == MAX_LAYERS and shared.layers[:-1] == image.layers[:-1]  # the base is shared
    top = image.layers[-1]
    # In the merged layer: what a later merged layer deleted is gone, a whiteout hides the lower copy,
    # an opaque directory holds only what came after its marker.
    assert (top / f"f{MAX_LAYERS + 2}").read_text() == f"{MAX_LAYERS + 2}\n"
    assert os.lstat(top / "etc" / "drop").st_rdev == os.makedev(0, 0)
    assert stat.S_ISCHR(os.lstat(top / "f30").st_mode)
    assert sorted(os.listdir(top / "opt")) == ["new"] and os.getxattr(top / "opt", OPAQUE_XATTR) == b"y"
    assert not (top / "etc" / "keep").exists() and (image.layers[0] / "etc" / "keep").exists()


def test_layers_are_keyed_by_chain_and_checked_against_the_diff_id(tmp_path: Path) -> None:
    store = ImageStore(tmp_path / "images")
    for sub in ("a", "b"):
        (tmp_path / sub).mkdir()
    a = _layers(tmp_path / "a", [{"base": b"b\n"}, {"x": b"x\n"}])
    b = _layers(tmp_path / "b", [{"other": b"o\n"}, {"x": b"x\n"}])
    one = store.add_layered("one", _digest(1), a, "test")
    two = store.add_layered("two", _digest(2), b, "test")
    # The same top layer over a different base is a different layer: its unpacked form may differ.
    assert one.layers[1] != two.layers[1] and len(store.layers.ids()) == 4
    assert [p.name for p in one.layers] == [c.removeprefix("sha256:") for c in chain_ids([s.diff_id for s in a])]
    lying = [LayerSource(a[0].blob, _digest(3))]
    with pytest.raises(Invalid, match="hashes to"):
        store.add_layered("liar", _digest(4), lying, "test")
    assert [i.name for i in store.list()] == ["one", "two"]
    store.remove("one")
    store.remove("two")
    assert store.collect_retired(set()) and store.layers.ids() == set()
