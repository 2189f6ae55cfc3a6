"""/v1/files and /v1/files/list against a real executor: raw bytes in and out, atomic writes, path errors."""

from __future__ import annotations

import os
import stat
import time
from urllib.parse import quote

import pytest

from tests.support.executor_fixtures import Client, RunningExecutor


def _put(client: Client, path: str, data: bytes, query: str = "") -> int:
    return client.request("PUT", f"/v1/files?path={quote(path)}{query}", data).status


def test_put_creates_parents_and_get_returns_the_bytes(any_executor: RunningExecutor) -> None:
    client = any_executor.client()
    data = bytes(range(256)) * 1000
    reply = client.request("PUT", "/v1/files?path=/work/new/deep/blob.bin", data)
    assert reply.status == 201
    assert reply.json() == {"path": "/work/new/deep/blob.bin", "size": len(data)}
    with open(any_executor.host_path("/work/new/deep/blob.bin"), "rb") as fh:
        assert fh.read() == data
    got = client.request("GET", "/v1/files?path=/work/new/deep/blob.bin")
    assert got.status == 200
    assert got.headers["Content-Type"] == "application/octet-stream"
    assert got.body == data
    client.close()


def test_relative_paths_are_under_the_workdir(executor: RunningExecutor, client: Client) -> None:
    assert _put(client, "rel/x.txt", b"x") == 201
    assert os.path.isfile(executor.host_path("/work/rel/x.txt"))
    assert client.request("GET", "/v1/files?path=rel/x.txt").body == b"x"


def test_put_mode_and_overwrite_keeps_mode(executor: RunningExecutor, client: Client) -> None:
    host = executor.host_path("/work/modes/run.sh")
    assert _put(client, "/work/modes/run.sh", b"#!/bin/sh\necho hi\n", "&mode=750") == 201
    assert stat.S_IMODE(os.stat(host).st_mode) == 0o750
    assert client.run(command=["./run.sh"], cwd="/work/modes")["stdout"] == b"hi\n"
    assert _put(client, "/work/modes/run.sh", b"#!/bin/sh\necho bye\n") == 201
    assert stat.S_IMODE(os.stat(host).st_mode) == 0o750
    assert _put(client, "/work/modes/plain.txt", b"p") == 201
    assert stat.S_IMODE(os.stat(executor.host_path("/work/modes/plain.txt")).st_mode) == 0o644
    bad = client.request("PUT", "/v1/files?path=/work/modes/x&mode=9z", b"x")
    assert bad.status == 400 and "mode" in bad.json()["error"]["message"]


def test_put_is_atomic_and_leaves_no_temp_files(executor: RunningExecutor, client: Client) -> None:
    for i in range(5):
        assert _put(client, "/work/atomic/f.txt", f"version {i}".encode() * 1000) == 201
    assert os.listdir(executor.host_path("/work/atomic")) == ["f.txt"]
    # A body that dies half-way leaves the old file in place and no temp file beside it.
    conn = executor.connect(5)
    conn.putrequest("PUT", "/v1/files?path=/work/atomic/f.txt")
    conn.putheader("Authorization", "Bearer test-token-7d1f")
    conn.putheader("Content-Length", "100000")
    conn.endheaders()
    conn.send(b"partial" * 100)
    conn.close()
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline and len(os.listdir(executor.host_path("/work/atomic"))) > 1:
        time.sleep(0.02)
    assert os.listdir(executor.host_path("/work/atomic")) == ["f.txt"]
    assert client.request("GET", "/v1/files?path=/work/atomic/f.txt").body == b"version 4" * 1000


def test_delete_file_and_directory(executor: RunningExecutor, client: Client) -> None:
    assert _put(client, "/work/del/a/b.txt", b"b") == 201
    assert _put(client, "/work/del/c.txt", b"c") == 201
    reply = client.request("DELETE", "/v1/files?path=/work/del/c.txt")
    assert reply.status == 200 and reply.json() == {"path": "/work/del/c.txt", "deleted": True}
    assert not os.path.exists(executor.host_path("/work/del/c.txt"))
    refused = client.request("DELETE", "/v1/files?path=/work/del")
    assert refused.status == 409
    assert "recursive=1" in refused.json()["error"]["message"]
    assert os.path.exists(executor.host_path("/work/del/a/b.txt"))
    assert client.request("DELETE", "/v1/files?path=/work/del&recursive=1").status == 200
    assert not os.path.exists(executor.host_path("/work/del"))
    assert client.request("DELETE", "/v1/files?path=/work/del").status == 404


def test_list_fields(executor: RunningExecutor, client: Client) -> None:
    assert _put(client, "/work/ls/file.txt", b"12345", "&mode=640") == 201
    os.makedirs(executor.host_path("/work/ls/dir"))
    os.symlink("file.txt", executor.host_path("/work/ls/link"))
    reply = client.request("GET", "/v1/files/list?path=/work/ls")
    assert reply.status == 200
    body = reply.json()
    assert body["path"] == "/work/ls"
    entries = {e["name"]: e for e in body["entries"]}
    assert [e["name"] for e in body["entries"]] == ["dir", "file.txt", "link"]
    assert entries["file.txt"]["type"] == "file"
    assert entries["file.txt"]["size"] == 5
    assert entries["file.txt"]["mode"] == "0640"
    assert abs(entries["file.txt"]["mtime"] - time.time()) < 60
    assert entries["dir"]["type"] == "dir"
    assert entries["link"]["type"] == "symlink"
    for entry in body["entries"]:
        assert set(entry) == {"name", "type", "size", "mode", "mtime"}
    assert client.request("GET", "/v1/files/list?path=/work/ls/file.txt").status == 400


def test_missing_file_is_404(client: Client) -> None:
    reply = client.request("GET", "/v1/files?path=/work/nope.txt")
    assert reply.status == 404
    assert reply.json()["error"] == {"code": "not_found", "message": "no such file or directory: /work/nope.txt"}
    assert client.request("GET", "/v1/files/list?path=/work/nope").status == 404


def test_directory_as_file_is_400(client: Client) -> None:
    reply = client.request("GET", "/v1/files?path=/work")
    assert reply.status == 400
    assert "directory" in reply.json()["error"]["message"]
    assert client.request("PUT", "/v1/files?path=/work", b"x").status == 409


def test_missing_path_is_400(client: Client) -> None:
    reply = client.request("GET", "/v1/files")
    assert reply.status == 400
    assert "path" in reply.json()["error"]["message"]


def test_symlink_out_of_the_root_is_403(executor: RunningExecutor, client: Client) -> None:
    outside = os.path.dirname(executor.root)  # the temp dir that holds the root
    with open(os.path.join(outside, "secret.txt"), "w", encoding="utf-8") as fh:
        fh.write("secret")
    os.symlink(outside, executor.host_path("/work/escape"))
    for method, body in (("GET", None), ("PUT", b"x"), ("DELETE", None)):
        reply = client.request(method, "/v1/files?path=/work/escape/secret.txt", body)
        assert reply.status == 403, (method, reply.body)
        assert reply.json()["error"]["code"] == "forbidden"
    assert client.request("GET", "/v1/files/list?path=/work/escape").status == 403
    with open(os.path.join(outside, "secret.txt"), encoding="utf-8") as fh:
        assert fh.read() == "secret"


@pytest.mark.parametrize("path", ["../../../../etc/passwd", "/../../etc/hostname", "/work/../../../etc"])
def test_dot_dot_stays_inside_the_root(client: Client, path: str) -> None:
    """'..' is normalised at the API root: the host's /etc is never reached."""
    reply = client.request("GET", f"/v1/files?path={quote(path)}")
    assert reply.status == 404, reply.body


def test_file_over_the_cap_is_413(capped_executor: RunningExecutor) -> None:
    client = capped_executor.client()
    assert client.request("PUT", "/v1/files?path=/work/ok.bin", b"x" * 4096).status == 201
    reply = client.request("PUT", "/v1/files?path=/work/big.bin", b"x" * 4097)
    assert reply.status == 413
    assert reply.json()["error"]["code"] == "too_large"
    assert "4096" in reply.json()["error"]["message"]
    client.close()
    # Without a Content-Length (chunked) the cap is enforced while streaming, and nothing is left behind.
    client = capped_executor.client()
    reply = client.request("PUT", "/v1/files?path=/work/chunked.bin", iter([b"y" * 3000, b"y" * 3000]))
    assert reply.status == 413
    client.close()
    assert sorted(os.listdir(capped_executor.host_path("/work"))) == ["ok.bin"]
