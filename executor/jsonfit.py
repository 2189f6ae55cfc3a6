"""Exec results within their byte budget once escaped for JSON, not only as raw bytes.

``max_output_bytes`` bounds the raw bytes of each stream, but JSON escapes a NUL as ``\\u0000`` (six
bytes) and, ASCII-only, any non-ASCII character as one or two ``\\uXXXX``: 32 MiB of NULs became a 201 MB
reply, held whole by the router to record it (issue 18, finding 11). A JSON reply now carries at most
:data:`JSON_FACTOR` times the budget per stream — room for any UTF-8 text, which escapes to at most twice
its bytes — cutting the middle otherwise, like the raw cut, with a marker saying so. msgpack replies carry
raw bytes and are not touched.
"""

from __future__ import annotations

import json
from typing import Any

JSON_FACTOR = 2


def _escaped(text: str) -> int:
    return len(json.dumps(text)) - 2


def escaped_size(data: bytes) -> int:
    """How many bytes ``data`` takes in a JSON reply (as text, invalid UTF-8 replaced)."""
    return _escaped(data.decode("utf-8", "replace"))


def _fits(text: str, budget: int, *, from_end: bool) -> str:
    """The longest prefix (or suffix) of ``text`` whose escaped form is within ``budget`` (about)."""
    n = min(len(text), budget)
    while n > 0:
        part = text[len(text) - n :] if from_end else text[:n]
        cost = _escaped(part)
        if cost <= budget:
            return part
        n = min(n - 1, int(n * budget / cost * 0.95))
    return ""


def fit_for_json(result: dict[str, Any], max_output_bytes: int) -> dict[str, Any]:
    """``result`` with each stream whose JSON escaping passes ``JSON_FACTOR * max_output_bytes`` cut."""
    budget = JSON_FACTOR * max_output_bytes
    fitted = dict(result)
    for stream in ("stdout", "stderr"):
        data = result.get(stream)
        if not isinstance(data, bytes) or len(data) * 6 <= budget:  # 6: the most one byte can escape to
            continue
        text = data.decode("utf-8", "replace")
        if _escaped(text) <= budget:
            continue
        head = _fits(text, budget // 2, from_end=False)
        tail = _fits(text, budget // 2, from_end=True)
        where = result.get(f"{stream}_file")
        rest = f"the full output in {where}" if where else "ask for msgpack (Accept: application/msgpack) for it raw"
        marker = f"\n[... grove: output cut to fit {budget} bytes once escaped for JSON; {rest} ...]\n"
        fitted[stream] = (head + marker + tail).encode("utf-8", "replace")
        fitted[f"{stream}_truncated"] = True
    return fitted
