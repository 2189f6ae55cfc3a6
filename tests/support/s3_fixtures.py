"""A real S3 server for the tests: the embedded ``weed mini``, one per session, data in a temporary dir.

``s3_server`` is started once and stopped at the end of the session (also when tests fail); each test
that wants isolation takes ``s3_config``/``object_store``, which use a bucket of its own. Tests that
stop the server (outages) start their own with ``private_s3``, so the shared one never moves.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from artifacts.s3config import S3Config
from artifacts.s3server import EmbeddedS3
from artifacts.store import ObjectStore


def new_bucket() -> str:
    """A fresh bucket name (lower case, DNS-safe)."""
    return f"t-{secrets.token_hex(6)}"


def config_for(server: EmbeddedS3, bucket: str | None = None) -> S3Config:
    """The S3Config of a running embedded server."""
    return S3Config(
        endpoint=server.endpoint,
        access_key=server.access_key,
        secret_key=server.secret_key,
        bucket=bucket or new_bucket(),
        part_size=5 * 1024 * 1024,  # the minimum, so the multipart test needs few bytes
    )


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedS3]:
    """The session's embedded S3 server (weed mini on loopback)."""
    server = EmbeddedS3(tmp_path_factory.mktemp("s3"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_config(s3_server: EmbeddedS3) -> S3Config:
    """Config for the shared server with a bucket of this test's own."""
    return config_for(s3_server)


@pytest.fixture
def object_store(s3_config: S3Config) -> Iterator[ObjectStore]:
    """An ObjectStore on this test's bucket."""
    store = ObjectStore(s3_config)
    try:
        yield store
    finally:
        store.close()


@pytest.fixture
def private_s3(tmp_path: Path) -> Iterator[EmbeddedS3]:
    """A server of this test's own, which the test may stop and start again (always stopped after)."""
    server = EmbeddedS3(tmp_path / "s3")
    server.start()
    try:
        yield server
    finally:
        server.stop()
