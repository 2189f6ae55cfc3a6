"""Trajectory records made by the router's own recorder and journal, for the artifacts and viewer tests."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from grove.core.errors import GroveError
from grove.core.schema import parse
from router.models import CreateRequest
from router.records.registry import SAFE_ID_RE, SandboxRecord
from router.trajectory.journal import Journal
from router.trajectory.recorder import Recorder, outcome_of

CREATED = 1_795_000_000.0  # 2026-11-18 07:06:40 UTC
PASS = {"result": "pass", "reward": 1.0}


def make_record(
    sandbox_id: str,
    *,
    task_id: str | None = "task-1",
    model: str | None = "model-a",
    harness: str | None = "mini-swe-agent",
    harness_version: str | None = "1.2.3",
    labels: dict[str, str] | None = None,
    created_at: float | str | None = CREATED,
    steps: list[dict[str, Any]] | None = None,
    outcome: dict[str, Any] | None = PASS,
    infra_errors: tuple[str, ...] = (),
) -> dict[str, Any]:
    """A trajectory record as the router makes it: the sandbox's header written by the real recorder from a
    create request, the steps appended through it to a real journal, the outcome set by a ``result`` event (a
    step too, as in every record: ``outcome=None`` posts none), infrastructure faults noted as the router
    notes them, the sandbox ended, and the journal read back.

    A value no router writes (a non-number ``created_at``, an id the journal refuses, an outcome no ``result``
    event can carry) is put into the finished record afterwards, as a record damaged behind grove's back.
    """
    journal_id = sandbox_id if SAFE_ID_RE.fullmatch(sandbox_id) else "sb-damaged"
    created = created_at if isinstance(created_at, float) else CREATED
    given = {"task_id": task_id, "model": model, "harness": harness, "harness_version": harness_version}
    # A create request takes at most 128-256 characters a field: longer ones only a damaged record holds.
    request = parse(CreateRequest, {"image": "python:3.11", "metadata": {
        **{k: v[:128] if isinstance(v, str) else v for k, v in given.items()}, "labels": labels or {}}})
    sandbox = SandboxRecord(id=journal_id, request=request, token="t", created_at=created,
                            image_digest="sha256:" + "ab" * 32)
    with tempfile.TemporaryDirectory(prefix="grove-record-") as state:
        recorder = Recorder(Journal(Path(state)), "local")
        recorder.start(sandbox)
        for step in steps if steps is not None else sample_steps():
            recorder.step(sandbox, step)
        valid = outcome is None or _is_result(outcome)
        if outcome is not None and valid:
            recorder.events(sandbox, [{"kind": "result", "data": outcome}])
        for reason in infra_errors:
            recorder.infra_error(sandbox, reason)
        recorder.ended(journal_id, created + 60, "deleted by request")
        record = recorder.journal.record(journal_id)
    if not valid:
        record["outcome"] = outcome
    if journal_id != sandbox_id:
        record["sandbox"]["id"] = sandbox_id
    record["sandbox"].update((k, v) for k, v in given.items() if record["sandbox"].get(k) != v)
    if not isinstance(created_at, float):
        record["sandbox"]["created_at"] = created_at
        record["sandbox"]["ended_at"] = None
    return record


def _is_result(outcome: dict[str, Any]) -> bool:
    """Whether a ``result`` event can carry ``outcome`` (the router refuses any other)."""
    try:
        outcome_of(outcome)
    except GroveError:
        return False
    return True


def sample_steps() -> list[dict[str, Any]]:
    """A short agent episode: messages, two commands (one failing), a file write, a reward."""
    t = CREATED
    return [
        {"type": "event", "kind": "message", "data": {"role": "system", "content": "You are a coder."}, "t": t},
        {"type": "event", "kind": "message", "data": {"role": "user", "content": "Fix the bug."}, "t": t + 1},
        {"type": "event", "kind": "message", "data": {"role": "assistant", "content": "Let me look."}, "t": t + 2},
        {
            "type": "exec",
            "command": "ls /repo",
            "cwd": "/repo",
            "exit_code": 0,
            "stdout": "main.py\n",
            "stderr": "",
            "timed_out": False,
            "duration_s": 0.01,
            "stdout_sha256": "0" * 64,
            "t": t + 3,
        },
        {
            "type": "exec",
            "command": ["python", "-c", "import sys; sys.exit(3)"],
            "cwd": "/repo",
            "exit_code": 3,
            "stdout": b"\xff partial",
            "stderr": "boom",
            "timed_out": False,
            "duration_s": 0.05,
            "t": t + 4,
        },
        {"type": "file_write", "path": "/repo/main.py", "size": 10, "sha256": "1" * 64, "t": t + 5},
        {
            "type": "event",
            "kind": "tool_call",
            "data": {
                "name": "submit",
                "arguments": {"answer": "done"},
                "output": "submitted",
                "parameters": {"type": "object", "properties": {"answer": {"type": "string"}}},
            },
            "t": t + 6,
        },
        {"type": "event", "kind": "reward", "data": {"reward": 0.5}, "t": t + 7},
    ]
