"""Issue 18, finding 10: odd event data is refused at the door, and what is stored never breaks a reader.

An event nested 900 deep used to be accepted and then make the live and stored trajectory answer 500 for
good; 200,000 deep answered 500 at once; a ``message`` whose data was a list crashed the export of every
trajectory. Now: 422 naming the limit or the rule, and readers (live trajectory, export) that take any
stored shape — a step written before the limits is marked ``bad_step``, the rest of the record is read.
"""

from __future__ import annotations

import io
import json

import msgpack

from artifacts.export import to_chat, write_jsonl
from artifacts.trajectory import MAX_EVENT_DEPTH
from grove.client import Grove
from tests.support.router_fixtures import RouterProcess, error_of


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def _post(router: RouterProcess, sandbox_id: str, body: bytes) -> tuple[int, dict[str, str]]:
    reply = router.http("POST", f"/v1/sandboxes/{sandbox_id}/events", body,
                        headers={"Content-Type": "application/json"})
    return reply.status, error_of(reply) if reply.status >= 400 else {}


def test_deep_or_mistyped_events_are_refused_and_the_record_stays_readable(router: RouterProcess,
                                                                           grove: Grove) -> None:
    sandbox = grove.create(heartbeat=False)
    for depth in (MAX_EVENT_DEPTH + 1, 900, 200_000):
        status, err = _post(router, sandbox.id, f'{{"kind": "note", "data": {_nested(depth)}}}'.encode())
        assert status == 422 and str(MAX_EVENT_DEPTH) in err["message"], (depth, status, err)
    for kind, data, needle in (
        ("message", ["not", "a", "message"], "role"),
        ("message", {"role": "boss", "content": "x"}, "role"),
        ("message", {"role": "user", "content": {"x": 1}}, "content"),
        ("tool_call", {"arguments": {}}, "name"),
        ("tool_result", "text", "tool_call_id"),
    ):
        status, err = _post(router, sandbox.id, json.dumps({"kind": kind, "data": data}).encode())
        assert status == 422 and needle in err["message"], (kind, data, status, err)
    # Within the limits everything is still taken.
    ok = {"events": [{"kind": "note", "data": json.loads(_nested(MAX_EVENT_DEPTH))},
                     {"kind": "message", "data": {"role": "user", "content": "hi"}},
                     {"kind": "reward", "data": {"reward": 1}}]}
    assert router.http("POST", f"/v1/sandboxes/{sandbox.id}/events", json_body=ok).status == 200
    # A step stored before the limits existed (900 deep, written straight into the journal): every reader
    # still answers, the step marked, the others kept.
    head = msgpack.packb({"type": "event", "t": 1.0, "kind": "note", "data": None})
    assert head.endswith(b"\xc0")
    with open(router.state_dir / "journals" / f"{sandbox.id}.msgpack", "ab") as journal:
        journal.write(head[:-1] + b"\x91" * 900 + b"\xc0")
        journal.write(msgpack.packb([1, 2, 3]))  # not even a map
    for path in (f"/v1/sandboxes/{sandbox.id}/trajectory", f"/v1/trajectories/{sandbox.id}"):
        reply = router.http("GET", path)
        assert reply.status == 200, (path, reply.status, reply.body[:300])
        steps = reply.json()["steps"]
        assert [s["type"] for s in steps][:3] == ["event"] * 3 and steps[3]["type"] == steps[4]["type"] == "bad_step"
    record = grove.request("GET", f"/v1/sandboxes/{sandbox.id}/trajectory")
    chat = to_chat(record)
    assert chat["messages"] == [{"role": "user", "content": "hi"}] and chat["metadata"]["reward"] == 1
    assert chat["metadata"]["bad_steps"] == [3, 4]
    sandbox.close()


def test_export_takes_any_stored_shape() -> None:
    good = {"version": 1, "sandbox": {"id": "sb-0000000000000001"}, "outcome": {"result": "pass"},
            "steps": [{"type": "event", "kind": "message", "data": {"role": "user", "content": "hi"}}]}
    odd = {"version": 1, "sandbox": {"id": "sb-0000000000000002"}, "outcome": ["not", "a", "map"],
           "steps": [{"type": "event", "kind": "message", "data": ["a", "list"]},
                     {"type": "event", "kind": "tool_call", "data": {"name": "x", "arguments": {"a": 1}}},
                     {"type": "event", "kind": "tool_result", "data": 5},
                     {"type": "event", "kind": "reward", "data": "lots"},
                     {"type": "exec", "command": {"not": "argv"}, "stdout": 7},
                     "a string step",
                     {"type": "event", "kind": "note", "data": json.loads(_nested(900))}]}
    out = io.StringIO()
    assert write_jsonl([good, odd, "not a record", good], out) == 3  # type: ignore[list-item]
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [line["metadata"]["sandbox_id"] for line in lines] == ["sb-0000000000000001", "sb-0000000000000002",
                                                                  "sb-0000000000000001"]
    assert 5 in lines[1]["metadata"]["bad_steps"] and 6 in lines[1]["metadata"]["bad_steps"]
