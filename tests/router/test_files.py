"""Files and archives through a real router: put/get/list/delete, tar up and down, a large streamed file."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from grove.client import Sandbox
from grove.core.errors import BadRequest, Conflict, NotFound, TooLarge
from tests.support.router_fixtures import RouterProcess, error_of, proc_status

MiB = 1024 * 1024


@pytest.fixture(scope="module")
def router(any_router: RouterProcess) -> RouterProcess:
    """This module runs against both backends (local and the Knative stand-in)."""
    return any_router


def test_write_read_list_delete(sandbox: Sandbox) -> None:
    sandbox.write_file("/workspace/dir/a.txt", "hello\n")
    sandbox.write_file("b.bin", bytes(range(256)), mode=0o750)  # relative: under the workdir
    assert sandbox.read_file("/workspace/dir/a.txt") == b"hello\n"
    assert sandbox.read_file("/workspace/b.bin") == bytes(range(256))
    assert sandbox.exec("cat dir/a.txt; stat -c %a b.bin").stdout == b"hello\n750\n"
    entries = {e["name"]: e for e in sandbox.list_files("/workspace")}
    assert entries["dir"]["type"] == "dir" and entries["b.bin"]["type"] == "file"
    assert entries["b.bin"]["size"] == 256 and entries["b.bin"]["mode"] == "0750"
    assert {"name", "type", "size", "mode", "mtime"} <= set(entries["b.bin"])
    sandbox.delete_file("/workspace/b.bin")
    with pytest.raises(NotFound):
        sandbox.read_file("/workspace/b.bin")
    with pytest.raises((BadRequest, Conflict), match="/workspace/dir"):
        sandbox.delete_file("/workspace/dir")  # a directory needs recursive
    sandbox.delete_file("/workspace/dir", recursive=True)
    assert sandbox.list_files("/workspace") == []


def test_file_errors(router: RouterProcess, sandbox: Sandbox) -> None:
    with pytest.raises(NotFound):
        sandbox.read_file("/no/such/file")
    with pytest.raises(NotFound):
        sandbox.list_files("/no/such/dir")
    reply = router.http("GET", f"/v1/sandboxes/{sandbox.id}/files?path=/no/such/file")
    assert reply.status == 404 and "/no/such/file" in error_of(reply)["message"]
    reply = router.http("GET", f"/v1/sandboxes/{sandbox.id}/files")
    assert reply.status in (400, 422) and "path" in error_of(reply)["message"]


@pytest.mark.local_only  # the stand-in runs pods on the host, without a root of their own
def test_written_files_are_visible_to_commands_and_back(sandbox: Sandbox) -> None:
    sandbox.exec("mkdir -p /srv/out && seq 3 > /srv/out/nums && ln -s nums /srv/out/link")
    assert sandbox.read_file("/srv/out/nums") == b"1\n2\n3\n"
    assert sandbox.read_file("/srv/out/link") == b"1\n2\n3\n"
    assert b"NAME=" in sandbox.read_file("/etc/os-release")  # the image's files read like any other


@pytest.mark.local_only  # the stand-in runs pods on the host, without a root of their own
def test_archive_upload_and_download(sandbox: Sandbox, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "__init__.py").write_text("X = 1\n")
    (src / "run.sh").write_text("#!/bin/sh\necho ran\n")
    os.chmod(src / "run.sh", 0o755)
    os.symlink("pkg/__init__.py", src / "link.py")
    members = sandbox.upload(src, "/workspace/proj")
    assert members >= 4
    r = sandbox.exec("./run.sh && python3 -c 'import pkg; print(pkg.X)' && readlink link.py", cwd="/workspace/proj")
    assert r.stdout == b"ran\n1\npkg/__init__.py\n", r.stderr
    sandbox.exec("echo new > /workspace/proj/pkg/made_inside.txt")
    out = tmp_path / "out"
    sandbox.download("/workspace/proj", out)
    assert (out / "pkg" / "made_inside.txt").read_text() == "new\n"
    assert (out / "run.sh").read_text() == "#!/bin/sh\necho ran\n" and os.access(out / "run.sh", os.X_OK)
    assert os.readlink(out / "link.py") == "pkg/__init__.py"


def test_archive_that_escapes_is_refused(router: RouterProcess, sandbox: Sandbox) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        info = tarfile.TarInfo("../../etc/evil")
        info.size = 4
        tf.addfile(info, io.BytesIO(b"evil"))
    reply = router.http("PUT", f"/v1/sandboxes/{sandbox.id}/archive?path=/workspace/x", buf.getvalue(),
                        headers={"Content-Type": "application/x-tar"})
    assert 400 <= reply.status < 500 and error_of(reply)["message"]
    assert sandbox.exec("test -e /etc/evil || echo absent").stdout == b"absent\n"


@pytest.mark.local_only  # the stand-in runs pods on the host, without a root of their own
def test_full_filesystem_is_413(router: RouterProcess) -> None:
    """A write beyond the sandbox's /dev/shm (a 64 MiB tmpfs) is a clear 413, not an internal error."""
    with router.client() as client, client.create(heartbeat=False) as sb:
        with pytest.raises(TooLarge, match="no space left"):
            sb.write_file("/dev/shm/big", b"\0" * (70 * MiB))
        assert sb.exec("ls -A /dev/shm; echo fine").stdout == b"fine\n"  # no torn temp file left
        assert sb.exec("echo fine").stdout == b"fine\n"


def _blocks(count: int, digest: hashlib._Hash) -> Iterator[bytes]:
    """``count`` MiB of varied bytes, made one block at a time (the test never holds the whole file)."""
    base = os.urandom(MiB)
    for i in range(count):
        block = i.to_bytes(8, "big") + base[8:]
        digest.update(block)
        yield block


@pytest.mark.local_only  # the stand-in runs pods on the host, without a root of their own
def test_large_file_streams_through_the_router(router: RouterProcess, sandbox: Sandbox) -> None:
    size_mib = 200
    pid = router.pid
    with open(f"/proc/{pid}/clear_refs", "w") as fh:
        fh.write("5")  # reset the peak-RSS mark, so VmHWM below is the peak of this transfer only
    rss_before = proc_status(pid, "VmRSS")
    sent = hashlib.sha256()
    reply = router.http(
        "PUT", f"/v1/sandboxes/{sandbox.id}/files?path=/workspace/big.bin", _blocks(size_mib, sent),
        headers={"Content-Length": str(size_mib * MiB), "Content-Type": "application/octet-stream"},
        timeout=120,
    )
    assert reply.status == 201, reply.body[:500]
    assert reply.json()["size"] == size_mib * MiB
    inside = sandbox.exec("sha256sum /workspace/big.bin", timeout_s=60).stdout.split()[0].decode()
    assert inside == sent.hexdigest()

    got = hashlib.sha256()
    total = 0
    resp, conn = router.send("GET", f"/v1/sandboxes/{sandbox.id}/files?path=/workspace/big.bin", timeout=120)
    try:
        assert resp.status == 200 and int(resp.headers["Content-Length"]) == size_mib * MiB
        while chunk := resp.read(MiB):
            got.update(chunk)
            total += len(chunk)
    finally:
        conn.close()
    assert total == size_mib * MiB and got.hexdigest() == sent.hexdigest()
    peak = proc_status(pid, "VmHWM")
    assert peak - rss_before < 50 * 1024, f"router RSS went from {rss_before} KiB to a peak of {peak} KiB"
    sandbox.delete_file("/workspace/big.bin")


def test_chunked_upload_without_length(router: RouterProcess, sandbox: Sandbox) -> None:
    sent = hashlib.sha256()
    reply = router.http("PUT", f"/v1/sandboxes/{sandbox.id}/files?path=/workspace/chunked.bin",
                        _blocks(8, sent))  # an iterable body without Content-Length goes chunked
    assert reply.status == 201, reply.body[:500]
    assert hashlib.sha256(sandbox.read_file("/workspace/chunked.bin")).hexdigest() == sent.hexdigest()
