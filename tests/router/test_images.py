"""Images through a real router: a busybox rootfs with no Python, a ``docker save`` tarball with layers and
whiteouts, both imported with ``grove image import`` into the running router's state dir."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from grove.client import Grove
from tests.support.imagetools import make_busybox_rootfs, make_docker_save_tar, tar_directory
from tests.support.router_fixtures import RouterProcess, error_of, wait_for, wait_removed


def _import(router: RouterProcess, name: str, source: Path) -> str:
    """Import with the CLI; return the digest it printed."""
    done = router.cli("image", "import", name, str(source))
    assert done.returncode == 0, done.stderr.decode()
    match = re.fullmatch(rf"imported {name} (sha256:[0-9a-f]{{64}})\n", done.stdout.decode())
    assert match, done.stdout
    return match.group(1)


@pytest.fixture(scope="module")
def busybox(router: RouterProcess, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The ``busybox`` image's digest."""
    rootfs = make_busybox_rootfs(tmp_path_factory.mktemp("bb") / "rootfs")
    return _import(router, "busybox", rootfs)


def test_busybox_image_runs_without_python(router: RouterProcess, grove: Grove, busybox: str) -> None:
    sb = grove.create("busybox")
    assert sb.info["image"] == "busybox" and sb.info["image_digest"] == busybox
    r = sb.exec("echo hi; ls /")
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.decode().split()
    assert lines[0] == "hi" and {"bin", "etc", "tmp", "proc", "workspace"} <= set(lines[1:])
    # The image has no Python, no /usr/lib: the executor runs from the read-only bundle at /.grove.
    assert sb.exec("test -e /usr/bin/python3 || test -e /bin/python3 || echo no-python").stdout == b"no-python\n"
    assert sb.exec(["sh", "-c", "readlink /bin/sh"]).stdout == b"busybox\n"
    assert sb.exec("ps | wc -l").exit_code == 0
    # Files in and out work the same.
    sb.write_file("/workspace/x.txt", "from the host\n")
    assert sb.exec("cat /workspace/x.txt").stdout == b"from the host\n"
    sb.exec("echo back > /root/y")
    assert sb.read_file("/root/y") == b"back\n"
    # Nothing written reaches the image.
    image_root = router.layout.images / "busybox" / "rootfs"
    assert not (image_root / "workspace" / "x.txt").exists() and not (image_root / "root" / "y").exists()


def test_the_default_image_finds_libraries_through_the_hosts_loader_cache(grove: Grove) -> None:
    # The default image runs the host's /usr, so it carries the host's loader cache: a dynamically linked command
    # looks its libraries up there instead of trying every library directory for each.
    with grove.create("default", heartbeat=False) as sandbox:
        listed = sandbox.exec(["/sbin/ldconfig", "-p"])
        assert listed.exit_code == 0, listed.stderr
        head, _, rest = listed.stdout.decode().partition("\n")
        assert head.endswith("libs found in cache `/etc/ld.so.cache'"), head
        libc = re.search(r"^\s+libc\.so\.6 \(.*\) => (\S+)$", rest, re.MULTILINE)
        assert libc, rest[:500]
        assert sandbox.exec(["test", "-f", libc.group(1)]).exit_code == 0, f"{libc.group(1)} is not in the sandbox"


def test_image_ls_lists_both(router: RouterProcess, busybox: str) -> None:
    done = router.cli("image", "ls")
    assert done.returncode == 0, done.stderr
    rows = {line.split()[0]: line.split()[1] for line in done.stdout.decode().splitlines()}
    assert rows["busybox"] == busybox and rows["default"].startswith("sha256:")


def test_docker_save_tarball(router: RouterProcess, grove: Grove, tmp_path: Path) -> None:
    base = make_busybox_rootfs(tmp_path / "base")
    (base / "etc" / "motd").write_text("from layer one\n")
    (base / "opt").mkdir()
    (base / "opt" / "old").write_text("old\n")
    tarball = make_docker_save_tar(tmp_path / "image.tar", [
        tar_directory(base),
        {"etc/motd": b"from layer two\n", "etc/.wh.group": b"", "opt/.wh..wh..opq": b"", "opt/new": b"new\n",
         "app": None, "app/run.sh": b"#!/bin/sh\necho app ran\n"},
    ])
    digest = _import(router, "docker-img", tarball)
    sb = grove.create("docker-img")
    assert sb.info["image_digest"] == digest
    r = sb.exec("cat /etc/motd; test -e /etc/group || echo group-whited-out; ls /opt; sh /app/run.sh")
    assert r.stdout == b"from layer two\ngroup-whited-out\nnew\napp ran\n", r.stderr


def test_same_content_same_digest_and_reimport_conflicts(router: RouterProcess, tmp_path: Path, busybox: str) -> None:
    again = router.cli("image", "import", "busybox", str(make_busybox_rootfs(tmp_path / "bb2")))
    assert again.returncode != 0 and b"already exists" in again.stderr
    assert _import(router, "busybox-copy", tmp_path / "bb2") == busybox  # content, not time, makes the digest


def test_unknown_and_invalid_images(router: RouterProcess, busybox: str) -> None:
    reply = router.http("POST", "/v1/sandboxes", json_body={"image": "no-such-image"})
    assert reply.status == 404
    message = error_of(reply)["message"]
    assert "no-such-image" in message and "busybox" in message and "default" in message
    reply = router.http("POST", "/v1/sandboxes", json_body={"image": "Bad/Name"})
    assert reply.status == 422 and "image name" in error_of(reply)["message"]
    bad = router.cli("image", "import", "x", "/no/such/source")
    assert bad.returncode != 0 and b"/no/such/source" in bad.stderr
    assert router.http("GET", "/v1/sandboxes").json()["sandboxes"] == []


def _versioned_rootfs(base: Path, version: str) -> Path:
    rootfs = make_busybox_rootfs(base / f"v{version}")
    (rootfs / "data").mkdir()
    (rootfs / "data" / "version").write_text(f"{version}\n")
    for n in range(20):  # files the running sandbox has not opened yet when the image is replaced
        (rootfs / "data" / f"late-{n}").write_text(f"{version}-{n}\n")
    return rootfs


def _retired(router: RouterProcess) -> set[str]:
    root = router.layout.images / ".retired"
    return {f"sha256:{p.name}" for p in root.iterdir()} if root.is_dir() else set()


def test_replacing_or_removing_an_image_leaves_its_sandboxes_their_own_version(
    router: RouterProcess, grove: Grove, tmp_path: Path
) -> None:
    first = _import(router, "versioned", _versioned_rootfs(tmp_path, "1"))
    old = grove.create("versioned", heartbeat=False, idle_timeout_s=1, heartbeat_timeout_s=120)
    old.exec("echo mine > /root/mine")

    done = router.cli("image", "import", "versioned", str(_versioned_rootfs(tmp_path, "2")), "--force")
    assert done.returncode == 0, done.stderr.decode()
    second = done.stdout.decode().split()[-1]
    assert second != first and _retired(router) == {first}
    new = grove.create("versioned", heartbeat=False)
    assert new.exec("cat /data/version").stdout == b"2\n"
    # The running sandbox keeps reading its own version, also files it had not touched yet.
    assert old.exec("cat /data/version /data/late-7").stdout == b"1\n1-7\n"

    # Scaled to zero and woken: the layer goes back over the version it was made on.
    wait_for(lambda: router.http("GET", f"/v1/sandboxes/{old.id}").json()["status"] == "idle", 8, 0.1,
             "the old sandbox to scale to zero")
    assert old.exec("cat /data/version /data/late-9 /root/mine").stdout == b"1\n1-9\nmine\n"

    removed = router.cli("image", "rm", "versioned")
    assert removed.returncode == 0, removed.stderr.decode()
    assert _retired(router) == {first, second}
    assert new.exec("cat /data/late-3").stdout == b"2-3\n"
    with pytest.raises(Exception) as gone:
        grove.create("versioned", heartbeat=False)
    assert getattr(gone.value, "status", None) == 404 and "no image 'versioned'" in str(gone.value)

    old.close()  # its version is collected with it (once its files are gone); the other stays for `new`
    wait_removed(router.state_dir, old.id)
    assert _retired(router) == {second}
    new.close()
    wait_removed(router.state_dir, new.id)
    assert _retired(router) == set()
