"""Export of stored trajectories to chat-messages JSONL for SFT."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from artifacts.archive import TrajectoryArchive
from artifacts.export import BASH_TOOL, to_chat, write_jsonl
from artifacts.store import ObjectStore
from tests.support.trajectory_samples import make_record

pytestmark = pytest.mark.fast  # pure logic: `make test-fast`


def test_messages_tools_and_metadata() -> None:
    chat = to_chat(make_record("sb-x"))
    roles = [m["role"] for m in chat["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant", "tool", "assistant",
                     "tool"]
    first_call = chat["messages"][2]
    assert first_call["content"] == "Let me look."  # the model's text and its call are one turn
    call = first_call["tool_calls"][0]
    assert call["type"] == "function" and call["function"]["name"] == "bash"
    assert json.loads(call["function"]["arguments"]) == {"command": "ls /repo"}
    assert chat["messages"][3] == {"role": "tool", "tool_call_id": call["id"], "name": "bash", "content": "main.py\n"}
    argv_call = chat["messages"][4]["tool_calls"][0]
    assert json.loads(argv_call["function"]["arguments"]) == {"command": "python -c 'import sys; sys.exit(3)'"}
    assert chat["messages"][5]["content"] == "\ufffd partial\nboom\n[exit code 3]"  # undecodable bytes survive
    # A file-API write is a tool call too (its content was not recorded in this sample: the size stands in).
    write = chat["messages"][6]["tool_calls"][0]["function"]
    assert write["name"] == "write_file"
    assert json.loads(write["arguments"]) == {"path": "/repo/main.py", "content": "[10 bytes, not recorded]"}
    submit = chat["messages"][8]["tool_calls"][0]
    assert submit["function"]["name"] == "submit" and json.loads(submit["function"]["arguments"]) == {"answer": "done"}
    assert chat["messages"][9]["content"] == "submitted"
    assert [t["function"]["name"] for t in chat["tools"]] == ["bash", "write_file", "submit"]
    assert chat["tools"][0] == BASH_TOOL
    assert chat["tools"][2]["function"]["parameters"]["properties"] == {"answer": {"type": "string"}}
    assert chat["metadata"] == {
        "sandbox_id": "sb-x",
        "task_id": "task-1",
        "model": "model-a",
        "harness": "mini-swe-agent",
        "harness_version": "1.2.3",
        "image": "python:3.11",
        "image_digest": "sha256:" + "ab" * 32,
        "result": "pass",
        "resolved": True,
        "reward": 1.0,  # the outcome's reward wins over reward events
        "infra_errors": [],
        "labels": {},
    }


def test_timeouts_failures_and_missing_outcome() -> None:
    steps: list[dict[str, Any]] = [
        {"type": "exec", "command": "sleep 99", "stdout": "", "stderr": "", "timed_out": True, "duration_s": 5.0},
        {"type": "exec", "command": "yes", "stdout": "y\n" * 3, "stdout_truncated": True, "exit_code": 0},
        {"type": "event", "kind": "reward", "data": {"reward": 0.25}},
    ]
    record = make_record("sb-t", steps=steps, outcome=None)
    chat = to_chat(record)
    assert [m["role"] for m in chat["messages"]] == ["assistant", "tool", "assistant", "tool"]
    assert chat["messages"][1]["content"] == "[timed out after 5.0s]"
    assert chat["messages"][3]["content"] == "y\ny\ny\n[output truncated]"
    assert (chat["metadata"]["resolved"], chat["metadata"]["reward"]) == (None, 0.25)
    failed = make_record("sb-f", outcome={"result": "fail", "reward": 0.0, "reason": "tests failed"})
    assert to_chat(failed)["metadata"]["resolved"] is False


def test_jsonl_from_the_archive(object_store: ObjectStore, tmp_path: Path) -> None:
    archive = TrajectoryArchive(object_store, tmp_path / "spool")
    for i in range(3):
        archive.store(make_record(f"sb-e{i}", task_id="export" if i < 2 else "other"))
    out = io.StringIO()
    # As `grove trajectories export` does it: the listing, each record, the JSONL writer.
    records = (archive.get(s["sandbox_id"]) for s in archive.list(task_id="export"))
    assert write_jsonl(records, out) == 2
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    for line in lines:
        row = json.loads(line)
        assert set(row) == {"messages", "tools", "metadata"}
        assert row["metadata"]["task_id"] == "export" and row["metadata"]["resolved"] is True
    assert write_jsonl([], out) == 0


def test_setup_and_grading_are_not_the_agents_actions() -> None:
    steps: list[dict[str, Any]] = [
        {"type": "event", "kind": "setup", "data": {"status": "started"}},
        {"type": "file_write", "path": "/w/a.py", "size": 3, "content": "x=1"},
        {"type": "exec", "command": "pip install -e .", "stdout": "ok", "stderr": "", "exit_code": 0},
        {"type": "event", "kind": "setup", "data": {"status": "finished"}},
        {"type": "event", "kind": "message", "data": {"role": "user", "content": "fix it"}},
        {"type": "file_read", "path": "/w/a.py", "size": 3, "content": "x=1"},
        {"type": "file_write", "path": "/w/a.py", "size": 3, "content": "x=2"},
        {"type": "exec", "command": "python3 a.py", "stdout": "", "stderr": "", "exit_code": 0},
        {"type": "event", "kind": "grading", "data": {"status": "started"}},
        {"type": "file_write", "path": "/grader/test_hidden.py", "size": 9, "content": "assert x"},
        {"type": "exec", "command": "python3 /grader/test_hidden.py", "stdout": "", "stderr": "", "exit_code": 1},
        {"type": "event", "kind": "result", "data": {"result": "fail", "reward": 0.0}},
        {"type": "event", "kind": "grading", "data": {"status": "finished", "result": "fail"}},
    ]
    record = make_record("sb-g", steps=steps, outcome=None)
    chat = to_chat(record)
    calls = [(c["function"]["name"], json.loads(c["function"]["arguments"]))
             for m in chat["messages"] for c in m.get("tool_calls") or []]
    assert calls == [("read_file", {"path": "/w/a.py"}), ("write_file", {"path": "/w/a.py", "content": "x=2"}),
                     ("bash", {"command": "python3 a.py"})]
    assert chat["messages"][0] == {"role": "user", "content": "fix it"}
    assert chat["messages"][2]["content"] == "x=1"  # what read_file answered
    assert "grader" not in json.dumps(chat) and "pip install" not in json.dumps(chat["messages"])
    assert chat["metadata"]["result"] == "fail" and chat["metadata"]["resolved"] is False
