"""The middleware chain, in one visible list: errors become the one error body, API keys are checked, and
sandbox ids are checked once, before any handler."""

from __future__ import annotations

import base64
import binascii
import logging

from aiohttp import web

from grove.core.errors import (
    BadRequest,
    GroveError,
    InternalError,
    MethodNotAllowed,
    NotFound,
    RequestTimeout,
    TooLarge,
)
from router.api.appkeys import CALLER, SERVICE, check_sandbox_ids
from router.api.appkeys import KEYS as KEYS  # where the app and the viewer have always found it
from router.api.openapi import canonical_path
from router.api.replies import error_of, reply
from router.api.routes import ROUTES, Handler
from router.api.shards import peer_auth_middleware, shards_middleware
from router.records.registry import SAFE_ID_RE
from router.upstream.proxy import StreamAborted

log = logging.getLogger("grove.router")


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The one place an exception becomes the error body."""
    try:
        return await handler(request)
    except StreamAborted as exc:
        # The answer had started: cutting the connection is the only error signal left. What broke is logged
        # once here (the recorder notes an executor lost), not as aiohttp's traceback of every cut answer.
        log.info("%s %s: the answer was cut: %s", request.method, request.path, exc)
        if request.transport is not None:
            request.transport.abort()
        return web.Response()  # never sent: its connection is gone
    except GroveError as exc:
        err: GroveError = exc
    except web.HTTPException as exc:
        if exc.status == 404:
            err = NotFound(f"no such endpoint: {request.method} {request.path}")
        elif exc.status == 405:
            err = MethodNotAllowed(f"{request.method} is not allowed on {request.path}")
        elif exc.status == 413:
            err = TooLarge(f"request body too large: {exc.text}")
        elif exc.status < 500:
            err = BadRequest(exc.text or exc.reason)
        else:
            err = InternalError(exc.text or exc.reason)
    except Exception as exc:
        err = error_of(exc, request.app[SERVICE].settings.state_dir, f"{request.method} {request.path}")
    route = request.match_info.route.resource
    shape = _ERROR_BODIES.get((request.method, route.canonical)) if route is not None else None
    response = reply(request, shape(err) if shape is not None else err.to_body(), status=err.status)
    if isinstance(err, RequestTimeout):
        response.force_close()  # the rest of a stalled body must not hold the connection (or a place) open
    if err.retry_after is not None:
        response.headers["Retry-After"] = str(max(1, round(err.retry_after)))
    return response


_PUBLIC = {(r.method, canonical_path(r.path)) for r in ROUTES if r.public}
_OWN_AUTH = {(r.method, canonical_path(r.path)) for r in ROUTES if r.own_auth}
_NO_KEY = _PUBLIC | _OWN_AUTH
_KEY_HEADERS = {(r.method, canonical_path(r.path)): r.key_header for r in ROUTES if r.key_header}
_BASIC = {(r.method, canonical_path(r.path)) for r in ROUTES if r.basic_auth}
_ERROR_BODIES = {(r.method, canonical_path(r.path)): r.error_body for r in ROUTES if r.error_body}
SESSION_ROUTES = web.AppKey("session_routes", frozenset)
"""(method, path) of the routes that check a session cookie themselves instead of an API key (the viewer's,
router/ui/guard.py), set by the app that adds them; only matched ones skip the key check here."""


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every call but the public ones needs a valid API key, loopback included (on routes that name a
    ``key_header``, the key may come in that header instead of ``Authorization: Bearer``). The viewer's
    routes take a session cookie instead, and check it themselves. A call a peer router signed has its caller
    already (router/api/shards.py)."""
    route = request.match_info.route.resource
    canonical = route.canonical if route is not None else request.path
    if CALLER not in request and (request.method, canonical) not in _NO_KEY and \
            (route is None or (request.method, canonical) not in request.app[SESSION_ROUTES]):
        header = request.headers.get("Authorization")
        alternative = _KEY_HEADERS.get((request.method, canonical))
        if not _is_bearer(header) and alternative and alternative in request.headers:
            # E2B's envd calls carry `Authorization: Basic <user>:` (the sandbox user) beside their token.
            header = f"Bearer {request.headers[alternative]}"
        elif (request.method, canonical) in _BASIC and header and header[:6].lower() == "basic ":
            header = f"Bearer {basic_password(header)}"
        request[CALLER] = request.app[KEYS].check(header)
    return await handler(request)


def _is_bearer(header: str | None) -> bool:
    return header is not None and header[:7].lower() == "bearer "


def basic_password(header: str) -> str:
    """The password of ``Authorization: Basic base64(user:password)`` (empty if it is malformed)."""
    try:
        return base64.b64decode(header[6:].strip(), validate=True).decode().partition(":")[2]
    except (binascii.Error, ValueError):
        return ""


_ID_PARTS = ("id", "sandbox_id")


@web.middleware
async def ids_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The one check of a sandbox id in a route: anything but ``sb-`` and lowercase letters and digits is a
    404 before a handler sees it, so no id ever reaches a file name or an object key (``..%2F..`` decodes to
    a path)."""
    # The viewer's HTML pages only carry the id to their script, whose API call is checked here.
    for part in _ID_PARTS if not request.path.startswith("/ui/") or request.path.startswith("/ui/api/") else ():
        if (value := request.match_info.get(part)) is not None and not SAFE_ID_RE.fullmatch(value):
            raise NotFound(f"{value[:80]!r} is not a sandbox id (they look like sb-0123456789abcdef)")
    return await handler(request)


@web.middleware
async def projects_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A sandbox named in a route must be the caller's project's (:func:`check_sandbox_ids`); the viewer's
    guard makes the same check for its routes, whose caller comes from the session."""
    if CALLER in request:
        check_sandbox_ids(request)
    return await handler(request)


MIDDLEWARES = [errors_middleware, peer_auth_middleware, auth_middleware, shards_middleware, ids_middleware,
               projects_middleware]
