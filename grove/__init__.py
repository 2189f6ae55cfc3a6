"""grove: isolated sandboxes for AI-agent training and evaluation — the package users import.

    from grove import Grove
    with Grove() as grove:                       # GROVE_URL and GROVE_API_KEY from the environment
        with grove.create(image="default", metadata={"task_id": "t1"}) as sb:
            print(sb.exec("python3 -c 'print(1+1)'").stdout)

The SDK names (``Grove``, ``AsyncGrove``, ``Sandbox``, ``AsyncSandbox``, ``ExecResult``) and the error
classes are loaded on first use: the executor, which shares ``grove.core.errors`` and ``grove.core.wire``, never
pays for the HTTP client it does not use. Importing grove pulls in no server module.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from grove.client import DEFAULT_URL, AsyncGrove, AsyncSandbox, ExecResult, Grove, Sandbox
    from grove.core.errors import (
        BadGateway,
        BadRequest,
        BatchFailed,
        Conflict,
        Forbidden,
        GroveError,
        InsufficientStorage,
        InternalError,
        Invalid,
        MethodNotAllowed,
        NotFound,
        TooLarge,
        Unauthorized,
        Unavailable,
        UpstreamTimeout,
    )

_SDK = ("DEFAULT_URL", "AsyncGrove", "AsyncSandbox", "ExecResult", "Grove", "Sandbox")
_ERRORS = (
    "BadGateway", "BadRequest", "BatchFailed", "Conflict", "Forbidden", "GroveError", "InsufficientStorage",
    "InternalError", "Invalid", "MethodNotAllowed", "NotFound", "TooLarge", "Unauthorized", "Unavailable",
    "UpstreamTimeout",
)
_LAZY = {**dict.fromkeys(_SDK, "grove.client"), **dict.fromkeys(_ERRORS, "grove.core.errors")}

__all__ = [
    "DEFAULT_URL",
    "AsyncGrove",
    "AsyncSandbox",
    "BadGateway",
    "BadRequest",
    "BatchFailed",
    "Conflict",
    "ExecResult",
    "Forbidden",
    "Grove",
    "GroveError",
    "InsufficientStorage",
    "InternalError",
    "Invalid",
    "MethodNotAllowed",
    "NotFound",
    "Sandbox",
    "TooLarge",
    "Unauthorized",
    "Unavailable",
    "UpstreamTimeout",
]


def __getattr__(name: str) -> Any:
    """Load an SDK name from its module on first use (PEP 562)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'grove' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
