"""Answers in the client's encoding: JSON, or msgpack when it accepts it (one function, every handler), and
the one mapping of an exception to the error it answers."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from aiohttp import web

from grove.core import wire
from grove.core.errors import GroveError, InternalError
from router.records.statedisk import storage_error

log = logging.getLogger("grove.router")


def reply(request: web.Request, value: Any, status: int = 200) -> web.Response:
    """JSON, or msgpack when the client accepts it."""
    as_msgpack = wire.is_msgpack(request.headers.get("Accept"))
    return web.Response(
        body=wire.encode(value, as_msgpack), status=status, content_type=wire.MSGPACK if as_msgpack else wire.JSON
    )


def error_of(exc: Exception, state_dir: Path, what: str) -> GroveError:
    """The error an exception raised while serving ``what`` answers: a :class:`GroveError` as it is; a full
    state disk as ``InsufficientStorage`` (no bug: the operator has to free space, the message says where);
    anything else as an ``InternalError``, logged with its traceback."""
    if isinstance(exc, GroveError):
        return exc
    full = storage_error(exc, state_dir)
    if full is not None:
        log.warning("%s: %s", what, full.message)
        return full
    log.exception("unhandled error on %s", what, exc_info=exc)
    return InternalError(f"router error: {type(exc).__name__}: {exc}")
