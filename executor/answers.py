"""How the executor answers, whichever layer serves the call: the bearer check, an exception turned into the
one error shape, bodies and frames in JSON or msgpack. Flask's handlers (:mod:`executor.app`) and the thin
WSGI exec route (:mod:`executor.exec_route`) both answer through here, so their answers cannot drift apart.
"""

from __future__ import annotations

import errno
import hmac
import logging
import os
from collections.abc import Iterable, Iterator
from typing import Any

from werkzeug.exceptions import HTTPException

from executor.runner import Chunk
from grove.core import wire
from grove.core.api import chunk_frame, encode_frame, error_frame, result_frame
from grove.core.errors import (
    BadRequest,
    Conflict,
    Forbidden,
    GroveError,
    InternalError,
    MethodNotAllowed,
    NotFound,
    TooLarge,
    Unauthorized,
)

log = logging.getLogger("grove.executor")

NDJSON = "application/x-ndjson"

_CLIENT_ERRNOS: dict[int, type[GroveError]] = {
    errno.ENAMETOOLONG: BadRequest, errno.ELOOP: BadRequest, errno.EINVAL: BadRequest, errno.EILSEQ: BadRequest,
    errno.ENOENT: NotFound, errno.ENOTDIR: NotFound, errno.EACCES: Forbidden, errno.EPERM: Forbidden,
    errno.EROFS: Forbidden, errno.EISDIR: Conflict, errno.EEXIST: Conflict, errno.ENOTEMPTY: Conflict,
    errno.ENOSPC: TooLarge, errno.EDQUOT: TooLarge, errno.EFBIG: TooLarge,
}


def authenticate(header: str, token: bytes) -> None:
    """Raise ``Unauthorized`` unless ``header`` is ``Bearer <token>``."""
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not given:
        raise Unauthorized("missing 'Authorization: Bearer <token>' header")
    if not hmac.compare_digest(given.strip().encode(), token):
        raise Unauthorized("the bearer token is not valid for this sandbox")


def as_grove_error(exc: Exception, method: str, path: str) -> GroveError:
    """The one place an exception becomes the error a caller is told."""
    if isinstance(exc, HTTPException):
        code = exc.code or 500
        if code == 404:
            return NotFound(f"no such endpoint: {method} {path}")
        if code == 405:
            return MethodNotAllowed(f"{method} is not allowed on {path}")
        if code == 413:
            return TooLarge("request body too large")
        return BadRequest(exc.description or "bad request") if code < 500 else InternalError(str(exc))
    if isinstance(exc, GroveError):
        return exc
    if isinstance(exc, OSError) and exc.errno in _CLIENT_ERRNOS:
        # A path the caller chose that the kernel refuses (too long, a loop, not a directory, ...):
        # the caller's mistake, named, not a server error.
        return _CLIENT_ERRNOS[exc.errno](f"{os.strerror(exc.errno)}: {exc.filename or path}")
    log.exception("unhandled error on %s %s", method, path)
    return InternalError(f"executor error: {type(exc).__name__}: {exc}")


def error_headers(err: GroveError) -> dict[str, str]:
    """The headers an error answer carries beside its body (``Retry-After`` when it says when to retry)."""
    return {} if err.retry_after is None else {"Retry-After": str(max(1, round(err.retry_after)))}


def body_type(as_msgpack: bool) -> str:
    """The Content-Type of a whole answer."""
    return wire.MSGPACK if as_msgpack else wire.JSON


def stream_type(as_msgpack: bool) -> str:
    """The Content-Type of a streamed answer (``?stream=1``)."""
    return wire.MSGPACK if as_msgpack else NDJSON


def frames(events: Iterable[Chunk | dict[str, Any]], as_msgpack: bool) -> Iterator[bytes]:
    """One frame per chunk (msgpack objects, or JSON lines), the result last; an error met on the way is the
    last frame (the status line has gone already)."""
    try:
        for event in events:
            frame = chunk_frame(event.stream, event.data) if isinstance(event, Chunk) else result_frame(event)
            yield encode_frame(frame, as_msgpack)
    except GroveError as exc:
        yield encode_frame(error_frame(exc.to_body()), as_msgpack)
