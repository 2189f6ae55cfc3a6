"""The exec contract, written once: what the SDK sends, what the router publishes in ``/v1/openapi.json``, what
the executor enforces, and the frames of a streamed answer.

:class:`ExecBody` is the request; its bounds are the constants below, which the executor's checks and settings
use too, so the published maximum of ``timeout_s`` and ``max_output_bytes`` is exactly what an executor accepts
by default (a Knative revision's timeout may lower the first, and says so). :func:`exec_body` builds the
SDK's request from the same fields. A streamed answer (``?stream=1``) is a sequence of frames — msgpack
objects back to back, or JSON lines — made by :func:`chunk_frame`, :func:`result_frame` and :func:`error_frame`
and read back by :class:`FrameReader` (the SDK, as they come) and :func:`final_result` (the router's recorder).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgpack

from grove.core import wire
from grove.core.schema import spec

DAY = 86400.0
MIN_TIMEOUT_S = 0.001
"""The shortest per-command timeout."""
MAX_TIMEOUT_S = DAY
"""The longest per-command timeout an executor accepts by default; past it, run the work in the background."""
DEFAULT_TIMEOUT_S = 600.0
"""The per-command timeout of a call that gives none."""
MIN_OUTPUT_BYTES = 64
"""The smallest ``max_output_bytes``: head and tail of an output need room."""
MAX_OUTPUT_BYTES = 64 << 20
"""The largest ``max_output_bytes`` (64 MiB per stream); past it a command's output is still kept whole, in S3."""
DEFAULT_OUTPUT_BYTES = 1 << 20
"""The ``max_output_bytes`` of a call that gives none (1 MiB per stream)."""


@dataclass(frozen=True)
class ExecBody:
    """Run one command in a sandbox (``POST /v1/sandboxes/{id}/exec``)."""

    command: str | list[str] = spec("a string runs under `/bin/sh -c`; a list is the argv itself (non-empty)")
    cwd: str | None = spec("working directory (absolute, or relative to the sandbox's workdir)", default=None,
                           max_len=4096)
    env: dict[str, str] = spec("variables merged over the sandbox's environment", factory=dict)
    stdin: bytes | str | None = spec("bytes written to the command's standard input (msgpack bin, or a UTF-8 "
                                     "string in JSON)", default=None)
    timeout_s: float | None = spec("server-side deadline: the command's whole process tree is killed at it "
                                   f"(default {DEFAULT_TIMEOUT_S:g})", default=None, minimum=MIN_TIMEOUT_S,
                                   maximum=MAX_TIMEOUT_S)
    max_output_bytes: int | None = spec("cap per stream of what the reply carries; past it head and tail are "
                                        f"kept and the full output is stored (default {DEFAULT_OUTPUT_BYTES})",
                                        default=None, minimum=MIN_OUTPUT_BYTES, maximum=MAX_OUTPUT_BYTES)
    request_id: str | None = spec("idempotency key: a retry with the same id returns the first call's result "
                                  "and never runs the command twice", default=None, max_len=200)
    user: str | None = spec("run as this user of the sandbox: `name`, `uid`, `name:group` or `uid:gid` "
                            "(default: the sandbox's root)", default=None, max_len=256)


EXEC_FIELDS = frozenset(ExecBody.__dataclass_fields__)
"""The exec call's field names (the executor refuses any other)."""


def exec_body(command: str | list[str], **options: Any) -> dict[str, Any]:
    """The body of an exec call: ``command``, the options given (None: left out) and a fresh ``request_id``
    unless one is given. An option that is no field of :class:`ExecBody` is a TypeError (a caller's typo)."""
    unknown = sorted(set(options) - EXEC_FIELDS)
    if unknown:
        raise TypeError(f"exec() got unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(EXEC_FIELDS))}")
    body: dict[str, Any] = {"command": command, "request_id": uuid.uuid4().hex}
    body.update((key, value) for key, value in options.items() if value is not None)
    return body


# -- the frames of a streamed answer ---------------------------------------------------------------------------


def chunk_frame(stream: str, data: bytes) -> dict[str, Any]:
    """Output as it comes: ``{"type": "stdout"|"stderr", "data"}``."""
    return {"type": stream, "data": data}


def result_frame(result: dict[str, Any]) -> dict[str, Any]:
    """The last frame: the command's result, as a plain answer would carry it."""
    return {"type": "result", "result": result}


def error_frame(body: dict[str, Any]) -> dict[str, Any]:
    """The last frame when the call failed after the answer began: the one error body, typed."""
    return {"type": "error", **body}


def encode_frame(frame: dict[str, Any], as_msgpack: bool) -> bytes:
    """One frame on the wire: a msgpack object, or a JSON line."""
    return wire.encode(frame, as_msgpack) + (b"" if as_msgpack else b"\n")


class FrameReader:
    """Frames back from the bytes of a streamed answer, fed in pieces as they arrive."""

    def __init__(self, content_type: str | None) -> None:
        """Read what the answer's ``Content-Type`` says: msgpack, else JSON lines."""
        self._msgpack = wire.is_msgpack(content_type)
        self._unpacker = msgpack.Unpacker(raw=False) if self._msgpack else None
        self._partial = b""

    def feed(self, data: bytes) -> Iterator[dict[str, Any]]:
        """The frames ``data`` completes (a frame cut between two pieces comes with the second)."""
        if self._unpacker is not None:
            self._unpacker.feed(data)
            yield from self._unpacker
            return
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            if line.strip():
                yield wire.decode(line, wire.JSON)


def final_result(answer: bytes, content_type: str | None) -> dict[str, Any] | None:
    """The result of a whole streamed answer (its last ``result`` frame), or None if it has none."""
    frames = list(FrameReader(content_type).feed(answer + (b"" if wire.is_msgpack(content_type) else b"\n")))
    for frame in reversed(frames):
        if isinstance(frame, dict) and frame.get("type") == "result":
            result = frame.get("result")
            return result if isinstance(result, dict) else None
    return None
