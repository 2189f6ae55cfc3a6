"""A real registry on loopback (Debian's ``docker-registry``, the CNCF distribution registry) and images
the tests build themselves: OCI layouts written here from tar layers, pushed with ``skopeo copy``.

:func:`registry_server` starts one registry on a free loopback port with filesystem storage in a temp
dir (optionally behind htpasswd basic auth) and stops it by PID at the end.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import free_tcp_port
from tests.support.imagetools import ARCH, Layer, layer_tar

USER, PASSWORD = "grove", "correct horse"


@dataclass
class Registry:
    """A running registry: where it listens and where it keeps its blobs."""

    host: str
    """``127.0.0.1:PORT``."""
    storage: Path
    """Its filesystem storage root."""
    auth: bool
    """Whether it asks for :data:`USER` / :data:`PASSWORD`."""

    def ref(self, repo: str) -> str:
        """A reference into this registry."""
        return f"{self.host}/{repo}"

    def push(self, layout: Path, repo: str, *, all_platforms: bool = False) -> None:
        """Push the OCI layout ``layout`` (its tag ``image``) to ``repo`` (``name:tag``)."""
        argv = ["skopeo", "copy", "--quiet", "--dest-tls-verify=false"]
        if self.auth:
            argv.append(f"--dest-creds={USER}:{PASSWORD}")
        if all_platforms:
            argv.append("--all")
        argv += [f"oci:{layout}:image", f"docker://{self.ref(repo)}"]
        done = subprocess.run(argv, capture_output=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr.decode()

    def blob_fetches(self, digest: str) -> int:
        """How many times a blob was served (from the registry's access log)."""
        log = (self.storage.parent / "registry.log").read_text(errors="replace")
        return sum(1 for line in log.splitlines() if f"/blobs/{digest} " in line and '" 200 ' in line
                   and '"GET ' in line)

    def blob_file(self, digest: str) -> Path:
        """Where the registry keeps a blob's bytes (to corrupt it on purpose)."""
        hexa = digest.removeprefix("sha256:")
        return self.storage / "docker/registry/v2/blobs/sha256" / hexa[:2] / hexa / "data"


@contextlib.contextmanager
def registry_server(*, auth: bool = False) -> Iterator[Registry]:
    """A registry on a free loopback port, stopped (by PID) and removed at the end."""
    tmp = Path(tempfile.mkdtemp(prefix="grove-registry-"))
    port = free_tcp_port()
    config = [
        "version: 0.1", "log:", "  level: error", "storage:", "  filesystem:", f"    rootdirectory: {tmp}/data",
        "  delete:", "    enabled: true", "http:", f"  addr: 127.0.0.1:{port}",
    ]
    if auth:
        done = subprocess.run(["htpasswd", "-Bbn", USER, PASSWORD], capture_output=True, check=True, timeout=30)
        (tmp / "htpasswd").write_bytes(done.stdout)
        config += ["auth:", "  htpasswd:", "    realm: grove-test", f"    path: {tmp}/htpasswd"]
    (tmp / "config.yml").write_text("\n".join(config) + "\n")
    with open(tmp / "registry.log", "wb") as log:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(["docker-registry", "serve", str(tmp / "config.yml")], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=2).close()
                break
            except urllib.error.HTTPError:
                break  # 401 with auth: it answers
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"docker-registry did not start: {(tmp / 'registry.log').read_text()}") from None
                time.sleep(0.05)
        yield Registry(f"127.0.0.1:{port}", tmp / "data", auth)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def _blob(root: Path, data: bytes, media_type: str, **extra: object) -> dict[str, object]:
    digest = hashlib.sha256(data).hexdigest()
    (root / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
    (root / "blobs" / "sha256" / digest).write_bytes(data)
    return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(data), **extra}


def write_oci_layout(
    root: Path, images: Sequence[Sequence[Layer]], *, platforms: Sequence[str] | None = None,
    run_config: dict[str, object] | None = None,
) -> list[str]:
    """An OCI layout directory tagged ``image``: one image, or an index of one image per platform
    (``os/arch``); returns each image's manifest digest. Layers are gzipped, as registries serve them.
    ``run_config``: the images' run config (``Env``, ``WorkingDir``, ``User``...; default ``PATH=/bin`` only)."""
    platforms = list(platforms or [f"linux/{ARCH}"])
    assert len(platforms) == len(images)
    descriptors, digests = [], []
    for layers, plat in zip(images, platforms, strict=True):
        os_name, arch = plat.split("/")
        tars = [layer_tar(layer) for layer in layers]
        config = json.dumps({
            "architecture": arch, "os": os_name, "config": run_config or {"Env": ["PATH=/bin"]},
            "rootfs": {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(t).hexdigest()}" for t in tars]},
        }).encode()
        manifest = json.dumps({
            "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": _blob(root, config, "application/vnd.oci.image.config.v1+json"),
            "layers": [_blob(root, gzip.compress(t, mtime=0), "application/vnd.oci.image.layer.v1.tar+gzip")
                       for t in tars],
        }).encode()
        desc = _blob(root, manifest, "application/vnd.oci.image.manifest.v1+json",
                     platform={"architecture": arch, "os": os_name})
        descriptors.append(desc)
        digests.append(str(desc["digest"]))
    top = descriptors[0]
    if len(images) > 1:
        index = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                            "manifests": descriptors}).encode()
        top = _blob(root, index, "application/vnd.oci.image.index.v1+json")
    top = {**top, "annotations": {"org.opencontainers.image.ref.name": "image"}}
    top.pop("platform", None)
    (root / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (root / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [top]}))
    return digests


def du(path: Path) -> int:
    """Bytes allocated under ``path`` (a hardlinked file once), as ``du`` counts them."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            st = os.lstat(os.path.join(dirpath, name))
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total
