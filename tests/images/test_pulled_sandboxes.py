"""Sandboxes from pulled, layered images through a real router: the overlay of shared layers under user
namespaces (owners, copy-up, whiteouts, hardlinks), the digest in the record, and ``rm`` while in use."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from grove.client import Grove
from router.backends.local.images import MAX_LAYERS
from tests.images.test_pull import whiteout_layers
from tests.support.imagetools import Layer
from tests.support.registry import Registry, write_oci_layout
from tests.support.router_fixtures import RouterProcess, wait_for, wait_removed


def _owned_layer() -> bytes:
    """Files owned by a user (1000:1000), with a directory that user may write to."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, uid, data in (("home", 0, None), ("home/dev", 1000, None), ("home/dev/notes", 1000, b"hi\n")):
            info = tarfile.TarInfo(name)
            info.uid = info.gid = uid
            info.type = tarfile.DIRTYPE if data is None else tarfile.REGTYPE
            info.mode, info.size = (0o755 if data is None else 0o644), len(data or b"")
            tf.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def _pull(router: RouterProcess, ref: str, *extra: str) -> str:
    done = router.cli("image", "pull", "--insecure", ref, *extra, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode().splitlines()[-1].split()[2]


def test_sandbox_on_layers_under_a_user_namespace(
    router: RouterProcess, grove: Grove, registry: Registry, base_layer: bytes, tmp_path: Path
) -> None:
    digests = write_oci_layout(tmp_path / "app", [[*whiteout_layers(base_layer), _owned_layer()]])
    registry.push(tmp_path / "app", "app:1")
    ref = registry.ref("app:1")
    assert _pull(router, ref) == digests[0]

    sb = grove.create(ref)
    assert sb.info["image"] == ref and sb.info["image_digest"] == digests[0]
    r = sb.exec("test -e /etc/motd || echo motd-whited-out; ls /opt; cat /data/link /data/twin;"
                " test -e /data/gone || echo gone-whited-out; stat -c '%u:%g %n' /bin/busybox /home/dev/notes")
    assert r.stdout == (b"motd-whited-out\nnew\nlinked\nmine\ngone-whited-out\n"
                        b"0:0 /bin/busybox\n1000:1000 /home/dev/notes\n"), r.stderr
    # Copy-up through the idmapped layers: root changes a root-owned file, the user keeps its own.
    r = sb.exec("echo more >> /data/orig && cat /data/orig && echo x > /opt/new && mkdir /opt/d && "
                "rm /bin/ls && test ! -e /bin/ls && stat -c '%u:%g' /data/orig /home/dev/notes")
    assert r.exit_code == 0 and r.stdout == b"linked\nmore\n0:0\n1000:1000\n", r.stderr
    # The shared layers on disk are untouched.
    layers = sorted((router.layout.images / "layers").glob("*/data/orig"))
    assert layers and all(p.read_text() == "linked\n" for p in layers)
    assert any((router.layout.images / "layers").glob("*/bin/ls"))
    # A second sandbox of the same image sees none of the first one's changes.
    other = grove.create(ref)
    assert other.exec("cat /data/orig; test -e /bin/ls && echo ls").stdout == b"linked\nls\n"


def test_rm_while_a_sandbox_uses_the_image(
    router: RouterProcess, grove: Grove, registry: Registry, base_layer: bytes, tmp_path: Path
) -> None:
    layers, blobs = router.layout.images / "layers", router.layout.images / "blobs" / "sha256"
    initial = ({p.name for p in layers.iterdir() if p.is_dir()} if layers.is_dir() else set(),
               {p.name for p in blobs.iterdir()} if blobs.is_dir() else set())
    for name, marker in (("keep", b"keep\n"), ("gone", b"gone\n")):
        write_oci_layout(tmp_path / name, [[base_layer, {"marker": marker}]])
        registry.push(tmp_path / name, f"{name}:1")
        _pull(router, registry.ref(f"{name}:1"), "--name", name)
    before = {p.name for p in layers.iterdir() if p.is_dir()}
    sb = grove.create("gone", heartbeat=False, idle_timeout_s=1, heartbeat_timeout_s=120)
    assert sb.exec("cat /marker").stdout == b"gone\n"

    done = router.cli("image", "rm", "gone")
    assert done.returncode == 0, done.stderr.decode()
    assert {p.name for p in layers.iterdir() if p.is_dir()} == before  # its sandbox still uses them
    with pytest.raises(Exception) as missing:
        grove.create("gone")
    assert getattr(missing.value, "status", None) == 404
    # Scaled to zero and woken, the sandbox goes back over the very layers it was made on.
    wait_for(lambda: router.http("GET", f"/v1/sandboxes/{sb.id}").json()["status"] == "idle", 8, 0.1,
             "the sandbox to scale to zero")
    assert sb.exec("cat /marker; ls /bin/busybox").stdout == b"gone\n/bin/busybox\n"

    sb.close()  # its layer goes with its files; the base stays for `keep`
    wait_removed(router.state_dir, sb.id)
    after = {p.name for p in layers.iterdir() if p.is_dir()}
    assert len(after) == len(before) - 1 and after < before
    keep = grove.create("keep")
    assert keep.exec("cat /marker").stdout == b"keep\n"
    assert router.cli("image", "rm", "keep").returncode == 0
    keep.close()
    wait_removed(router.state_dir, keep.id)
    # Back to what other images of the module hold: every layer and blob of these two is gone.
    assert ({p.name for p in layers.iterdir() if p.is_dir()}, {p.name for p in blobs.iterdir()}) == initial


def test_a_deep_image_runs_with_its_top_merged(
    router: RouterProcess, grove: Grove, registry: Registry, base_layer: bytes, tmp_path: Path
) -> None:
    layers: list[Layer] = [base_layer, {"data": None, "data/keep": b"k\n", "data/drop": b"d\n"}]
    layers += [{f"data/f{i}": f"{i}\n".encode()} for i in range(MAX_LAYERS + 4)]
    # Whiteouts of a file of a kept layer (f5) and of one merged into the top (f25, 26 layers up).
    layers.append({"data/.wh.drop": b"", "data/.wh.f5": b"", "data/.wh.f25": b"", "data/f3": b"changed\n"})
    write_oci_layout(tmp_path / "deep", [layers])
    registry.push(tmp_path / "deep", "deep:1")
    _pull(router, registry.ref("deep:1"), "--name", "deep")
    sb = grove.create("deep")
    r = sb.exec("ls /data | wc -l; cat /data/keep /data/f3 /data/f27; test -e /data/drop || echo no-drop;"
                " test -e /data/f5 || test -e /data/f25 || echo no-f5-f25")
    assert r.stdout == f"{1 + MAX_LAYERS + 4 - 2}\nk\nchanged\n27\nno-drop\nno-f5-f25\n".encode(), r.stderr
    listing = router.cli("image", "ls").stdout.decode().splitlines()
    row = next(line.split() for line in listing if line.startswith("deep "))
    assert row[1].startswith("sha256:") and row[2].endswith("M") and row[3].endswith("M"), row
