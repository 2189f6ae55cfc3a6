"""Issue 29, critical: an image whose mount points are symlinks must never reach the host's root.

The attack: an image with ``proc -> /`` (or ``dev -> /``, ``.grove -> /``). A sandbox init that mounts
on ``<root>/proc`` by name follows the link and mounts procfs over the host's ``/``; ``pivot_root`` and
the detach of the old root then take the stacked procfs off instead of the host's root, which stays
above the sandbox's root: ``ls /..`` inside lists the host. Each test here failed before the fix.

grove refuses such an image twice: when it is stored (import and pull, every layer, whatever a later
layer does) and again when a sandbox starts on it (a store written by an older grove, or changed on disk
behind its back). And init resolves every path it mounts on inside the new root, never on the host.
"""

from __future__ import annotations

import os
import shutil
import stat
import tarfile
from pathlib import Path

import pytest

from grove.client import Grove
from grove.core.errors import Invalid, NotFound
from tests.images.conftest import base_layer, registry  # noqa: F401  (module fixtures of the image tests)
from tests.support.imagetools import make_busybox_rootfs, make_docker_save_tar, tar_directory
from tests.support.registry import Registry, write_oci_layout
from tests.support.router_fixtures import RouterProcess

pytestmark = pytest.mark.local_only

MOUNT_POINTS = ("proc", "dev", ".grove", "usr")


def target_of(where: str, tmp: Path) -> str:
    """Where the attack's link points: the host's ``/``, but for ``dev`` (whose files init *writes*: a device
    node per name) an empty canary directory, so that a regression fills the canary, not the host's root."""
    if where != "dev":
        return "/"
    canary = tmp / "canary"
    canary.mkdir(exist_ok=True)
    return str(canary)


def _rootfs(tmp: Path, name: str, *, link: str | None = None, file: str | None = None) -> Path:
    """A busybox rootfs with ``link`` a symlink (see :func:`target_of`) or ``file`` a regular file, where a
    directory belongs. With ``proc`` linked, the root also holds what init reads from a /proc (as in the issue's
    reproduction), so that nothing but the link stops the attack."""
    root = make_busybox_rootfs(tmp / name)
    for rel in (link, file):
        if rel is not None and os.path.lexists(root / rel):
            if (root / rel).is_dir() and not (root / rel).is_symlink():
                shutil.rmtree(root / rel)
            else:
                (root / rel).unlink()
    if link is not None:
        os.symlink(target_of(link, tmp), root / link)
    if link == "proc":
        (root / "self").mkdir()
        (root / "self" / "oom_score_adj").write_text("0\n")
        (root / "sys" / "kernel").mkdir(parents=True)
        (root / "sys" / "kernel" / "cap_last_cap").write_text("40\n")
    if file is not None:
        (root / file).write_text("not a directory\n")
    return root


def _host_exposed(grove: Grove, image: str) -> str | None:
    """What a sandbox on ``image`` sees of the host's root, or None if it sees nothing of it (or cannot start)."""
    try:
        sb = grove.create(image)
    except (Invalid, NotFound):  # refused when stored, or when started
        return None
    try:
        r = sb.exec("stat -c %d:%i / /..; ls /.. /../proc/1 2>/dev/null | head -50")
        lines = r.stdout.decode().split("\n")
        return None if lines[0] == lines[1] else r.stdout.decode()
    finally:
        sb.close()


@pytest.mark.parametrize("where", MOUNT_POINTS)
def test_import_refuses_a_symlinked_mount_point(router: RouterProcess, grove: Grove, tmp_path: Path,
                                                where: str) -> None:
    tarball = tmp_path / "evil.tar"
    tarball.write_bytes(tar_directory(_rootfs(tmp_path, "r", link=where)))
    done = router.cli("image", "import", f"evil-{where.strip('.')}", str(tarball))
    err = done.stderr.decode()
    assert done.returncode != 0, f"the import of an image with {where} -> / was accepted: {done.stdout!r}"
    assert f"/{where}" in err and "symlink" in err and "directory" in err, err
    assert _host_exposed(grove, f"evil-{where.strip('.')}") is None
    assert not (tmp_path / "canary").exists() or not any((tmp_path / "canary").iterdir())


def test_import_refuses_a_mount_point_that_is_a_file(router: RouterProcess, tmp_path: Path) -> None:
    done = router.cli("image", "import", "evil-file", str(_rootfs(tmp_path, "r", file="dev")))
    assert done.returncode != 0 and "/dev" in done.stderr.decode() and "directory" in done.stderr.decode()


def test_docker_save_symlink_in_a_later_layer_is_refused(router: RouterProcess, tmp_path: Path) -> None:
    base = tar_directory(make_busybox_rootfs(tmp_path / "base"))
    # The later layer whites out the base's /proc and puts a link in its place.
    archive = make_docker_save_tar(tmp_path / "evil.tar", [base, {".wh.proc": b"", "proc": "/"}])
    done = router.cli("image", "import", "evil-later", str(archive))
    assert done.returncode != 0 and "/proc" in done.stderr.decode(), done.stdout
    assert "evil-later" not in router.cli("image", "ls").stdout.decode()


@pytest.mark.parametrize("layer", [
    {"proc": "/"},                                  # straight over the base's directory
    {".wh.proc": b"", "proc": "/"},                 # a whiteout of the directory, then the link
    {".wh..wh..opq": b"", "proc": "/"},             # the root made opaque, then the link
    {"dev": b"a file where /dev belongs"},          # not a link, still not a directory
])
def test_pull_refuses_a_mount_point_replaced_in_a_later_layer(
    router: RouterProcess, grove: Grove, registry: Registry, base_layer: bytes, tmp_path: Path,  # noqa: F811
    layer: dict[str, bytes | str | None],
) -> None:
    write_oci_layout(tmp_path / "evil", [[base_layer, layer]])
    registry.push(tmp_path / "evil", "evil:1")
    ref = registry.ref("evil:1")
    done = router.cli("image", "pull", "--insecure", ref, timeout=120)
    err = done.stderr.decode()
    assert done.returncode != 0, done.stdout
    assert ("/proc" in err or "/dev" in err) and "directory" in err, err
    assert _host_exposed(grove, ref) is None


def test_whiteout_of_a_mount_point_alone_is_harmless(
    router: RouterProcess, grove: Grove, registry: Registry, base_layer: bytes, tmp_path: Path,  # noqa: F811
) -> None:
    """A layer that deletes /proc (and one with a hard link under /dev) is an ordinary image: the sandbox gets
    its own /proc and /dev in place, and sees nothing of the host."""
    write_oci_layout(tmp_path / "ok", [[base_layer, {".wh.proc": b"", "dev/held": b"x", "dev/twin": None}]])
    registry.push(tmp_path / "ok", "whiteout:1")
    ref = registry.ref("whiteout:1")
    done = router.cli("image", "pull", "--insecure", ref, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    sb = grove.create(ref)
    try:
        r = sb.exec("stat -c %d:%i / /..; test -e /proc/self/status && echo procfs; ls /dev | grep -c held")
        lines = r.stdout.decode().split("\n")
        assert lines[0] == lines[1] and lines[2] == "procfs" and lines[3] == "0", r.stdout
    finally:
        sb.close()


@pytest.mark.parametrize("where", ["proc", "dev", ".grove"])
def test_start_refuses_a_store_changed_behind_grove(
    router: RouterProcess, grove: Grove, tmp_path: Path, where: str,
) -> None:
    """An image changed on disk behind grove's back is refused when a sandbox starts on it: a 422 naming the
    path, before any sandbox is made when the router reads the image anew, and by sandbox init itself when the
    router had already read it (its copy of the image said nothing was wrong). The host is never touched."""
    name = f"later-{where.strip('.')}"
    done = router.cli("image", "import", name, str(make_busybox_rootfs(tmp_path / "r")))
    assert done.returncode == 0, done.stderr.decode()
    grove.create(name).close()  # the router has read the image now, as it was
    rootfs = router.layout.images / name / "rootfs"
    if (rootfs / where).is_dir():
        shutil.rmtree(rootfs / where)
    os.symlink(target_of(where, tmp_path), rootfs / where)
    before = router.live_ids()
    # Sandbox init refuses it: the router's copy of the image is still the one it read before.
    with pytest.raises(Invalid) as caught:
        grove.create(name)
    message = str(caught.value)
    assert f"/{where}" in message and "symlink" in message and name in message, message
    failed = router.live_ids() - before
    assert len(failed) == 1, failed  # it got as far as a start: the router's check did not stop it
    assert all(router.http("GET", f"/v1/sandboxes/{i}").json()["status"] == "failed" for i in failed), failed
    assert not (tmp_path / "canary").exists() or not any((tmp_path / "canary").iterdir())
    # Read anew (its image.json changed), the image is refused before any sandbox is made.
    meta = router.layout.images / name / "image.json"
    meta.write_text(meta.read_text() + " ")
    with pytest.raises(Invalid) as caught:
        grove.create(name)
    assert f"/{where}" in str(caught.value) and "grove image rm" in str(caught.value)
    assert router.live_ids() - before == failed
    assert name in router.cli("image", "ls").stdout.decode()  # still listed, for the operator to remove
    assert not (tmp_path / "canary").exists() or not any((tmp_path / "canary").iterdir())


def test_sandbox_root_has_nothing_stacked_on_it(grove: Grove) -> None:
    """In an ordinary sandbox ``/..`` is ``/``: the old root was detached, nothing sits above the new one."""
    sb = grove.create()
    try:
        r = sb.exec("stat -c %d:%i / /..; cat /proc/self/mountinfo")
        lines = r.stdout.decode().split("\n")
        assert lines[0] == lines[1], r.stdout
        roots = [line for line in lines[2:] if line.split()[4:5] == ["/"]]
        assert len(roots) == 1, roots
    finally:
        sb.close()


def _with_members(base: bytes, tmp: Path, members: list[tarfile.TarInfo]) -> Path:
    """A rootfs tarball: ``base`` (a tar) with ``members`` (links, no data) appended."""
    path = tmp / "with-members.tar"
    path.write_bytes(base)
    with tarfile.open(path, "a") as tf:
        for member in members:
            tf.addfile(member)
    return path


def _link(name: str, target: str, kind: bytes = tarfile.LNKTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, target, 0o644
    return info


def test_hard_links_at_and_into_mount_points(router: RouterProcess, grove: Grove, tmp_path: Path) -> None:
    """A hard link *as* a mount point is refused like a file; hard links *under* one are ordinary files that the
    sandbox's own /dev and /proc cover."""
    base = tar_directory(make_busybox_rootfs(tmp_path / "r"))
    done = router.cli("image", "import", "hl-dev", str(_with_members(base, tmp_path, [_link("usr", "etc/passwd")])))
    assert done.returncode != 0 and "/usr" in done.stderr.decode() and "hard link" in done.stderr.decode()
    (tmp_path / "with-members.tar").unlink()
    inside = [_link("dev/held", "etc/passwd"), _link("proc/x", "bin/busybox")]
    done = router.cli("image", "import", "hl-in", str(_with_members(base, tmp_path, inside)))
    assert done.returncode == 0, done.stderr.decode()
    sb = grove.create("hl-in")
    try:
        r = sb.exec("stat -c %d:%i / /..; ls /dev | grep -c held; test -e /proc/x || echo no-x; "
                    "test -e /proc/self/status && echo procfs")
        lines = r.stdout.decode().split("\n")
        assert lines[0] == lines[1] and lines[2:5] == ["0", "no-x", "procfs"], r.stdout
    finally:
        sb.close()


def test_links_where_init_makes_directories_after_the_pivot(
    router: RouterProcess, grove: Grove, tmp_path: Path,
) -> None:
    """``/tmp``, ``/root`` and the workdir are made after ``pivot_root``, as the sandbox's own root: links there
    resolve inside the sandbox, whatever they name."""
    root = make_busybox_rootfs(tmp_path / "r")
    shutil.rmtree(root / "tmp")
    shutil.rmtree(root / "root")
    os.symlink("/", root / "tmp")
    os.symlink("/proc/1", root / "root")
    os.symlink("/..", root / "workspace")
    done = router.cli("image", "import", "links", str(root))
    assert done.returncode == 0, done.stderr.decode()
    sb = grove.create("links")
    try:
        r = sb.exec("stat -L -c %d:%i / /.. /workspace")
        lines = r.stdout.decode().split("\n")
        assert lines[0] == lines[1] == lines[2], r.stdout
    finally:
        sb.close()
    assert stat.S_IMODE(os.stat("/").st_mode) == 0o755  # the host's root was not made 1777 (tmp -> /)
