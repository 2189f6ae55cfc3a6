"""``grove image export`` and ``build-debian`` through the real CLI on a real state dir: an exported image, layered
or flat, comes back through ``grove image import`` as the same tree; a Debian build says how it is getting on."""

from __future__ import annotations

import gzip
import hashlib
import http.server
import json
import os
import stat
import subprocess
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from grove.statedir import StateDir
from router.backends.local.images import ImageStore, LayerSource
from router.backends.local.overlay_layer import OPAQUE_XATTR
from tests.support.imagetools import layer_tar, make_busybox_rootfs, make_docker_save_tar, tar_directory
from tests.support.router_fixtures import GROVE_BIN

pytestmark = pytest.mark.local_only

# Over a busybox base: a layer that adds a directory, and one that deletes a file below it (a whiteout), replaces
# that directory's content (opaque), adds a hardlinked pair and a file of its own.
MIDDLE: dict[str, bytes | str | None] = {"opt": None, "opt/old": b"old\n", "opt/keep-not": b"gone\n"}
TOP: dict[str, bytes | str | None] = {
    "etc/.wh.group": b"", "opt": None, "opt/.wh..wh..opq": b"", "opt/new": b"new\n", "etc/motd": b"hello\n",
}


def grove(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The ``grove`` CLI on a state dir."""
    return subprocess.run([GROVE_BIN, "--state-dir", str(state), *args], capture_output=True, text=True, timeout=300,
                          check=False, stdin=subprocess.DEVNULL)


def digest_of(state: Path, name: str) -> str:
    """An image's digest as its ``image.json`` records it."""
    return str(json.loads((StateDir(state).images / name / "image.json").read_text())["digest"])


@pytest.fixture
def state(tmp_path: Path) -> Path:
    """A state dir of the test's own."""
    path = tmp_path / "state"
    path.mkdir()
    return path


def test_an_exported_layered_image_imports_as_the_tree_its_layers_make(state: Path, tmp_path: Path) -> None:
    base = tar_directory(make_busybox_rootfs(tmp_path / "busybox"))
    layers = [base, MIDDLE, TOP]
    sources = []
    for i, layer in enumerate(layers):
        tar = layer_tar(layer)
        blob = tmp_path / f"layer{i}.tar.gz"
        blob.write_bytes(gzip.compress(tar, mtime=0))
        sources.append(LayerSource(blob, "sha256:" + hashlib.sha256(tar).hexdigest()))
    image = ImageStore(StateDir(state).images).add_layered("layered", "sha256:" + "ab" * 32, sources, "test")
    top = image.layers[-1]
    assert stat.S_ISCHR(os.lstat(top / "etc" / "group").st_mode) and os.getxattr(top / "opt", OPAQUE_XATTR) == b"y"

    done = grove(state, "image", "export", "layered", str(tmp_path / "out.tar.gz"))
    assert done.returncode == 0, done.stderr
    assert "exported layered sha256:" + "ab" * 32 in done.stderr and "(3 layers;" in done.stderr
    with tarfile.open(tmp_path / "out.tar.gz") as tf:
        manifest = json.load(tf.extractfile("manifest.json"))  # type: ignore[arg-type]
        assert manifest[0]["RepoTags"] == ["layered:latest"] and len(manifest[0]["Layers"]) == 3
        with tarfile.open(fileobj=tf.extractfile(manifest[0]["Layers"][2])) as last:  # the top layer, OCI form
            names = set(last.getnames())
    assert {"etc/.wh.group", "opt/.wh..wh..opq", "opt/new"} <= names and "etc/group" not in names

    assert grove(state, "image", "import", "back", str(tmp_path / "out.tar.gz")).returncode == 0
    assert grove(state, "image", "import", "reference", str(make_docker_save_tar(tmp_path / "ref.tar", layers))
                 ).returncode == 0
    assert digest_of(state, "back") == digest_of(state, "reference")
    rootfs = StateDir(state).images / "back" / "rootfs"
    assert not (rootfs / "etc" / "group").exists() and (rootfs / "etc" / "passwd").exists()
    assert sorted(os.listdir(rootfs / "opt")) == ["new"] and (rootfs / "etc" / "motd").read_text() == "hello\n"


def test_a_flat_image_round_trips_to_the_same_digest(state: Path, tmp_path: Path) -> None:
    rootfs = make_busybox_rootfs(tmp_path / "rootfs")
    (rootfs / "data").mkdir()
    (rootfs / "data" / "a").write_bytes(b"x" * 70_000)
    os.link(rootfs / "data" / "a", rootfs / "data" / "b")
    os.chown(rootfs / "data" / "a", 1234, 5678)
    os.chmod(rootfs / "data", 0o750)
    assert grove(state, "image", "import", "flat", str(rootfs)).returncode == 0

    with open(tmp_path / "flat.tar", "wb") as out:  # to stdout, as into `docker load`
        done = subprocess.run([GROVE_BIN, "--state-dir", str(state), "image", "export", "flat", "-"], stdout=out,
                              stderr=subprocess.PIPE, text=True, timeout=120, check=False)
    assert done.returncode == 0 and "to stdout (1 layer;" in done.stderr, done.stderr
    assert grove(state, "image", "import", "flat-again", str(tmp_path / "flat.tar")).returncode == 0
    assert digest_of(state, "flat-again") == digest_of(state, "flat")
    again = StateDir(state).images / "flat-again" / "rootfs" / "data"
    assert os.stat(again / "a").st_ino == os.stat(again / "b").st_ino  # still one file with two names
    assert (os.stat(again / "a").st_uid, os.stat(again / "a").st_gid) == (1234, 5678)

    refused = grove(state, "image", "export", "default", str(tmp_path / "d.tar"))
    assert refused.returncode == 1 and "cannot be exported" in refused.stderr and "Traceback" not in refused.stderr
    nowhere = grove(state, "image", "export", "flat", str(tmp_path / "no" / "such" / "dir.tar"))
    assert nowhere.returncode == 1 and "is not a directory" in nowhere.stderr
    unknown = grove(state, "image", "export", "nope", str(tmp_path / "x.tar"))
    assert unknown.returncode == 1 and "no image 'nope'; known images:" in unknown.stderr
    assert sorted(p.name for p in tmp_path.glob("*.tar*")) == ["flat.tar"]  # nothing half-written left


class _SlowMirror(http.server.BaseHTTPRequestHandler):
    """A Debian mirror that takes its time and then has nothing: apt waits on it, then mmdebstrap fails."""

    def do_GET(self) -> None:
        time.sleep(5)
        self.send_error(404)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def slow_mirror() -> Iterator[str]:
    """The URL of a real HTTP server on loopback that answers every request after 5 s, with a 404."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _SlowMirror)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/debian"
    finally:
        server.shutdown()
        server.server_close()


def test_build_debian_says_how_it_is_getting_on(state: Path, slow_mirror: str) -> None:
    started = time.monotonic()
    done = grove(state, "image", "build-debian", "deb", "--packages", "hello", "--mirror", slow_mirror)
    took = time.monotonic() - started
    lines = done.stderr.splitlines()
    assert lines[0] == (f"building image deb: Debian bookworm (minbase + hello) from {slow_mirror} with mmdebstrap; "
                        "about 20 s with a nearby mirror, minutes without")
    ticks = [line for line in lines if "s  mmdebstrap: fetching the package lists" in line]
    assert took > 5 and ticks, (took, lines)
    assert len(ticks) >= int(took // 5) - 1, (took, lines)  # one every 5 s while it works
    assert done.returncode == 1 and lines[-1].startswith("grove: mmdebstrap failed"), lines
