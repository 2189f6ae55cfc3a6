"""The trajectory record format and key layout (no server needed)."""

from __future__ import annotations

import json
import urllib.parse

import msgpack
import pytest

from artifacts import trajectory as tj
from grove.core.errors import Invalid
from tests.support.trajectory_samples import make_record

pytestmark = pytest.mark.fast  # pure logic: `make test-fast`


def test_key_layout_and_index_entries() -> None:
    record = make_record("sb-1")
    assert tj.trajectory_key(record) == "trajectories/2026-11-18/task-1/sb-1.msgpack"
    entries = tj.index_entries(record)
    assert list(entries) == [
        "index/by-task/task-1/sb-1",
        "index/by-model/model-a/sb-1",
        "index/by-harness/mini-swe-agent/sb-1",
        "index/by-id/sb-1",  # last: written once everything it points at exists
    ]
    body = json.loads(entries["index/by-id/sb-1"])
    assert body["key"] == tj.trajectory_key(record)
    assert (body["sandbox_id"], body["task_id"], body["model"], body["harness"]) == (
        "sb-1",
        "task-1",
        "model-a",
        "mini-swe-agent",
    )
    # The 8 sample steps and the result event that set the outcome.
    assert (body["result"], body["reward"], body["steps"], body["harness_version"]) == ("pass", 1.0, 9, "1.2.3")
    assert len(set(entries.values())) == 1


def test_missing_fields_use_reserved_markers_and_skip_indexes() -> None:
    record = make_record("sb-2", task_id=None, model=None, harness=None, created_at=None)
    assert tj.trajectory_key(record) == "trajectories/_undated/_none/sb-2.msgpack"
    assert list(tj.index_entries(record)) == ["index/by-id/sb-2"]


def test_odd_names_are_escaped_into_single_segments() -> None:
    record = make_record("sb/../x", task_id="org/repo#12 ü", model="..", harness="_none")
    key = tj.trajectory_key(record)
    assert key == "trajectories/2026-11-18/org%2Frepo%2312%20%C3%BC/sb%2F..%2Fx.msgpack"
    entries = tj.index_entries(record)
    assert "index/by-model/%2E./sb%2F..%2Fx" in entries  # never a bare '..' segment
    assert "index/by-harness/%5Fnone/sb%2F..%2Fx" in entries  # never the reserved '_none'
    for k in [key, *entries]:
        assert all(seg not in ("", ".", "..") for seg in k.split("/"))
    assert urllib.parse.unquote(tj.segment("org/repo#12 ü")) == "org/repo#12 ü"  # a segment is quoted, no more


def test_very_long_names_are_shortened_but_distinct() -> None:
    a, b = "t" * 2000 + "a", "t" * 2000 + "b"
    assert tj.segment(a) != tj.segment(b)
    assert len(tj.trajectory_key(make_record("sb", task_id=a))) < 400


def test_encode_decode_round_trip_keeps_bytes() -> None:
    record = make_record("sb-3")
    again = tj.decode(tj.encode(record))
    assert again == record
    assert again["steps"][4]["stdout"] == b"\xff partial"


def test_bad_records_are_invalid() -> None:
    with pytest.raises(Invalid):
        tj.encode({"version": 2, "sandbox": {"id": "x"}})
    with pytest.raises(Invalid):
        tj.encode({"version": 1, "sandbox": {}})
    with pytest.raises(Invalid):
        tj.encode({"version": 1, "sandbox": {"id": "x"}, "steps": [object()]})
    with pytest.raises(Invalid):
        tj.decode(b"\xc1 not msgpack")
    with pytest.raises(Invalid):
        tj.decode(msgpack.packb([1, 2]))
    with pytest.raises(Invalid):
        tj.trajectory_key(make_record("x", created_at="yesterday"))
