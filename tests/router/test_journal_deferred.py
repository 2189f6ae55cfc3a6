"""Journals whose header is written behind the answer (a batch of claims, ``Journal.defer_start``): the
header still comes first in the file whoever writes first (the worker thread, an append, a read), an
unclaimed journal is told from a begun one, and a removed one writes nothing."""

from __future__ import annotations

import threading
from pathlib import Path

import msgpack
import pytest

from router.trajectory.journal import Journal

pytestmark = pytest.mark.fast  # real files in a temp dir, no router: `make test-fast`
IDS = [f"sb-{i:016x}" for i in range(200)]


def _entries(journal: Journal, sandbox_id: str) -> list[dict[str, object]]:
    raw = (journal.dir / f"{sandbox_id}.msgpack").read_bytes()
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
    unpacker.feed(raw)
    return list(unpacker)


def _prepared(tmp_path: Path) -> Journal:
    journal = Journal(tmp_path)
    for sandbox_id in IDS:
        journal.prepare(sandbox_id)  # made ahead, empty, as a pool member's is
    return journal


def test_a_deferred_header_is_written_by_whoever_comes_first(tmp_path: Path) -> None:
    journal = _prepared(tmp_path)
    made: list[str] = []

    def header(sandbox_id: str) -> dict[str, object]:
        made.append(sandbox_id)
        return {"id": sandbox_id, "labels": {"k": "v"}}

    journal.defer_start((sid, lambda sid=sid: header(sid)) for sid in IDS[:3])
    assert not any(journal.unused(sid) for sid in IDS[:3]), "a begun journal is not an unclaimed member's"
    assert journal.unused(IDS[3])
    journal.append(IDS[0], {"type": "exec", "command": "first"})  # an append writes the header first
    assert [list(e) for e in _entries(journal, IDS[0])] == [["sandbox"], ["type", "command"]]
    assert journal.record(IDS[1])["sandbox"] == {"id": IDS[1], "labels": {"k": "v"}}  # so does a read
    journal.write_deferred(IDS[:3])  # the worker thread's pass: only the one left
    assert made == IDS[:3], "each header is made exactly once"
    assert _entries(journal, IDS[2]) == [{"sandbox": {"id": IDS[2], "labels": {"k": "v"}}}]
    journal.append(IDS[0], {"type": "exec", "command": "second"})
    assert [s["command"] for s in journal.record(IDS[0])["steps"]] == ["first", "second"]


def test_an_append_waits_while_the_worker_thread_writes_the_header(tmp_path: Path) -> None:
    # The worker thread is in the middle of a header (its metadata being made) when the event loop appends a
    # step: the step must wait for the header and land after it, never before.
    journal = _prepared(tmp_path)
    making, release = threading.Event(), threading.Event()

    def header() -> dict[str, object]:
        making.set()
        assert release.wait(10)
        return {"id": IDS[0]}

    journal.defer_start([(IDS[0], header)])
    writer = threading.Thread(target=journal.write_deferred, args=([IDS[0]],))
    writer.start()
    appender = threading.Thread(target=journal.append, args=(IDS[0], {"type": "exec", "command": "step"}))
    try:
        assert making.wait(10)
        appender.start()
        appender.join(0.3)
        assert appender.is_alive(), "the append did not wait for the header being written"
        assert (journal.dir / f"{IDS[0]}.msgpack").stat().st_size == 0
    finally:
        release.set()  # a failure here must not leave the writer waiting
        writer.join(10)
        if appender.ident is not None:  # started
            appender.join(10)
    assert _entries(journal, IDS[0]) == [{"sandbox": {"id": IDS[0]}}, {"type": "exec", "command": "step"}]


def test_a_journal_removed_before_its_header_writes_nothing(tmp_path: Path) -> None:
    journal = _prepared(tmp_path)
    journal.defer_start([(IDS[0], lambda: {"id": IDS[0]})])
    journal.remove(IDS[0])
    journal.write_deferred([IDS[0]])
    assert not (journal.dir / f"{IDS[0]}.msgpack").exists()
    journal.append(IDS[1], {"type": "exec"})  # nothing deferred is left: appends take no lock
    assert not journal._deferred
