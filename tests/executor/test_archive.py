"""/v1/archive against a real executor: tar out, tar in, and every way a tar tries to write outside."""

from __future__ import annotations

import gzip
import io
import os
import stat
import tarfile
import uuid
from collections.abc import Iterator

import pytest

from tests.support.executor_fixtures import Client, RunningExecutor

Member = tuple[tarfile.TarInfo, bytes | None]


def _tar(*members: Member, gz: bool = False) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return gzip.compress(buf.getvalue()) if gz else buf.getvalue()


def _file(name: str, data: bytes = b"evil", mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.mode = mode
    return info, data


def _special(name: str, kind: bytes, linkname: str = "") -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    if kind == tarfile.CHRTYPE:
        info.devmajor, info.devminor = 1, 3
    return info, None


def _tree(top: str) -> dict[str, tuple[str, int, bytes | str]]:
    """Every entry under ``top``: kind, permission bits, and contents or link target."""
    out: dict[str, tuple[str, int, bytes | str]] = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, top)
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", 0, os.readlink(full))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st.st_mode), b"")
            else:
                with open(full, "rb") as fh:
                    out[rel] = ("file", stat.S_IMODE(st.st_mode), fh.read())
    return out


@pytest.fixture
def area(executor: RunningExecutor) -> Iterator[str]:
    """A fresh API directory holding ``outside/secret`` beside the (not yet existing) target ``t``."""
    api = f"/work/arch-{uuid.uuid4().hex[:8]}"
    os.makedirs(executor.host_path(f"{api}/outside"))
    with open(executor.host_path(f"{api}/outside/secret"), "w", encoding="utf-8") as fh:
        fh.write("secret")
    yield api


def _snapshot_outside(executor: RunningExecutor, target: str) -> dict[str, tuple[str, int, bytes | str]]:
    """Everything in the executor's temp dir (root and beyond) except the target."""
    top = os.path.dirname(executor.root)
    skip = os.path.relpath(executor.host_path(target), top)
    tree = _tree(top)
    del tree[os.path.basename(executor.log_path)]  # the executor's own log may grow meanwhile
    return {k: v for k, v in tree.items() if k != skip and not k.startswith(skip + os.sep)}


def test_get_archive_streams_a_tar_of_the_directory(executor: RunningExecutor, client: Client, area: str) -> None:
    src = executor.host_path(f"{area}/src")
    os.makedirs(os.path.join(src, "sub", "empty"))
    with open(os.path.join(src, "a.txt"), "wb") as fh:
        fh.write(b"alpha\n")
    with open(os.path.join(src, "sub", "bin"), "wb") as fh:
        fh.write(bytes(range(256)) * 1000)
    os.chmod(os.path.join(src, "sub", "bin"), 0o755)
    os.symlink("../a.txt", os.path.join(src, "sub", "link"))
    reply = client.request("GET", f"/v1/archive?path={area}/src")
    assert reply.status == 200
    assert reply.headers["Content-Type"] == "application/x-tar"
    with tarfile.open(fileobj=io.BytesIO(reply.body), mode="r:") as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert set(members) == {"a.txt", "sub", "sub/empty", "sub/bin", "sub/link"}
        assert tar.extractfile("a.txt").read() == b"alpha\n"  # type: ignore[union-attr]
        assert tar.extractfile("sub/bin").read() == bytes(range(256)) * 1000  # type: ignore[union-attr]
        assert members["sub/bin"].mode == 0o755
        assert members["sub/link"].issym() and members["sub/link"].linkname == "../a.txt"
        assert members["sub/empty"].isdir()


def test_archive_round_trip(executor: RunningExecutor, client: Client, area: str) -> None:
    src = executor.host_path(f"{area}/src")
    os.makedirs(os.path.join(src, "d1", "d2"))
    files = (("top.txt", b"top", 0o600), ("d1/x.bin", os.urandom(300_000), 0o644), ("d1/d2/run", b"#!", 0o755))
    for rel, data, mode in files:
        with open(os.path.join(src, rel), "wb") as fh:
            fh.write(data)
        os.chmod(os.path.join(src, rel), mode)
    os.symlink("d2/run", os.path.join(src, "d1", "alias"))
    tar = client.request("GET", f"/v1/archive?path={area}/src").body
    reply = client.request("PUT", f"/v1/archive?path={area}/copy", tar)
    assert reply.status == 201
    assert reply.json() == {"path": f"{area}/copy", "members": 6}
    assert _tree(executor.host_path(f"{area}/copy")) == _tree(src)


def test_put_archive_gzip_and_hard_link_inside(executor: RunningExecutor, client: Client, area: str) -> None:
    body = _tar(
        _file("dir/data.txt", b"payload"),
        _special("dir/hard", tarfile.LNKTYPE, "dir/data.txt"),
        _special("dir/soft", tarfile.SYMTYPE, "data.txt"),
        gz=True,
    )
    reply = client.request("PUT", f"/v1/archive?path={area}/t", body)
    assert reply.status == 201, reply.body
    target = executor.host_path(f"{area}/t")
    assert os.stat(f"{target}/dir/hard").st_ino == os.stat(f"{target}/dir/data.txt").st_ino
    assert os.readlink(f"{target}/dir/soft") == "data.txt"


BAD_ARCHIVES: dict[str, tuple[str, list[Member]]] = {
    "absolute name": ("/tmp/grove-evil.txt", [_file("/tmp/grove-evil.txt")]),
    "dot-dot": ("../evil.txt", [_file("ok.txt", b"fine"), _file("../evil.txt")]),
    "deep dot-dot": ("a/../../evil.txt", [_file("a/../../evil.txt")]),
    "symlink outside": ("link", [_special("link", tarfile.SYMTYPE, "../outside")]),
    "absolute symlink": ("link", [_special("link", tarfile.SYMTYPE, "/etc")]),
    "symlink then file through it": (
        "link",
        [_special("link", tarfile.SYMTYPE, "../outside"), _file("link/evil.txt")],
    ),
    "symlink chain": ("a/b", [_special("a", tarfile.SYMTYPE, "."), _special("a/b", tarfile.SYMTYPE, "..")]),
    "hard link outside": ("hl", [_special("hl", tarfile.LNKTYPE, "../outside/secret")]),
    "absolute hard link": ("hl", [_special("hl", tarfile.LNKTYPE, "/etc/hostname")]),
    "character device": ("null", [_special("null", tarfile.CHRTYPE)]),
    "fifo": ("pipe", [_special("pipe", tarfile.FIFOTYPE)]),
}


@pytest.mark.parametrize("case", sorted(BAD_ARCHIVES))
def test_put_archive_refuses_escapes(executor: RunningExecutor, client: Client, area: str, case: str) -> None:
    bad_name, members = BAD_ARCHIVES[case]
    before = _snapshot_outside(executor, f"{area}/t")
    reply = client.request("PUT", f"/v1/archive?path={area}/t", _tar(*members))
    assert reply.status == 400, reply.body
    error = reply.json()["error"]
    assert error["code"] == "bad_request"
    assert repr(bad_name) in error["message"], error["message"]
    assert _snapshot_outside(executor, f"{area}/t") == before
    assert not os.path.exists("/tmp/grove-evil.txt")


def test_put_archive_refuses_writing_through_an_existing_link(
    executor: RunningExecutor, client: Client, area: str
) -> None:
    """A link planted in the target beforehand (by a command) must not redirect a member outside."""
    target = executor.host_path(f"{area}/t")
    os.makedirs(target)
    os.symlink(executor.host_path(f"{area}/outside"), os.path.join(target, "planted"))
    before = _snapshot_outside(executor, f"{area}/t")
    reply = client.request("PUT", f"/v1/archive?path={area}/t", _tar(_file("planted/evil.txt")))
    assert reply.status == 400
    assert "'planted/evil.txt'" in reply.json()["error"]["message"]
    assert _snapshot_outside(executor, f"{area}/t") == before


def test_archive_errors(client: Client, area: str) -> None:
    assert client.request("GET", f"/v1/archive?path={area}/missing").status == 404
    assert client.request("GET", f"/v1/archive?path={area}/outside/secret").status == 404
    reply = client.request("PUT", f"/v1/archive?path={area}/t", b"this is not a tar archive" * 40)
    assert reply.status == 400
    assert "tar" in reply.json()["error"]["message"]
