"""The terminal's frames between router and executor: a kind byte, a 4-byte big-endian length, the payload.

The router turns a client's WebSocket messages into these and back; the executor's relay reads and writes
them on the upgraded connection (:mod:`executor.relay`).
"""

from __future__ import annotations

import json
import struct
from typing import Any

HEADER = struct.Struct(">cI")
DATA, RESIZE, EXIT, HANGUP = b"d", b"r", b"x", b"h"
"""Bytes for (or from) the terminal; ``{"cols", "rows"}``; ``{"exit_code"}`` (the executor's last frame); the
client is done (empty: a named session ends now instead of waiting for a resume)."""
MAX_FRAME = 1024 * 1024


def frame(kind: bytes, payload: bytes) -> bytes:
    """One frame."""
    return HEADER.pack(kind, len(payload)) + payload


def json_frame(kind: bytes, body: dict[str, Any]) -> bytes:
    """One frame with a JSON payload."""
    return frame(kind, json.dumps(body).encode())
