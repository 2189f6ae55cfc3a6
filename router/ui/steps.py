"""What the viewer sends of a trajectory: small step outlines first, each output only when it is opened.

A record may hold thousands of steps and tens of megabytes of output. The page gets the metadata and
pages of *outlines*: every field a timeline row shows, with outputs replaced by their sizes, long
strings clipped (``clipped: true`` says the step has more), a file's content replaced by its view (the
first lines of its text or diff), and each step's phase. :func:`output` serves one stream of one step
when the reader expands it. Everything stays data: the browser renders it as text.
"""

from __future__ import annotations

from typing import Any

from router.ui.files import is_file_step, views
from router.ui.phases import phase_of_each, summary

CLIP_CHARS = 4000
"""Strings longer than this are cut in an outline."""
CLIP_ITEMS = 200
"""Lists and dicts longer than this are cut in an outline."""
OUTPUT_CHARS = 2_000_000
"""At most this much of one output is shown in the page (the full text has its own link)."""
STREAMS = ("stdout", "stderr")
_EXEC_FIELDS = ("cwd", "user", "exit_code", "duration_s", "latency_s", "timed_out", "timeout_s", "env_keys",
                "stdin_bytes", "request_id", "error")


def text(value: Any) -> str:
    """Output as text: bytes (msgpack keeps undecodable output as bytes) decoded with replacement."""
    if value is None:
        return ""
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    return value if isinstance(value, str) else str(value)


def clip(value: Any, state: list[bool], depth: int = 0) -> Any:
    """A JSON-safe copy of ``value`` with long strings and collections cut; sets ``state[0]`` if anything was."""
    if isinstance(value, bytes | bytearray):
        value = text(value)
    if isinstance(value, str):
        if len(value) > CLIP_CHARS:
            state[0] = True
            return value[:CLIP_CHARS]
        return value
    if depth > 8:
        state[0] = True
        return "…"
    if isinstance(value, dict):
        if len(value) > CLIP_ITEMS:
            state[0] = True
        return {str(k): clip(v, state, depth + 1) for k, v in list(value.items())[:CLIP_ITEMS]}
    if isinstance(value, list | tuple):
        if len(value) > CLIP_ITEMS:
            state[0] = True
        return [clip(v, state, depth + 1) for v in list(value)[:CLIP_ITEMS]]
    if value is None or isinstance(value, bool | int | float):
        return value
    return str(value)


def plain(value: Any) -> Any:
    """A JSON-safe copy of ``value``, whole (bytes as text, other odd values as their string)."""
    if isinstance(value, bytes | bytearray | str):
        return text(value)
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if value is None or isinstance(value, bool | int | float):
        return value
    return str(value)


def outline(step: Any, index: int) -> dict[str, Any]:
    """One step as a timeline row: outputs as sizes, strings clipped."""
    if not isinstance(step, dict):
        return {"i": index, "type": "unknown", "clipped": False}
    state = [False]
    kind = step.get("type")
    out: dict[str, Any] = {"i": index, "type": kind if isinstance(kind, str) else "unknown", "t": step.get("t")}
    if kind == "exec":
        out["command"] = clip(step.get("command"), state)
        for name in _EXEC_FIELDS:
            if name in step:
                out[name] = clip(step[name], state)
        for stream in STREAMS:
            body = step.get(stream)
            size = step.get(f"{stream}_bytes")
            out[stream] = {
                "bytes": size if isinstance(size, int) else len(text(body).encode()),
                "kept": len(text(body)),
                "truncated": bool(step.get(f"{stream}_truncated")),
                "sha256": step.get(f"{stream}_sha256"),
                "artifact": isinstance(step.get(f"{stream}_artifact"), str),
            }
    else:
        # A file's content is the step's ``file`` view (:mod:`router.ui.files`), not a clipped string.
        skipped = ("type", "t", "content") if is_file_step(step) else ("type", "t")
        for name, value in step.items():
            if name not in skipped:
                out[name] = clip(value, state)
    out["clipped"] = state[0]
    return out


def output(step: Any, stream: str) -> dict[str, Any]:
    """One stream of an exec step, as text (up to :data:`OUTPUT_CHARS`)."""
    body = text(step.get(stream)) if isinstance(step, dict) else ""
    return {
        "text": body[:OUTPUT_CHARS],
        "cut": len(body) > OUTPUT_CHARS,
        "truncated": bool(isinstance(step, dict) and step.get(f"{stream}_truncated")),
        "artifact": isinstance(step, dict) and isinstance(step.get(f"{stream}_artifact"), str),
    }


METADATA = ("task_id", "model", "harness", "harness_version", "labels")
"""The sandbox's metadata fields, flat on the record's ``sandbox`` as the recorder writes them."""


def recorded_shape(sandbox: Any) -> dict[str, Any]:
    """A record's ``sandbox`` with its metadata flat, as the recorder writes it (a record stored by an older
    router nested it under ``metadata``): the one shape the viewer's pages read."""
    if not isinstance(sandbox, dict):
        return {}
    inner = sandbox.get("metadata")
    if not isinstance(inner, dict):
        return sandbox
    flat = {k: v for k, v in sandbox.items() if k != "metadata"}
    for name in METADATA:
        if flat.get(name) is None and inner.get(name) is not None:
            flat[name] = inner[name]
    return flat


def header(record: dict[str, Any]) -> dict[str, Any]:
    """Everything of a record but its steps (clipped), and how many steps it has."""
    state = [False]
    steps = record.get("steps") or []
    return {
        "sandbox": clip(recorded_shape(record.get("sandbox")), state),
        "outcome": clip(record.get("outcome"), state),
        "version": record.get("version"),
        "step_count": len(steps) if isinstance(steps, list) else 0,
    }


def page(record: dict[str, Any], offset: int, limit: int, phase: str | None = None) -> dict[str, Any]:
    """The header, the record's phases and final-diff event, and one page of step outlines, each with its
    phase and, for a file step, its file view; of one phase only when ``phase`` is given (then ``offset``
    and ``limit`` count that phase's steps)."""
    steps = record.get("steps")
    steps = steps if isinstance(steps, list) else []
    each = phase_of_each(steps)
    if phase is None:
        indices = list(range(offset, min(len(steps), offset + limit)))
    else:
        indices = [i for i, p in enumerate(each) if p == phase][offset : offset + limit]
    shown = views(steps, indices)
    body = header(record)
    body.update(summary(steps, each), offset=offset, phase=phase, steps=[
        {**outline(steps[i], i), "phase": each[i], **({"file": shown[i]} if i in shown else {})} for i in indices])
    return body
