"""The router's state disk fills up: every refused call says so (507, "free space under <state dir>"), no
record is torn, no step of a trajectory is lost, and once there is space again everything works on —
without a restart, and after one.

The state dir is a tmpfs of its own (``router_state(disk_mb=...)``); S3 is the session's server
elsewhere, so what fills is the router's own state, not the object store. The test fills the disk byte
for byte, so small appends still fit in the last page of a file and larger ones are cut off part-way —
the "nearly full" case, where a naive append leaves half an entry behind.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

from artifacts.s3server import EmbeddedS3
from router.models import CreateRequest
from router.records import log as recordlog
from router.records.registry import Registry, SandboxRecord
from router.trajectory.journal import Journal
from tests.conftest import short_tempdir
from tests.support.executor_fixtures import Reply
from tests.support.router_fixtures import (
    RouterProcess,
    cgroup_procs,
    error_of,
    mount_state_disk,
    new_state_dir,
    router_state,
    starts_held,
    unmount_state_disk,
    wait_for,
)
from tests.support.s3_fixtures import new_bucket

# The runtime bundle (~61 MiB) and the default image are built into the state dir when the router starts.
DISK_MB = 96
BIG = 6000  # bytes of stdout in one exec step: more than the slack in any page a journal ends in


@pytest.fixture
def small_disk_router(s3_server: EmbeddedS3) -> Iterator[RouterProcess]:
    """A router whose state dir is a tmpfs of DISK_MB MiB, storing trajectories in the session's S3."""
    with router_state(start=False, disk_mb=DISK_MB) as router:
        # No disk check at admission: this test fills the disk on purpose, to see what the writes do.
        router.up_args = ("--s3", s3_server.endpoint, "--s3-bucket", new_bucket(), "--disk-reserve-mb", "0")
        router.extra_env = {"GROVE_S3_ACCESS_KEY": s3_server.access_key, "GROVE_S3_SECRET_KEY": s3_server.secret_key}
        router.start()
        yield router


@pytest.fixture
def tiny_disk() -> Iterator[Path]:
    """A 1 MiB tmpfs of this test's own (unmounted and removed however the test ends)."""
    path = new_state_dir()
    try:
        mount_state_disk(path, 1)
        yield path
    finally:
        unmount_state_disk(path)
        path.rmdir()


def fill(path: Path) -> int:
    """Write ``path`` until its filesystem takes not one more byte; return how many bytes that was."""
    written = 0
    with open(path, "wb", buffering=0) as fh:
        for size in (1 << 20, 4096, 1):
            block = b"\xa5" * size
            while True:
                try:
                    n = fh.write(block)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
                written += n or 0
                if n != size:
                    break
    return written


def records(state: Path) -> dict[str, dict[str, Any]]:
    """Every record file of the state dir, parsed (a torn one fails the test here); the records' log, if
    one is there, must parse whole to its last byte (no torn frame)."""
    found = {}
    for path in sorted((state / "records").iterdir()):
        if path.name.startswith("wal-") and path.suffix == ".log":
            raw = path.read_bytes()
            whole = sum(recordlog.HEADER.size + 2 + len(sid.encode()) + len(data)
                        for _, sid, data in recordlog.frames(raw))
            assert whole == len(raw), f"{path.name} ends in a torn frame ({len(raw) - whole} bytes)"
            continue
        assert path.name.startswith("sb-") and path.suffix == ".json", f"stray file in records: {path.name}"
        found[path.stem] = json.loads(path.read_bytes())
    return found


def journal_entries(state: Path, sandbox_id: str) -> list[dict[str, Any]]:
    """Every entry of a journal on disk, insisting that it parses to the last byte."""
    raw = (state / "journals" / f"{sandbox_id}.msgpack").read_bytes()
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
    unpacker.feed(raw)
    entries = list(unpacker)  # raises on a garbled entry
    assert unpacker.tell() == len(raw), f"the journal ends in a torn entry ({len(raw) - unpacker.tell()} bytes)"
    return entries


def commands(trajectory: dict[str, Any]) -> list[str]:
    """The exec commands and event kinds of a trajectory, in order."""
    return [s.get("command") or f"event:{s.get('kind')}" for s in trajectory["steps"] if s["type"] in ("exec", "event")]


def create(router: RouterProcess, **options: Any) -> str:
    """Create a sandbox (waiting until it is ready); its id."""
    reply = router.http("POST", "/v1/sandboxes", json_body=options)
    assert reply.status == 201, reply.body[:500]
    return str(reply.json()["id"])


def run(router: RouterProcess, sandbox_id: str, command: str) -> Reply:
    """One exec call, raw."""
    return router.http("POST", f"/v1/sandboxes/{sandbox_id}/exec", json_body={"command": command, "timeout_s": 30})


def test_state_disk_full(small_disk_router: RouterProcess) -> None:
    router, state = small_disk_router, small_disk_router.state_dir
    seen: list[tuple[str, Reply]] = []

    def check_refusal(what: str, reply: Reply) -> None:
        """A refused call on the full disk: the one error shape, a message a person can act on, never a 500."""
        seen.append((what, reply))
        assert reply.status in (507, 503), (what, reply.status, reply.body[:500])
        err = error_of(reply)
        assert err["code"] in ("insufficient_storage", "unavailable"), (what, err)
        assert "state disk is full" in err["message"] and str(state) in err["message"], (what, err)

    kept = create(router)  # lives through it all
    doomed = create(router)  # deleted while the disk is full
    sleeper = create(router, idle_timeout_s=1)  # scaled to zero before the disk fills, woken while full
    assert run(router, kept, "echo kept > /workspace/f").status == 200
    assert router.http("POST", f"/v1/sandboxes/{kept}/events", json_body={"kind": "before"}).status == 200
    assert run(router, doomed, "echo doomed").status == 200
    wait_for(lambda: router.http("GET", f"/v1/sandboxes/{sleeper}").json()["status"] == "idle", 30,
             what="the sleeper scaled to zero")
    before = records(state)
    assert set(before) == {kept, doomed, sleeper}

    filler = state / "filler"
    filled = fill(filler)
    assert filled > 1 << 20
    assert os.statvfs(state).f_bavail == 0

    # -- the disk is full ----------------------------------------------------------------------------
    check_refusal("create", router.http("POST", "/v1/sandboxes", json_body={}))
    check_refusal("create again", router.http("POST", "/v1/sandboxes", json_body={"request_id": "full-1"}))
    assert router.live_ids() == {kept, doomed, sleeper}  # nothing half-made is listed

    # Commands run; their steps cannot all be written yet, and are neither lost nor torn.
    big = run(router, kept, f"head -c {BIG} /dev/zero | tr '\\0' x")
    assert big.status == 200 and len(big.json()["stdout"]) == BIG, big.body[:300]
    small = run(router, kept, "echo during-full")
    assert small.status == 200 and small.json()["stdout"] == "during-full\n", small.body[:300]
    event = router.http("POST", f"/v1/sandboxes/{kept}/events", json_body={"kind": "while-full", "data": {"n": 1}})
    assert event.status == 200, event.body[:300]
    # The sandbox's own layer is on the same disk: its writes fail inside it, with a clear answer.
    put = router.http("PUT", f"/v1/sandboxes/{kept}/files?path=/workspace/g", body=b"y" * 65536)
    seen.append(("write file", put))
    assert put.status in (413, 507), (put.status, put.body[:300])
    assert "no space" in error_of(put)["message"].lower()
    live = router.http("GET", f"/v1/sandboxes/{kept}/trajectory")
    assert live.status == 200, live.body[:300]
    assert commands(live.json())[-3:] == [f"head -c {BIG} /dev/zero | tr '\\0' x", "echo during-full",
                                          "event:while-full"], commands(live.json())

    # Waking a sandbox that was scaled to zero needs its record rewritten: refused, and left asleep.
    check_refusal("wake", run(router, sleeper, "echo awake"))
    assert router.http("GET", f"/v1/sandboxes/{sleeper}").json()["status"] == "idle"

    # An image import (the CLI, on the state dir) is refused the same way and leaves nothing behind.
    with short_tempdir() as source:
        (Path(source) / "etc").mkdir()
        (Path(source) / "etc" / "big").write_bytes(b"z" * 65536)
        images = sorted(p.name for p in (state / "images").iterdir())
        done = router.cli("image", "import", "full-disk", source)
    assert done.returncode == 1 and b"Traceback" not in done.stderr, done.stderr.decode()[-2000:]
    assert b"state disk is full" in done.stderr and str(state).encode() in done.stderr, done.stderr
    assert sorted(p.name for p in (state / "images").iterdir()) == images

    # Deleting is what frees space, so it works on a full disk; its trajectory goes to S3 whole.
    gone = router.http("DELETE", f"/v1/sandboxes/{doomed}")
    seen.append(("delete", gone))
    assert gone.status == 200, gone.body[:300]
    stored = router.http("GET", f"/v1/trajectories/{doomed}")
    assert stored.status == 200 and commands(stored.json()) == ["echo doomed"], stored.body[:300]

    # Nothing on disk is torn or half-written, and the router still lists what it had.
    now = records(state)
    assert set(now) == {kept, sleeper}
    assert now[kept] == before[kept]
    assert router.live_ids() == {kept, sleeper}
    assert all(reply.status != 500 for _, reply in seen), [(w, r.status) for w, r in seen]
    assert "Traceback" not in router.log(), router.log()[-3000:]

    # -- space again: no restart needed --------------------------------------------------------------
    filler.unlink()
    fresh = create(router)
    assert run(router, kept, "cat /workspace/f").json()["stdout"] == "kept\n"
    after = run(router, kept, "echo after-free")
    assert after.status == 200, after.body[:300]
    assert run(router, sleeper, "echo awake").json()["stdout"] == "awake\n"
    on_disk = journal_entries(state, kept)  # what was held is written now, in order, and parses whole
    steps = [e.get("command") or f"event:{e.get('kind')}" for e in on_disk if e.get("type") in ("exec", "event")]
    assert steps == ["echo kept > /workspace/f", "event:before", f"head -c {BIG} /dev/zero | tr '\\0' x",
                     "echo during-full", "event:while-full", "cat /workspace/f", "echo after-free"], steps

    # -- a restart re-adopts everything ---------------------------------------------------------------
    assert router.stop() == 0
    router.start()
    assert router.live_ids() == {kept, sleeper, fresh}
    assert set(records(state)) == {kept, sleeper, fresh}
    assert run(router, kept, "cat /workspace/f").json()["stdout"] == "kept\n"
    for sandbox_id in (kept, sleeper, fresh):
        assert router.http("DELETE", f"/v1/sandboxes/{sandbox_id}").status == 200
    stored = wait_for(lambda: (r := router.http("GET", f"/v1/trajectories/{kept}")).status == 200 and r, 30,
                      what="the kept sandbox's trajectory in S3")
    assert commands(stored.json())[:5] == steps[:5]
    assert not records(state) and not list((state / "journals").iterdir())


def test_a_write_cut_off_by_the_full_disk_leaves_no_torn_file(tiny_disk: Path) -> None:
    """The two writers of the router's own files, each on a disk that takes part of a write and refuses
    the rest: the record keeps its last whole version (no temp file left), the journal its last whole
    entry, and the entries that did not fit come back when there is room."""
    registry, journal = Registry(tiny_disk), Journal(tiny_disk)
    record = SandboxRecord(id="sb-00000000000000aa", request=CreateRequest(), token="t", created_at=1.0)
    registry.save(record)
    journal.start(record.id, {"id": record.id})
    journal.append(record.id, {"type": "exec", "command": "first"})
    filler = tiny_disk / "filler"
    fill(filler)

    # A write whose log append does not fit: refused, the append cut back, the file as it was.
    big = dataclasses.replace(record, request=CreateRequest(env={"BIG": "b" * 8192}), status="ready")
    with pytest.raises(OSError) as raised:
        registry.save(big)
    assert raised.value.errno == errno.ENOSPC
    assert set(records(tiny_disk)) == {record.id}  # no .tmp- left, the records' log not torn
    assert json.loads((tiny_disk / "records" / f"{record.id}.json").read_text())["status"] == "pending"
    # One whose append fits in the log's last page: durable (the file is overwritten in its own blocks, or
    # lags the log until it can be; either way a router starting on the still-full disk reads "ready").
    record.status = "ready"
    registry.save(record)
    assert [r.status for r in Registry(tiny_disk).load()] == ["ready"]
    size = (tiny_disk / "journals" / f"{record.id}.msgpack").stat().st_size
    assert size % 4096, "the journal must end inside a page, so a big append is cut off part-way"
    journal.append(record.id, {"type": "exec", "command": "big", "stdout": "x" * 3 * 4096})
    journal.append(record.id, {"type": "exec", "command": "small"})
    assert (tiny_disk / "journals" / f"{record.id}.msgpack").stat().st_size == size  # cut back, not torn
    assert [e["command"] for e in journal_entries(tiny_disk, record.id) if "command" in e] == ["first"]
    assert [s["command"] for s in journal.record(record.id)["steps"]] == ["first", "big", "small"]

    filler.unlink()
    journal.flush_held()
    assert [e["command"] for e in journal_entries(tiny_disk, record.id) if "command" in e] == ["first", "big", "small"]
    assert [r.status for r in Registry(tiny_disk).load()] == ["ready"]
    assert json.loads((tiny_disk / "records" / f"{record.id}.json").read_text())["status"] == "ready"


def test_disk_fills_while_a_sandbox_starts(small_disk_router: RouterProcess) -> None:
    """The disk fills between a create's answer (``wait: false``) and the end of the start: the record
    that would say ``ready`` cannot be written, so the sandbox is taken down and reported failed with
    the reason — never left running under a record that says ``pending`` (which a restart would start
    a second time). The zygote is held (SIGSTOP) while the disk fills, so the start cannot end first."""
    router, state = small_disk_router, small_disk_router.state_dir
    # Scaled to zero before the disk fills, so only the router writes to the disk while it is full (a
    # running sandbox's layer is on it too); the restart below then re-adopts it asleep.
    steady = create(router, idle_timeout_s=1)
    wait_for(lambda: router.http("GET", f"/v1/sandboxes/{steady}").json()["status"] == "idle", 30,
             what="the steady sandbox scaled to zero")
    reserve = state / "reserve"
    reserve.write_bytes(b"r" * (256 << 10))
    fill(state / "filler")
    reserve.unlink()  # room for the create's record and journal, not much more
    with starts_held(router):
        reply = router.http("POST", "/v1/sandboxes", json_body={"wait": False})
        assert reply.status == 201 and reply.json()["status"] == "pending", reply.body[:300]
        fill(state / "filler-2")
    sandbox_id = reply.json()["id"]
    info = wait_for(lambda: (i := router.http("GET", f"/v1/sandboxes/{sandbox_id}").json())["status"] != "pending"
                    and i, 60, what="the start to end")
    # The `ready` record may still have fit in the records' log (its last page had room) though no file
    # could be written: then it is durable, the sandbox works, and the restart below re-adopts it ready.
    recorded_ready = info["status"] == "ready"
    if recorded_ready:
        assert run(router, sandbox_id, "echo ok").json()["stdout"] == "ok\n"
    else:
        assert info["status"] == "failed", info
        assert "state disk is full" in info["error"] and str(state) in info["error"], info
        # Either the start itself ran out of room (the sandbox's own files are on this disk too) and its
        # record says so, or it started and the record that would say `ready` could not be written: dropped.
        record_file = state / "records" / f"{sandbox_id}.json"
        assert not record_file.exists() or json.loads(record_file.read_text())["status"] == "failed"
        wait_for(lambda: not cgroup_procs(state, sandbox_id) and not (state / "sandboxes" / sandbox_id).exists(),
                 30, what="the unrecorded sandbox taken down")
        exec_reply = run(router, sandbox_id, "true")
        assert exec_reply.status == 409 and "state disk is full" in error_of(exec_reply)["message"], exec_reply.body
        trajectory = router.http("GET", f"/v1/sandboxes/{sandbox_id}/trajectory").json()
        assert "state disk is full" in (trajectory["outcome"] or {}).get("reason", ""), trajectory

    # A router restarted on the full disk comes up: it serves what it has and refuses what needs space
    # (507, or 503 when the space the restart freed by storing the failed start's journal let the
    # create's record in and the start failed after it).
    assert router.stop() == 0
    router.start()
    # The failed start is either gone (no record left: collected as an orphan) or still listed as failed,
    # and never started again.
    live = router.live_ids()
    assert steady in live and live <= {steady, sandbox_id}, live
    if recorded_ready:
        assert router.http("GET", f"/v1/sandboxes/{sandbox_id}").json()["status"] in ("ready", "idle")
    elif sandbox_id in live:
        assert router.http("GET", f"/v1/sandboxes/{sandbox_id}").json()["status"] == "failed"
        assert not cgroup_procs(state, sandbox_id)
    refused = router.http("POST", "/v1/sandboxes", json_body={})
    assert refused.status in (503, 507) and "state disk is full" in error_of(refused)["message"], refused.body[:300]

    (state / "filler").unlink()
    (state / "filler-2").unlink()
    fresh = create(router)
    assert run(router, steady, "echo up").json()["stdout"] == "up\n"
    assert {steady, fresh} <= router.live_ids()
    assert {steady, fresh} <= set(records(state))
