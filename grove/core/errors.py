"""The one error hierarchy of grove.

Every failure a user can see is a :class:`GroveError` subclass with a stable ``code`` and an HTTP
``status``. The executor's Flask handler, the router's aiohttp middleware and the SDK all use
:func:`error_body` and :func:`error_from_body`, so the same class crosses every boundary.
"""

from __future__ import annotations

from typing import Any, ClassVar


class GroveError(Exception):
    """Base of every error grove reports; ``code`` and ``status`` map it to the wire."""

    code: ClassVar[str] = "internal"
    status: ClassVar[int] = 500

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after

    def to_body(self) -> dict[str, Any]:
        """The JSON error body: ``{"error": {"code", "message"}}``."""
        return error_body(self.code, self.message)


class BadRequest(GroveError):
    """The request is malformed: bad JSON or msgpack, wrong types, unknown fields."""

    code = "bad_request"
    status = 400


class Unauthorized(GroveError):
    """No credentials, or credentials that are not valid."""

    code = "unauthorized"
    status = 401


class Forbidden(GroveError):
    """Valid credentials that may not do this."""

    code = "forbidden"
    status = 403


class NotFound(GroveError):
    """The sandbox, file, image or trajectory does not exist."""

    code = "not_found"
    status = 404


class MethodNotAllowed(GroveError):
    """The path exists but not with this method."""

    code = "method_not_allowed"
    status = 405


class RequestTimeout(GroveError):
    """The caller stopped sending its request body part-way (the server does not wait for ever)."""

    code = "request_timeout"
    status = 408


class Conflict(GroveError):
    """The request conflicts with the current state (e.g. a deleted sandbox)."""

    code = "conflict"
    status = 409


class TooLarge(GroveError):
    """A body, file or header exceeds its limit."""

    code = "too_large"
    status = 413


class RangeNotSatisfiable(GroveError):
    """A ``Range`` that starts past the end of the object (the answer carries ``Content-Range: bytes */SIZE``)."""

    code = "range_not_satisfiable"
    status = 416


class Misdirected(GroveError):
    """Another router owns this sandbox and the call cannot be passed on to it (a WebSocket upgrade, a call that
    came from a peer already): the message names the owner's URL."""

    code = "misdirected"
    status = 421


class Invalid(GroveError):
    """Well-formed but semantically invalid (e.g. a negative timeout)."""

    code = "invalid"
    status = 422


class NoDisplay(Invalid):
    """A computer action on a sandbox whose image has no screen (no Xvfb): build one with ``--preset desktop``."""

    code = "no_display"


class BadGateway(GroveError):
    """The sandbox's executor failed or went away during the call."""

    code = "bad_gateway"
    status = 502


class Unavailable(GroveError):
    """Temporarily unable to serve; retry after ``retry_after`` seconds."""

    code = "unavailable"
    status = 503


class Unreachable(Unavailable):
    """The client could not reach the router at all (refused, reset, timed out): said by the SDK, never by a
    server. Not back-pressure: the router is down or away, and nothing of the call may have arrived."""

    code = "unreachable"


class QuotaExceeded(Unavailable):
    """A project's quota is reached (429): the call names which; retry after ``retry_after`` seconds, once some of
    the project's sandboxes (or bytes) are gone. A kind of :class:`Unavailable`: a client that waits out
    back-pressure waits this out too."""

    code = "quota_exceeded"
    status = 429


class UpstreamTimeout(GroveError):
    """The sandbox did not answer in time."""

    code = "upstream_timeout"
    status = 504


class ChecksumMismatch(GroveError):
    """Bytes fetched from storage whose sha256 is not the one recorded when they were stored."""

    code = "checksum_mismatch"
    status = 502


class InsufficientStorage(GroveError):
    """The disk the router keeps its own state on is full (or over quota): free space there and retry."""

    code = "insufficient_storage"
    status = 507


class InternalError(GroveError):
    """A bug in grove: reported, never swallowed."""

    code = "internal"
    status = 500


class BatchFailed(GroveError):
    """Some items of a batch create (``create_many``) failed. Never on the wire: the SDK raises it after the
    batch's answer, so the sandboxes that were made are not lost with the error. ``created`` holds them by
    their index in the batch — the caller's, to use or to close — and ``errors`` each failed item's error
    by its index (``retry_after`` is the longest any of them asked for)."""

    code = "batch_failed"
    status = 207  # some items made, some not: what the HTTP call itself answered was a 200

    def __init__(self, created: dict[int, Any], errors: dict[int, GroveError], total: int) -> None:
        first = min(errors)
        waits = [e.retry_after for e in errors.values() if e.retry_after is not None]
        super().__init__(f"{len(errors)} of {total} creates failed (the first, item {first}: "
                         f"{errors[first].code}: {errors[first].message}); {len(created)} sandboxes were made "
                         "and are in .created: use them or close them", retry_after=max(waits) if waits else None)
        self.created = created
        self.errors = errors
        self.total = total
        """How many sandboxes the batch asked for."""


_BY_CODE: dict[str, type[GroveError]] = {
    cls.code: cls
    for cls in (
        BadRequest,
        Unauthorized,
        Forbidden,
        NotFound,
        MethodNotAllowed,
        RequestTimeout,
        Conflict,
        TooLarge,
        RangeNotSatisfiable,
        Misdirected,
        Invalid,
        NoDisplay,
        ChecksumMismatch,  # before BadGateway: a bare 502 stays a BadGateway
        BadGateway,
        Unavailable,
        QuotaExceeded,
        UpstreamTimeout,
        InsufficientStorage,
        InternalError,
    )
}

_BY_STATUS: dict[int, type[GroveError]] = {cls.status: cls for cls in _BY_CODE.values()}


def error_body(code: str, message: str) -> dict[str, Any]:
    """The one error body shape on every grove wire."""
    return {"error": {"code": code, "message": message}}


def error_from_body(status: int, body: Any) -> GroveError:
    """Turn an error response back into the matching :class:`GroveError` subclass."""
    code, message = None, None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        code = body["error"].get("code")
        message = body["error"].get("message")
    cls = _BY_CODE.get(code) if isinstance(code, str) else None
    if cls is None:
        cls = _BY_STATUS.get(status, InternalError if status >= 500 else BadRequest)
    return cls(str(message) if message is not None else f"HTTP {status}")
