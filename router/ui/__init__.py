"""The web viewer, served by the router under ``/ui/``: live sandboxes, trajectories, comparisons, rollout runs.

Its routes are not API routes: they are absent from the ``/v1`` table and the OpenAPI document, and
the API's bearer check skips exactly these (:data:`UI_ROUTES`); each one checks the session cookie
itself (:mod:`router.ui.guard`), except the login form and the static files.
"""

from __future__ import annotations

from aiohttp import web

from router.auth import KeyRing
from router.ui import api, filmstrip, lineage, runs, views
from router.ui.guard import SESSIONS, Handler, add_headers
from router.ui.guard import api as json_call
from router.ui.search import Summaries
from router.ui.sessions import Sessions
from router.ui.trajectories import TrajectoryCache

UI_ROUTES: list[tuple[str, str, Handler]] = [
    ("GET", "/ui", views.root),
    ("GET", "/ui/login", views.login_form),
    ("POST", "/ui/login", views.login),
    ("POST", "/ui/logout", views.logout),
    ("GET", "/ui/static/{name}", views.static),
    ("GET", "/ui/", views.sandboxes_page),
    ("GET", "/ui/sandboxes/{id}", views.sandbox_page),
    ("GET", "/ui/trajectories", views.trajectories_page),
    ("GET", "/ui/trajectories/{sandbox_id}", views.trajectory_page),
    ("GET", "/ui/compare", views.compare_page),
    ("GET", "/ui/runs", views.runs_page),
    ("GET", "/ui/runs/{run_id}", views.run_page),
    ("GET", "/ui/api/sandboxes", json_call(api.sandboxes)),
    ("GET", "/ui/api/sandboxes/{id}", json_call(api.sandbox)),
    ("POST", "/ui/api/sandboxes/{id}/delete", json_call(api.delete_sandbox)),
    ("GET", "/ui/api/sandboxes/{id}/screen", json_call(filmstrip.live_screen)),
    ("GET", "/ui/api/runs", json_call(runs.runs)),
    ("GET", "/ui/api/runs/{run_id}", json_call(runs.run)),
    ("GET", "/ui/api/runs/{run_id}/plots/{name}", json_call(runs.plot)),
    ("GET", "/ui/api/trajectories", json_call(api.trajectories)),
    ("GET", "/ui/api/trajectories/{sandbox_id}", json_call(api.trajectory)),
    ("GET", "/ui/api/trajectories/{sandbox_id}/raw", json_call(api.raw)),
    ("GET", "/ui/api/trajectories/{sandbox_id}/filmstrip", json_call(filmstrip.filmstrip)),
    ("GET", "/ui/api/trajectories/{sandbox_id}/lineage", json_call(lineage.lineage)),
    ("GET", "/ui/api/trajectories/{sandbox_id}/screenshots/{sha}", json_call(filmstrip.screenshot)),
    ("GET", "/ui/api/trajectories/{sandbox_id}/steps/{n}", json_call(api.step)),
    ("GET", "/ui/api/trajectories/{sandbox_id}/steps/{n}/file", json_call(api.file_view)),
    ("GET", "/ui/api/trajectories/{sandbox_id}/steps/{n}/{stream}", json_call(api.output)),
    ("GET", "/ui/api/trajectories/{sandbox_id}/steps/{n}/{stream}/full", json_call(api.full_output)),
]
"""Every viewer route: (method, path, handler). The API's auth middleware lets exactly these through."""


def install(app: web.Application, keys: KeyRing) -> None:
    """Add the viewer to the router's app; its sessions end when ``keys`` stops accepting their key."""
    app[SESSIONS] = Sessions(keys.valid)
    app[api.TRAJECTORIES] = TrajectoryCache()
    app[api.SUMMARIES] = Summaries()
    app[runs.RUN_FILES] = runs.RunFiles()
    for method, path, handler in UI_ROUTES:
        app.router.add_route(method, path, handler)
    app.on_response_prepare.append(add_headers)
