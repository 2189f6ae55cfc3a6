"""ObjectStore against the real embedded S3 server: objects, multipart, presigned URLs, errors."""

from __future__ import annotations

import hashlib
import http.client
import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from artifacts.s3config import S3Config
from artifacts.store import ObjectStore
from grove.core.errors import Forbidden, Invalid, NotFound, Unavailable
from tests.conftest import free_tcp_port


def http_request(url: str, method: str = "GET", body: bytes | None = None) -> tuple[int, bytes]:
    """One plain http.client request (what a credential-less consumer does with a presigned URL)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10)
    try:
        conn.request(method, f"{parts.path}?{parts.query}", body=body)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def test_put_get_list_exists_delete(object_store: ObjectStore) -> None:
    object_store.put_bytes("a/one.txt", b"one")
    object_store.put_bytes("a/two.txt", b"two" * 1000, content_type="text/plain")
    object_store.put_bytes("b/three", b"")
    assert object_store.get_bytes("a/one.txt") == b"one"
    assert object_store.get_bytes("b/three") == b""
    listed = object_store.list("a/")
    assert [(o.key, o.size) for o in listed] == [("a/one.txt", 3), ("a/two.txt", 3000)]
    assert all(o.last_modified and o.etag for o in listed)
    assert {o.key for o in object_store.list()} == {"a/one.txt", "a/two.txt", "b/three"}
    assert object_store.exists("a/one.txt")
    object_store.delete("a/one.txt")
    object_store.delete("a/one.txt")  # idempotent
    assert not object_store.exists("a/one.txt")
    with pytest.raises(NotFound):
        object_store.get_bytes("a/one.txt")
    assert [o.key for o in object_store.list("a/")] == ["a/two.txt"]


def test_keys_with_odd_characters(object_store: ObjectStore) -> None:
    key = "odd/sp ace/ü+%?#&=/x"
    object_store.put_bytes(key, b"odd")
    assert object_store.get_bytes(key) == b"odd"
    assert [o.key for o in object_store.list("odd/")] == [key]


def _pattern(total: int, chunk: int = 1 << 20) -> Iterator[bytes]:
    # Not all zeros and not repetitive at the part size, so a misplaced part would show in the hash.
    for i in range(0, total, chunk):
        yield hashlib.sha256(str(i).encode()).digest() * (min(chunk, total - i) // 32)


def test_multipart_upload_of_20_mb_stream(object_store: ObjectStore) -> None:
    total = 20 * 1024 * 1024
    want = hashlib.sha256()
    for part in _pattern(total):
        want.update(part)
    etag = object_store.put_stream("big/stream.bin", _pattern(total))  # unknown length: multipart
    assert etag is not None and etag.strip('"').endswith("-4")  # 5 MiB parts: S3's multipart etag
    got = hashlib.sha256()
    size = 0
    with object_store.get_stream("big/stream.bin") as reader:
        assert reader.size == total
        for chunk in reader:
            got.update(chunk)
            size += len(chunk)
    assert size == total and got.hexdigest() == want.hexdigest()


def test_put_file_and_missing_file(object_store: ObjectStore, tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(os.urandom(6 * 1024 * 1024))  # above the part size: uploaded in parts
    object_store.put_file("files/f.bin", path)
    assert object_store.get_bytes("files/f.bin") == path.read_bytes()
    with pytest.raises(NotFound, match="no such file"):
        object_store.put_file("files/none", tmp_path / "none")


def test_presigned_get_and_put_with_plain_http(object_store: ObjectStore) -> None:
    put_url = object_store.presign_put("shared/upload.bin", expires=60)
    assert put_url.startswith(object_store.config.endpoint + "/")
    status, _ = http_request(put_url, "PUT", b"from a sandbox")
    assert status == 200
    assert object_store.get_bytes("shared/upload.bin") == b"from a sandbox"

    status, body = http_request(object_store.presign_get("shared/upload.bin"))
    assert (status, body) == (200, b"from a sandbox")
    # The signature covers the key: the same URL cannot fetch another object.
    tampered = object_store.presign_get("shared/upload.bin").replace("upload.bin", "other.bin")
    assert http_request(tampered)[0] == 403
    assert http_request(object_store.presign_get("shared/missing"))[0] == 404


def test_presign_expiry_is_checked(object_store: ObjectStore) -> None:
    with pytest.raises(Invalid):
        object_store.presign_get("k", expires=0)
    with pytest.raises(Invalid):
        object_store.presign_put("k", expires=8 * 86400)


def test_bad_credentials_are_rejected(s3_config: S3Config) -> None:
    with ObjectStore(replace(s3_config, secret_key="not-the-secret")) as store, pytest.raises(Forbidden) as err:
        store.put_bytes("k", b"x")
    assert "refused the credentials" in err.value.message
    with ObjectStore(replace(s3_config, access_key="NOSUCHKEY")) as store, pytest.raises(Forbidden):
        store.list()


def test_unreachable_server_is_unavailable_naming_it() -> None:
    endpoint = f"http://127.0.0.1:{free_tcp_port()}"
    with ObjectStore(S3Config(endpoint, "k", "s")) as store, pytest.raises(Unavailable) as err:
        store.get_bytes("anything")
    assert endpoint in err.value.message and err.value.retry_after


def test_public_endpoint_signs_urls_for_another_host(s3_config: S3Config) -> None:
    host = urlsplit(s3_config.endpoint).port
    public = replace(s3_config, public_endpoint=f"http://localhost:{host}")
    with ObjectStore(public) as store:
        store.put_bytes("pub/x", b"via localhost")
        url = store.presign_get("pub/x")
        assert url.startswith(f"http://localhost:{host}/")
        assert http_request(url) == (200, b"via localhost")


def test_config_is_validated() -> None:
    with pytest.raises(Invalid):
        S3Config("ftp://host", "a", "b")
    with pytest.raises(Invalid):
        S3Config("http://host:9000/bucket", "a", "b")
    config = S3Config("https://s3.example.com", "a", "very-secret")
    assert config.secure and config.host == "s3.example.com"
    assert "very-secret" not in repr(config)
