"""The viewer's pages: login and logout, the page shells (their data comes from :mod:`router.ui.api`), static files.

Templates autoescape everything; the shells carry only ids the URL already named and the session's
CSRF token, and leave every value a sandbox or harness wrote to the scripts, which set it as text. A page
about one sandbox, trajectory or run answers with the status its data call would (the shell alike: its
script shows why), so another project's answers 404 exactly as one that never existed.
"""

from __future__ import annotations

import asyncio
import functools
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import jinja2
from aiohttp import web

from grove.core.errors import Forbidden
from router.ui.api import page_status
from router.ui.guard import SESSIONS, check_csrf, clear_cookie, page, redirect, safe_next, session_of, set_cookie
from router.ui.runs import page_status as run_status

HERE = Path(__file__).parent
STATIC = HERE / "static"
_STATIC_NAME = re.compile(r"^[a-z0-9_-]+\.(js|css|svg)$")
_TYPES = {"js": "text/javascript", "css": "text/css", "svg": "image/svg+xml"}
LOGIN_DELAY_S = 0.5
"""A wrong key costs this long: guessing keys through the form is slow (they are 256-bit anyway)."""


@functools.cache
def _templates() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True,
                              undefined=jinja2.StrictUndefined)


def render(name: str, *, status: int = 200, **context: Any) -> web.Response:
    """A template as an HTML answer."""
    context.setdefault("csrf", "")
    html = _templates().get_template(name).render(**context)
    return web.Response(text=html, status=status, content_type="text/html", charset="utf-8")


async def login_form(request: web.Request) -> web.StreamResponse:
    """GET /ui/login — the form (or straight on, when already logged in)."""
    target = safe_next(request.query.get("next"))
    if session_of(request) is not None:
        return redirect(target)
    return render("login.html", title="Log in", next=target, error=None)


async def login(request: web.Request) -> web.StreamResponse:
    """POST /ui/login — check the key, open a session, set its cookie. The key travels only in this body."""
    origin = request.headers.get("Origin")
    if origin is not None and origin != f"{request.scheme}://{request.host}":
        # Another site's form must not log this browser into a session of the attacker's key.
        raise Forbidden(f"login from another origin ({origin!r}) refused")
    form = await request.post()
    key, target = str(form.get("key") or ""), safe_next(str(form.get("next") or ""))
    session = request.app[SESSIONS].open(key)
    if session is None:
        await asyncio.sleep(LOGIN_DELAY_S)
        message = ("That API key is not valid (the state dir's api_keys file holds the valid ones)."
                   if key.strip() else "Enter an API key.")
        return render("login.html", status=401, title="Log in", next=target, error=message)
    try:
        response = redirect(target)
        set_cookie(request, response, session)
    except BaseException:
        request.app[SESSIONS].close(session.id)  # a login that answers nothing leaves no session behind
        raise
    return response


async def logout(request: web.Request) -> web.StreamResponse:
    """POST /ui/logout — end the session (CSRF-checked: another site cannot log you out)."""
    session = session_of(request)
    if session is not None:
        form = await request.post()
        check_csrf(request, session, str(form.get("csrf") or ""))
        request.app[SESSIONS].close(session.id)
    response = redirect("/ui/login")
    clear_cookie(response)
    return response


async def static(request: web.Request) -> web.StreamResponse:
    """GET /ui/static/{name} — the viewer's own scripts and styles (no session needed; nothing secret)."""
    name = request.match_info["name"]
    found = _STATIC_NAME.match(name)
    path = STATIC / name
    if found is None or not path.is_file():
        return web.Response(status=404, text="no such file", content_type="text/plain")
    body = await asyncio.to_thread(path.read_bytes)
    return web.Response(body=body, content_type=_TYPES[found.group(1)], charset="utf-8")


Status = Callable[[web.Request], Awaitable[int]]


def _shell(template: str, title: str, script: str, status: Status | None = None, **ids: str) -> Any:
    """A page shell; ``status``: what it answers with, from whether its data call would answer (the shell is the
    same either way, and its script shows why not)."""

    async def handler(request: web.Request) -> web.StreamResponse:
        values: dict[str, Any] = {var: request.match_info.get(src) or request.query.get(src) or ""
                                  for var, src in ids.items()}
        values.update(title=title, script=script, csrf=request["session"].csrf)
        return render(template, status=200 if status is None else await status(request), **values)

    handler.__name__ = f"{script.removesuffix('.js')}_page"
    return page(handler)


async def root(request: web.Request) -> web.StreamResponse:
    """GET /ui — the viewer lives under /ui/."""
    return redirect("/ui/")


async def _sandbox_status(request: web.Request) -> int:
    return await page_status(request, request.match_info["id"], trajectory=False)


async def _trajectory_status(request: web.Request) -> int:
    return await page_status(request, request.match_info["sandbox_id"], trajectory=True)


async def _compare_status(request: web.Request) -> int:
    """Both records' (the first that would not answer decides)."""
    for sandbox_id in (request.query.get("a"), request.query.get("b")):
        if sandbox_id and (status := await page_status(request, sandbox_id, trajectory=True)) != 200:
            return status
    return 200


sandboxes_page = _shell("sandboxes.html", "Live sandboxes", "sandboxes.js")
sandbox_page = _shell("sandbox.html", "Sandbox", "sandbox.js", _sandbox_status, id="id")
trajectories_page = _shell("trajectories.html", "Trajectories", "trajectories.js")
trajectory_page = _shell("trajectory.html", "Trajectory", "trajectory.js", _trajectory_status, id="sandbox_id")
compare_page = _shell("compare.html", "Compare trajectories", "compare.js", _compare_status, a="a", b="b")
runs_page = _shell("runs.html", "Rollout runs", "runs.js")
run_page = _shell("run.html", "Rollout run", "run.js", run_status, id="run_id")
