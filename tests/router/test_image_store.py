"""The local image store: the host-built default image, every import format, and hostile archives."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import stat
import subprocess
import tarfile
from pathlib import Path

import pytest
import zstandard

from grove.core.errors import Conflict, Invalid, NotFound
from router.backends.local.images import Image, ImageStore
from tests.support.imagetools import (
    Layer,
    layer_tar,
    make_busybox_rootfs,
    make_docker_save_tar,
    make_oci_layout_tar,
    tar_directory,
)


@pytest.fixture
def store(tmp_path: Path) -> ImageStore:
    return ImageStore(tmp_path / "state" / "images")


@pytest.fixture
def busybox(tmp_path: Path) -> Path:
    return make_busybox_rootfs(tmp_path / "busybox")


def leftovers(store_root: Path) -> list[str]:
    """Everything in the store's directory besides images, the lock file and retired images."""
    return sorted(p.name for p in store_root.iterdir()
                  if p.name not in (".lock", ".retired", "layers", "blobs") and not (p / "image.json").exists())


def retired(store_root: Path) -> list[str]:
    """Digests of the replaced or removed images kept for their sandboxes."""
    root = store_root / ".retired"
    return sorted(f"sha256:{p.name}" for p in root.iterdir()) if root.is_dir() else []


def run_busybox(rootfs: Path, *args: str) -> str:
    return subprocess.run([str(rootfs / "bin" / "busybox"), *args], capture_output=True, text=True,
                          check=True).stdout


# --- the default image ------------------------------------------------------------------------------


def test_default_image_layout(store: ImageStore) -> None:
    image = store.ensure_default()
    root = image.rootfs
    assert image.name == "default" and image.bind_host_usr and image.source == "host"
    assert image.digest.startswith("sha256:") and len(image.digest) == 71
    for name in ("bin", "sbin", "lib", "lib64"):
        if Path("/usr", name).is_dir():
            assert os.readlink(root / name) == f"usr/{name}"
        else:
            assert not os.path.lexists(root / name)
    assert (root / "usr").is_dir() and not any((root / "usr").iterdir())
    for d in ("root", "proc", "dev", "sys", "run", "workspace", "var/tmp"):
        assert (root / d).is_dir() and not (root / d).is_symlink()
    assert stat.S_IMODE((root / "tmp").stat().st_mode) == 0o1777
    passwd = (root / "etc" / "passwd").read_text()
    assert passwd.startswith("root:x:0:0:") and "\nnobody:" in passwd
    assert "localhost" in (root / "etc" / "hosts").read_text()
    assert (root / "etc" / "resolv.conf").read_text() == ""
    for name in ("group", "hostname", "nsswitch.conf"):
        assert (root / "etc" / name).stat().st_size > 0
    assert (root / "etc" / "os-release").read_bytes() == Path("/etc/os-release").read_bytes()
    assert not (root / "etc" / "os-release").is_symlink()
    assert (root / "etc" / "ld.so.cache").read_bytes() == Path("/etc/ld.so.cache").read_bytes()
    assert stat.S_IMODE((root / "etc" / "ld.so.cache").stat().st_mode) == 0o644
    assert store.get("default") == image and store.list() == [image]


def test_default_image_is_built_once_and_its_digest_is_stable(store: ImageStore, tmp_path: Path) -> None:
    first = store.ensure_default()
    marker = os.stat(first.rootfs).st_ino
    again = store.ensure_default()
    assert again == first and os.stat(again.rootfs).st_ino == marker  # not rebuilt
    assert ImageStore(store.get("default").rootfs.parent.parent).ensure_default() == first
    elsewhere = ImageStore(tmp_path / "other").ensure_default()
    assert elsewhere.digest == first.digest and elsewhere.rootfs != first.rootfs


def test_default_image_is_rebuilt_when_the_host_changes(store: ImageStore) -> None:
    first = store.ensure_default()
    meta = first.rootfs.parent / "image.json"
    # Stands in for an upgrade of the host's packages: the recorded host fingerprint no longer matches.
    meta.write_text(meta.read_text().replace('"host_fingerprint": "sha256:', '"host_fingerprint": "sha256:0'))
    rebuilt = store.ensure_default()
    assert rebuilt.created_at > first.created_at and rebuilt.digest == first.digest
    assert leftovers(first.rootfs.parent.parent) == []


def test_default_cannot_be_imported_over_or_removed(store: ImageStore, busybox: Path) -> None:
    store.ensure_default()
    with pytest.raises(Invalid, match="reserved"):
        store.import_image("default", busybox, force=True)
    with pytest.raises(Invalid, match="cannot be removed"):
        store.remove("default")


# --- imports ----------------------------------------------------------------------------------------


def test_import_directory_keeps_symlinks_as_symlinks(store: ImageStore, busybox: Path) -> None:
    os.symlink("/etc/shadow", busybox / "etc" / "shadow-link")
    os.link(busybox / "etc" / "passwd", busybox / "etc" / "passwd-hardlink")
    image = store.import_image("bb", busybox)
    root = image.rootfs
    assert image == store.get("bb") and not image.bind_host_usr and image.source == str(busybox)
    assert os.readlink(root / "bin" / "sh") == "busybox"
    assert os.readlink(root / "etc" / "shadow-link") == "/etc/shadow"  # kept, not followed
    assert (root / "bin" / "busybox").read_bytes() == Path("/bin/busybox").read_bytes()
    assert os.stat(root / "etc" / "passwd").st_ino == os.stat(root / "etc" / "passwd-hardlink").st_ino
    assert stat.S_IMODE((root / "tmp").stat().st_mode) == 0o1777
    assert run_busybox(root, "echo", "hi") == "hi\n"
    assert store.import_image("bb2", busybox).digest == image.digest  # deterministic
    (busybox / "etc" / "passwd").write_text("changed\n")
    assert store.import_image("bb3", busybox).digest != image.digest


@pytest.mark.parametrize("compress", ["", "gz", "zst"])
def test_import_rootfs_tarball_detected_by_content(
    store: ImageStore, busybox: Path, tmp_path: Path, compress: str
) -> None:
    data = tar_directory(busybox, gzip_it=compress == "gz")
    if compress == "zst":
        data = zstandard.ZstdCompressor().compress(data)
    source = tmp_path / "rootfs.bin"  # an extension that says nothing: the content decides
    source.write_bytes(data)
    image = store.import_image("bb", source)
    assert os.readlink(image.rootfs / "bin" / "ls") == "busybox"
    assert stat.S_IMODE((image.rootfs / "tmp").stat().st_mode) == 0o1777
    assert image.digest == store.import_image("bb-dir", busybox).digest
    assert sorted(os.listdir(image.rootfs.parent)) == ["image.json", "rootfs"]  # no decompressed copy left
    assert leftovers(image.rootfs.parent.parent) == []


def test_import_docker_save_applies_layers_and_whiteouts(store: ImageStore, tmp_path: Path) -> None:
    base = {
        "etc/": None, "etc/motd": b"hello\n", "etc/keep": b"keep\n",
        "opt/": None, "opt/old-a": b"a", "opt/sub/": None, "opt/sub/old-b": b"b",
        "bin/": None, "bin/tool": b"#!/bin/sh\n", "bin/tool-link": "tool",
    }
    top = {
        "etc/.wh.motd": b"",
        "opt/": None,
        "opt/new": b"new",  # before the opaque marker: this layer's own files survive it
        "opt/.wh..wh..opq": b"",
        "bin/tool": b"#!/bin/sh\necho v2\n",
        "/abs/file": b"leading slash is stripped",
    }
    image = store.import_image("layered", make_docker_save_tar(tmp_path / "img.tar", [base, top]))
    root = image.rootfs
    assert not os.path.lexists(root / "etc" / "motd")
    assert (root / "etc" / "keep").read_text() == "keep\n"
    assert sorted(os.listdir(root / "opt")) == ["new"]
    assert (root / "bin" / "tool").read_text() == "#!/bin/sh\necho v2\n"
    assert os.readlink(root / "bin" / "tool-link") == "tool"
    assert (root / "abs" / "file").exists()
    assert not list(root.rglob(".wh.*"))


def test_import_oci_layout_with_gzip_layers(store: ImageStore, busybox: Path, tmp_path: Path) -> None:
    extra = {"workspace/": None, "workspace/README": b"task\n", "bin/.wh.yes": b""}
    source = make_oci_layout_tar(tmp_path / "oci.tar", [tar_directory(busybox), extra], nested=True)
    image = store.import_image("oci", source)
    assert (image.rootfs / "workspace" / "README").read_text() == "task\n"
    assert not os.path.lexists(image.rootfs / "bin" / "yes")
    assert run_busybox(image.rootfs, "cat", str(image.rootfs / "workspace" / "README")) == "task\n"
    plain = make_oci_layout_tar(tmp_path / "oci-plain.tar", [tar_directory(busybox), extra], gzip_layers=False)
    assert store.import_image("oci-plain", plain).digest == image.digest


def test_tar_details_hardlinks_setuid_and_special_files(store: ImageStore, tmp_path: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, kind in (("bin/", tarfile.DIRTYPE), ("dev/", tarfile.DIRTYPE), ("bin/su", tarfile.REGTYPE)):
            info = tarfile.TarInfo(name)
            info.type, info.mode = kind, 0o4755 if name == "bin/su" else 0o755
            info.uid, info.gid = 1234, 5678
            tf.addfile(info, io.BytesIO(b""))
        link = tarfile.TarInfo("bin/su-again")
        link.type, link.linkname = tarfile.LNKTYPE, "bin/su"
        tf.addfile(link)
        for name, kind in (("dev/null", tarfile.CHRTYPE), ("dev/sda", tarfile.BLKTYPE), ("fifo", tarfile.FIFOTYPE)):
            info = tarfile.TarInfo(name)
            info.type, info.devmajor, info.devminor = kind, 1, 3
            tf.addfile(info)
    (tmp_path / "t.tar").write_bytes(buf.getvalue())
    root = store.import_image("details", tmp_path / "t.tar").rootfs
    su = (root / "bin" / "su").stat()
    assert stat.S_IMODE(su.st_mode) == 0o4755 and (su.st_uid, su.st_gid) == (1234, 5678)
    assert (root / "bin" / "su-again").stat().st_ino == su.st_ino
    assert os.listdir(root / "dev") == [] and not os.path.lexists(root / "fifo")
    assert json.loads((root.parent / "image.json").read_text())["skipped_special_files"] == 3


# --- hostile archives -------------------------------------------------------------------------------


@pytest.mark.parametrize("link", ["{outside}", "../../../../../../../..{outside}", "/"])
def test_symlink_then_write_through_it_never_leaves_the_rootfs(
    store: ImageStore, tmp_path: Path, link: str
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    target = link.format(outside=outside)
    layers: list[Layer] = [{"x": target}, {"x/evil": b"pwned"}]
    with pytest.raises(Invalid, match=r"'x/evil'.*symlink 'x'"):
        store.import_image("evil", make_docker_save_tar(tmp_path / "evil.tar", layers))
    assert not (outside / "evil").exists() and not os.path.lexists("/evil")
    assert store.list() == [] and leftovers(tmp_path / "state" / "images") == []


def test_etc_symlink_cannot_reach_the_host_etc(store: ImageStore, tmp_path: Path) -> None:
    before = hashlib.sha256(Path("/etc/passwd").read_bytes()).hexdigest()
    layers: list[Layer] = [{"etc": "/etc"}, {"etc/passwd": b"evil::0:0::/:/bin/sh\n"}]
    with pytest.raises(Invalid, match="etc/passwd"):
        store.import_image("evil", make_docker_save_tar(tmp_path / "evil.tar", layers))
    # Within one rootfs tarball, too, and with a relative climb.
    flat = tmp_path / "flat.tar"
    flat.write_bytes(layer_tar({"lib": "../../../..", "lib/escape": b"x"}))
    with pytest.raises(Invalid, match="lib/escape"):
        store.import_image("evil", flat)
    assert hashlib.sha256(Path("/etc/passwd").read_bytes()).hexdigest() == before
    assert not os.path.lexists("/escape")


def test_a_directory_replaces_a_symlink_instead_of_following_it(store: ImageStore, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    layers: list[Layer] = [{"x": str(outside)}, {"x/": None, "x/file": b"inside"}]
    root = store.import_image("ok", make_docker_save_tar(tmp_path / "ok.tar", layers)).rootfs
    assert (root / "x").is_dir() and not (root / "x").is_symlink()
    assert (root / "x" / "file").read_text() == "inside" and list(outside.iterdir()) == []


def test_whiteout_through_a_symlink_deletes_nothing_outside(store: ImageStore, tmp_path: Path) -> None:
    victim = tmp_path / "outside" / "victim"
    victim.parent.mkdir()
    victim.write_text("precious")
    layers: list[Layer] = [
        {"x": str(victim.parent)}, {"x/.wh.victim": b""}, {"y": str(victim.parent), "y/.wh..wh..opq": b""},
    ]
    with pytest.raises(Invalid):
        store.import_image("evil", make_docker_save_tar(tmp_path / "evil.tar", layers[:2]))
    with pytest.raises(Invalid):
        store.import_image("evil", make_docker_save_tar(tmp_path / "evil2.tar", [layers[0], layers[2]]))
    assert victim.read_text() == "precious"


@pytest.mark.parametrize("name", ["../evil", "a/../../evil", "ok/../.."])
def test_dotdot_members_are_refused(store: ImageStore, tmp_path: Path, name: str) -> None:
    source = tmp_path / "dots.tar"
    source.write_bytes(layer_tar({"a/": None, name: b"x"}))
    with pytest.raises(Invalid, match=r"'\.\.'") as caught:
        store.import_image("dots", source)
    assert name in caught.value.message
    assert not (tmp_path / "evil").exists() and not (tmp_path / "state" / "evil").exists()
    assert leftovers(tmp_path / "state" / "images") == []


@pytest.mark.parametrize("linkname", ["../../../etc/passwd", "/etc/passwd", "missing"])
def test_hardlinks_must_point_inside_the_image(store: ImageStore, tmp_path: Path, linkname: str) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        info = tarfile.TarInfo("stolen")
        info.type, info.linkname = tarfile.LNKTYPE, linkname
        tf.addfile(info)
    (tmp_path / "h.tar").write_bytes(buf.getvalue())
    with pytest.raises(Invalid, match="stolen"):
        store.import_image("h", tmp_path / "h.tar")
    assert store.list() == []


def test_a_hardlink_to_a_symlink_links_the_symlink_itself(store: ImageStore, tmp_path: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        sym = tarfile.TarInfo("s")
        sym.type, sym.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tf.addfile(sym)
        hard = tarfile.TarInfo("h")
        hard.type, hard.linkname = tarfile.LNKTYPE, "s"
        tf.addfile(hard)
    (tmp_path / "hs.tar").write_bytes(buf.getvalue())
    root = store.import_image("hs", tmp_path / "hs.tar").rootfs
    assert (root / "h").is_symlink() and os.readlink(root / "h") == "/etc/passwd"
    assert os.lstat(root / "h").st_ino == os.lstat(root / "s").st_ino != os.stat("/etc/passwd").st_ino


# --- names, formats, lifecycle ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["", "Upper", "-x", ".x", "A/b", "a//b", "a:b:c", "..", "x" * 64, "abc\n", "sp ace"])
def test_bad_names(store: ImageStore, busybox: Path, name: str) -> None:
    with pytest.raises(Invalid, match="invalid image name"):
        store.import_image(name, busybox)
    with pytest.raises(Invalid):
        store.get(name)


def test_unknown_formats_are_invalid_with_a_clear_message(store: ImageStore, tmp_path: Path) -> None:
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(os.urandom(4096))
    with pytest.raises(Invalid, match=r"not a directory or a tar archive.*docker save"):
        store.import_image("junk", junk)
    text = tmp_path / "text.gz"
    text.write_bytes(gzip.compress(b"just some text\n" * 100))
    with pytest.raises(Invalid, match="gzip-compressed, but what it holds is not a tar archive"):
        store.import_image("junk", text)
    truncated = tmp_path / "truncated.tgz"
    truncated.write_bytes(gzip.compress(layer_tar({"big": os.urandom(100_000)}))[:20_000])
    with pytest.raises(Invalid, match="truncated or corrupt"):
        store.import_image("junk", truncated)
    with pytest.raises(NotFound, match="no such file"):
        store.import_image("junk", tmp_path / "nope")
    assert store.list() == [] and leftovers(tmp_path / "state" / "images") == []


def test_conflict_force_get_list_remove(store: ImageStore, busybox: Path, tmp_path: Path) -> None:
    first = store.import_image("bb", busybox)
    with pytest.raises(Conflict, match="already exists"):
        store.import_image("bb", busybox)
    (busybox / "etc" / "hostname").write_text("v2\n")
    second = store.import_image("bb", busybox, force=True)
    assert second.digest != first.digest and (second.rootfs / "etc" / "hostname").read_text() == "v2\n"
    store.ensure_default()
    assert [i.name for i in store.list()] == ["bb", "default"]
    with pytest.raises(NotFound, match="known images: bb, default"):
        store.get("nope")
    store.remove("bb")
    with pytest.raises(NotFound):
        store.remove("bb")
    assert [i.name for i in store.list()] == ["default"] and isinstance(store.list()[0], Image)
    assert leftovers(tmp_path / "state" / "images") == []
