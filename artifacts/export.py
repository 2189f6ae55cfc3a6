"""Trajectory records as chat-messages JSONL for SFT: one line per trajectory, ``messages``/``tools``/``metadata``.

Step shapes expected in ``record["steps"]`` (other keys are ignored, unknown types skipped)::

    {"type": "exec", "command": str | [argv], "cwd": str | None, "exit_code": int | None,
     "stdout": str, "stderr": str, "stdout_truncated": bool, "stderr_truncated": bool,
     "timed_out": bool, "duration_s": float, "stdout_sha256": str, "t": epoch s}
    {"type": "file_write" | "file_read", "path": str, "size": int, "sha256": str, "t": epoch s}
    {"type": "event", "kind": "message" | "tool_call" | "tool_result" | "reward" | "result" | …,
     "data": {…}, "t": epoch s}

and ``record["outcome"]``: ``{"result": "pass" | "fail" | "infra_error", "reward": float | None,
"reason": str | None, "infra_errors"?: [{"t", "reason"}]}`` or None.

How steps become messages, in order:

- event ``message`` with ``data = {"role", "content"}`` (plus ``tool_calls``, ``tool_call_id``,
  ``name`` if given): that message, as is. Roles: system, user, assistant, tool.
- ``exec``: an assistant tool call ``{"type": "function", "function": {"name": "bash", "arguments":
  "{\\"command\\": …}"}}`` — added to the preceding assistant message when that is the last message
  (the model's text and its call are one turn), else to a new assistant message with empty content —
  followed by a ``tool`` message: stdout, then stderr, then ``[output truncated]``, ``[timed out after
  Ns]`` or ``[exit code N]`` when they apply.
- event ``tool_call`` with ``data = {"name", "arguments" (dict or JSON string), "id"?, "output"?,
  "description"?, "parameters"?}``: a call of that tool the same way (a ``tool`` message if ``output``).
- event ``tool_result`` with ``data = {"tool_call_id", "content"}``: a ``tool`` message.
- ``computer`` (``POST /v1/sandboxes/{id}/computer``): a ``computer`` tool call with the action in the vocabulary
  it was given, a ``tool`` message answering it, and a ``user`` message with the screen after it as an image
  content part (only the last few stay images: :mod:`artifacts.export_screens` says how and why).
- ``file_write`` (the file API's PUT): a ``write_file`` tool call ``{"path", "content"}`` (content as
  the router recorded it: whole files up to 64 KiB of UTF-8; else ``"[N bytes]"``), with a short
  ``tool`` answer; ``file_read``: a ``read_file`` tool call ``{"path"}`` answered with the content.
  So an agent's edits through the file API show up just as its shell commands do.
- steps inside a ``setup`` or ``grading`` bracket (events ``{"kind": "setup"|"grading", "data":
  {"status": "started"}}`` … ``{"status": "finished"}``, as grove's rollout runner posts them): no
  message at all. The task's setup and its grader are not the agent's actions; a model trained on them
  would learn to run graders it will never have.
- ``display`` steps (the screen and its browser started: the environment's setup), other file steps, ``reward``
  and ``result`` events: no message (rewards and the result go to metadata).

``tools`` lists the JSON schema of every tool called (bash's is :data:`BASH_TOOL`). ``metadata``:
sandbox_id, task_id, model, harness, harness_version, image, image_digest, result, ``resolved``
(result == "pass"; None without an outcome or for ``infra_error``), reward (the outcome's, else the last
reward event's; none for ``infra_error``) and ``infra_errors`` (the reasons of environment faults the
router noted: a ``fail`` beside them may be the environment's doing, not the policy's), ``bad_steps``
when a stored step had a shape no writer makes (skipped; the rest of the record is exported), and ``screenshots``
when there were computer steps (how many screens, shown as images, omitted for the window, missing). With
``image_format="trl"`` a line also has ``images``: the images' data URLs in the order of their placeholders.
"""

from __future__ import annotations

import json
import logging
import shlex
from collections.abc import Iterable
from typing import IO, Any

from artifacts import trajectory as tj
from artifacts.export_screens import ScreenOptions, Screenshots, as_parts, computer_call, computer_tool

log = logging.getLogger("grove.export")

BASH_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command in the sandbox; returns its stdout and stderr.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "The command, run by /bin/sh -c."}},
            "required": ["command"],
        },
    },
}
_ROLES = ("system", "user", "assistant", "tool")


class _Conversation:
    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.tools: dict[str, dict[str, Any]] = {}
        self._calls = 0

    def call(self, name: str, arguments: Any, call_id: str | None, output: str | None) -> None:
        self._calls += 1
        call_id = call_id or f"call_{self._calls}"
        args = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
        call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
        last = self.messages[-1] if self.messages else None
        if last is not None and last["role"] == "assistant":
            last.setdefault("tool_calls", []).append(call)
        else:
            self.messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        if output is not None:
            self.messages.append({"role": "tool", "tool_call_id": call_id, "name": name, "content": output})

    def message(self, data: dict[str, Any]) -> None:
        role = data.get("role")
        if role not in _ROLES:
            return
        msg: dict[str, Any] = {"role": role, "content": _content(data.get("content"))}
        for extra in ("tool_calls", "tool_call_id", "name"):
            if data.get(extra) is not None:
                msg[extra] = data[extra]
        for call in msg.get("tool_calls") or []:
            name = (call.get("function") or {}).get("name") if isinstance(call, dict) else None
            if isinstance(name, str):
                self.tools.setdefault(name, _tool_schema(name, {}))
        self.messages.append(msg)


def to_chat(record: dict[str, Any], screens: ScreenOptions | None = None) -> dict[str, Any]:
    """One record as ``{"messages", "tools", "metadata"}`` (and ``images`` for ``trl``); ``screens``: how computer
    steps' screenshots are read and shown (default: none read, each a text part saying so)."""
    conv = _Conversation()
    shots = Screenshots(screens or ScreenOptions())
    rewards: list[Any] = []
    result_event: dict[str, Any] | None = None
    bracket: str | None = None  # inside a setup or grading bracket: not the agent's doing
    bad_steps: list[int] = []
    for index, step in enumerate(tj.readable_steps(record.get("steps") or [])):
        kind = step.get("type")
        if kind == "bad_step":
            bad_steps.append(index)
            continue
        raw = step.get("data")
        data: dict[str, Any] = raw if isinstance(raw, dict) else {}
        event = step.get("kind")
        if kind == "event" and event in _BRACKETS:
            bracket = event if data.get("status") == "started" else None
            continue
        if kind == "event" and event == "result":
            result_event = data
        if bracket is not None:
            continue
        try:
            _add_step(conv, step, kind, event, data, rewards, shots)
        except (TypeError, ValueError, AttributeError, RecursionError):
            bad_steps.append(index)  # a shape no writer makes: skipped and named, the rest still exported
    outcome = record.get("outcome") if isinstance(record.get("outcome"), dict) else None
    outcome = outcome or result_event or {}
    reward = outcome.get("reward")
    result = outcome.get("result")
    if reward is None and rewards and result != "infra_error":
        reward = rewards[-1]
    metadata = {
        "sandbox_id": tj.sandbox_id(record),
        **{name: tj.meta(record, name) for name in ("task_id", "model", "harness", "harness_version")},
        "image": (record.get("sandbox") or {}).get("image"),
        "image_digest": (record.get("sandbox") or {}).get("image_digest"),
        "result": result,
        # An environment fault is no verdict on the policy: neither resolved nor unresolved.
        "resolved": None if result in (None, "infra_error") else result == "pass",
        "reward": reward,
        "infra_errors": [str(e.get("reason")) for e in outcome.get("infra_errors") or [] if isinstance(e, dict)],
        "labels": tj.meta(record, "labels") or {},
    }
    if bad_steps:
        metadata["bad_steps"] = bad_steps  # indexes of steps no reader could take (skipped, not guessed at)
    images, counts = shots.fill()
    if counts["steps"]:
        metadata["screenshots"] = counts
    row = {"messages": conv.messages, "tools": list(conv.tools.values()), "metadata": metadata}
    if shots.options.image_format == "trl":
        as_parts(conv.messages)
        row["images"] = images
    return row


def _add_step(conv: _Conversation, step: dict[str, Any], kind: Any, event: Any, data: dict[str, Any],
              rewards: list[Any], shots: Screenshots) -> None:
    """One step of the agent's own into the conversation (and a reward event into ``rewards``)."""
    if kind == "exec":
        conv.tools["bash"] = BASH_TOOL
        conv.call("bash", {"command": _command_text(step.get("command"))}, None, _observation(step))
    elif kind == "computer":
        arguments, answer = computer_call(step)
        conv.tools.setdefault("computer", computer_tool(step))
        conv.call("computer", arguments, None, answer)
        if step.get("error") is None:
            conv.messages.append(shots.slot(step))
    elif kind in _FILE_TOOLS:
        _file_call(conv, step)
    elif kind != "event":
        return
    elif event == "message":
        conv.message(data)
    elif event == "tool_call" and isinstance(data.get("name"), str):
        conv.tools.setdefault(data["name"], _tool_schema(data["name"], data))
        output = None if data.get("output") is None else _text(data["output"])
        conv.call(data["name"], data.get("arguments") or {}, data.get("id"), output)
    elif event == "tool_result":
        call_id = data.get("tool_call_id") or data.get("id")
        conv.messages.append({"role": "tool", "tool_call_id": call_id, "content": _content(data.get("content"))})
    elif event == "reward":
        rewards.append(data.get("reward", data.get("value")))


def write_jsonl(records: Iterable[dict[str, Any]], out: IO[str], screens: ScreenOptions | None = None) -> int:
    """Write one JSON line per record to ``out``; return how many. A record that cannot be exported at all
    (not a map, or not encodable) is left out with a warning, never the end of the export."""
    count = 0
    for record in records:
        try:
            line = json.dumps(to_chat(record, screens), ensure_ascii=False, default=str)
        except (TypeError, ValueError, AttributeError, RecursionError) as exc:
            sid = record.get("sandbox", {}).get("id") if isinstance(record, dict) else None
            log.warning("trajectory %s left out of the export: %s: %s", sid, type(exc).__name__, exc)
            continue
        out.write(line + "\n")
        count += 1
    return count


_BRACKETS = ("setup", "grading")
WRITE_FILE_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "write_file",
        "description": "Write a whole file in the sandbox (parents created).",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["path", "content"],
        },
    },
}
READ_FILE_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "Read a whole file of the sandbox.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    },
}
_FILE_TOOLS = {"file_write": WRITE_FILE_TOOL, "file_read": READ_FILE_TOOL}


def _file_call(conv: _Conversation, step: dict[str, Any]) -> None:
    """A file API transfer as the tool call it was."""
    tool = _FILE_TOOLS[str(step["type"])]
    name = tool["function"]["name"]
    conv.tools[name] = tool
    path = _text(step.get("path"))
    content = step.get("content")
    shown = _text(content) if content is not None else f"[{int(step.get('size') or 0)} bytes, not recorded]"
    status = step.get("status")
    failed = isinstance(status, int) and status >= 400
    if name == "write_file":
        answer = f"[error {status}]" if failed else f"wrote {int(step.get('size') or 0)} bytes to {path}"
        conv.call(name, {"path": path, "content": shown}, None, answer)
    else:
        conv.call(name, {"path": path}, None, f"[error {status}]" if failed else shown)


def _observation(step: dict[str, Any]) -> str:
    text = _text(step.get("stdout"))
    stderr = _text(step.get("stderr"))
    if stderr:
        text += ("\n" if text and not text.endswith("\n") else "") + stderr
    notes = []
    if step.get("stdout_truncated") or step.get("stderr_truncated"):
        notes.append("[output truncated]")
    if step.get("timed_out"):
        notes.append(f"[timed out after {float(step.get('duration_s') or 0):.1f}s]")
    elif step.get("exit_code") not in (0, None):
        notes.append(f"[exit code {step['exit_code']}]")
    if notes:
        text += ("\n" if text and not text.endswith("\n") else "") + " ".join(notes)
    return text


_SHELLS = ("sh", "bash", "/bin/sh", "/bin/bash", "/usr/bin/bash")


def _command_text(command: Any) -> str:
    if isinstance(command, list | tuple):
        # A harness that runs `bash -c CMD` (mini-swe-agent does) meant CMD: that is the tool call.
        if len(command) == 3 and command[0] in _SHELLS and command[1] in ("-c", "-lc"):
            return _text(command[2])
        return shlex.join(str(part) for part in command)
    return _text(command)


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")  # msgpack keeps undecodable output as bytes
    return value if isinstance(value, str) else str(value)


def _content(value: Any) -> Any:
    # Lists are multimodal content parts and stay lists; anything else becomes text.
    return value if isinstance(value, list) else _text(value)


def _tool_schema(name: str, data: dict[str, Any]) -> dict[str, Any]:
    if name == "bash" and not data.get("parameters"):
        return BASH_TOOL
    parameters = data.get("parameters") if isinstance(data.get("parameters"), dict) else {"type": "object"}
    return {
        "type": "function",
        "function": {"name": name, "description": _text(data.get("description")), "parameters": parameters},
    }
