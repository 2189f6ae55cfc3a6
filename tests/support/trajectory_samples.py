"""Trajectory records shaped like the router's, for the artifacts tests."""

from __future__ import annotations

from typing import Any

CREATED = 1_795_000_000.0  # 2026-11-18 07:06:40 UTC


def make_record(
    sandbox_id: str,
    *,
    task_id: str | None = "task-1",
    model: str | None = "model-a",
    harness: str | None = "mini-swe-agent",
    created_at: float | str | None = CREATED,
    steps: list[dict[str, Any]] | None = None,
    outcome: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A version-1 record with the router's public sandbox view and a few steps."""
    sandbox: dict[str, Any] = {
        "id": sandbox_id,
        "status": "deleted",
        "image": "python:3.11",
        "image_digest": "sha256:" + "ab" * 32,
        "resources": {"cpu": 1.0, "memory_mb": 1024, "pids_max": 512, "disk_mb": 10240},
        "network": {"egress": "deny", "allow": []},
        "metadata": {
            "task_id": task_id,
            "model": model,
            "harness": harness,
            "harness_version": "1.2.3",
            "labels": {},
        },
    }
    if created_at is not None:
        sandbox["created_at"] = created_at
        sandbox["ended_at"] = created_at + 60 if isinstance(created_at, float) else None
    return {
        "version": 1,
        "sandbox": sandbox,
        "steps": steps if steps is not None else sample_steps(),
        "outcome": outcome if outcome is not None else {"result": "pass", "reward": 1.0, "reason": None},
    }


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
