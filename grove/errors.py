"""The error tree, by the name users import (``from grove.errors import NotFound``); defined in
:mod:`grove.core.errors`, which the router and the executor share."""

from grove.core.errors import (
    BadGateway,
    BadRequest,
    BatchFailed,
    ChecksumMismatch,
    Conflict,
    Forbidden,
    GroveError,
    InsufficientStorage,
    InternalError,
    Invalid,
    MethodNotAllowed,
    NoDisplay,
    NotFound,
    QuotaExceeded,
    RangeNotSatisfiable,
    RequestTimeout,
    TooLarge,
    Unauthorized,
    Unavailable,
    Unreachable,
    UpstreamTimeout,
    error_from_body,
)

__all__ = [
    "BadGateway", "BadRequest", "BatchFailed", "ChecksumMismatch", "Conflict", "Forbidden", "GroveError",
    "InsufficientStorage", "InternalError", "Invalid", "MethodNotAllowed", "NoDisplay", "NotFound", "QuotaExceeded",
    "RangeNotSatisfiable",
    "RequestTimeout", "TooLarge", "Unauthorized", "Unavailable", "Unreachable", "UpstreamTimeout",
    "error_from_body",
]
