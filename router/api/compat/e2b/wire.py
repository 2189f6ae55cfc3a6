"""The two wire dialects of E2B: its control plane's error body, and envd's Connect protocol with the JSON codec
(unary calls as plain JSON; server-streaming calls as 5-byte-enveloped JSON messages closed by an end-of-stream
envelope flagged 0x02 that carries the error, if any)."""

from __future__ import annotations

import json
import struct
from typing import Any

from grove.core.errors import BadRequest, GroveError

END_STREAM = 0x02
STREAM_TYPE = "application/connect+json"
ENVD_VERSION = "0.5.7"
"""What grove's envd reports: commands with stdin and ``CloseStdin`` (0.5.2), octet-stream uploads (0.5.7); not
file metadata (0.6.2) nor the watcher features after it, which the SDK then refuses itself."""

# grove's statuses as Connect codes, and Connect codes as the HTTP status of a unary error.
_CODE_OF_STATUS = {400: "invalid_argument", 401: "unauthenticated", 403: "permission_denied", 404: "not_found",
                   405: "unimplemented", 408: "deadline_exceeded", 409: "failed_precondition",
                   413: "resource_exhausted", 422: "invalid_argument", 429: "resource_exhausted",
                   501: "unimplemented", 502: "unavailable", 503: "unavailable", 504: "deadline_exceeded",
                   507: "resource_exhausted"}
_STATUS_OF_CODE = {"invalid_argument": 400, "unauthenticated": 401, "permission_denied": 403, "not_found": 404,
                   "already_exists": 409, "failed_precondition": 400, "resource_exhausted": 429,
                   "unimplemented": 501, "unavailable": 503, "deadline_exceeded": 504, "internal": 500,
                   "canceled": 499, "unknown": 500}


class ConnectError(GroveError):
    """An envd call's failure as a Connect code (``already_exists``, ``unimplemented``, ...)."""

    code = "bad_request"
    status = 400

    def __init__(self, connect_code: str, message: str) -> None:
        super().__init__(message)
        self.connect_code = connect_code


def connect_code(err: GroveError) -> str:
    """The Connect code of a grove error."""
    if isinstance(err, ConnectError):
        return err.connect_code
    return _CODE_OF_STATUS.get(err.status, "internal")


def connect_status(err: GroveError) -> int:
    """The HTTP status a unary call's error answers with."""
    return _STATUS_OF_CODE.get(connect_code(err), 500)


def connect_error_body(err: GroveError) -> dict[str, Any]:
    """Connect's error body (a unary call's answer, a stream's end)."""
    return {"code": connect_code(err), "message": err.message}


def e2b_error_body(err: GroveError) -> dict[str, Any]:
    """E2B's control-plane (and envd HTTP) error body: ``{"code": <status>, "message"}``."""
    return {"code": err.status, "message": err.message}


def envelope(message: dict[str, Any], flags: int = 0) -> bytes:
    """One enveloped message of a stream."""
    data = json.dumps(message, separators=(",", ":")).encode()
    return struct.pack(">BI", flags, len(data)) + data


def end_stream(err: GroveError | None = None) -> bytes:
    """The end-of-stream envelope: empty, or carrying the error."""
    return envelope({"error": connect_error_body(err)} if err is not None else {}, END_STREAM)


def unenvelope(body: bytes) -> dict[str, Any]:
    """The one message of a server-streaming request."""
    if len(body) < 5:
        raise BadRequest("a Connect streaming request needs a 5-byte envelope")
    flags, size = struct.unpack(">BI", body[:5])
    if flags & 0x01:
        raise ConnectError("unimplemented", "compressed Connect messages are not supported")
    return message(body[5:5 + size])


def message(raw: bytes) -> dict[str, Any]:
    """A JSON-codec message."""
    try:
        value = json.loads(raw or b"{}")
    except ValueError as exc:
        raise BadRequest(f"the message is not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise BadRequest("the message must be a JSON object")
    return value
