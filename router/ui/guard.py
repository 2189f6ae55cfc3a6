"""The viewer's gate: session checks on its routes, CSRF on state changes, and the headers of every answer.

Nothing under ``/ui/`` takes the API's bearer header: a browser logs in once (``/ui/login``) and then
carries only the session cookie, which is HttpOnly (no script reads it) and SameSite=Strict (no other
site's page sends it). The headers forbid inline script and style, framing and MIME sniffing, so even a
rendering bug could not run what a sandbox wrote.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from urllib.parse import quote

from aiohttp import web

from grove.core.errors import BadRequest, Forbidden, Unauthorized
from router.api.appkeys import CALLER, check_sandbox_ids
from router.api.middleware import KEYS
from router.ui.sessions import COOKIE, LIFETIME_S, Session, Sessions

SESSIONS = web.AppKey("ui_sessions", Sessions)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "font-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cache-Control": "no-store",
}
CSRF_HEADER = "X-CSRF-Token"


async def add_headers(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare``: the security headers on every ``/ui`` answer, errors included."""
    if request.path == "/ui" or request.path.startswith("/ui/"):
        for name, value in HEADERS.items():
            response.headers.setdefault(name, value)


def session_of(request: web.Request) -> Session | None:
    """The request's live session, if its cookie names one."""
    return request.app[SESSIONS].get(request.cookies.get(COOKIE))


def page(handler: Handler) -> Handler:
    """A page: without a session, off to the login form (which comes back here after). A page names its
    sandbox or run only to its script; whether the caller may see it decides the page's status
    (:mod:`router.ui.views`), so another project's answers exactly as one that never was."""

    async def guarded(request: web.Request) -> web.StreamResponse:
        session = session_of(request)
        if session is None:
            return redirect(f"/ui/login?next={quote(request.path_qs, safe='')}")
        request["session"] = session
        _set_caller(request, session)
        return await handler(request)

    guarded.__name__ = handler.__name__
    return guarded


def _set_caller(request: web.Request, session: Session) -> None:
    """The session's key's caller, as the API's key check sets it: a page sees what its key may see."""
    caller = request.app[KEYS].caller(session.key)
    if caller is None:  # revoked between the session's check and now
        raise Unauthorized("the session's API key is no longer valid (log in again at /ui/login)")
    request[CALLER] = caller


def api(handler: Handler) -> Handler:
    """A JSON call of the pages: 401 without a session; a POST also needs the session's CSRF token."""

    async def guarded(request: web.Request) -> web.StreamResponse:
        session = session_of(request)
        if session is None:
            raise Unauthorized("not logged in, or the session ended (log in again at /ui/login)")
        if request.method not in ("GET", "HEAD"):
            check_csrf(request, session, request.headers.get(CSRF_HEADER))
        request["session"] = session
        _set_caller(request, session)
        check_sandbox_ids(request)
        return await handler(request)

    guarded.__name__ = handler.__name__
    return guarded


def check_csrf(request: web.Request, session: Session, given: str | None) -> None:
    """Forbidden unless ``given`` is the session's token and the request, if it says, comes from this origin."""
    origin = request.headers.get("Origin")
    if origin is not None and origin != f"{request.scheme}://{request.host}":
        raise Forbidden(f"cross-origin request from {origin!r} refused")
    if not session.csrf_ok(given):
        raise Forbidden(f"missing or wrong CSRF token (send the page's token in {CSRF_HEADER})")


def set_cookie(request: web.Request, response: web.StreamResponse, session: Session) -> None:
    """The session cookie: HttpOnly, SameSite=Strict, only for /ui, expiring with the session."""
    response.set_cookie(COOKIE, session.id, max_age=int(LIFETIME_S), path="/ui", httponly=True,
                        samesite="Strict", secure=request.secure)


def clear_cookie(response: web.StreamResponse) -> None:
    """Tell the browser to forget the session cookie."""
    response.del_cookie(COOKIE, path="/ui")


def redirect(location: str) -> web.Response:
    """A 303 to ``location`` (returned, not raised: the error middleware turns raised HTTP errors into JSON)."""
    return web.Response(status=303, headers={"Location": location})


def safe_next(target: str | None) -> str:
    """Where to go after login: a path of the viewer only (never another site, never a scheme). A control
    character (CR, LF, ...) is a 400: it cannot go into a Location header, and no browser sent it."""
    if target and any(ord(c) < 0x20 or ord(c) == 0x7F for c in target):
        raise BadRequest("'next' holds a control character; it must be a path of the viewer, such as /ui/runs")
    if target and target.startswith("/ui/") and "//" not in target and "\\" not in target:
        return target
    return "/ui/"
