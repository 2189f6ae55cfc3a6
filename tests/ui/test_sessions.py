"""The viewer's session table, step outlines and record cache, as pure logic (no router, no browser)."""

from __future__ import annotations

from pathlib import Path

import pytest

from grove.core.errors import BadRequest
from router.trajectory.journal import Journal
from router.ui import steps
from router.ui.search import Query
from router.ui.sessions import IDLE_S, LIFETIME_S, MAX_SESSIONS, Sessions
from router.ui.trajectories import TrajectoryCache

pytestmark = pytest.mark.fast


class Clock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_session_needs_a_valid_key_and_ends_when_the_key_is_revoked() -> None:
    keys = {"good"}
    table = Sessions(lambda k: k in keys, clock=Clock())
    assert table.open("bad") is None and len(table) == 0
    session = table.open("good")
    assert session is not None and session.id != session.csrf and "good" not in (session.id + session.csrf)
    assert table.get(session.id) is session
    keys.clear()
    assert table.get(session.id) is None and len(table) == 0  # gone for good, even if the key came back
    keys.add("good")
    assert table.get(session.id) is None


def test_sessions_expire_idle_and_in_any_case() -> None:
    clock = Clock()
    table = Sessions(lambda k: True, clock=clock)
    idle, busy = table.open("k"), table.open("k")
    assert idle is not None and busy is not None
    for _ in range(int(LIFETIME_S // (IDLE_S / 2))):
        clock.now += IDLE_S / 2
        if clock.now - busy.created <= LIFETIME_S:
            assert table.get(busy.id) is busy
    assert table.get(idle.id) is None
    clock.now = busy.created + LIFETIME_S + 1
    assert table.get(busy.id) is None
    assert table.get(None) is None and table.get("") is None and table.get("made-up") is None


def test_the_csrf_token_is_the_sessions_own_and_the_table_is_bounded() -> None:
    table = Sessions(lambda k: True, clock=Clock())
    first = table.open("k")
    other = table.open("k")
    assert first is not None and other is not None
    assert first.csrf_ok(first.csrf) and not first.csrf_ok(other.csrf)
    assert not first.csrf_ok(None) and not first.csrf_ok("")
    for _ in range(MAX_SESSIONS):
        table.open("k")
    assert len(table) == MAX_SESSIONS and table.get(first.id) is None  # the oldest made room


def test_outlines_keep_outputs_out_and_clip_long_text() -> None:
    step = {"type": "exec", "command": "x" * 10_000, "stdout": b"\xffhello", "stderr": "", "exit_code": 0,
            "stdout_truncated": True, "stdout_bytes": 9_000_000, "stdout_artifact": "artifacts/sb/out"}
    outline = steps.outline(step, 7)
    assert outline["i"] == 7 and outline["clipped"] and len(outline["command"]) == steps.CLIP_CHARS
    assert "hello" not in str(outline)
    assert outline["stdout"] == {"bytes": 9_000_000, "kept": 6, "truncated": True, "sha256": None, "artifact": True}
    assert steps.output(step, "stdout")["text"] == "\ufffdhello"
    event = steps.outline({"type": "event", "kind": "message", "data": {"content": list(range(500))}}, 0)
    assert event["clipped"] and len(event["data"]["content"]) == steps.CLIP_ITEMS
    assert steps.outline("not a step", 3) == {"i": 3, "type": "unknown", "clipped": False}


@pytest.mark.parametrize(("query", "needle"), [
    (Query(outcome="great"), "outcome must be one of"),
    (Query(date_from="yesterday"), "date_from must be a day"),
    (Query(limit=0), "limit must be between"),
    (Query(after="index/by-id/x"), "cursor"),
])
def test_bad_searches_say_what_is_wrong(query: Query, needle: str) -> None:
    with pytest.raises(BadRequest, match=needle):
        query.check()


def test_a_live_record_is_read_again_exactly_when_its_journal_changed(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    cache = TrajectoryCache()
    journal.start("sb-00000000000000a1", {"id": "sb-00000000000000a1"})
    first = cache.live(journal, "sb-00000000000000a1")
    assert first["steps"] == [] and cache.live(journal, "sb-00000000000000a1") is first  # unchanged: not decoded again
    journal.append("sb-00000000000000a1", {"type": "exec", "command": "ls"})
    second = cache.live(journal, "sb-00000000000000a1")
    assert second is not first and [s["command"] for s in second["steps"]] == ["ls"]
    journal.append("sb-00000000000000a1", {"type": "exec", "command": "pwd"})
    assert [s["command"] for s in cache.live(journal, "sb-00000000000000a1")["steps"]] == ["ls", "pwd"]
