"""Workspace snapshots: tar + zstd streamed through presigned URLs, and archives that try to escape."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path

import pytest
import zstandard

from artifacts.snapshot import download_via_presigned, pack_directory, unpack_into, upload_via_presigned
from artifacts.store import ObjectStore
from grove.core.errors import BadRequest, Forbidden, NotFound

pytestmark = pytest.mark.fast  # pure logic: `make test-fast`


def make_workspace(root: Path) -> None:
    """Files, modes, nested and empty directories, links inside (relative and dangling)."""
    (root / "src/pkg").mkdir(parents=True)
    (root / "empty").mkdir()
    (root / "src/main.py").write_text("print('hi')\n")
    (root / "src/run.sh").write_text("#!/bin/sh\necho run\n")
    (root / "src/run.sh").chmod(0o755)
    (root / "src/pkg/secret.txt").write_text("only me")
    (root / "src/pkg/secret.txt").chmod(0o600)
    (root / "big.bin").write_bytes(os.urandom(3 * 1024 * 1024 + 123))  # several chunks, not block-aligned
    (root / "blank").write_bytes(b"")
    os.symlink("src/main.py", root / "link-to-file")
    os.symlink("src", root / "link-to-dir")
    os.symlink("does/not/exist", root / "dangling")
    os.utime(root / "src/main.py", (1_600_000_000, 1_600_000_000))
    (root / "readonly").mkdir()
    (root / "readonly/inside").write_text("x")
    (root / "readonly").chmod(0o555)


def tree(root: Path) -> dict[str, tuple[object, ...]]:
    """Everything below ``root`` that a snapshot must keep: type, mode, content or link target, mtime."""
    out: dict[str, tuple[object, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            st = path.lstat()
            rel = str(path.relative_to(root))
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(path))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st.st_mode))
            else:
                out[rel] = ("file", stat.S_IMODE(st.st_mode), path.read_bytes(), int(st.st_mtime))
    return out


def test_snapshot_round_trip_through_presigned_urls(object_store: ObjectStore, tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    make_workspace(src)
    chunks = list(pack_directory(src, chunk_size=256 * 1024))
    assert len(chunks) > 3  # streamed, not one blob

    put_url = object_store.presign_put("snapshots/sb-1.tar.zst")
    assert upload_via_presigned(put_url, b"".join(chunks)) is not None
    with download_via_presigned(object_store.presign_get("snapshots/sb-1.tar.zst")) as body:
        assert body.size == sum(map(len, chunks))
        count = unpack_into(body, dst)
    assert count == len(tree(src))
    assert tree(dst) == tree(src)
    assert (dst / "src/main.py").stat().st_mtime == 1_600_000_000


def test_presigned_transfer_errors(object_store: ObjectStore) -> None:
    with pytest.raises(NotFound):
        download_via_presigned(object_store.presign_get("snapshots/none"))
    url = object_store.presign_put("snapshots/x")
    with pytest.raises(Forbidden):
        upload_via_presigned(url.replace("X-Amz-Signature=", "X-Amz-Signature=0"), b"data")
    upload_via_presigned(url, io.BytesIO(b"known length"), length=12)
    assert object_store.get_bytes("snapshots/x") == b"known length"
    # No chunked PUT (AWS refuses it) and no staging: a stream of unknown length is a multipart upload.
    with pytest.raises(BadRequest, match="needs its length"):
        upload_via_presigned(url, iter([b"unknown ", b"length"]))
    assert object_store.get_bytes("snapshots/x") == b"known length"


def archive_of(*members: tuple[tarfile.TarInfo, bytes | None]) -> bytes:
    """A tar + zstd archive of hand-made members (what an attacker would send)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return zstandard.ZstdCompressor().compress(raw.getvalue())


def member(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "") -> tarfile.TarInfo:
    """A tar header."""
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    info.mode = 0o644
    return info


EVIL: dict[str, list[tuple[tarfile.TarInfo, bytes | None]]] = {
    "absolute": [(member("/etc/evil"), b"x")],
    "dotdot": [(member("a/../../evil"), b"x")],
    "symlink-out": [(member("link", tarfile.SYMTYPE, "../outside"), None)],
    "symlink-abs": [(member("link", tarfile.SYMTYPE, "/etc"), None)],
    "symlink-chain": [
        (member("l2", tarfile.SYMTYPE, "."), None),
        (member("esc", tarfile.SYMTYPE, "l2/.."), None),
    ],
    "late-chain": [
        (member("esc", tarfile.SYMTYPE, "b/.."), None),  # inside while b does not exist...
        (member("b", tarfile.SYMTYPE, "."), None),  # ...and outside once it does
    ],
    "hardlink-out": [(member("hard", tarfile.LNKTYPE, "../outside/victim"), None)],
    "device": [(member("dev", tarfile.CHRTYPE), None)],
    "fifo": [(member("pipe", tarfile.FIFOTYPE), None)],
}


@pytest.mark.parametrize("case", sorted(EVIL))
def test_unpack_refuses_escapes(case: str, tmp_path: Path) -> None:
    outside, target = tmp_path / "outside", tmp_path / "target"
    outside.mkdir()
    (outside / "victim").write_text("untouched")
    members = EVIL[case]
    with pytest.raises(BadRequest) as err:
        unpack_into([archive_of(*members)], target)
    assert any(repr(info.name) in err.value.message for info, _ in members)  # names the culprit
    assert sorted(os.listdir(outside)) == ["victim"] and (outside / "victim").read_text() == "untouched"
    assert not (tmp_path / "evil").exists()


def test_unpack_never_writes_through_a_link_already_on_disk(tmp_path: Path) -> None:
    outside, target = tmp_path / "outside", tmp_path / "target"
    outside.mkdir()
    target.mkdir()
    os.symlink(outside, target / "sub")
    with pytest.raises(BadRequest, match="'sub/file'"):
        unpack_into([archive_of((member("sub/file"), b"x"))], target)
    assert os.listdir(outside) == []
    # A link at the member's own path is replaced, not followed.
    os.symlink(outside / "victim", target / "file")
    unpack_into([archive_of((member("file"), b"new"))], target)
    assert not (outside / "victim").exists() and (target / "file").read_bytes() == b"new"


def test_outside_links_can_be_allowed_and_setuid_is_dropped(tmp_path: Path) -> None:
    suid = member("tool")
    suid.mode = 0o4755
    data = archive_of((member("python", tarfile.SYMTYPE, "/usr/bin/python3"), None), (suid, b"#!"))
    unpack_into([data], tmp_path / "t", allow_outside_links=True)
    assert os.readlink(tmp_path / "t/python") == "/usr/bin/python3"
    assert stat.S_IMODE((tmp_path / "t/tool").stat().st_mode) == 0o755


def test_garbage_is_a_bad_request(tmp_path: Path) -> None:
    with pytest.raises(BadRequest, match="not a valid"):
        unpack_into([b"this is not zstd"], tmp_path / "t")
    truncated = archive_of((member("f"), b"x" * 100_000))[:-20]
    with pytest.raises(BadRequest):
        unpack_into([truncated], tmp_path / "t2")
