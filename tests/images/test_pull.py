"""``grove image pull`` against a real registry on loopback: platforms, auth, digests, retries, sharing.

Each test pushes images it builds itself (OCI layouts from tar layers, pushed with skopeo) and pulls
them into a store of its own; one registry serves the whole module.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import signal
import stat
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from grove.core.errors import BadGateway, Invalid, NotFound
from router.backends.local.image_pull import pull_image, write_authfile
from router.backends.local.images import ImageStore
from router.backends.local.overlay_layer import OPAQUE_XATTR
from router.backends.local.registry_pull import PullOptions
from tests.support.imagetools import ARCH, Layer, layer_tar, make_oci_layout_tar
from tests.support.registry import PASSWORD, USER, Registry, du, registry_server, write_oci_layout

INSECURE = PullOptions(insecure=True)


def _hardlinks_layer() -> bytes:
    """A layer with a hardlink to a file of the layer below and one to a file of its own."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, kind, target, data in (("data/link", tarfile.LNKTYPE, "data/orig", b""),
                                         ("data/mine", tarfile.REGTYPE, "", b"mine\n"),
                                         ("data/twin", tarfile.LNKTYPE, "data/mine", b"")):
            info = tarfile.TarInfo(name)
            info.type, info.linkname, info.size, info.mode = kind, target, len(data), 0o644
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def whiteout_layers(base: bytes) -> list[Layer]:
    """Three layers over ``base``: files, then whiteouts, an opaque directory and hardlinks over them."""
    return [
        base,
        {"etc/motd": b"one\n", "opt": None, "opt/old": b"old\n", "data": None, "data/orig": b"linked\n",
         "data/gone": b"gone\n"},
        {"etc/.wh.motd": b"", "opt/.wh..wh..opq": b"", "opt/new": b"new\n", "data/.wh.gone": b""},
        _hardlinks_layer(),
    ]


@pytest.fixture
def store(tmp_path: Path) -> ImageStore:
    return ImageStore(tmp_path / "images")


def leftovers(store: ImageStore) -> list[str]:
    """Temporary entries a pull left in the store (there must be none)."""
    return sorted(p.name for p in store.root.iterdir() if p.name.startswith((".pull-", ".tmp-"))) + sorted(
        p.name for p in (store.root / "layers").iterdir() if p.name.startswith(".tmp-"))


def test_multi_platform_index_picks_the_platform(registry: Registry, store: ImageStore, tmp_path: Path) -> None:
    other = "arm64" if ARCH != "arm64" else "amd64"
    digests = write_oci_layout(tmp_path / "multi", [[{"platform": f"{ARCH}\n".encode()}],
                                                    [{"platform": f"{other}\n".encode()}]],
                               platforms=[f"linux/{ARCH}", f"linux/{other}"])
    registry.push(tmp_path / "multi", "multi:1", all_platforms=True)
    ref = registry.ref("multi:1")

    host = pull_image(store, ref, options=INSECURE)
    assert host.digest == digests[0] and (host.rootfs / "platform").read_text() == f"{ARCH}\n"
    foreign = pull_image(store, ref, name="multi-other", options=PullOptions(platform=f"linux/{other}", insecure=True))
    assert foreign.digest == digests[1] and (foreign.rootfs / "platform").read_text() == f"{other}\n"
    meta = (store.root / "multi-other" / "image.json").read_text()
    assert f'"platform": "linux/{other}"' in meta and '"index_digest": "sha256:' in meta

    with pytest.raises(NotFound) as missing:
        pull_image(store, ref, name="nope", options=PullOptions(platform="linux/s390x", insecure=True))
    assert "no image for linux/s390x" in str(missing.value) and f"linux/{other}" in str(missing.value)
    with pytest.raises(Invalid, match="invalid platform"):
        pull_image(store, ref, name="nope", options=PullOptions(platform="s390x", insecure=True))
    assert leftovers(store) == []


def test_unknown_image_and_plain_http_are_clear(registry: Registry, store: ImageStore) -> None:
    with pytest.raises(NotFound) as unknown:
        pull_image(store, registry.ref("no/such:image"), options=INSECURE)
    assert "404" in str(unknown.value) and "manifest unknown" in str(unknown.value)
    with pytest.raises(BadGateway) as plain:  # without --insecure skopeo insists on HTTPS
        pull_image(store, registry.ref("no/such:image"))
    assert "--insecure" in str(plain.value) or "https" in str(plain.value).lower()
    assert leftovers(store) == [] and store.list() == []


def test_auth_wrong_password_is_a_clear_401(store: ImageStore, tmp_path: Path, base_layer: bytes) -> None:
    write_oci_layout(tmp_path / "private", [[base_layer]])
    with registry_server(auth=True) as reg:
        reg.push(tmp_path / "private", "private:1")
        ref = reg.ref("private:1")
        for creds in (None, "wrong password"):
            authfile = None if creds is None else write_authfile(tmp_path / "w", reg.host, USER, creds)
            (tmp_path / "w").mkdir(exist_ok=True)
            with pytest.raises(BadGateway) as refused:
                pull_image(store, ref, options=PullOptions(insecure=True, authfile=authfile))
            message = str(refused.value)
            assert "401 Unauthorized" in message and reg.host in message and "--authfile" in message, message
            (authfile or tmp_path / "none").unlink(missing_ok=True)
        assert leftovers(store) == [] and store.list() == []

        # The credentials users already have: REGISTRY_AUTH_FILE, read by the CLI's skopeo.
        (tmp_path / "ok").mkdir()
        good = write_authfile(tmp_path / "ok", reg.host, USER, PASSWORD)
        env = {**os.environ, "REGISTRY_AUTH_FILE": str(good)}
        done = subprocess.run(
            [str(Path(sys.executable).with_name("grove")), "image", "pull", "--insecure", ref,
             "--state-dir", str(store.root.parent)], env=env, capture_output=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr.decode()
        assert store.get(ref).layers and (store.get(ref).rootfs / "bin" / "busybox").is_file()
        # And --username with the password on stdin (never on a command line).
        done = subprocess.run(
            [str(Path(sys.executable).with_name("grove")), "image", "pull", "--insecure", ref, "--name", "priv",
             "--username", USER, "--password-stdin", "--state-dir", str(store.root.parent)],
            input=f"{PASSWORD}\n".encode(), capture_output=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr.decode()
        assert store.get("priv").digest == store.get(ref).digest


def test_corrupt_blob_is_refused_and_a_retry_completes(
    registry: Registry, store: ImageStore, tmp_path: Path, base_layer: bytes
) -> None:
    layers = [base_layer, {"one": os.urandom(300_000)}, {"two": os.urandom(300_000)}]
    write_oci_layout(tmp_path / "img", [layers])
    registry.push(tmp_path / "img", "corrupt:1")
    blobs = sorted((tmp_path / "img" / "blobs" / "sha256").iterdir(), key=lambda p: -p.stat().st_size)
    victim = next(p for p in blobs if p.stat().st_size > 250_000 and p.read_bytes()[:2] == b"\x1f\x8b"
                  and len(p.read_bytes()) < 1_000_000)
    stored = registry.blob_file(f"sha256:{victim.name}")
    good = stored.read_bytes()
    stored.write_bytes(good[:1000] + bytes(255 - b for b in good[1000:1010]) + good[1010:])  # same size

    with pytest.raises(BadGateway) as refused:
        pull_image(store, registry.ref("corrupt:1"), options=INSECURE)
    assert "did not match its digest" in str(refused.value) and victim.name in str(refused.value)
    assert store.list() == [] and leftovers(store) == []
    assert not (store.root / "blobs" / "sha256" / victim.name).exists()
    fetched = {p.name: p.stat().st_ino for p in (store.root / "blobs" / "sha256").iterdir()}

    stored.write_bytes(good)  # the registry is repaired: the retry completes, reusing what it fetched
    image = pull_image(store, registry.ref("corrupt:1"), options=INSECURE)
    assert len(image.layers) == 3 and (image.layers[1] / "one").stat().st_size == 300_000
    after = {p.name: p.stat().st_ino for p in (store.root / "blobs" / "sha256").iterdir()}
    assert victim.name in after and all(after[name] == ino for name, ino in fetched.items())
    assert leftovers(store) == []


def test_images_sharing_a_base_store_it_once(
    registry: Registry, store: ImageStore, tmp_path: Path, base_layer: bytes
) -> None:
    big = {"opt": None, "opt/base.bin": os.urandom(3 << 20)}  # incompressible: 3 MiB on disk however stored
    for n in range(3):
        write_oci_layout(tmp_path / f"task{n}", [[base_layer, big, {f"task{n}": f"task {n}\n".encode()}]])
        registry.push(tmp_path / f"task{n}", f"task{n}:1")
    pull_image(store, registry.ref("task0:1"), options=INSECURE)
    one = du(store.root / "layers")
    for n in (1, 2):
        pull_image(store, registry.ref(f"task{n}:1"), options=INSECURE)
    three = du(store.root / "layers")
    # Two more images cost their own small layer each, not the 5 MB base again.
    assert one > 4 << 20 and three - one < 200_000, (one, three)
    usage = store.usage()
    for n in range(3):
        use = usage[registry.ref(f"task{n}:1")]
        assert use.shared > 4 << 20 and use.size - use.shared < 100_000, use
    assert len(store.layers.ids()) == 2 + 3
    # ... and the pulls fetched the base's blobs once: skopeo reuses what the shared blob dir holds.
    layer_digest = "sha256:" + hashlib.sha256(gzip.compress(layer_tar(big), mtime=0)).hexdigest()
    assert registry.blob_fetches(layer_digest) == 1
    # The flattened store (``grove image import`` of the same images as OCI tarballs) holds the base thrice.
    flat = ImageStore(tmp_path / "flat")
    for n in range(3):
        tarball = make_oci_layout_tar(tmp_path / f"task{n}.tar", [base_layer, big, {f"task{n}": b"x\n"}])
        flat.import_image(f"t{n}", tarball)
    assert du(flat.root) > 3 * (4 << 20) > 2 * du(store.root / "layers")


def test_whiteouts_opaque_dirs_and_hardlinks_become_overlay_form(
    registry: Registry, store: ImageStore, tmp_path: Path, base_layer: bytes
) -> None:
    write_oci_layout(tmp_path / "wh", [whiteout_layers(base_layer)])
    registry.push(tmp_path / "wh", "wh:1")
    image = pull_image(store, registry.ref("wh:1"), options=INSECURE)
    whiteouts, top = image.layers[2], image.layers[3]
    motd = os.lstat(whiteouts / "etc" / "motd")
    assert stat.S_ISCHR(motd.st_mode) and motd.st_rdev == os.makedev(0, 0)
    assert os.getxattr(whiteouts / "opt", OPAQUE_XATTR) == b"y"
    assert (whiteouts / "opt" / "new").read_text() == "new\n"
    assert (image.layers[1] / "opt" / "old").exists()  # the lower layer is untouched: it may be shared
    # A hardlink to a lower layer's file is a copy (layers are shared, never linked into each other);
    # one inside its own layer stays a link.
    assert (top / "data" / "link").read_text() == "linked\n" and os.stat(top / "data" / "link").st_nlink == 1
    assert os.stat(top / "data" / "twin").st_ino == os.stat(top / "data" / "mine").st_ino


def test_a_killed_pull_completes_on_retry_without_fetching_twice(
    registry: Registry, store: ImageStore, tmp_path: Path
) -> None:
    # A small layer lands first while two big ones are still in flight: the kill interrupts those.
    write_oci_layout(tmp_path / "big", [[{"small": b"s\n"}, {"big1": os.urandom(24 << 20)},
                                         {"big2": os.urandom(24 << 20)}]])
    registry.push(tmp_path / "big", "big:1")
    ref = registry.ref("big:1")
    argv = [str(Path(sys.executable).with_name("grove")), "image", "pull", "--insecure", ref,
            "--state-dir", str(store.root.parent)]
    blobs = store.root / "blobs" / "sha256"
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not (blobs.is_dir() and any(blobs.iterdir())) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.002)
        assert proc.poll() is None, "the pull finished before it could be interrupted"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # grove and its skopeo
        proc.wait()
    fetched = {p.name: p.stat().st_ino for p in blobs.iterdir() if not p.name.startswith(".")}
    assert fetched and store.list() == []

    image = pull_image(store, ref, options=INSECURE)
    assert [sorted(os.listdir(layer)) for layer in image.layers] == [["small"], ["big1"], ["big2"]]
    after = {p.name: p.stat().st_ino for p in blobs.iterdir()}
    assert all(after.get(name) == ino for name, ino in fetched.items())  # reused, not fetched again
    # The killed pull's scratch directory goes with the next collection.
    store.collect_layers()
    assert leftovers(store) == []
