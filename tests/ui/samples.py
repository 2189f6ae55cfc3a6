"""Trajectory records for the viewer's tests: an ordinary episode, a hostile one, a huge one."""

from __future__ import annotations

import hashlib
from typing import Any

from tests.support.trajectory_samples import CREATED, make_record, sample_steps

DAY = 86400.0
# Each payload would set window.__pwned and the title if any of it ran.
PAYLOADS = (
    "<script>window.__pwned = 1; document.title = 'pwned'</script>",
    '"><img src=x onerror="window.__pwned = 2; document.title = \'pwned\'">',
    "javascript:window.__pwned = 3; document.title = 'pwned'",
    "'><svg onload=\"window.__pwned = 4\"></svg><a href=\"javascript:window.__pwned=5\">x</a>",
)
HOSTILE = " ".join(PAYLOADS)


def sha(data: bytes) -> str:
    """Hex sha256."""
    return hashlib.sha256(data).hexdigest()


def episode(sid: str, *, task: str = "task-1", model: str = "model-a", harness: str = "mini-swe-agent",
            result: str | None = "pass", run_id: str | None = None, day: int = 0, faults: int = 0) -> dict[str, Any]:
    """An agent episode: messages with a tool call, commands (one in colour, one truncated), files, an outcome."""
    t = CREATED + day * DAY
    full = b"line of output\n" * 20_000
    steps = [*sample_steps(),
             {"type": "event", "kind": "message", "t": t + 8,
              "data": {"role": "assistant", "content": "Running the tests.",
                       "tool_calls": [{"id": "c1", "type": "function",
                                       "function": {"name": "bash", "arguments": '{"command": "pytest -q"}'}}]}},
             {"type": "exec", "command": ["bash", "-c", "pytest -q"], "cwd": "/repo", "user": "agent", "exit_code": 1,
              "stdout": "\x1b[31mFAILED\x1b[0m test_main.py::test_add - \x1b[1massert 3 == 4\x1b[0m\n",
              "stderr": "", "duration_s": 1.25, "timed_out": False, "t": t + 9},
             {"type": "exec", "command": "cat big.log", "cwd": "/repo", "exit_code": 0, "stdout": full[:4096].decode(),
              "stderr": "", "stdout_truncated": True, "stdout_bytes": len(full), "stdout_sha256": sha(full),
              "stdout_artifact": f"artifacts/{sid}/big.log.out", "duration_s": 0.2, "t": t + 10},
             {"type": "archive_write", "path": "/repo/fixtures", "size": 20480, "sha256": "2" * 64, "status": 200,
              "t": t + 11},
             {"type": "file_read", "path": "/repo/result.json", "size": 17, "sha256": "3" * 64, "status": 200,
              "t": t + 12}]
    outcome: dict[str, Any] | None = None
    if result is not None:
        outcome = {"result": result, "reward": 1.0 if result == "pass" else 0.0}
        if result == "infra_error":
            outcome = {"result": result, "reason": "executor lost"}
    faulted = tuple(f"POST /v1/exec: executor lost ({i})" for i in range(faults))
    return make_record(sid, task_id=task, model=model, harness=harness, created_at=t, steps=steps,
                       outcome=outcome, infra_errors=faulted, labels={"run_id": run_id} if run_id else None)


def full_output(record: dict[str, Any]) -> tuple[str, bytes]:
    """The S3 key and body of the episode's truncated output."""
    step = next(s for s in record["steps"] if s.get("stdout_artifact"))
    return str(step["stdout_artifact"]), b"line of output\n" * 20_000


def hostile(sid: str) -> dict[str, Any]:
    """A record whose every free-text field a sandbox or harness controls holds the payloads."""
    t = CREATED
    steps = [
        {"type": "exec", "command": HOSTILE, "cwd": HOSTILE, "user": HOSTILE, "exit_code": 0,
         "stdout": f"\x1b[31m{HOSTILE}\x1b[0m\n{HOSTILE}", "stderr": HOSTILE, "duration_s": 0.1, "t": t},
        {"type": "exec", "command": ["sh", "-c", HOSTILE], "exit_code": 1, "stdout": b"\xff" + HOSTILE.encode(),
         "stderr": "", "t": t + 1},
        {"type": "file_write", "path": f"/tmp/{HOSTILE}", "size": 1, "sha256": HOSTILE, "status": 200, "t": t + 2},
        {"type": "archive_read", "path": HOSTILE, "size": 2, "sha256": "0" * 64, "status": 200, "t": t + 3},
        {"type": "event", "kind": "message", "t": t + 4,
         "data": {"role": HOSTILE, "content": HOSTILE + ("x" * 5000),
                  "tool_calls": [{"id": HOSTILE, "function": {"name": HOSTILE, "arguments": HOSTILE}}]}},
        {"type": "event", "kind": "message", "t": t + 5,
         "data": {"role": "user", "content": [{"type": "text", "text": HOSTILE}, {"type": HOSTILE}]}},
        {"type": "event", "kind": "tool_call", "t": t + 6,
         "data": {"name": HOSTILE, "arguments": {HOSTILE: HOSTILE}, "output": HOSTILE}},
        {"type": "event", "kind": "tool_result", "t": t + 7, "data": {"tool_call_id": HOSTILE, "content": HOSTILE}},
        {"type": "event", "kind": HOSTILE, "t": t + 8, "data": {HOSTILE: [HOSTILE]}},
        {"type": HOSTILE, "t": t + 9, HOSTILE: HOSTILE},
    ]
    record = make_record(sid, task_id="hostile-task", model=HOSTILE, harness=HOSTILE, steps=steps,
                         outcome={"result": "fail", "reward": HOSTILE, "reason": HOSTILE,
                                  "infra_errors": [{"t": t, "reason": HOSTILE}]})
    sandbox = record["sandbox"]
    sandbox["image"] = sandbox["image_digest"] = HOSTILE
    sandbox["end_reason"] = HOSTILE
    sandbox["network"] = {"egress": HOSTILE, "allow": [HOSTILE]}
    sandbox["harness_version"] = HOSTILE
    sandbox["labels"] = {"run_id": HOSTILE, HOSTILE: HOSTILE}
    return record


def huge(sid: str, steps: int = 2000, output_bytes: int = 50_000_000) -> dict[str, Any]:
    """A long episode: ``steps`` commands sharing ``output_bytes`` of output."""
    each = output_bytes // steps
    line = b"0123456789abcdef" * 4 + b"\n"
    body = (line * (each // len(line) + 1))[:each].decode()
    # ``steps`` in all: the commands and the result event that ends every record.
    records = [{"type": "exec", "command": f"step {n}", "cwd": "/repo", "exit_code": 0, "stdout": body,
                "stderr": "", "duration_s": 0.01, "t": CREATED + n} for n in range(steps - 1)]
    return make_record(sid, task_id="huge-task", steps=records)
