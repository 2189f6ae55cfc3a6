"""The records' files written off the event loop through their log: one record's writes land in the order
they were asked for, a removal is not undone by a write still in flight, a write's error reaches its
caller, many writes share one fsync, and a crash (a child process dying with its log unapplied, files
left empty, stale or missing, a torn last frame) loses no write that returned."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
from pathlib import Path

import pytest

from grove.statedir import StateDir
from router.models import CreateRequest, Metadata, NetworkModel
from router.records import log as recordlog
from router.records.files import RecordFiles
from router.records.registry import Registry, SandboxRecord, _encode

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


def _members(shared: CreateRequest) -> list[SandboxRecord]:
    """Ready pool members, as a filled pool records them."""
    return [SandboxRecord(id=f"sb-{i:016x}", request=shared, token=f"pool-{i}", created_at=1.0 + i, status="ready",
                          image_digest="sha256:ab", handle={"pid": 5349 + i, "nested": {"x": [1, 2]}},
                          endpoint_url=f"unix:/s/e{i}.sock", ready_at=2.5, pool="p") for i in range(5)]


def _claim(members: list[SandboxRecord], claimant: CreateRequest) -> None:
    """What a claim changes of its member in memory (as ``router.lifecycle.claims.Claims._take``)."""
    rids = ["r-1", 'a "quoted" \\ id', None, "\u00fc"]
    for i, (record, rid) in enumerate(zip(members, rids[:len(members)], strict=True)):
        record.request, record.token, record.pool = claimant.with_request_id(rid), f"tok_en+/={i}", None
        record.created_at = record.last_activity = 1796154406.6649044  # a group's claims: one instant
        record.status = "pending"


def _on_disk(directory: Path) -> dict[str, dict[str, object]]:
    return {path.stem: json.loads(path.read_bytes()) for path in directory.glob("sb-*.json")}


def test_a_batch_of_claims_logged_as_a_patch_replays_to_the_whole_records_after_a_crash(tmp_path: Path) -> None:
    # A batch's claims are durable as one patch of the members' records; the whole records follow with the
    # hand-overs. A router dying in between: the restarted one reads each claim as its whole record says.
    pool = CreateRequest(pool="p")
    claimant = CreateRequest(pool="p", env={"A": "1"}, metadata=Metadata(task_id="t", labels={"k": "v"}),
                             network=NetworkModel("allow", ("10.0.0.0/8",)), workdir="/work")
    members = _members(pool)
    pid = os.fork()
    if pid == 0:
        try:
            registry = Registry(tmp_path)

            async def run() -> None:
                for record in members:
                    registry.add(record)
                    await registry.store(record)
                _claim(members[:4], claimant)
                await asyncio.wrap_future(registry.queue_group(members[:4], claimant))
                registry.unlink(members[3].id)  # deleted after its claim: stays deleted
                await registry.store(members[4])  # (in the log once this one is: one queue, in order)

            asyncio.run(run())
        finally:
            os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    records = StateDir(tmp_path).records
    assert recordlog.logs(records), "a crash leaves the log behind"
    assert all(data["pool"] is not None for data in _on_disk(records).values())  # the files: still members

    _claim(members[:4], claimant)
    loaded = {record.id: record for record in Registry(tmp_path).load()}
    assert sorted(loaded) == sorted(r.id for r in members if r is not members[3])
    for record in [*members[:3], members[4]]:
        assert dataclasses.replace(loaded[record.id], last_activity=record.last_activity) == record
        assert _on_disk(records)[record.id] == json.loads(_encode(record))  # and the files are brought up to it


def test_a_torn_patch_leaves_its_members_as_they_were(tmp_path: Path) -> None:
    pool = CreateRequest(pool="p")
    members = _members(pool)
    files = RecordFiles(tmp_path)
    for record in members:
        files.write(record.id, _encode(record))
    files.close()
    before = _on_disk(tmp_path)
    payload = recordlog.patch_of({"request": CreateRequest().to_dict(), "pool": None}, [r.id for r in members],
                                 [("token", ["t"] * len(members))])
    recordlog.log_path(tmp_path, 0).write_bytes(recordlog.frame(recordlog.PATCH, "", payload)[:-5])

    RecordFiles(tmp_path)
    assert _on_disk(tmp_path) == before
    assert not recordlog.logs(tmp_path)


def test_a_patchs_log_stays_until_each_record_it_names_is_written_whole(tmp_path: Path) -> None:
    files = RecordFiles(tmp_path)
    whole = [(f"sb-{n:016x}", json.dumps({"n": n, "request": {"request_id": None}}).encode()) for n in range(6)]
    plain_id = "sb-00000000000fffff"

    async def run() -> None:
        for sid, data in whole:
            await files.write_async(sid, data)
        # Three patches back to back (a streamed batch's parts), then a write whose caller waits for its file.
        parts = []
        for i in range(0, 6, 2):
            ids = [sid for sid, _ in whole[i:i + 2]]
            column = (("request", "request_id"), [f"r{sid[-1]}" for sid in ids])
            payload = recordlog.patch_of({"claimed": True}, ids, [column])
            parts.append(files.queue_patch(ids, payload))
        await asyncio.gather(*(asyncio.wrap_future(part) for part in parts))
        await files.write_async(plain_id, b'{"plain": true}')
        assert (tmp_path / f"{plain_id}.json").read_bytes() == b'{"plain": true}'
        assert all(json.loads((tmp_path / f"{sid}.json").read_bytes()) == json.loads(data) for sid, data in whole)

    asyncio.run(run())
    files.close()
    assert recordlog.logs(tmp_path), "the files lag the patches: the log stays"
    again = RecordFiles(tmp_path)  # replays them
    for n, (sid, _) in enumerate(whole):
        assert json.loads((tmp_path / f"{sid}.json").read_bytes()) == {"n": n, "claimed": True,
                                                                     "request": {"request_id": f"r{n}"}}
    assert not recordlog.logs(tmp_path)

    async def patch_then_write_whole() -> None:
        await asyncio.wrap_future(again.queue_patch([whole[0][0]], recordlog.patch_of({"x": 1}, [whole[0][0]], [])))
        await again.write_async(whole[0][0], b'{"whole": true}')
        await again.drain()

    asyncio.run(patch_then_write_whole())
    assert not recordlog.logs(tmp_path), "written whole after its patch: the log is checkpointed away"
    assert (tmp_path / f"{whole[0][0]}.json").read_bytes() == b'{"whole": true}'
