"""TrajectoryArchive against the real embedded S3 server: store, list, get, and nothing lost in an outage."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from artifacts import trajectory as tj
from artifacts.archive import TrajectoryArchive
from artifacts.s3config import S3Config
from artifacts.s3server import EmbeddedS3
from artifacts.store import ObjectStore
from grove.core.errors import NotFound, Unavailable
from tests.conftest import free_tcp_port
from tests.support.s3_fixtures import config_for
from tests.support.trajectory_samples import CREATED, make_record


def dead_store() -> ObjectStore:
    """A store whose server is not there."""
    return ObjectStore(S3Config(f"http://127.0.0.1:{free_tcp_port()}", "k", "s"))


def tj_time(minutes: int) -> float:
    """A creation time some minutes after the samples' default."""
    return CREATED + 60.0 * minutes


def test_store_list_get(object_store: ObjectStore, tmp_path: Path) -> None:
    archive = TrajectoryArchive(object_store, tmp_path / "spool")
    records = [
        make_record("sb-a", task_id="t1", model="m1", harness="h1"),
        make_record("sb-b", task_id="t1", model="m2", harness="h1", created_at=tj_time(1)),
        make_record("sb-c", task_id="t2/x", model="m1", harness="h2", created_at=tj_time(2)),
        make_record("sb-d", task_id=None, model=None, harness=None, created_at=tj_time(3)),
    ]
    for record in records:
        stored = archive.store(record)
        assert not stored.spooled and stored.key == tj.trajectory_key(record)
        assert object_store.exists(stored.key)

    def ids(summaries: list[dict[str, object]]) -> list[object]:
        return [s["sandbox_id"] for s in summaries]

    assert ids(archive.list()) == ["sb-a", "sb-b", "sb-c", "sb-d"]  # oldest first
    assert ids(archive.list(task_id="t1")) == ["sb-a", "sb-b"]
    assert ids(archive.list(task_id="t2/x")) == ["sb-c"]
    assert ids(archive.list(model="m1")) == ["sb-a", "sb-c"]
    assert ids(archive.list(harness="h1", model="m2")) == ["sb-b"]
    assert archive.list(task_id="nope") == []
    summary = archive.list(task_id="t2/x")[0]
    assert summary["key"] == tj.trajectory_key(records[2]) and summary["image_digest"].startswith("sha256:")

    assert archive.get("sb-c") == records[2]
    with pytest.raises(NotFound, match="sb-zzz"):
        archive.get("sb-zzz")


def test_outage_spools_then_flush_uploads_everything(private_s3: EmbeddedS3, tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    with ObjectStore(config_for(private_s3, "outage")) as store:
        archive = TrajectoryArchive(store, spool)
        assert not archive.store(make_record("sb-before", task_id="outage")).spooled
        endpoint = private_s3.endpoint

        private_s3.stop()
        records = [make_record(f"sb-{i}", task_id="outage") for i in range(5)]
        started = time.monotonic()
        results = [archive.store(record) for record in records]
        assert time.monotonic() - started < 2.0  # a refused connection fails fast; later ones skip S3
        assert all(r.spooled and r.error for r in results)
        assert sorted(p.name for p in spool.iterdir()) == [f"sb-{i}.msgpack" for i in range(5)]
        assert archive.get("sb-3") == records[3]  # readable while spooled
        assert archive.pending() == 5
        assert archive.flush_spool() == 0  # still down: nothing uploaded, nothing deleted
        with pytest.raises(Unavailable, match=endpoint):
            archive.list(task_id="outage")

        private_s3.start()
        assert private_s3.endpoint == endpoint  # same port: the store's config is still right
        assert archive.flush_spool() == 5
        assert archive.pending() == 0 and list(spool.glob("*.msgpack")) == []
        found = archive.list(task_id="outage")
        assert sorted(s["sandbox_id"] for s in found) == sorted(["sb-before"] + [f"sb-{i}" for i in range(5)])
        assert not any(s.get("spooled") for s in found)
        assert archive.get("sb-before")["sandbox"]["id"] == "sb-before"  # written before the outage


def test_spool_survives_a_restart(object_store: ObjectStore, tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    with dead_store() as down:
        old = TrajectoryArchive(down, spool)
        for i in range(3):
            assert old.store(make_record(f"sb-r{i}", task_id="restart")).spooled
        listed = old.spool.files()
    assert len(listed) == 3
    # A new process on the same state dir: the records the old one left go up now.
    new = TrajectoryArchive(object_store, spool)
    assert [s["sandbox_id"] for s in new.list(task_id="restart")] == ["sb-r0", "sb-r1", "sb-r2"]  # from the spool
    assert all(s["spooled"] for s in new.list(task_id="restart"))
    assert new.flush_spool() == 3
    assert new.flush_spool() == 0
    assert [s["sandbox_id"] for s in new.list(task_id="restart")] == ["sb-r0", "sb-r1", "sb-r2"]
    assert new.get("sb-r1")["sandbox"]["id"] == "sb-r1"


def test_concurrent_store_and_flush_keep_the_newest_record(object_store: ObjectStore, tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    ids = [f"sb-c{i}" for i in range(12)]
    with dead_store() as down:
        stale = TrajectoryArchive(down, spool)
        for sid in ids:
            stale.store(make_record(sid, task_id="conc", outcome={"result": "fail", "reward": 0.0}))
    archive = TrajectoryArchive(object_store, spool)
    errors: list[BaseException] = []

    def run(fn: Callable[[], object]) -> threading.Thread:
        def target() -> None:
            try:
                fn()
            except BaseException as exc:  # surfaced below
                errors.append(exc)

        thread = threading.Thread(target=target)
        thread.start()
        return thread

    def store_newer(sid: str) -> Callable[[], object]:
        return lambda: archive.store(make_record(sid, task_id="conc"))

    newer = [run(store_newer(sid)) for sid in ids]
    flushers = [run(archive.flush_spool) for _ in range(3)]
    for thread in newer + flushers:
        thread.join(30)
    assert errors == []
    assert archive.pending() == 0
    summaries = archive.list(task_id="conc")
    assert sorted(s["sandbox_id"] for s in summaries) == sorted(ids)
    assert {s["result"] for s in summaries} == {"pass"}  # no flush overwrote a newer record


def test_unreadable_spool_file_is_moved_aside(object_store: ObjectStore, tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    (spool / "sb-bad.msgpack").write_bytes(b"\xc1 torn")
    archive = TrajectoryArchive(object_store, spool)
    assert archive.flush_spool() == 0
    assert (spool / "rejected" / "sb-bad.msgpack").exists()
    assert archive.pending() == 0
