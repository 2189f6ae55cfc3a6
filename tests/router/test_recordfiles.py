"""The records' files written off the event loop through their log: one record's writes land in the order
they were asked for, a removal is not undone by a write still in flight, a write's error reaches its
caller, many writes share one fsync, and a crash (a child process dying with its log unapplied, files
left empty, stale or missing, a torn last frame) loses no write that returned."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import time
from pathlib import Path

import pytest

from router import recordlog
from router.models import CreateRequest, Metadata, NetworkModel
from router.recordfiles import RecordFiles

pytestmark = pytest.mark.fast  # real files in a temp dir, no router: `make test-fast`
ID = "sb-00000000000000aa"


def test_writes_of_one_record_land_in_order(tmp_path: Path) -> None:
    files = RecordFiles(tmp_path)

    async def run() -> None:
        # Many writes at once, across the worker threads: the last one asked for is what stays.
        await asyncio.gather(*(files.write_async(ID, json.dumps({"n": n}).encode()) for n in range(60)))
        await files.drain()

    asyncio.run(run())
    assert json.loads((tmp_path / f"{ID}.json").read_text()) == {"n": 59}
    assert [p.name for p in tmp_path.iterdir()] == [f"{ID}.json"]  # no temp file left


def test_a_removal_stays_removed(tmp_path: Path) -> None:
    files = RecordFiles(tmp_path)

    async def run() -> None:
        writes = [asyncio.create_task(files.write_async(ID, b'{"n": %d}' % n)) for n in range(20)]
        await asyncio.sleep(0)  # the writes are queued, some already in a thread
        files.unlink(ID)
        await asyncio.gather(*writes)
        other = "sb-00000000000000bb"
        await files.write_async(other, b"{}")
        files.discard(other)
        await files.drain()

    asyncio.run(run())
    assert list(tmp_path.iterdir()) == []


def test_a_failed_write_raises_in_its_caller(tmp_path: Path) -> None:
    files = RecordFiles(tmp_path / "gone")  # no such directory: the temp file cannot be made

    async def run() -> None:
        with pytest.raises(FileNotFoundError):
            await files.write_async(ID, b"{}")
        await files.drain()

    asyncio.run(run())


def _die_after_writes(directory: Path, writes: list[tuple[str, bytes]]) -> None:
    """In a child process: write the records, then die without closing (the logs stay, as in a crash)."""
    pid = os.fork()
    if pid == 0:
        try:
            files = RecordFiles(directory)

            async def run() -> None:
                await asyncio.gather(*(files.write_async(sid, data) for sid, data in writes))

            asyncio.run(run())
        finally:
            os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0


def test_many_writes_share_one_log_append_and_a_crash_loses_none(tmp_path: Path) -> None:
    ids = [f"sb-{n:016x}" for n in range(400)]
    _die_after_writes(tmp_path, [(sid, json.dumps({"id": sid}).encode()) for sid in ids])
    assert [p.name for p in tmp_path.glob("wal-*.log")], "a crash leaves the log behind"
    # What a machine crash can leave of files written without an fsync of their own: empty, stale, gone.
    (tmp_path / f"{ids[0]}.json").write_bytes(b"")
    (tmp_path / f"{ids[1]}.json").write_bytes(b'{"id": "stale"}')
    (tmp_path / f"{ids[2]}.json").unlink()

    files = RecordFiles(tmp_path)  # replays the log
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{sid}.json" for sid in ids)
    assert all(json.loads((tmp_path / f"{sid}.json").read_text()) == {"id": sid} for sid in ids)

    async def burst() -> None:
        await asyncio.gather(*(files.write_async(sid, b"{}") for sid in ids))
        await files.drain()

    asyncio.run(burst())
    assert files.commits < len(ids) / 10, f"{files.commits} fsyncs for {len(ids)} writes at once"


def test_a_torn_tail_is_ignored_and_removals_replay(tmp_path: Path) -> None:
    kept, removed = "sb-00000000000000aa", "sb-00000000000000bb"
    _die_after_writes(tmp_path, [(kept, b'{"n": 1}'), (removed, b'{"n": 2}')])
    files = RecordFiles(tmp_path)
    files.discard(removed)
    files.write(kept, b'{"n": 3}')  # after the discard: when it returns, both are logged
    (log,) = tmp_path.glob("wal-*.log")
    # A crash mid-append: half a frame at the end, and the files as they were before the last writes.
    with log.open("ab") as fh:
        fh.write(recordlog.frame(recordlog.WRITE, kept, b'{"n": 4}')[:-3])
    (tmp_path / f"{kept}.json").write_bytes(b'{"n": 1}')
    (tmp_path / f"{removed}.json").write_bytes(b'{"n": 2}')

    RecordFiles(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == [f"{kept}.json"]
    assert json.loads((tmp_path / f"{kept}.json").read_text()) == {"n": 3}


def test_rotated_logs_are_checkpointed_away(tmp_path: Path) -> None:
    files = RecordFiles(tmp_path, rotate_bytes=4096)
    ids = [f"sb-{n:016x}" for n in range(30)]

    async def run() -> None:
        for sid in ids:  # one at a time: one append each, a rotation every few
            await files.write_async(sid, b"x" * 1000)
        for sid in ids[:20]:
            files.discard(sid)
        await files.write_async(ids[-1], b"y" * 1000)
        await files.drain()

    asyncio.run(run())
    assert files.commits >= 30
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{sid}.json" for sid in ids[20:])
    assert (tmp_path / f"{ids[-1]}.json").read_bytes() == b"y" * 1000


def test_a_file_that_cannot_be_written_lags_its_log_and_nothing_is_lost(tmp_path: Path) -> None:
    """A logged write whose file cannot be replaced (here a directory in its place; on a full disk, a file
    that needs a new block) still returns: the log has it, the files' view shows it, the log is not
    checkpointed away, and a start reads it from the log until the file can be written."""
    files = RecordFiles(tmp_path)
    blocked = tmp_path / f"{ID}.json"
    blocked.mkdir()
    files.write(ID, b'{"n": 1}')
    assert files.current() == {ID: b'{"n": 1}'}
    files.close()
    assert list(tmp_path.glob("wal-*.log")), "the log stays while a file lags it"

    assert RecordFiles(tmp_path).current() == {ID: b'{"n": 1}'}  # replay cannot write it either: read from the log
    blocked.rmdir()
    again = RecordFiles(tmp_path)  # now it can
    assert blocked.read_bytes() == b'{"n": 1}' and again.current() == {ID: b'{"n": 1}'}
    assert [p.name for p in tmp_path.iterdir()] == [f"{ID}.json"]


def test_a_request_on_disk_is_what_asdict_gives() -> None:
    """``CreateRequest.to_dict`` (the records' fast path) writes the same JSON as ``dataclasses.asdict``."""
    req = CreateRequest(env={"A": "1"}, network=NetworkModel("allow", ("10.0.0.0/8:443",)),
                        metadata=Metadata(task_id="t", labels={"k": "v"}), request_id="r")
    assert json.dumps(req.to_dict(), sort_keys=True) == json.dumps(dataclasses.asdict(req), sort_keys=True)
    assert req.to_dict()["env"] is not req.env  # a copy: the record on disk never aliases the request


def test_a_batch_of_claims_encodes_each_record_as_a_single_write_would() -> None:
    # Registry.store_group encodes a group's shared request once and writes a claim's own fields by hand;
    # read back, every record must be what encoding it whole gives, whatever its request id or token.
    from router.registry import SandboxRecord, _encode, _encode_claimed

    shared = CreateRequest(pool="p", env={"A": "1"}, metadata=Metadata(task_id="t", labels={"k": "v"}),
                           network=NetworkModel("allow", ("10.0.0.0/8",)))
    records = [SandboxRecord(id=f"sb-{i:016x}", request=shared.with_request_id(rid), token=token,
                             created_at=1796154406.6649044 + i, status="pending", image_digest="sha256:ab",
                             handle={"pid": 5349 + i, "nested": {"x": [1, 2]}}, endpoint_url="unix:/s/e.sock",
                             ready_at=1796154400.5)
               for i, (rid, token) in enumerate([("r-1", "tok_en-1"), ('a "quoted" \\ id', "t"), (None, "t+/="),
                                                 ("ü", "x")])]
    records.append(dataclasses.replace(records[0], id="sb-1", pool="p"))  # not a claim's: encoded whole
    encode = _encode_claimed(shared)
    for record in records:
        assert json.loads(encode(record)) == json.loads(_encode(record))
        back = SandboxRecord.from_disk(json.loads(encode(record)))
        assert dataclasses.replace(back, last_activity=record.last_activity) == record  # that one is not kept


def test_a_claims_record_has_its_members_values_as_they_are_not_as_encoded_ahead() -> None:
    # A ready member's kept fields are encoded when it is recorded (encode_ahead); its claim's record uses
    # that only while nothing changed since: a handle changed in place, a field set anew, are written as now.
    from router.registry import SandboxRecord, _encode, _encode_claimed, encode_ahead

    shared = CreateRequest(pool="p")
    encode = _encode_claimed(shared)

    def member() -> SandboxRecord:
        record = SandboxRecord(id="sb-00000000000000aa", request=shared, token="old", created_at=1.0,
                               status="ready", image_digest="sha256:ab", handle={"pid": 7, "oom_kills": 0},
                               endpoint_url="unix:/s/e.sock", ready_at=2.5, pool="p")
        encode_ahead(record)
        assert record.kept_json is not None
        record.request, record.token, record.pool, record.status = shared.with_request_id("r"), "new", None, "pending"
        return record

    def changed_in_place(r: SandboxRecord) -> None:
        r.handle["oom_kills"] = 3

    def handle_replaced(r: SandboxRecord) -> None:
        r.handle = {"pid": 8}

    def field_set(r: SandboxRecord) -> None:
        r.endpoint_url = "unix:/s/other.sock"

    for change in (None, changed_in_place, handle_replaced, field_set):
        record = member()
        if change is not None:
            change(record)
        assert json.loads(encode(record)) == json.loads(_encode(record)), change
        assert record.kept_json is None  # freed once used: a claimed sandbox keeps no copy


def test_files_deferred_while_held_are_durable_in_the_log_and_written_once_let_go(tmp_path: Path) -> None:
    # A streamed batch holds defer_files over its parts: the writer only appends; a write whose caller
    # waits for its file still gets it; the rest follow once the last holder lets go.
    files = RecordFiles(tmp_path)
    group = [(f"sb-{n:016x}", json.dumps({"n": n}).encode()) for n in range(100)]
    plain_id = "sb-00000000000fffff"

    async def run() -> None:
        with files.defer_files():
            with files.defer_files():  # held twice: the inner release lets nothing go
                await asyncio.wrap_future(files.queue_many(group[:50], files_after=True))
            await asyncio.wrap_future(files.queue_many(group[50:], files_after=True))
            await files.write_async(plain_id, b'{"plain": true}')
            assert (tmp_path / f"{plain_id}.json").read_bytes() == b'{"plain": true}'
            await asyncio.sleep(0.2)  # the writer idle, the files still held back
            assert not any((tmp_path / f"{sid}.json").exists() for sid, _ in group)
            logged = {sid: data for _, path in recordlog.logs(tmp_path)
                      for _, sid, data in recordlog.frames(path.read_bytes())}
            assert logged == {**dict(group), plain_id: b'{"plain": true}'}  # durable: the log has them
        deadline = time.monotonic() + 10
        while not all((tmp_path / f"{sid}.json").exists() for sid, _ in group) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for sid, data in group:
            assert (tmp_path / f"{sid}.json").read_bytes() == data

    asyncio.run(run())
    files.close()


def test_writes_answered_at_the_log_let_queued_appends_go_first_and_their_files_follow(tmp_path: Path) -> None:
    files = RecordFiles(tmp_path)
    group = [(f"sb-{n:016x}", json.dumps({"n": n}).encode()) for n in range(200)]
    plain_id = "sb-00000000000fffff"

    async def run() -> None:
        # Three groups answered at the log, queued back to back (a streamed batch's parts), then a write
        # answered only once its file shows it: each returns with what it promised.
        parts = [files.queue_many(group[i:i + 50], files_after=True) for i in range(0, 150, 50)]
        await asyncio.gather(*(asyncio.wrap_future(part) for part in parts))
        await files.write_many_async(group[150:])  # not files_after: its files are current when it returns
        for sid, data in group[150:]:
            assert (tmp_path / f"{sid}.json").read_bytes() == data
        await files.write_async(plain_id, b'{"plain": true}')
        assert (tmp_path / f"{plain_id}.json").read_bytes() == b'{"plain": true}'
        await files.drain()

    asyncio.run(run())
    for sid, data in group:  # the groups' files caught up with the log
        assert (tmp_path / f"{sid}.json").read_bytes() == data
    files.close()
    assert not recordlog.logs(tmp_path)  # and the log was checkpointed away
