"""Issue 29, medium 1: layer bombs. A few bytes of layer must not unpack to gigabytes on the state disk.

The attack: a gzipped layer of 144 bytes holding one GNU sparse tar member of 1 GiB (all hole), or a
gzip of a gigabyte of zeros (about a megabyte). The diff-id check cannot stop either: the attacker
writes the image config too. Before the fix each unpacked fully allocated; now holes are written as
holes, and a layer or image past its cap (``--max-layer-gb``, ``--max-image-gb``) is refused by name.
"""

from __future__ import annotations

import gzip
import subprocess
from pathlib import Path

import pytest

from grove.client import Grove
from tests.images.conftest import base_layer, registry  # noqa: F401  (module fixtures of the image tests)
from tests.support.registry import Registry, du, write_oci_layout
from tests.support.router_fixtures import RouterProcess

pytestmark = pytest.mark.local_only

GIB = 1 << 30


def sparse_layer(tmp: Path, size: int) -> bytes:
    """A layer tar (GNU format) of one sparse file ``bomb`` of ``size`` bytes that is all hole, made by GNU tar."""
    work = tmp / "sparse"
    work.mkdir()
    subprocess.run(["truncate", "-s", str(size), str(work / "bomb")], check=True)
    out = tmp / "sparse.tar"
    subprocess.run(["tar", "--sparse", "--format=gnu", "-C", str(work), "-cf", str(out), "bomb"], check=True)
    return out.read_bytes()


def zeros_layer(tmp: Path, size: int) -> bytes:
    """A layer tar of one plain (not sparse) file ``zeros`` of ``size`` zero bytes."""
    work = tmp / "zeros"
    work.mkdir()
    with open(work / "zeros", "wb") as fh:
        for _ in range(size >> 20):
            fh.write(bytes(1 << 20))
    out = tmp / "zeros.tar"
    subprocess.run(["tar", "--format=gnu", "-C", str(work), "-cf", str(out), "zeros"], check=True)
    (work / "zeros").unlink()
    return out.read_bytes()


def _pull(router: RouterProcess, ref: str, *extra: str) -> subprocess.CompletedProcess[bytes]:
    return router.cli("image", "pull", "--insecure", ref, *extra, timeout=300)


def test_a_sparse_bomb_is_written_as_holes(
    router: RouterProcess, grove: Grove, registry: Registry, base_layer: bytes, tmp_path: Path,  # noqa: F811
) -> None:
    bomb = sparse_layer(tmp_path, GIB)
    assert len(gzip.compress(bomb, mtime=0)) < 1024  # the attack's point: a tiny layer
    write_oci_layout(tmp_path / "img", [[base_layer, bomb]])
    registry.push(tmp_path / "img", "sparse:1")
    before = du(router.layout.images)
    done = _pull(router, registry.ref("sparse:1"))
    assert done.returncode == 0, done.stderr.decode()
    grown = du(router.layout.images) - before
    assert grown < 64 << 20, f"the state disk grew by {grown >> 20} MiB for a {len(bomb)}-byte layer"
    sb = grove.create(registry.ref("sparse:1"))
    try:
        assert sb.exec("stat -c %s /bomb").stdout == f"{GIB}\n".encode()
    finally:
        sb.close()


def test_zeros_are_holes_and_a_layer_past_its_cap_is_refused(
    router: RouterProcess, registry: Registry, base_layer: bytes, tmp_path: Path,  # noqa: F811
) -> None:
    bomb = zeros_layer(tmp_path, 256 << 20)
    write_oci_layout(tmp_path / "img", [[base_layer, bomb]])
    registry.push(tmp_path / "img", "zeros:1")
    ref = registry.ref("zeros:1")
    done = _pull(router, ref, "--max-layer-gb", "0.125")
    err = done.stderr.decode()
    assert done.returncode != 0 and "0.125 GiB" in err and "--max-layer-gb" in err and "layer" in err, err
    assert ref not in router.cli("image", "ls").stdout.decode()
    done = _pull(router, ref, "--max-image-gb", "0.125")
    err = done.stderr.decode()
    assert done.returncode != 0 and "--max-image-gb" in err, err
    # Within its caps it is taken, its zeros stored as holes.
    before = du(router.layout.images)
    done = _pull(router, ref)
    assert done.returncode == 0, done.stderr.decode()
    assert du(router.layout.images) - before < 64 << 20


def test_a_flat_import_bomb_is_refused_before_it_fills_the_disk(router: RouterProcess, tmp_path: Path) -> None:
    """A gzipped rootfs tarball is decompressed to scratch space before it is unpacked: that copy is capped too."""
    source = tmp_path / "bomb.tar.gz"
    source.write_bytes(gzip.compress(zeros_layer(tmp_path, 256 << 20), compresslevel=1, mtime=0))
    done = router.cli("image", "import", "bomb", str(source), "--max-image-gb", "0.0625", "--max-layer-gb", "0.0625")
    err = done.stderr.decode()
    assert done.returncode != 0 and "--max-image-gb" in err, err
    assert not list(router.layout.images.glob(".tmp-*")), "the failed import left its scratch copy"
