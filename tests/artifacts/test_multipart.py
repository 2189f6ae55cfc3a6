"""Snapshot uploads as S3 multipart uploads: the executor's writer against the router's broker, on real S3.

The broker is the router's own :class:`router.backends.knative.uploads.SnapshotUploads`, called in-process; parts
are 5 MiB, S3's smallest (SeaweedFS refuses less, as AWS does).
"""

from __future__ import annotations

import os
import tracemalloc
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from artifacts.multipart import upload_multipart
from artifacts.store import ObjectStore
from grove.core.errors import Invalid, TooLarge, Unauthorized, Unavailable
from router.backends.knative.manifest import snapshot_key
from router.backends.knative.uploads import part_size_for
from tests.support.snapshot_broker import INSTANCE, LocalBroker, broker_for

PART = 5 * 1024 * 1024
SANDBOX = "sb-000000000000a11d"
KEY = snapshot_key(INSTANCE, SANDBOX)


def random_chunks(total: int, chunk: int = 1024 * 1024) -> Iterator[bytes]:
    """``total`` incompressible bytes, a chunk at a time (like the packer's output)."""
    for start in range(0, total, chunk):
        yield os.urandom(min(chunk, total - start))


def test_a_stream_of_several_parts_becomes_one_object_holding_one_part(object_store: ObjectStore) -> None:
    broker = LocalBroker(broker_for(object_store, PART), SANDBOX, disk_mb=64)
    data = b"".join(random_chunks(3 * PART + 12345))
    tracemalloc.start()
    try:
        stats = upload_multipart(broker, (data[i:i + 2**20] for i in range(0, len(data), 2**20)))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert stats.parts == 4 and stats.size == len(data) and stats.etag
    assert object_store.get_bytes(KEY) == data
    # One part buffered, plus the chunk being split (the 15 MiB stream itself was made before tracing).
    assert stats.largest_buffer <= PART + 2**20
    assert peak < PART + 3 * 2**20, peak
    assert broker.calls == ["start", "complete"]  # 16 URLs came with the start
    assert object_store.incomplete_uploads("snapshots/") == []


def test_a_snapshot_cut_off_midway_leaves_the_last_good_one_and_no_upload(object_store: ObjectStore) -> None:
    broker = LocalBroker(broker_for(object_store, PART), SANDBOX, disk_mb=64)
    upload_multipart(broker, [b"the last good snapshot"])
    before = object_store.stat(KEY).etag

    def dies_after_two_parts() -> Iterator[bytes]:
        yield from random_chunks(2 * PART + 1)
        raise OSError("the workspace went away")

    with pytest.raises(OSError, match="went away"):
        upload_multipart(broker, dies_after_two_parts())
    assert object_store.get_bytes(KEY) == b"the last good snapshot" and object_store.stat(KEY).etag == before
    assert broker.calls[-1] == "abort"
    assert object_store.incomplete_uploads("snapshots/") == []


def test_what_a_killed_writer_left_is_aborted_by_the_next_start(object_store: ObjectStore) -> None:
    uploads = broker_for(object_store, PART)
    broker = LocalBroker(uploads, SANDBOX, disk_mb=64)
    started = broker.call("start")  # a writer that then died without a word
    assert object_store.incomplete_uploads(KEY) == [(KEY, started["upload_id"])]
    upload_multipart(broker, [b"next"])
    assert object_store.incomplete_uploads("snapshots/") == [] and object_store.get_bytes(KEY) == b"next"


def test_the_broker_bounds_a_sandbox_to_its_own_key_and_disk(object_store: ObjectStore) -> None:
    uploads = broker_for(object_store, PART)
    token = uploads.token(SANDBOX, 64)
    assert uploads.check(SANDBOX, f"Bearer {token}") == 64 * 2**20 + PART
    for wrong in (None, token, f"Bearer {token}x", "Bearer 999999999." + token.split(".")[1]):
        with pytest.raises(Unauthorized):
            uploads.check(SANDBOX, wrong)
    with pytest.raises(Unauthorized):  # another sandbox's token
        uploads.check("sb-000000000000b0b0", f"Bearer {token}")
    broker = LocalBroker(uploads, SANDBOX, disk_mb=64)
    started = broker.call("start")
    assert started["max_parts"] == 14 and len(started["urls"]) == 14  # 64 MiB and a part's slack, in 5 MiB parts
    with pytest.raises(TooLarge, match="larger than its disk quota"):
        broker.call("parts", upload_id=started["upload_id"], first=15)
    with pytest.raises(Invalid, match="'op'"):
        broker.call("delete-everything")
    broker.call("abort", upload_id=started["upload_id"])
    # A 1 TiB quota would need more than S3's 10000 parts of 16 MiB: its parts grow instead.
    assert part_size_for(2**40, 16 * 2**20) == 105 * 2**20 and part_size_for(10 * 2**30, 16 * 2**20) == 16 * 2**20


def test_parts_larger_than_the_quota_allows_are_never_stored(object_store: ObjectStore) -> None:
    """A presigned part URL takes a part of any size: the broker checks the parts' total at completion."""
    broker = LocalBroker(broker_for(object_store, PART), SANDBOX, disk_mb=1)
    upload_multipart(broker, [b"the last good snapshot"])
    started = broker.call("start")  # 1 MiB and a part's slack: 2 parts of 5 MiB
    assert started["max_parts"] == 2
    etags = []
    for url, size in zip(started["urls"], (PART, PART + 2**20), strict=True):  # 11 MiB in all
        request = urllib.request.Request(url, data=os.urandom(size), method="PUT")
        with urllib.request.urlopen(request, timeout=30) as answer:
            etags.append(answer.headers["ETag"])
    with pytest.raises(TooLarge, match="more than its disk quota allows"):
        broker.call("complete", upload_id=started["upload_id"], etags=etags)
    assert object_store.get_bytes(KEY) == b"the last good snapshot"
    assert object_store.incomplete_uploads("snapshots/") == []


class FlakyBroker:
    """A broker that is unreachable for its first call of each kind named (a router restarting)."""

    def __init__(self, broker: LocalBroker, *flaky: str) -> None:
        self.broker, self.flaky = broker, set(flaky)

    def call(self, op: str, **fields: Any) -> dict[str, Any]:
        if op in self.flaky:
            self.flaky.discard(op)
            raise Unavailable("the snapshot broker is unreachable: connection refused")
        return self.broker.call(op, **fields)


def test_a_broker_away_for_a_moment_costs_no_snapshot(object_store: ObjectStore) -> None:
    broker = LocalBroker(broker_for(object_store, PART), SANDBOX, disk_mb=64)
    upload_multipart(FlakyBroker(broker, "start", "complete"), [b"kept"])
    assert object_store.get_bytes(KEY) == b"kept" and broker.calls == ["start", "complete"]
