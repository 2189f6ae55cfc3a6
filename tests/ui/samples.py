"""Trajectory records for the viewer's tests: an ordinary episode, a rollout's attempt and its grader, a hostile
one, a huge one."""

from __future__ import annotations

import hashlib
from typing import Any

from grove.rollouts.changes import FileChange, diff
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


BEFORE = "".join(f"{PAYLOADS[n % len(PAYLOADS)]} {n}\n" for n in range(80))
AFTER = BEFORE.replace(" 3\n", " 3 " + HOSTILE + "\n").replace(" 70\n", " seventy\n")


def hostile_changes() -> dict[str, Any]:
    """A final diff whose every field a sandbox could shape holds the payloads."""
    text = FileChange(HOSTILE, HOSTILE, HOSTILE, mode_before=0o100644, mode_after=0o100755, size=len(AFTER),
                      sha256=HOSTILE, diff=diff(HOSTILE, BEFORE.encode(), AFTER.encode())[0] + HOSTILE + "\n",
                      diff_truncated=True, dropped=HOSTILE)
    binary = FileChange(f"{HOSTILE}.bin", "added", "file", size=3, sha256=HOSTILE, binary=True, applied=True)
    link = FileChange(f"{HOSTILE}.lnk", "added", "symlink", target=HOSTILE, applied=True)
    return {"grading": HOSTILE, "base": HOSTILE, "grader": HOSTILE,
            "files": [text.record(), binary.record(), link.record(), HOSTILE, {"path": [HOSTILE], "diff": 7}]}


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
        # A file read, then written: numbered text, then a diff, both of payloads (long enough to be cut).
        {"type": "file_read", "path": HOSTILE, "size": len(BEFORE), "sha256": sha(BEFORE.encode()),
         "content": BEFORE, "status": 200, "t": t + 10},
        {"type": "file_write", "path": HOSTILE, "size": len(AFTER), "sha256": sha(AFTER.encode()),
         "content": AFTER, "status": 200, "t": t + 11},
        {"type": "event", "kind": "grading", "data": {"status": "started", "mode": HOSTILE}, "t": t + 12},
        {"type": "event", "kind": "changes", "data": hostile_changes(), "t": t + 13},
        {"type": "event", "kind": "grading", "t": t + 14,
         "data": {"status": "finished", "mode": HOSTILE, "result": HOSTILE, "reward": HOSTILE, "grader": HOSTILE}},
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


# An attempt as `grove rollouts` records it: the task's files written in setup, the agent reading and fixing
# one, grading (in place, or isolated in a grader sandbox of its own) with the attempt's final diff in it.
CALC = "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n"
FIXED = CALC.replace("a - b", "a + b")
TEST = "from calc import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n"
NOTES = "".join(f"note {n}\n" for n in range(1, 101))
"""A new file of 100 lines: its outline shows the first ones, the rest on request."""
LOGO = bytes(range(256)) * 8
"""A binary file: the recorder keeps no content of it, only its size and hash."""
BIG = 100_000
"""Bytes of a text file too large for the recorder to keep."""


def final_changes(grading: str, grader: str | None) -> dict[str, Any]:
    """The ``changes`` event's data, its files made by grove's own :class:`FileChange` and :func:`diff`."""
    isolated = grading == "isolated"
    files = [
        FileChange("NOTES.md", "added", "file", mode_after=0o100644, size=len(NOTES), sha256=sha(NOTES.encode()),
                   diff=diff("NOTES.md", b"", NOTES.encode())[0]),
        FileChange("assets/logo.png", "modified", "file", kind_before="file", mode_before=0o100644,
                   mode_after=0o100644, size=len(LOGO), sha256=sha(LOGO), binary=True),
        FileChange("calc.py", "modified", "file", kind_before="file", mode_before=0o100644, mode_after=0o100644,
                   size=len(FIXED), sha256=sha(FIXED.encode()), diff=diff("calc.py", CALC.encode(), FIXED.encode())[0]),
        FileChange("old.txt", "deleted", "file", kind_before="file", mode_before=0o100644),
        FileChange("run.sh", "mode", "file", kind_before="file", mode_before=0o100644, mode_after=0o100755, size=9,
                   sha256=sha(b"pytest -q")),
        FileChange("tests/test_calc.py", "modified", "file", kind_before="file", mode_before=0o100644,
                   mode_after=0o100644, size=len(TEST) + 12, sha256=sha(TEST.encode() + b"    pass\n"),
                   diff=diff("tests/test_calc.py", TEST.encode(), TEST.encode() + b"    pass\n")[0]),
    ]
    for change in files:
        change.applied = True
    if isolated:  # what isolated grading leaves out, and why
        files[-1].applied, files[-1].dropped = False, "reset by the test patch"
    return {"grading": grading, "base": "after setup", "grader": grader, "files": [c.record() for c in files]}


def rollout(sid: str, *, model: str = "model-a", result: str = "pass", grading: str = "in-place",
            grader: str | None = None, long_setup: bool = False, run_id: str | None = None) -> dict[str, Any]:
    """A rollout's attempt: setup (two more commands with ``long_setup``), the agent's turn, grading."""
    t = CREATED

    def write(path: str, data: bytes, at: float, *, kept: bool = True) -> dict[str, Any]:
        step = {"type": "file_write", "path": path, "size": len(data), "sha256": sha(data), "status": 200, "t": at}
        return {**step, "content": data.decode()} if kept else step

    setup = [{"type": "event", "kind": "setup", "data": {"status": "started"}, "t": t},
             write("/repo/calc.py", CALC.encode(), t + 1),
             write("/repo/tests/test_calc.py", TEST.encode(), t + 1),
             write("/repo/assets/logo.png", LOGO, t + 1, kept=False)]
    if long_setup:
        setup += [{"type": "exec", "command": "pip install -e .", "cwd": "/repo", "exit_code": 0, "stdout": "ok\n",
                   "stderr": "", "duration_s": 2.0, "t": t + 2},
                  {"type": "exec", "command": "git init -q", "cwd": "/repo", "exit_code": 0, "stdout": "",
                   "stderr": "", "duration_s": 0.1, "t": t + 3}]
    setup.append({"type": "event", "kind": "setup", "data": {"status": "finished"}, "t": t + 4})
    prompt = {"role": "user", "content": "Fix add in calc.py."}
    agent = [{"type": "event", "kind": "message", "data": prompt, "t": t + 5},
             {"type": "file_read", "path": "/repo/calc.py", "size": len(CALC), "sha256": sha(CALC.encode()),
              "content": CALC, "status": 200, "t": t + 6},
             write("/repo/calc.py", FIXED.encode(), t + 7),
             write("/repo/NOTES.md", NOTES.encode(), t + 8),
             write("/repo/data.bin", b"x" * BIG, t + 9, kept=False),
             {"type": "exec", "command": "pytest -q", "cwd": "/repo", "exit_code": 0, "stdout": "1 passed\n",
              "stderr": "", "duration_s": 0.4, "t": t + 10}]
    mode = {"status": "started", "mode": grading, "task_id": "calc"}
    grade = [{"type": "event", "kind": "grading", "data": mode, "t": t + 11}]
    if grading == "in-place":  # the check runs in the agent's own sandbox: its steps are in this record
        grade += [write("/tmp/.grove-test.patch", b"--- a/tests/test_calc.py\n", t + 12),
                  {"type": "exec", "command": ["git", "apply", "-v", "/tmp/.grove-test.patch"], "cwd": "/repo",
                   "exit_code": 0, "stdout": "", "stderr": "Applied patch\n", "duration_s": 0.1, "t": t + 13},
                  {"type": "exec", "command": "pytest -q tests", "cwd": "/repo",
                   "exit_code": 0 if result == "pass" else 1, "stdout": "1 passed\n", "stderr": "",
                   "duration_s": 0.5, "t": t + 14}]
    reward = 1.0 if result == "pass" else 0.0
    grade += [{"type": "event", "kind": "changes", "data": final_changes(grading, grader), "t": t + 15},
              {"type": "event", "kind": "grading", "t": t + 16, "data": {
                  "status": "finished", "mode": grading, "result": result, "reward": reward, "grader": grader}}]
    return make_record(sid, task_id="calc", model=model, created_at=t, steps=[*setup, *agent, *grade],
                       outcome={"result": result, "reward": reward}, labels={"run_id": run_id} if run_id else None)


def grader_record(sid: str, graded: str) -> dict[str, Any]:
    """The trajectory of the sandbox that graded an attempt in isolation: the task's setup inside its grading."""
    t = CREATED + 20
    steps = [{"type": "event", "kind": "grading", "data": {"status": "started", "mode": "isolated"}, "t": t},
             {"type": "event", "kind": "setup", "data": {"status": "started"}, "t": t},
             {"type": "file_write", "path": "/repo/calc.py", "size": len(CALC), "sha256": sha(CALC.encode()),
              "content": CALC, "status": 200, "t": t + 1},
             {"type": "event", "kind": "setup", "data": {"status": "finished"}, "t": t + 2},
             {"type": "archive_write", "path": "/repo", "size": 10240, "sha256": "4" * 64, "status": 200, "t": t + 3},
             {"type": "exec", "command": "pytest -q tests", "cwd": "/repo", "exit_code": 0, "stdout": "1 passed\n",
              "stderr": "", "duration_s": 0.5, "t": t + 4},
             {"type": "event", "kind": "grading", "t": t + 5,
              "data": {"status": "finished", "mode": "isolated", "result": "pass", "reward": 1.0}}]
    return make_record(sid, task_id="calc", created_at=t, steps=steps, outcome=None,
                       labels={"graded": graded})
